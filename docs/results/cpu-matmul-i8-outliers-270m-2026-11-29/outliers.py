import torch, transformers, numpy as np, json
torch.set_num_threads(1)
d = "/work/cache-int/exports-fe9c5606b763/hf-gemma3-270m-transformers-5.24.0"
cfg = transformers.AutoConfig.from_pretrained(d)
m = transformers.AutoModelForCausalLM.from_config(cfg).eval()
sd = torch.load(f"{d}/state_dict.pt", map_location="cpu")
print(m.load_state_dict(sd, strict=False))
ids = torch.randint(1000, 200000, (1, 200), generator=torch.Generator().manual_seed(0))
stats = {}
def hook(name):
    def f(mod, inp):
        stats[name] = inp[0].detach().reshape(-1, inp[0].shape[-1]).float()
    return f
for i, layer in enumerate(m.model.layers):
    layer.self_attn.q_proj.register_forward_pre_hook(hook(f"{i}.qkv"))
    layer.self_attn.o_proj.register_forward_pre_hook(hook(f"{i}.o"))
    layer.mlp.gate_proj.register_forward_pre_hook(hook(f"{i}.gateup"))
    layer.mlp.down_proj.register_forward_pre_hook(hook(f"{i}.down"))
with torch.no_grad():
    m(ids)
def q_err(x):
    s = x.abs().amax(1, keepdim=True) / 127
    q = torch.round(x / s) * s
    return ((q - x).norm() / x.norm()).item()
res = {}
for i, layer in enumerate(m.model.layers):
    for kind, normw in (("qkv", layer.input_layernorm.weight), ("gateup", layer.pre_feedforward_layernorm.weight), ("o", None), ("down", None)):
        x = stats[f"{i}.{kind}"]
        line = [q_err(x), (x.abs().amax(1) / x.pow(2).mean(1).sqrt()).median().item()]
        if normw is not None:
            g = (1 + normw.detach().float()).abs() + 1e-6
            line += [q_err(x / g), q_err(x / g.sqrt()), g.max().item()]
        res.setdefault(kind, []).append(line)
for kind, rows in res.items():
    a = np.array(rows, dtype=float)
    print(kind, "cols: int8 rel err, max/rms, [err w/o norm weight, err half-migrated, max g]; median:", np.round(np.median(a, 0), 4), "max:", np.round(a.max(0), 4))
