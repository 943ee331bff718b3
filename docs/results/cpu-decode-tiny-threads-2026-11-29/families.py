"""Ad-hoc: every dense family of tests/graph/test_families.py, ort-quant 4-bit at accuracy_level 4 (llama.cpp's int8
arithmetic on both sides), exported with kernels="wicore" (MatMulQ, BlockAttention / BlockAttentionQKV) and with
kernels="ort" (MatMulNBits, the portable attention): the same greedy tokens expected (as
tests/kernels/test_matmul_q_export.py checks on the tiny Gemma 3), and which layers took BlockAttentionQKV."""
import collections, shutil, sys
from pathlib import Path
import onnx
sys.path.insert(0, "/work/wt-dec37/tests/graph"); sys.path.insert(0, "/work/wt-dec37/tests")
import test_families as T
from test_gemma3 import engine
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.types.sampling import SamplingParams
root = Path("/work/cache-dec37/fam")
for name in T.CONFIGS:
    tmp = root / name
    shutil.rmtree(tmp, ignore_errors=True); tmp.mkdir(parents=True)
    T.build(tmp, name)
    toks, ops = {}, None
    for kernels in ("wicore", "ort"):
        out = tmp / kernels
        export_model(open_source(str(tmp / "hf")), out, ExportConfig(op_flavour="ort-quant", weight_bits=4, accuracy_level=4, kernels=kernels), progress=lambda _: None)
        if kernels == "wicore":
            nodes = onnx.load(str(out / "part-00.onnx"), load_external_data=False).graph.node
            c = collections.Counter(n.op_type for n in nodes); ops = (c.get("BlockAttentionQKV", 0), c.get("BlockAttention", 0))
        with engine(out, prefill_chunk=T.PREFILL_CHUNK.get(name, 16)) as eng:
            toks[kernels] = [c.token_ids for c in eng.generate(T.PROMPTS, SamplingParams(max_tokens=16, ignore_eos=True))]
    import json, os; json.dump(toks["wicore"], open(f"/work/cache-dec37/fam-{os.environ.get('TAG', 'x')}-{name}.json", "w"))
    same = toks["wicore"] == toks["ort"]
    print(f"{name:24s} BlockAttentionQKV / BlockAttention layers {ops}: same tokens {same}" + ("" if same else f" {[sum(a == b for a, b in zip(x, y)) for x, y in zip(toks['wicore'], toks['ort'])]}"), flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
