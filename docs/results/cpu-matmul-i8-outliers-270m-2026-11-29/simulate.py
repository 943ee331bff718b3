"""Simulated MatMulI8 numerics on the real Gemma 3 270M (HF float32 on its GGUF's dequantized weights): every linear
layer's weight rounded to int8 a channel, its input rounded to int8 a row (all prompt rows > 16), with variants;
argmax agreement with plain float32 over a 200-token random prompt."""
import sys
import torch, transformers
torch.set_num_threads(2)
d = "/work/cache-int/exports-fe9c5606b763/hf-gemma3-270m-transformers-5.24.0"
cfg = transformers.AutoConfig.from_pretrained(d)
m = transformers.AutoModelForCausalLM.from_config(cfg).eval()
m.load_state_dict(torch.load(f"{d}/state_dict.pt", map_location="cpu"), strict=False)
m.lm_head.weight = torch.nn.Parameter(m.lm_head.weight.detach().clone())  # untied: the embedding stays float
from wicore.inputs.tokenizer import Tokenizer
from wicore.graph.manifest import Manifest
from wicore.model.tokenizer_info import TokenizerInfo
folder = "/work/cache-int/exports-d18bc3853e6a/gemma3-270m-p1"
tok = Tokenizer(folder, TokenizerInfo.from_dict(Manifest.read(folder).tokenizer))
TEXT = open(sys.argv[1]).read()
ids = torch.tensor([tok.encode(TEXT)[:200]])
print("prompt tokens", ids.shape[1])
with torch.no_grad():
    ref = m(ids).logits[0].argmax(-1)
orig = {n: mod.weight.detach().clone() for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear)}

def q_rows(x, passes):
    s = x.abs().amax(-1, keepdim=True) / 127
    s = torch.where(s > 0, s, torch.ones_like(s))
    q = torch.round(x / s).clamp(-127, 127) * s
    if passes == 2:  # the residual pass: r = x - q, rounded with s / 254
        s2 = s / 254
        q = q + torch.round((x - q) / s2).clamp(-127, 127) * s2
    return q

def run(act_passes):  # act_passes: name -> 0 (float x), 1 (int8 x), 2 (int8 x + residual pass)
    hooks = []
    for n, mod in m.named_modules():
        if isinstance(mod, torch.nn.Linear):
            w = orig[n]
            s = w.abs().amax(1, keepdim=True) / 127
            mod.weight.data = torch.round(w / s).clamp(-127, 127) * s
            kind = n.split(".")[-1]
            p = act_passes(kind)
            if p:
                hooks.append(mod.register_forward_pre_hook(lambda mod, inp, p=p: (q_rows(inp[0], p),)))
    with torch.no_grad():
        out = m(ids).logits[0].argmax(-1)
    for h in hooks:
        h.remove()
    for n, mod in m.named_modules():
        if isinstance(mod, torch.nn.Linear):
            mod.weight.data = orig[n].clone()
    return int((out == ref).sum())

variants = {
    "weight-only (float x)": lambda k: 0,
    "int8 x on the layers, the head weight-only": lambda k: 0 if k == "lm_head" else 1,
    "int8 x on the layers and the head (MatMulI8 as built)": lambda k: 1,
    "as the layers-only row, down_proj with the residual pass": lambda k: 0 if k == "lm_head" else (2 if k == "down_proj" else 1),
    "the residual pass on every layer, the head weight-only": lambda k: 0 if k == "lm_head" else 2,
}
for name, f in variants.items():
    print(f"{name}: {run(f)} / 200 argmax as float32's", flush=True)
