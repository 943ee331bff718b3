"""usage: diag.py TAG PROMPTS (default qwen05-shape-std0.02 2,3). The TAG's Q8_0 GGUF: HF float32 on the GGUF's dequantized weights (transformers' GGUF loader), logits at the
end of prompts 3 and 4: the margin of HF's / llama.cpp's first token over WiCore's."""
import json, sys, torch
from transformers import AutoModelForCausalLM
tag = sys.argv[1] if len(sys.argv) > 1 else "qwen05-shape-std0.02"
which = [int(i) for i in sys.argv[2].split(",")] if len(sys.argv) > 2 else [2, 3]
r = json.load(open(f"/work/cache-small37/real/agree-{tag}.json"))
name = f"{tag}-Q8_0.gguf"
print("#", name)
m = AutoModelForCausalLM.from_pretrained("/work/cache-small37/real", gguf_file=name, torch_dtype=torch.float32).eval()
torch.set_num_threads(1)
for i in which:
    p = r["prompts"][i]; hf, wi, ll = r["hf"][i], r["Q8_0"]["wicore"][i], r["Q8_0"]["llama.cpp"][i]
    k = next(j for j in range(32) if wi[j] != hf[j])  # WiCore's first departure
    ids = torch.tensor([p + hf[:k]])
    with torch.no_grad(): logits = m(ids).logits[0, -1]
    top = torch.topk(logits, 5)
    print(f"prompt {i}: WiCore departs at token {k}: HF {hf[k]} WiCore {wi[k]} llama.cpp {ll[k]}; dequantized-HF logits: "
          f"HF's {logits[hf[k]].item():.4f} WiCore's {logits[wi[k]].item():.4f} llama.cpp's {logits[ll[k]].item():.4f}; top5 {top.indices.tolist()} {[round(v, 4) for v in top.values.tolist()]}")
    # and the deq-HF greedy continuation's agreement
    with torch.no_grad():
        g = m.generate(torch.tensor([p]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(p):].tolist()
    agree = lambda a, b: next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), 32)
    print(f"   dequantized-HF greedy agrees with HF {agree(g, hf)}, WiCore {agree(g, wi)}, llama.cpp {agree(g, ll)}")
