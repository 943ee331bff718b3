"""Ad-hoc prototype (issue 37, 2026-11-29, not in the tree): the CPU graph's full-attention layers on
wicore.BlockAttentionQKV (split, RoPE from fixed caches and the K/V write inside the op, as the paged graphs'
fused layers), in place of Split, two RotaryEmbeddings, two Reshapes, two ScatterNDs and BlockAttention; the
shared prologue's index and RoPE-table nodes then feed nothing and are dropped. usage: proto_export.py GGUF OUT"""
import sys
import numpy as np
from onnx import TensorProto
import wicore.graph.attention as A
import wicore.graph.decoder as D
import wicore.graph.fused_residual as F
import wicore.graph.skip_norm as S
from wicore.graph import io
from wicore.graph.paged_attention import rope_caches
from wicore.kernels.library import DOMAIN
from wicore.model.families import ALL_HEADS, PER_HEAD
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
orig = A.layer_attention

def fused(b, g, layer, x, shared, masses):
    cfg, i = b.cfg, layer.index
    rope = cfg.rope_global
    if not (b.cpu_attention and shared.paged is None and not cfg.is_sliding(i) and b.family.qk_norm != ALL_HEADS
            and not rope.is_longrope and masses is None):
        return orig(b, g, layer, x, shared, masses)
    p = f"/model/layers.{i}/attn"
    scale = cfg.query_pre_attn_scalar**-0.5
    qkv = b.linear(g, x, [layer["self_attn.q_proj"], layer["self_attn.k_proj"], layer["self_attn.v_proj"]], f"{p}/qkv_proj")
    if b.family.qkv_bias:
        bias = np.concatenate([layer[f"self_attn.{n}_proj.bias"] for n in "qkv"]).astype(np.float32)
        qkv = g.op("Add", [qkv, g.const(bias, np.float32)], f"{p}/qkv_bias")
    weights, op_scale = ["", ""], scale
    if b.family.qk_norm == PER_HEAD:
        q_w, k_w = b.norm_weight(layer["self_attn.q_norm"], scale), b.norm_weight(layer["self_attn.k_norm"])
        weights = [g.const(w.astype(np.float32), np.float32) for w in (q_w, k_w)]
        op_scale = 1.0
    if not any(v.name == io.PAST_SEQLENS for v in g.inputs):
        g.input(io.PAST_SEQLENS, TensorProto.INT32, ["batch"])
    cos, sin = rope_caches(g, cfg, rope, "/model/shared/rope_global_cache", np.float32)
    out, _, _ = g.op_multi(
        "BlockAttentionQKV",
        [qkv, io.key_cache(i), io.value_cache(i), io.BLOCK_TABLES, io.POSITIONS, io.SLOT_MAPPING, io.PAST_SEQLENS, cos, sin, *weights],
        f"{p}/BlockAttentionQKV", 3, outs=[None, io.key_cache_out(i), io.value_cache_out(i)], domain=DOMAIN,
        num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, window=int(cfg.window_all_layers or 0),
        softcap=float(cfg.attn_logit_softcapping or 0.0), scale=float(op_scale), epsilon=float(cfg.rms_norm_eps))
    return A.o_proj(b, g, layer, out, p)

for m in (A, D, F, S):
    m.layer_attention = fused
gguf, out = sys.argv[1], sys.argv[2]
export_model(open_source(gguf), out, ExportConfig(op_flavour="ort-quant", kernels="wicore", overwrite=True), progress=lambda _: None)
