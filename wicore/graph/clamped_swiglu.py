"""gpt-oss's experts: biased projections around a clamped SwiGLU, as transformers' GptOssExperts:

    gate, up = x @ gateᵀ + b_gate, x @ upᵀ + b_up
    gate = min(gate, limit);  up = clip(up, -limit, limit)
    y = ((up + 1) * gate * sigmoid(alpha * gate)) @ downᵀ + b_down

(alpha 1.702 and limit 7.0 in the released models; the config's `swiglu_alpha`, `swiglu_limit`.)
ONNX Runtime's MoE / QMoE compute the same with activation_type swiglu, activation_alpha alpha,
activation_beta 1 (the + 1) and swiglu_limit (wicore.graph.moe.ort_moe).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from onnx import helper

from wicore.graph.ops import Graph
from wicore.model.weights import LayerWeights

if TYPE_CHECKING:
    from wicore.graph.decoder import DecoderBuilder


def clamped_swiglu_expert(b: DecoderBuilder, g: Graph, x: str, layer: LayerWeights, prefix: str, name: str) -> str:
    """The expert whose tensors are `{prefix}gate_proj`, `up_proj`, `down_proj` (and their `.bias`)
    on rows x [M, H] of the activation type; [M, H] back."""
    cfg = b.cfg
    act_type = helper.tensor_dtype_to_np_dtype(b.act_type)
    gate_w, up_w, down_w = (layer[f"{prefix}{n}"] for n in ("gate_proj", "up_proj", "down_proj"))
    width = gate_w.shape[0]
    gate_up = b.linear(g, x, [gate_w, up_w], f"{name}/gate_up_proj")
    bias = np.concatenate([layer[f"{prefix}gate_proj.bias"], layer[f"{prefix}up_proj.bias"]])
    gate_up = g.op("Add", [gate_up, g.const(bias.astype(act_type), act_type)], f"{name}/gate_up_bias")
    gate, up = g.op_multi("Split", [gate_up, g.const([width, width])], f"{name}/gate_up_split", 2, axis=-1)
    limit = g.const(np.asarray(cfg.swiglu_limit, act_type), act_type)
    gate = g.op("Min", [gate, limit], f"{name}/gate_clamp")
    low = g.const(np.asarray(-cfg.swiglu_limit, act_type), act_type)
    up = g.op("Max", [g.op("Min", [up, limit], f"{name}/up_clamp_max"), low], f"{name}/up_clamp")
    alpha = g.const(np.asarray(cfg.swiglu_alpha, act_type), act_type)
    glu = g.op(
        "Mul", [gate, g.op("Sigmoid", [g.op("Mul", [gate, alpha], f"{name}/alpha_gate")], f"{name}/Sigmoid")], f"{name}/glu"
    )
    up_1 = g.op("Add", [up, g.const(np.asarray(1.0, act_type), act_type)], f"{name}/up_plus_1")
    y = b.linear(g, g.op("Mul", [up_1, glu], f"{name}/gate_mul"), [b.residual_scaled(down_w)], f"{name}/down_proj")
    down_bias = b.residual_scaled(layer[f"{prefix}down_proj.bias"])
    return g.op("Add", [y, g.const(down_bias.astype(act_type), act_type)], f"{name}/down_bias")
