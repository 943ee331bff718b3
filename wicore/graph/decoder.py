"""Decoder of every family in wicore.model.families as ONNX graphs over a paged KV pool (the `portable` flavour, opset 17;
with a QuantLinear, the `ort-quant` flavour: linear layers, LM head and embedding in graph/quant.py).

One partition holds layers [start, stop). The first also embeds the tokens,
the last also applies the final norm and the tied LM head to the rows in
`logits_indices`. Per layer:

    x ──► RMSNorm ─► QKV ─► q/k RMSNorm ─► RoPE ─► ScatterND k,v into pool (in place)
    │                                                   │
    │                        Gather(pool, block_tables) ◄┘
    │                        softmax(q·kᵀ + mask) · v ─► o_proj ─► RMSNorm ─┐
    ├◄──────────────────────────────────────────────────────────────────────┘ (+)
    x ──► RMSNorm ─► gate|up ─► gelu_tanh(gate) * up ─► down ─► RMSNorm ─┐
    └◄───────────────────────────────────────────────────────────────────┘ (+)

Conventions: the residual stream is float32 in both dtypes (Gemma's activations
overflow float16 there); with `fp16` the weights, the matmuls and the KV pools
are float16 (with `kv_cache_dtype` int8 the pools hold int8 groups with their
scales, graph/kv_quant.py, whatever the dtype). Between the residual's norms the activations are float32 in the
portable graphs (norms, RoPE and attention in float32, a Cast around each
MatMul) and float16 in the `paged` graphs, which run on CUDA only and are
written in ONNX Runtime's fused kernels: each norm one SimplifiedLayerNormalization
whose output type folds in the Cast, the q/k norms and RoPE in the paged
attention op's own prologue, GELU one FastGelu (at batch 1 a decode step is as
many kernels as nodes, and the 27B shape's ~60 small nodes a layer cost as much
as its weight reads).
Gemma's RMSNorm scales by (1 + w): the 1 is folded into the stored weight,
and the attention scale query_pre_attn_scalar^-0.5 into the q-norm weight.
What the other families do differently is one row of wicore.model.families each, read
here (norm offset, activation, embedding scale, sandwich norms, q/k norm, qkv bias, tied
head); images are Gemma 3's only. The attention block is graph/attention.py, the mixture-of-experts MLP graph/moe.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto

from wicore.errors import UnsupportedModelError
from wicore.graph import cpu_kernels, io, paged_block
from wicore.graph.attention import layer_attention, softcap
from wicore.graph.decoder_options import BuildOptions
from wicore.graph.fused_ops import fused_rms_norm
from wicore.graph.fused_residual import Pending, fused_layer, gated_activation, settle
from wicore.graph.kv_quant import kv_row_width
from wicore.graph.moe import moe
from wicore.graph.ops import MS_DOMAIN, DataFile, Graph, gelu_tanh, place_images, rms_norm_f32, silu
from wicore.graph.partition import PartitionSpec
from wicore.graph.quant import QuantLinear
from wicore.graph.shared_values import SharedValues, shared_values
from wicore.graph.skip_norm import skip_norm_layer
from wicore.model.config import DecoderConfig
from wicore.model.weights import LayerWeights, check_layer

OPSET = 17
ATTENTIONS = ("portable", "paged", "batch-invariant")
DTYPES: dict[str, tuple[type[np.floating[Any]], int]] = {
    "fp32": (np.float32, TensorProto.FLOAT),
    "fp16": (np.float16, TensorProto.FLOAT16),
}
DTYPES_BY_ONNX = {onnx_type: np_type for np_type, onnx_type in DTYPES.values()}
TABLE = "model.embed_tokens"  # the token embedding, also the tied LM head


class DecoderBuilder:
    """Builds the partitions of one model: its config and family row plus the graph functions."""

    def __init__(
        self,
        cfg: DecoderConfig,
        dtype: str,
        attention_stats: bool = False,
        quant: QuantLinear | None = None,
        attention: str = "portable",
        image_inputs: bool = False,
        kv_cache_dtype: str = "auto",
        expert_kernel: str = "auto",
        kernels: str = "ort",
        fused_ops: bool = False,
        block_attention: str = "off",
    ) -> None:
        """`quant` set: the `ort-quant` flavour, linear layers and LM head as MatMulNBits (graph/quant.py).
        `attention`: "portable" (standard ops), "paged" (com.microsoft.PagedAttention, fp16, CUDA) or
        "batch-invariant" (standard ops, a row's logits the same in any batch: graph/invariant_attention.py).
        `image_inputs`: the graphs take image embeddings and image spans (wicore.graph.io, "Images").
        `sampling_head`: the last partition also draws sampled rows (graph/sampling.py).
        `kv_cache_dtype`: "auto" (the graphs' dtype) or "int8" (graph/kv_quant.py; portable attention).
        `expert_kernel` (mixtures of experts, graph/moe.py): "graph" (standard ops; per-expert
        MatMulNBits with `quant`), "ort-moe" (com.microsoft.MoE; QMoE with `quant`) or "auto": ort-moe
        in the flavours that use contrib ops (ort-quant, paged), graph in the portable one.
        `kernels`: "ort" (ONNX Runtime's ops) or "wicore" (paged graphs: the residual adds, norms and
        gated activation on WiCore's own kernels, graph/fused_residual.py).
        `fused_ops`: the webgpu flavour's fused norms, RoPE and GELU and int32 index arithmetic (graph/fused_ops.py).
        `block_attention` (paged graphs): the layer kinds on WiCore's BlockAttention, "off", "sliding",
        "all" or "fused" (`auto`'s kinds, where the op's prologue fuses: graph/paged_block.py); "all" also
        builds the paged graphs in float32 (the CPU's kernel)."""
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: expected one of {sorted(DTYPES)}")
        if attention not in ATTENTIONS:
            raise ValueError(f"attention {attention!r}: expected one of {ATTENTIONS}")
        self.family = cfg.family_row
        options = BuildOptions(dtype, attention, block_attention, kernels, kv_cache_dtype, expert_kernel)
        self.expert_kernel = options.checked(self.family, quant is not None, attention_stats, image_inputs)
        self.block_kinds = paged_block.layer_kinds(block_attention)
        self.wicore_kernels = kernels == "wicore"
        self.image_inputs = image_inputs
        self.paged = attention == "paged"
        self.batch_invariant = attention == "batch-invariant"
        self.cfg = cfg
        if block_attention == paged_block.FUSED:  # auto: only where BlockAttentionQKV's own prologue serves
            self.block_kinds = paged_block.fused_kinds(self)
        self.dtype = dtype
        self.attention_stats = attention_stats
        self.quant = quant
        self.np_dtype, self.onnx_dtype = DTYPES[dtype]
        self.kv_int8 = kv_cache_dtype == "int8"
        self.kv_type = TensorProto.INT8 if self.kv_int8 else self.onnx_dtype  # the pools' element type
        # ort-quant and paged may use com.microsoft contrib ops (RotaryEmbedding, FastGelu): the EPs
        # that run those flavours (CPU and CUDA; CUDA) implement them; portable stays on standard ONNX.
        self.contrib = quant is not None or self.paged or fused_ops
        self.fused_ops = fused_ops and not self.paged
        # the webgpu flavour's paged graphs: the WebGPU EP's SimplifiedLayerNormalization takes one type
        self.webgpu_paged = fused_ops and self.paged
        if self.webgpu_paged and (cfg.attn_logit_softcapping or self.family.attention_sinks):
            raise UnsupportedModelError(
                f"the WebGPU EP's PagedAttention takes no attention soft-capping or sinks ({self.family.name} has them): "
                "export it with --op-flavour webgpu --attention portable"
            )
        # The activations' type between the residual's norms (module docstring).
        self.act_type = self.onnx_dtype if self.paged else TensorProto.FLOAT
        self.act_np_dtype = DTYPES_BY_ONNX[self.act_type]
        # ort-quant: each residual add in the next norm's kernel (graph/skip_norm.py)
        self.skip_norms = (quant is not None or fused_ops) and not self.paged and self.family.pre_norms
        # ort-quant with kernels "wicore" (MatMulQ): the attention on WiCore's CPU kernel too (graph/cpu_kernels.py)
        on_cpu_kernels = quant is not None and quant.kernels == "wicore" and attention == "portable" and not fused_ops
        self.cpu_attention = on_cpu_kernels and cpu_kernels.can_use(
            dtype, self.kv_int8, attention_stats, image_inputs, self.family.attention_sinks
        )
        self.cpu_greedy = on_cpu_kernels and dtype == "fp32"  # the greedy tokens on wicore.ArgMaxRows

    # -- entry point -----------------------------------------------------------------
    def build(
        self,
        spec: PartitionSpec,
        layers: Iterable[LayerWeights],
        data: DataFile,
        embedding: Callable[[], np.ndarray] | None = None,
        final_norm: np.ndarray | None = None,
        embedding_data: DataFile | None = None,
        lm_head: Callable[[], np.ndarray | None] | None = None,
    ) -> onnx.ModelProto:
        """One partition. `layers` yields the partition's layers in order (consumed lazily).
        `embedding` returns the [vocab, hidden] table, needed by the first and last partitions
        (tied LM head); with `embedding_data` both partitions share one copy on disk and it is
        loaded once. `lm_head` returns an untied head [vocab, hidden] (None: tied)."""
        cfg = self.cfg
        g = Graph(f"gemma3_part{spec.index}", data)
        f32 = TensorProto.FLOAT
        if spec.has_embedding:
            if embedding is None:
                raise ValueError(f"partition {spec.index} embeds the tokens: it needs `embedding`")
            tokens = g.input(io.INPUT_IDS, TensorProto.INT64, ["batch", "seq"])
            x = self.embed(g, tokens, embedding, embedding_data)
            if self.image_inputs:
                x = place_images(g, x, cfg.hidden_size)
        else:
            x = g.input(io.HIDDEN_STATES, f32, ["batch", "seq", cfg.hidden_size])
        shared = shared_values(
            g,
            cfg,
            spec.start,
            spec.stop,
            attention_stats=self.attention_stats,
            contrib=self.contrib,
            paged=self.paged,
            image_spans=self.image_inputs,
            index_int32=self.fused_ops or self.webgpu_paged,
            block_kinds=paged_block.prologue_kinds(self),
            dtype=self.onnx_dtype,
        )
        width = kv_row_width(cfg.head_dim, "int8" if self.kv_int8 else np.dtype(self.np_dtype).name)
        pool_shapes: dict[bool, list[int | str]] = {
            False: ["num_blocks", "block_size", cfg.num_kv_heads, width],
            True: ["num_window_blocks", "block_size", cfg.num_kv_heads, width],
        }
        masses: list[str] | None = [] if self.attention_stats else None
        pending: Pending | None = None  # WiCore's kernels: the last block's output, not yet added to x
        skip_pending: str | None = None  # skip norms: the last MLP output, not yet added to x
        for layer in layers:
            if not spec.start <= layer.index < spec.stop:
                raise ValueError(f"layer {layer.index} is outside partition {spec}")
            check_layer(cfg, layer)
            i = layer.index
            pool_shape = pool_shapes[cfg.is_sliding(i)]
            g.input(io.key_cache(i), self.kv_type, pool_shape)
            g.input(io.value_cache(i), self.kv_type, pool_shape)
            is_last = layer.index == spec.stop - 1 and not spec.has_lm_head
            if self.wicore_kernels:
                x, pending = fused_layer(self, g, layer, x, pending, shared, masses)
                if layer.index == spec.stop - 1:
                    x = settle(self, g, x, pending, out=io.HIDDEN_STATES_OUT if is_last else None)
            elif self.skip_norms:
                x, skip_pending = skip_norm_layer(self, g, layer, x, skip_pending, shared, masses)
                if layer.index == spec.stop - 1:
                    out = io.HIDDEN_STATES_OUT if is_last else None
                    x = g.op("Add", [x, skip_pending], f"/model/layers.{i}/mlp_residual", out=out)
            else:
                x = self.decoder_layer(g, layer, x, shared, masses, out=io.HIDDEN_STATES_OUT if is_last else None)
            g.output(io.key_cache_out(i), self.kv_type, pool_shape)
            g.output(io.value_cache_out(i), self.kv_type, pool_shape)
        if spec.has_lm_head:
            if final_norm is None:
                raise ValueError(f"partition {spec.index} has the LM head: it needs `final_norm`")
            g.input(io.LOGITS_INDICES, TensorProto.INT64, ["num_logits"])
            head = None if lm_head is None else lm_head()
            logits = self.lm_head(g, x, final_norm, embedding, embedding_data, head)
            g.output(io.LOGITS, f32, ["num_logits", cfg.vocab_size])
            if self.cpu_greedy:
                cpu_kernels.greedy_tokens(g, logits)
            else:
                g.op("ArgMax", [logits], "/model/greedy/ArgMax", out=io.GREEDY_TOKENS, axis=-1, keepdims=0)
            g.output(io.GREEDY_TOKENS, TensorProto.INT64, ["num_logits"])
        else:
            g.output(io.HIDDEN_STATES_OUT, f32, ["batch", "seq", cfg.hidden_size])
        if masses is not None:
            if not masses:  # no full layer here: shared_values gave this partition zeros_mass
                assert shared.zeros_mass is not None
                masses = [shared.zeros_mass]
            g.op("Sum", masses, "/model/attention_mass/Sum", out=io.ATTENTION_MASS)
            g.output(io.ATTENTION_MASS, f32, ["batch", "max_blocks"])
        return g.to_model(OPSET, doc=f"Gemma 3 layers [{spec.start}, {spec.stop}), {self.dtype}")

    # -- blocks ----------------------------------------------------------------------
    def embedding_weight(self, g: Graph, table: Callable[[], np.ndarray], data: DataFile | None) -> str:
        return g.weight("model.embed_tokens.weight", lambda: table().astype(self.np_dtype, copy=False), data)

    def embed(self, g: Graph, tokens: str, table: Callable[[], np.ndarray], data: DataFile | None) -> str:
        x = None
        if self.quant is not None:  # ort-quant: rows from the table's own 8-bit blocks, where it has them
            x = self.quant.gather(g, tokens, table(), "/model/embed_tokens", TABLE, self.np_dtype, data)
        if x is None:  # portable, or a table without 8-bit blocks: float rows
            x = g.op("Gather", [self.embedding_weight(g, table, data), tokens], "/model/embed_tokens/Gather")
        x = self.to_f32(g, x, "/model/embed_tokens")
        scale = self.cfg.embedding_multiplier
        if scale is None and self.family.embedding_scale:
            scale = self.cfg.hidden_size**0.5
        if scale is None:
            return x
        return g.op("Mul", [x, g.const(np.float32(scale), np.float32)], "/model/embed_tokens/scale")

    def rms_norm(
        self,
        g: Graph,
        x: str,
        weight: np.ndarray,
        name: str,
        scale: float = 1.0,
        to: int = TensorProto.FLOAT,
        x_type: int = TensorProto.FLOAT,
    ) -> str:
        """x / sqrt(mean(x^2) + eps) * (offset + w) * scale in float32 (offset: the family's, Gemma's 1), the result of type `to`
        (x of type `x_type`). Paged graphs: one SimplifiedLayerNormalization of any input type (it computes in float32),
        in the webgpu flavour's one type in and out (a Cast before or after it where they differ); the
        others: the standard-op pattern ORT fuses into that kernel (or the webgpu flavour's fused op), on float32 x, then a Cast."""
        w = self.norm_weight(weight, scale)
        if self.webgpu_paged and x_type == to:  # (the WebGPU EP's kernel takes one type: in, weight, out)
            w_const = g.const(w.astype(DTYPES_BY_ONNX[to]), DTYPES_BY_ONNX[to])
            return g.op("SimplifiedLayerNormalization", [x, w_const], name, axis=-1, epsilon=self.cfg.rms_norm_eps, stash_type=1)
        if self.webgpu_paged:  # in float32, cast on the way in or out
            if x_type != TensorProto.FLOAT:
                x = g.op("Cast", [x], f"{name}/Cast_in", to=TensorProto.FLOAT)
            return fused_rms_norm(g, x, w, self.cfg.rms_norm_eps, name, to)
        if self.paged:
            w_const = g.const(w.astype(DTYPES_BY_ONNX[to]), DTYPES_BY_ONNX[to])
            eps = self.cfg.rms_norm_eps
            return g.op("SimplifiedLayerNormalization", [x, w_const], name, axis=-1, epsilon=eps, stash_type=1)
        if self.fused_ops:
            return fused_rms_norm(g, x, w, self.cfg.rms_norm_eps, name, to)
        y = rms_norm_f32(g, x, w, self.cfg.rms_norm_eps, name)
        return y if to == TensorProto.FLOAT else g.op("Cast", [y], f"{name}/Cast", to=to)

    def norm_weight(self, weight: np.ndarray, scale: float = 1.0) -> np.ndarray:
        """An RMS norm's effective weight, float64: (the family's offset + w) * scale."""
        return (self.family.norm_offset + weight.astype(np.float64)) * scale

    def linear(self, g: Graph, x: str, weights: list[np.ndarray], name: str, float_weights: bool = False) -> str:
        """x @ concat(weights)ᵀ; weights are [out, in] (HF layout), stored [in, out] in the model dtype
        (quantized in the ort-quant flavour unless `float_weights`, an expert router's choice, or rows
        that are no whole blocks).
        x and the result are of the activation type; the MatMul runs in the model dtype."""
        cast = self.act_type != self.onnx_dtype
        if cast:
            x = g.op("Cast", [x], f"{name}/Cast_in", to=self.onnx_dtype)
        if self.quant is not None and not float_weights and self.quant.can_quantize(weights):
            y = self.quant.linear(g, x, weights, name, self.np_dtype)
        else:
            w = np.concatenate(weights, axis=0).T.astype(self.np_dtype)
            y = g.op("MatMul", [x, g.weight(f"{name}.weight", np.ascontiguousarray(w))], f"{name}/MatMul")
        return g.op("Cast", [y], f"{name}/Cast_out", to=self.act_type) if cast else y

    def to_f32(self, g: Graph, x: str, name: str) -> str:
        return x if self.dtype == "fp32" else g.op("Cast", [x], f"{name}/Cast_out", to=TensorProto.FLOAT)

    def residual_scaled(self, weight: np.ndarray) -> np.ndarray:
        """A block's last weight times the residual multiplier (Granite's; 1 elsewhere: unchanged)."""
        m = self.cfg.residual_multiplier
        return weight if m == 1.0 else weight * np.float32(m)

    def mlp(self, g: Graph, layer: LayerWeights, x: str) -> str:
        """The layer's MLP: the family's gated MLP, or its mixture of experts (graph/moe.py)."""
        if self.family.is_moe:
            return moe(self, g, layer, x)
        p = f"/model/layers.{layer.index}/mlp"
        down = self.residual_scaled(layer["mlp.down_proj"])
        return self.gated_mlp(g, x, layer["mlp.gate_proj"], layer["mlp.up_proj"], down, p)

    def gated_mlp(self, g: Graph, x: str, gate_w: np.ndarray, up_w: np.ndarray, down_w: np.ndarray, p: str) -> str:
        """down(act(gate(x)) * up(x)), act the family's (Gemma: gelu_tanh, GeGLU; others: SiLU)."""
        inter = gate_w.shape[0]
        gate_up = self.linear(g, x, [gate_w, up_w], f"{p}/gate_up_proj")
        if self.wicore_kernels:
            act = gated_activation(g, gate_up, self.family.activation, f"{p}/act")
            return self.linear(g, act, [down_w], f"{p}/down_proj")
        gate, up = g.op_multi("Split", [gate_up, g.const([inter, inter])], f"{p}/gate_up_split", 2, axis=-1)
        if self.family.activation == "silu":
            act = silu(g, gate, f"{p}/act")
        elif self.contrib:
            act = g.op("FastGelu", [gate], f"{p}/act/FastGelu", domain=MS_DOMAIN)
        else:
            act = gelu_tanh(g, gate, f"{p}/act")
        return self.linear(g, g.op("Mul", [act, up], f"{p}/gate_mul"), [down_w], f"{p}/down_proj")

    def decoder_layer(
        self, g: Graph, layer: LayerWeights, x: str, shared: SharedValues, masses: list[str] | None, out: str | None = None
    ) -> str:
        p = f"/model/layers.{layer.index}"
        pre, post = self.family.pre_norms, self.family.post_norms
        h = self.rms_norm(g, x, layer["input_layernorm"], f"{p}/input_layernorm", to=self.act_type) if pre else self.act(g, x, p)
        h = layer_attention(self, g, layer, h, shared, masses)
        if post:
            h = self.rms_norm(g, h, layer["post_attention_layernorm"], f"{p}/post_attention_layernorm", x_type=self.act_type)
        else:
            h = self.residual_type(g, h, f"{p}/attn")
        x = g.op("Add", [x, h], f"{p}/attn_residual")
        if pre:
            h = self.rms_norm(g, x, layer["pre_feedforward_layernorm"], f"{p}/pre_feedforward_layernorm", to=self.act_type)
        else:
            h = self.act(g, x, f"{p}/mlp")
        h = self.mlp(g, layer, h)
        if post:
            h = self.rms_norm(g, h, layer["post_feedforward_layernorm"], f"{p}/post_feedforward_layernorm", x_type=self.act_type)
        else:
            h = self.residual_type(g, h, f"{p}/mlp")
        return g.op("Add", [x, h], f"{p}/mlp_residual", out=out)

    def act(self, g: Graph, x: str, name: str) -> str:
        """The residual stream in the activation type, where no norm comes before a block (OLMo 2)."""
        return x if self.act_type == TensorProto.FLOAT else g.op("Cast", [x], f"{name}/Cast_act", to=self.act_type)

    def residual_type(self, g: Graph, h: str, name: str) -> str:
        """A block's output in the residual stream's float32 (Gemma's post-norms cast it themselves)."""
        return h if self.act_type == TensorProto.FLOAT else g.op("Cast", [h], f"{name}/Cast_residual", to=TensorProto.FLOAT)

    def lm_head(
        self,
        g: Graph,
        x: str,
        final_norm: np.ndarray,
        table: Callable[[], np.ndarray] | None,
        data: DataFile | None,
        head: np.ndarray | None = None,
    ) -> str:
        """Final norm and LM head (tied, or `head`) on the rows in logits_indices only: [num_logits, vocab].
        `table` (the embedding) is read by a tied head only."""
        p = "/model/lm_head"
        rows = g.op("Reshape", [x, g.const([-1, self.cfg.hidden_size])], f"{p}/flatten")
        rows = g.op("Gather", [rows, io.LOGITS_INDICES], f"{p}/select_rows", axis=0)
        # Granite divides the logits by logits_scaling: folded into the final norm's weight.
        rows = self.rms_norm(g, rows, final_norm, "/model/norm", scale=1.0 / self.cfg.logits_scaling, to=self.onnx_dtype)
        cap = self.cfg.final_logit_softcapping
        fp32 = self.dtype == "fp32"
        logits_out = io.LOGITS if fp32 and not cap else None
        if head is not None and self.quant is not None:
            logits = self.quant.head(g, rows, head, p, self.np_dtype, logits_out)
        elif head is not None:
            w = g.weight(f"{p}.weight", np.ascontiguousarray(head.astype(self.np_dtype)))
            logits = g.op("Gemm", [rows, w], f"{p}/Gemm", out=logits_out, transB=1)
        elif table is None:
            raise ValueError("a tied LM head needs the embedding table")
        elif self.quant is not None:  # ort-quant: the tied head from the embedding's own blocks
            logits = self.quant.head(g, rows, table(), p, self.np_dtype, logits_out, weight_name=TABLE, data=data)
        else:
            w = self.embedding_weight(g, table, data)
            logits = g.op("Gemm", [rows, w], f"{p}/Gemm", out=logits_out, transB=1)
        if not fp32:
            logits = g.op("Cast", [logits], f"{p}/Cast_out", out=None if cap else io.LOGITS, to=TensorProto.FLOAT)
        if cap:
            logits = softcap(g, logits, cap, f"{p}/softcap", out=io.LOGITS)
        return logits
