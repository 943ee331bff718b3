"""A mixture-of-experts MLP in standard ONNX ops that runs each expert on its own tokens only.

Every token goes to the top k of E experts (wicore.model.families: the router; the config: E, k,
renormalised or not). Computing every expert for every token, the simple graph, costs E / k times
the MLP's arithmetic (16x for Qwen3-30B-A3B's 128 / 8); this one gathers each expert's tokens,
runs the expert on those rows, and puts the results back in one permutation:

    x [b, s, H] ─► rows [N, H] ─► router ─► softmax ─► TopK ─► (renormalise) ─► p, e  [N, k]
                                                   flattened into N * k assignments, token n * k + j
    for each expert:  its assignments a = NonZero(e == expert)
                      y_a = expert(rows[a // k])          [M_expert, H]   (M = 0: empty MatMuls)
    concat over experts: y [N * k, H] in expert order, positions a in the same order
    y[inverse(a)] * p ─► [N, k, H] ─► sum over k ─► [b, s, H]

The node count grows with E (about 15 a layer an expert: ~1,900 a layer at E = 128), so a
session of a 128-expert model has ~10^5 nodes; each runs even for an expert no token chose.
Routing is computed in float32 (HF: softmax in float32); the experts run in the model dtype
through the builder's own `linear` (so `--weight-bits` quantizes them like dense weights, or `--expert-bits`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import TensorProto

from wicore.graph.clamped_swiglu import clamped_swiglu_expert
from wicore.graph.ops import MS_DOMAIN, Graph
from wicore.graph.quant import QuantLinear, pack_codes
from wicore.model.weights import LayerWeights

if TYPE_CHECKING:
    from wicore.graph.decoder import DecoderBuilder


def moe(b: DecoderBuilder, g: Graph, layer: LayerWeights, x: str) -> str:
    """The layer's experts on x [batch, seq, hidden] (of the activation type); the same shape back:
    one com.microsoft.MoE node where the builder's `expert_kernel` is "ort-moe" (QMoE where the
    experts' blocks fit it, `qmoe_fits`), else the routed graph."""
    cfg = b.cfg
    if b.expert_kernel == "ort-moe" and (
        b.quant is None or qmoe_fits(b.quant.for_experts(), expert_weights(layer, cfg.num_experts))
    ):
        return ort_moe(b, g, layer, x)
    p = f"/model/layers.{layer.index}/moe"
    k, h = cfg.num_experts_per_tok, cfg.hidden_size
    f32 = TensorProto.FLOAT
    rows = g.op("Reshape", [x, g.const([-1, h])], f"{p}/rows")  # [N, H]
    # the router in float weights in every flavour: a quantized one flips experts, not just logits
    logits = b.linear(g, rows, [layer["mlp.router"]], f"{p}/router", float_weights=True)
    if b.act_type != f32:
        logits = g.op("Cast", [logits], f"{p}/router/Cast_f32", to=f32)
    if b.family.moe_bias:
        logits = g.op("Add", [logits, g.const(layer["mlp.router.bias"].astype(np.float32), np.float32)], f"{p}/router/bias")
    probs = g.op("Softmax", [logits], f"{p}/router/Softmax", axis=-1)
    top_p, top_e = g.op_multi("TopK", [probs, g.const([k])], f"{p}/router/TopK", 2, axis=-1, largest=1, sorted=1)
    if cfg.norm_topk_prob:
        total = g.op("ReduceSum", [top_p, g.const([-1])], f"{p}/router/top_sum", keepdims=1)
        top_p = g.op("Div", [top_p, total], f"{p}/router/renormalise")
    if b.act_type != f32:
        top_p = g.op("Cast", [top_p], f"{p}/router/Cast_act", to=b.act_type)
    experts = g.op("Reshape", [top_e, g.const([-1])], f"{p}/assigned_experts")  # [N * k]
    weights = g.op("Reshape", [top_p, g.const([-1, 1])], f"{p}/assigned_weights")  # [N * k, 1]
    n_k = g.op("Shape", [experts], f"{p}/num_assignments")
    assignments = g.op("Range", [g.const(0), g.op("Squeeze", [n_k, g.const([0])], f"{p}/n_k"), g.const(1)], f"{p}/range")
    token_of = g.op("Div", [assignments, g.const(k)], f"{p}/token_of")  # [N * k]

    positions: list[str] = []
    with quantized_as_experts(b):
        outputs = [routed_expert(b, g, layer, rows, token_of, experts, e, p, positions) for e in range(cfg.num_experts)]
    order = g.op("Concat", positions, f"{p}/expert_order", axis=0)  # [N * k]: assignment of each row of y
    y = g.op("Concat", outputs, f"{p}/expert_outputs", axis=0)  # [N * k, H]
    inverse = g.op("ScatterElements", [assignments, order, assignments], f"{p}/inverse_order", axis=0)
    y = g.op("Gather", [y, inverse], f"{p}/assignment_outputs", axis=0)  # back in assignment order
    y = g.op("Mul", [y, weights], f"{p}/weighted")
    y = g.op("Reshape", [y, g.const([-1, k, h])], f"{p}/per_token")
    y = g.op("ReduceSum", [y, g.const([1])], f"{p}/sum", keepdims=0)  # [N, H]
    y = with_shared_expert(b, g, layer, rows, y, p)
    shape = g.op("Shape", [x], f"{p}/shape")
    return g.op("Reshape", [y, shape], f"{p}/out")


