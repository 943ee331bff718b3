"""A decoder layer whose residual adds ride in the next norm: com.microsoft.SkipSimplifiedLayerNormalization
(CPU and CUDA kernels), in the ort-quant flavour, for families with pre-norms.

With ONNX Runtime's standard ops (graph/decoder.py, decoder_layer) each block's output is added to
the stream by an Add, and the next norm reads the sum:

    x ──► norm ► attention (► post-norm) ─(+)─► norm ► MLP (► post-norm) ─(+)─► x'

here one kernel adds and normalizes, and gives the sum back; the MLP's output is left pending
into the next layer's first norm (a partition's last layer adds it with an Add):

    (x, pending) ► Skip norm ► attention (► post-norm) ► Skip norm ► MLP (► post-norm) ─► (x', pending')
                   └ x + pending ┘                      └ x + attention ┘

Two nodes a layer fewer (2 of SmolLM2-135M's ~52 after ONNX Runtime's own fusions); the sum and the
norm are computed as the Add and the norm compute them, in float32.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from wicore.graph.attention import layer_attention
from wicore.graph.ops import MS_DOMAIN, Graph
from wicore.graph.shared_values import SharedValues
from wicore.model.weights import LayerWeights

if TYPE_CHECKING:
    from wicore.graph.decoder import DecoderBuilder


def skip_rms_norm(g: Graph, x: str, h: str, weight: np.ndarray, epsilon: float, name: str) -> tuple[str, str]:
    """(rms_norm(x + h) * weight, x + h), float32 [b, s, hidden]; `weight` the norm's effective weight."""
    w = g.const(weight.astype(np.float32), np.float32)
    outputs = [f"{name}/output_0", f"{name}/input_skip_sum"]
    node = g.op_multi("SkipSimplifiedLayerNormalization", [h, x, w], name, 4, outs=outputs, domain=MS_DOMAIN, epsilon=epsilon)
    return node[0], node[3]


def skip_norm_layer(
    b: DecoderBuilder,
    g: Graph,
    layer: LayerWeights,
    x: str,
    pending: str | None,
    shared: SharedValues,
    masses: list[str] | None,
) -> tuple[str, str]:
    """One layer: (x, the previous layer's MLP output not yet added, or None) -> (x', this layer's
    MLP output, pending)."""
    p = f"/model/layers.{layer.index}"
    eps = b.cfg.rms_norm_eps
    post = b.family.post_norms
    if pending is None:
        h = b.rms_norm(g, x, layer["input_layernorm"], f"{p}/input_layernorm")
    else:
        w = b.norm_weight(layer["input_layernorm"])
        h, x = skip_rms_norm(g, x, pending, w, eps, f"{p}/input_layernorm/SkipSimplifiedLayerNormalization")
    h = layer_attention(b, g, layer, h, shared, masses)
    if post:
        h = b.rms_norm(g, h, layer["post_attention_layernorm"], f"{p}/post_attention_layernorm")
    w = b.norm_weight(layer["pre_feedforward_layernorm"])
    h, x = skip_rms_norm(g, x, h, w, eps, f"{p}/pre_feedforward_layernorm/SkipSimplifiedLayerNormalization")
    h = b.mlp(g, layer, h)
    if post:
        h = b.rms_norm(g, h, layer["post_feedforward_layernorm"], f"{p}/post_feedforward_layernorm")
    return x, h
