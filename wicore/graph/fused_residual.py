"""The residual stream on WiCore's own kernels (wicore/kernels, domain "wicore"): a block's output
is added to the stream by the next norm's kernel, which also returns the sum.

A layer with ONNX Runtime's ops (Gemma's sandwich norms; other families add h without a post-norm):

    x ──────────────────────────────(+)──────────────────────────────(+)──► x'
    └► norm ► attention ► post-norm ─┘└► norm ► MLP(gate|up ► Split ► act ► Mul) ► post-norm ─┘

on these kernels, the MLP's output left pending into the next layer's first norm:

    (x, pending) ► NormAddRMSNorm ► attention ► NormAddRMSNorm ► MLP(gate|up ► GeGLU) ─► (x', pending')
                   └ x + post-norm(pending) ┘   └ x + post-norm(attention) ┘

Per layer 2 norm kernels instead of 4 norms and 2 adds, and one activation kernel instead of a
Split, an activation and a Mul. A partition's first layer has nothing pending (its plain first
norm); its last settles the pending output with ONNX Runtime's ops (`settle`). The kernels take
the block's float16 output, the float32 stream and the weights in the ops' types (csrc/kernels.h).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from wicore.graph.attention import layer_attention
from wicore.graph.ops import Graph
from wicore.graph.shared_values import SharedValues
from wicore.kernels.library import DOMAIN
from wicore.model.weights import LayerWeights

if TYPE_CHECKING:
    from wicore.graph.decoder import DecoderBuilder


@dataclass(frozen=True)
class Pending:
    """A block's output not yet added to the residual stream."""

    h: str  # float16 [b, s, hidden]
    post_norm: np.ndarray | None  # its post-norm's effective weight (sandwich families), float64 [hidden]
    name: str  # the block's node prefix


def add_rms_norm(g: Graph, x: str, pending: Pending, weight: np.ndarray, epsilon: float, name: str) -> tuple[str, str]:
    """(rms_norm(x + pending) * weight in float16, the sum in float32); `weight` is the norm's
    effective weight (float64), stored in float16 as the standard graph's norm stores it."""
    w = g.const(weight.astype(np.float16), np.float16)
    if pending.post_norm is None:
        inputs, op = [x, pending.h, w], "AddRMSNorm"
    else:
        inputs, op = [x, pending.h, g.const(pending.post_norm.astype(np.float32), np.float32), w], "NormAddRMSNorm"
    y, total = g.op_multi(op, inputs, f"{name}/{op}", 2, domain=DOMAIN, epsilon=float(epsilon))
    return y, total


def gated_activation(g: Graph, gate_up: str, activation: str, name: str) -> str:
    """act(gate) * up of one [.., 2 * inter] float16 tensor (gate first): GeGLU (gelu_tanh) or SwiGLU (silu)."""
    op = {"gelu_tanh": "GeGLU", "silu": "SwiGLU"}[activation]
    return g.op(op, [gate_up], f"{name}/{op}", domain=DOMAIN)


def fused_layer(
    b: DecoderBuilder,
    g: Graph,
    layer: LayerWeights,
    x: str,
    pending: Pending | None,
    shared: SharedValues,
    masses: list[str] | None,
) -> tuple[str, Pending]:
    """DecoderBuilder.decoder_layer on these kernels: `pending` (the previous
    layer's MLP output) is added to x by this layer's first norm; its own MLP output is returned pending."""
    p = f"/model/layers.{layer.index}"
    sandwich = b.family.sandwich_norms
    if pending is None:
        h = b.rms_norm(g, x, layer["input_layernorm"], f"{p}/input_layernorm", to=b.act_type)
    else:
        h, x = add_rms_norm(g, x, pending, b.norm_weight(layer["input_layernorm"]), b.cfg.rms_norm_eps, f"{p}/input_layernorm")
    h = layer_attention(b, g, layer, h, shared, masses)
    attn = Pending(h, b.norm_weight(layer["post_attention_layernorm"]) if sandwich else None, f"{p}/attn")
    norm = b.norm_weight(layer["pre_feedforward_layernorm"])
    h, x = add_rms_norm(g, x, attn, norm, b.cfg.rms_norm_eps, f"{p}/pre_feedforward_layernorm")
    h = b.mlp(g, layer, h)
    return x, Pending(h, b.norm_weight(layer["post_feedforward_layernorm"]) if sandwich else None, f"{p}/mlp")


def settle(b: DecoderBuilder, g: Graph, x: str, pending: Pending, out: str | None = None) -> str:
    """x + the pending block's output (through its post-norm), on ONNX Runtime's ops: a partition's end."""
    if pending.post_norm is None:
        h = b.residual_type(g, pending.h, pending.name)
    else:
        w = g.const(pending.post_norm.astype(np.float32), np.float32)
        eps = b.cfg.rms_norm_eps
        h = g.op("SimplifiedLayerNormalization", [pending.h, w], f"{pending.name}/post_norm", axis=-1, epsilon=eps, stash_type=1)
    return g.op("Add", [x, h], f"{pending.name}/residual", out=out)