@contextmanager
def quantized_as_experts(b: DecoderBuilder) -> Iterator[None]:
    """The builder's linear layers in the experts' encoding (QuantLinear.for_experts) while it builds them."""
    dense = b.quant
    b.quant = None if dense is None else dense.for_experts()
    try:
        yield
    finally:
        b.quant = dense


def routed_expert(
    b: DecoderBuilder, g: Graph, layer: LayerWeights, rows: str, token_of: str, experts: str, e: int, p: str, positions: list[str]
) -> str:
    """Expert e on the rows assigned to it, [M, H]; its assignments' positions appended to `positions`."""
    q = f"{p}/experts.{e}"
    hits = g.op("NonZero", [g.op("Equal", [experts, g.const(e)], f"{q}/Equal")], f"{q}/NonZero")
    mine = g.op("Reshape", [hits, g.const([-1])], f"{q}/assignments")  # [M]
    positions.append(mine)
    tokens = g.op("Gather", [token_of, mine], f"{q}/tokens", axis=0)
    xe = g.op("Gather", [rows, tokens], f"{q}/rows", axis=0)  # [M, H]
    if b.family.clamped_swiglu:
        return clamped_swiglu_expert(b, g, xe, layer, f"mlp.experts.{e}.", q)
    w = [layer[f"mlp.experts.{e}.{n}"] for n in ("gate_proj", "up_proj", "down_proj")]
    return b.gated_mlp(g, xe, w[0], w[1], b.residual_scaled(w[2]), q)


def with_shared_expert(b: DecoderBuilder, g: Graph, layer: LayerWeights, rows: str, y: str, p: str) -> str:
    """y + sigmoid(rows @ gateᵀ) * shared_expert(rows), where the family has a shared expert (Qwen2-MoE);
    rows and y [N, H] of the activation type."""
    if not b.family.shared_expert:
        return y
    q = f"{p}/shared_expert"
    down = b.residual_scaled(layer["mlp.shared_expert.down_proj"])
    shared = b.gated_mlp(g, rows, layer["mlp.shared_expert.gate_proj"], layer["mlp.shared_expert.up_proj"], down, q)
    gate = b.linear(g, rows, [layer["mlp.shared_expert_gate"]], f"{q}_gate", float_weights=True)  # [N, 1]
    shared = g.op("Mul", [g.op("Sigmoid", [gate], f"{q}_gate/Sigmoid"), shared], f"{q}/gated")
    return g.op("Add", [y, shared], f"{p}/add_shared")


