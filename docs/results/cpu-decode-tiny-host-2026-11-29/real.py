"""Issue 37, item 3 (ad hoc): a random HF checkpoint at a realistic small shape, converted by llama.cpp's converter
(tests/llama_cpp_peer.py, as the tiny GGUFs were), quantized Q4_K_M and Q8_0, exported (ort-quant, kernels wicore);
greedy tokens of HF float32, WiCore and llama.cpp on the five prompts of tests/export/test_gguf_llama_cpp.py.
usage: real.py NAME   (smollm2-shape: Llama at SmolLM2-135M's shape; qwen05-shape: Qwen2 at Qwen2.5-0.5B's, vocab 49,152)"""
import gc, json, os, shutil, sys, time
from pathlib import Path
sys.path[:0] = ["/work/wt-small37/tests", "/work/wt-small37/tests/export"]
from llama_cpp_peer import convert, llama_cpp_greedy, num_agreeing, quantize, random_checkpoint
from test_gguf_llama_cpp import TEXTS, _init, hf_greedy, NUM_TOKENS
from transformers import AutoTokenizer
from wicore.engine.engine import Engine, EngineConfig
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.types.sampling import SamplingParams
SHAPES = {
    "smollm2-shape": (("LlamaConfig", "LlamaForCausalLM", {"tie_word_embeddings": True}),
                      dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                           head_dim=64, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=100000.0)),
    "qwen05-shape": (("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),
                     dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                          max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=1000000.0)),
}
name = sys.argv[1]
STD = float(os.environ.get("STD", "0.1")); TAG = "" if STD == 0.1 else f"-std{STD}"
def init(p): return (1.0, 0.2) if "norm" in p else (0.0, STD)  # tests' _init at STD 0.1 (biases 0.5 there)
if STD == 0.1: init = _init
out = Path("/work/cache-small37/real"); src = Path("/work/cache-int/llama.cpp-src-0.3.36")
tok = AutoTokenizer.from_pretrained("/work/cache-int/exports-fe9c5606b763/tiny-llama-hf")
prompts = [tok(t)["input_ids"] for t in TEXTS]
rec = {"name": name, "std": STD, "shape": SHAPES[name][1], "spec": SHAPES[name][0], "prompts": prompts, "t": {}}
def mark(k): rec["t"][k] = time.strftime("%H:%M:%S", time.gmtime()); print(k, rec["t"][k], flush=True)
hf = out / f"{name}{TAG}-hf"
model = random_checkpoint(SHAPES[name][0], SHAPES[name][1], tok, hf, init); mark("checkpoint")
rec["hf"] = hf_greedy(model, prompts); mark("hf greedy")
del model; gc.collect()
f32 = out / f"{name}{TAG}-f32.gguf"
convert(src, hf, f32); mark("converted"); shutil.rmtree(hf)
for quant in ("Q4_K_M", "Q8_0"):
    gguf = quantize(f32, out / f"{name}{TAG}-{quant}.gguf", quant); mark(f"quantized {quant}")
    exp = out / f"{name}{TAG}-{quant}-wicore"
    export_model(open_source(str(gguf)), exp, ExportConfig(op_flavour="ort-quant", kernels="wicore", overwrite=True), progress=lambda _: None)
    mark(f"exported {quant}")
    with Engine(EngineConfig(model_dir=exp, num_threads=2, host_tier_gb=0)) as engine:
        ours = [c.token_ids for c in engine.generate(prompts, SamplingParams(max_tokens=NUM_TOKENS, ignore_eos=True))]
    theirs = llama_cpp_greedy(gguf, prompts, NUM_TOKENS)
    rec[quant] = {"wicore": ours, "llama.cpp": theirs,
                  "wicore_agree": [num_agreeing(o, r) for o, r in zip(ours, rec["hf"])],
                  "llama_cpp_agree": [num_agreeing(t, r) for t, r in zip(theirs, rec["hf"])]}
    mark(f"greedy {quant}"); print(quant, rec[quant]["wicore_agree"], rec[quant]["llama_cpp_agree"], flush=True)
f32.unlink()
(out / f"agree-{name}{TAG}.json").write_text(json.dumps(rec))