def ort_moe(b: DecoderBuilder, g: Graph, layer: LayerWeights, x: str) -> str:
    """ONNX Runtime's MoE kernel (CPU and CUDA): the router's logits in, softmax, top-k and the
    renormalisation inside, every expert's gate / up rows interleaved in one fc1 [E, 2 * W, H]
    (swiglu_fusion=1, the one layout both EPs take), down as fc2 [E, H, W], SwiGLU with alpha 1,
    beta 0 and no clamp: silu(gate) * up. With the builder's `quant` (ort-quant): QMoE (`qmoe`)."""
    cfg = b.cfg
    p = f"/model/layers.{layer.index}/moe"
    h, w = cfg.hidden_size, cfg.moe_intermediate_size
    rows = g.op("Reshape", [x, g.const([-1, h])], f"{p}/rows")
    if b.act_type != b.onnx_dtype:
        rows = g.op("Cast", [rows], f"{p}/Cast_in", to=b.onnx_dtype)
    logits = g.op("MatMul", [rows, g.weight(f"{p}/router.weight", layer["mlp.router"].T.astype(b.np_dtype))], f"{p}/router")
    if b.family.moe_bias:
        logits = g.op("Add", [logits, g.const(layer["mlp.router.bias"].astype(b.np_dtype), b.np_dtype)], f"{p}/router/bias")

    def gate_up(e: int) -> np.ndarray:  # rows g0, u0, g1, u1, ...
        return np.stack([layer[f"mlp.experts.{e}.gate_proj"], layer[f"mlp.experts.{e}.up_proj"]], axis=1).reshape(2 * w, h)

    def down(e: int) -> np.ndarray:
        return b.residual_scaled(layer[f"mlp.experts.{e}.down_proj"])

    attrs: dict[str, Any] = dict(
        k=cfg.num_experts_per_tok,
        activation_type="swiglu",
        swiglu_fusion=1,
        activation_alpha=1.0,
        activation_beta=0.0,
        normalize_routing_weights=int(cfg.norm_topk_prob),
    )
    if b.family.clamped_swiglu:  # gpt-oss: (clamp(up) + 1) * g * sigmoid(alpha g), g = min(gate, limit)
        attrs.update(activation_alpha=cfg.swiglu_alpha, activation_beta=1.0, swiglu_limit=cfg.swiglu_limit)
    experts = range(cfg.num_experts)
    biases = ["", ""]  # fc1 [E, 2W] interleaved as its rows, fc2 [E, H]
    if b.family.moe_bias:
        down_bias = [b.residual_scaled(layer[f"mlp.experts.{e}.down_proj.bias"]) for e in experts]
        biases = [
            g.weight(f"{p}/fc1.bias", np.stack([expert_biases(layer, e) for e in experts]).astype(b.np_dtype)),
            g.weight(f"{p}/fc2.bias", np.stack(down_bias).astype(b.np_dtype)),
        ]
    if b.quant is None:
        fc1 = g.weight(f"{p}/fc1.weight", lambda: np.stack([gate_up(e) for e in experts]).astype(b.np_dtype))
        fc2 = g.weight(f"{p}/fc2.weight", lambda: np.stack([down(e) for e in experts]).astype(b.np_dtype))
        y = g.op("MoE", [rows, logits, fc1, biases[0], fc2, biases[1]], f"{p}/MoE", domain=MS_DOMAIN, **attrs)
    else:
        fc1s, fc2s = [gate_up(e) for e in experts], [down(e) for e in experts]
        # ONNX Runtime's CPU QMoE renormalises the top k whatever normalize_routing_weights says
        # (1.32; its MoE keeps the attribute): ask for it, and scale by the top k's mass where the family does not
        y = qmoe(b, g, b.quant.for_experts(), [rows, logits], fc1s, fc2s, p, {**attrs, "normalize_routing_weights": 1}, biases)
        if not cfg.norm_topk_prob:
            y = g.op("Mul", [y, top_k_mass(b, g, logits, p)], f"{p}/unnormalised")
    if b.act_type != b.onnx_dtype:
        y = g.op("Cast", [y], f"{p}/Cast_out", to=b.act_type)
        rows = g.op("Reshape", [x, g.const([-1, h])], f"{p}/rows_act")
    y = with_shared_expert(b, g, layer, rows, y, p)
    return g.op("Reshape", [y, g.op("Shape", [x], f"{p}/shape")], f"{p}/out")


def top_k_mass(b: DecoderBuilder, g: Graph, logits: str, p: str) -> str:
    """[N, 1] (model dtype): the sum of each row's top k router probabilities (softmax in float32)."""
    f32 = TensorProto.FLOAT
    if b.onnx_dtype != f32:
        logits = g.op("Cast", [logits], f"{p}/router/Cast_f32", to=f32)
    probs = g.op("Softmax", [logits], f"{p}/router/Softmax", axis=-1)
    top_p, _ = g.op_multi("TopK", [probs, g.const([b.cfg.num_experts_per_tok])], f"{p}/router/TopK", 2, axis=-1)
    mass = g.op("ReduceSum", [top_p, g.const([-1])], f"{p}/router/top_mass", keepdims=1)
    return mass if b.onnx_dtype == f32 else g.op("Cast", [mass], f"{p}/router/Cast_mass", to=b.onnx_dtype)


def expert_weights(layer: LayerWeights, num_experts: int) -> list[np.ndarray]:
    """Every expert's gate, up and down weights."""
    return [layer[f"mlp.experts.{e}.{n}"] for e in range(num_experts) for n in ("gate_proj", "up_proj", "down_proj")]


def qmoe_fits(quant: QuantLinear, weights: list[np.ndarray]) -> bool:
    """Whether QMoE runs these expert weights without loss: float weights of whole blocks (the builder
    quantizes them alike), or source blocks (a GGUF's) of one bit width, symmetric, in blocks of the builder's size.
    A GGUF's Q4_K (an offset a block) or Q4_K_M's mix of Q4_K and Q6_K does not: such experts run
    in the routed graph, each projection a MatMulNBits on its own blocks (graph/quant.py)."""
    if not quant.can_quantize(weights):
        return False  # rows of no whole blocks stay float: in the routed graph
    blocks = [getattr(w, "blocks", None) for w in weights]
    if all(q is None for q in blocks):
        return True
    widths = {quant.weight_bits if q is None else q.bits for q in blocks}
    return len(widths) == 1 and all(q is None or (q.offsets is None and q.block_size == quant.block_size) for q in blocks)


def expert_biases(layer: LayerWeights, e: int) -> np.ndarray:
    """Expert e's fc1 bias [2W]: gate and up biases interleaved as fc1's rows."""
    p = f"mlp.experts.{e}."
    return np.stack([layer[p + "gate_proj.bias"], layer[p + "up_proj.bias"]], axis=1).reshape(-1)


def qmoe(
    b: DecoderBuilder,
    g: Graph,
    quant: QuantLinear,
    inputs: list[str],
    fc1: list[np.ndarray],
    fc2: list[np.ndarray],
    p: str,
    attrs: dict[str, Any],
    biases: list[str] | None = None,
) -> str:
    """com.microsoft.QMoE over the experts' fc1 / fc2 [out, in] weights in the builder's quantized
    blocks: MatMulNBits' codes and scales, stacked by expert (weights_prepacked=0: codes
    [E, N, K * bits / 8], scales [E, N, K / block], zero point 2 ** (bits - 1) as MatMulNBits');
    `biases`: fc1's and fc2's bias inputs ("" none); `quant`: the experts' encoding."""
    blocks = {"fc1": [quant.blocks([w]) for w in fc1], "fc2": [quant.blocks([w]) for w in fc2]}
    every = blocks["fc1"] + blocks["fc2"]
    bits = {q.bits for q in every}
    if len(bits) != 1 or any(q.offsets is not None for q in every):
        raise ValueError("QMoE needs one bit width and symmetric blocks for every expert")
    inputs = list(inputs)
    for (fc, quantized), bias in zip(blocks.items(), biases or ["", ""], strict=True):
        codes = np.stack([pack_codes(q).reshape(q.shape[0], -1) for q in quantized])
        scales = np.stack([q.scales for q in quantized]).astype(b.np_dtype)
        inputs += [g.weight(f"{p}/{fc}.qweight", codes), g.weight(f"{p}/{fc}.scales", scales), bias]
    while inputs[-1] == "":  # no trailing empty inputs
        inputs.pop()
    return g.op(
        "QMoE",
        inputs,
        f"{p}/QMoE",
        domain=MS_DOMAIN,
        expert_weight_bits=bits.pop(),
        block_size=quant.block_size,
        weights_prepacked=0,
        accuracy_level=quant.accuracy_level,
        **attrs,
    )
