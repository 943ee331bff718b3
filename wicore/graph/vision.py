"""Gemma 3's vision partition as one ONNX graph: SigLIP encoder and multi-modal projector (opset 17,
standard ops only, so every execution provider runs it).

    pixel_values [n, 3, S, S] ──► Conv patch_size² stride patch_size ──► [n, hidden, P, P]
        ──► patches as rows [n, P², hidden] + position embedding
        ──► num_layers x ( x + attn(LayerNorm(x)),  x + fc2(gelu_tanh(fc1(LayerNorm(x)))) )
        ──► post LayerNorm ──► back to [n, hidden, P, P] ──► AveragePool pool x pool ──► [n, T², hidden]
        ──► RMSNorm (1 + w) ──► MatMul [hidden, text_hidden] ──► image_features [n, T², text_hidden]

Attention is bidirectional over the P² patches, softmax(q kᵀ / sqrt(head_dim)) v per head. The
residual stream and the norms are float32; with `fp16` the weights, the linear layers and the
attention are float16 (as HF runs the tower in half precision). Two flavours (FLAVOURS) differ in
the attention core and the MLP's activation, the same linear layers and norms around them:

    portable   standard ops, every EP:
               q, k, v ──► heads apart ──► MatMul q kᵀ ──► Softmax ──► MatMul v ──► heads together
               fc1 ──► Cast to float32 ──► gelu_tanh in 9 elementwise ops ──► Cast ──► fc2
               at 4,096 patches the [n, heads, 4096, 4096] scores and the [n, 4096, 4304] float32
               activations are written to memory each layer: most of the tower's time on a GPU
    fused      ONNX Runtime's contrib ops (CPU and CUDA EPs):
               q, k, v [n, P², hidden] ──► com.microsoft.MultiHeadAttention ──► [n, P², hidden]
               fc1 ──► com.microsoft.FastGelu (model dtype) ──► fc2
               the CUDA EP runs the attention in a flash kernel (cuDNN's on an H100; head sizes a
               multiple of 8 up to 256, SigLIP's 72 included): 3x the portable graph (PERFORMANCE.md)
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from wicore.graph import io
from wicore.graph.decoder import DTYPES, OPSET
from wicore.graph.ops import MS_DOMAIN, DataFile, Graph, gelu_tanh, rms_norm_f32
from wicore.model.vision import VisionConfig, VisionWeights, checked_tensor

FILE_NAME = "vision.onnx"
FLAVOURS = ("portable", "fused")  # which ops the graph may use (module docstring)


class VisionBuilder:
    """Builds the vision partition of one model (module docstring)."""

    def __init__(self, weights: VisionWeights, dtype: str, flavour: str = "portable") -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: expected one of {sorted(DTYPES)}")
        if flavour not in FLAVOURS:
            raise ValueError(f"flavour {flavour!r}: expected one of {FLAVOURS}")
        self.weights = weights
        self.flavour = flavour
        self.fused = flavour == "fused"
        self.cfg: VisionConfig = weights.config
        self.dtype = dtype
        self.np_dtype, self.onnx_dtype = DTYPES[dtype]

    def tensor(self, name: str) -> np.ndarray:
        return checked_tensor(self.weights, name)

    def build(self, data: DataFile) -> onnx.ModelProto:
        cfg = self.cfg
        g = Graph("gemma3_vision", data)
        size = cfg.image_size
        pixels = g.input(io.PIXEL_VALUES, TensorProto.FLOAT, ["num_images", 3, size, size])
        x = self.embed(g, pixels)
        for i in range(cfg.num_layers):
            x = self.encoder_layer(g, x, i)
        x = self.layer_norm(g, x, "post_layernorm", "/vision/post_layernorm")
        self.project(g, x)
        g.output(io.IMAGE_FEATURES, TensorProto.FLOAT, ["num_images", cfg.mm_tokens_per_image, cfg.text_hidden_size])
        doc = f"Gemma 3 vision tower ({cfg.num_layers} SigLIP layers) and projector, {self.dtype}, {self.flavour} flavour"
        return g.to_model(OPSET, doc=doc)

    # -- blocks ----------------------------------------------------------------------
    def embed(self, g: Graph, pixels: str) -> str:
        """Patch embedding (a Conv whose stride is its kernel) plus the position embedding: [n, P², hidden]."""
        cfg, p = self.cfg, "/vision/embeddings"
        x = self.to_model_dtype(g, pixels, f"{p}/pixels")
        weight = g.weight("vision.patch_embedding.weight", self.tensor("embeddings.patch_embedding.weight").astype(self.np_dtype))
        bias = g.const(self.tensor("embeddings.patch_embedding.bias").astype(self.np_dtype), self.np_dtype)
        patches = g.op("Conv", [x, weight, bias], f"{p}/patch_embedding/Conv", strides=[cfg.patch_size] * 2)
        patches = self.to_f32(g, patches, f"{p}/patch_embedding")
        rows = g.op("Reshape", [patches, g.const([0, cfg.hidden_size, -1])], f"{p}/flatten")  # [n, hidden, P²]
        rows = g.op("Transpose", [rows], f"{p}/rows", perm=[0, 2, 1])
        positions = g.weight("vision.position_embedding.weight", self.tensor("embeddings.position_embedding.weight"))
        return g.op("Add", [rows, positions], f"{p}/add_positions")

    def encoder_layer(self, g: Graph, x: str, i: int) -> str:
        p, q = f"/vision/layers.{i}", f"encoder.layers.{i}"
        h = self.layer_norm(g, x, f"{q}.layer_norm1", f"{p}/layer_norm1")
        x = g.op("Add", [x, self.attention(g, h, i)], f"{p}/attn_residual")
        h = self.layer_norm(g, x, f"{q}.layer_norm2", f"{p}/layer_norm2")
        return g.op("Add", [x, self.mlp(g, h, i)], f"{p}/mlp_residual")

    def mlp(self, g: Graph, x: str, i: int) -> str:
        """fc2(gelu_tanh(fc1(x))): the GELU in float32 standard ops, or (fused) one com.microsoft.FastGelu
        in the model dtype between the two linear layers, as HF runs it."""
        p, q = f"/vision/layers.{i}/mlp", f"encoder.layers.{i}.mlp"
        h = self.linear(g, x, [f"{q}.fc1"], f"{p}/fc1", cast_out=not self.fused)
        h = g.op("FastGelu", [h], f"{p}/act/FastGelu", domain=MS_DOMAIN) if self.fused else gelu_tanh(g, h, f"{p}/act")
        return self.linear(g, h, [f"{q}.fc2"], f"{p}/fc2", cast_in=not self.fused)

    def attention(self, g: Graph, x: str, i: int) -> str:
        """Multi-head self-attention over the patches, without a mask: [n, P², hidden]."""
        cfg, p, q = self.cfg, f"/vision/layers.{i}/attn", f"encoder.layers.{i}.self_attn"
        h = cfg.hidden_size
        qkv = self.linear(g, x, [f"{q}.q_proj", f"{q}.k_proj", f"{q}.v_proj"], f"{p}/qkv_proj", cast_out=False)
        q_, k, v = g.op_multi("Split", [qkv, g.const([h, h, h])], f"{p}/qkv_split", 3, axis=-1)
        core = self.fused_core if self.fused else self.portable_core
        return self.linear(g, core(g, q_, k, v, p), [f"{q}.out_proj"], f"{p}/out_proj", cast_in=False)

    def portable_core(self, g: Graph, q: str, k: str, v: str, p: str) -> str:
        """softmax(q kᵀ / sqrt(head_dim)) v per head in standard ops: [n, P², hidden] each -> [n, P², hidden]."""
        heads, hd = self.cfg.num_heads, self.cfg.head_dim
        split = g.const([0, 0, heads, hd])
        q = g.op("Transpose", [g.op("Reshape", [q, split], f"{p}/q_heads")], f"{p}/q_T", perm=[0, 2, 1, 3])
        k = g.op("Transpose", [g.op("Reshape", [k, split], f"{p}/k_heads")], f"{p}/k_T", perm=[0, 2, 3, 1])
        v = g.op("Transpose", [g.op("Reshape", [v, split], f"{p}/v_heads")], f"{p}/v_T", perm=[0, 2, 1, 3])
        q = g.op("Mul", [q, g.const(hd**-0.5, self.np_dtype)], f"{p}/q_scale")
        probs = g.op("Softmax", [g.op("MatMul", [q, k], f"{p}/scores")], f"{p}/Softmax", axis=-1)  # [n, heads, P², P²]
        out = g.op("Transpose", [g.op("MatMul", [probs, v], f"{p}/context")], f"{p}/context_T", perm=[0, 2, 1, 3])
        return g.op("Reshape", [out, g.const([0, 0, self.cfg.hidden_size])], f"{p}/context_flat")

    def fused_core(self, g: Graph, q: str, k: str, v: str, p: str) -> str:
        """The same in one com.microsoft.MultiHeadAttention (no mask, not causal): [n, P², hidden]."""
        cfg = self.cfg
        attrs = dict(num_heads=cfg.num_heads, scale=cfg.head_dim**-0.5, domain=MS_DOMAIN)
        return g.op("MultiHeadAttention", [q, k, v], f"{p}/MultiHeadAttention", **attrs)

    def project(self, g: Graph, x: str) -> str:
        """Average-pool the patch grid to tokens_per_side², RMSNorm, map to the text width."""
        cfg, p = self.cfg, "/vision/projector"
        side = cfg.patches_per_side
        grid = g.op("Transpose", [x], f"{p}/channels_first", perm=[0, 2, 1])  # [n, hidden, P²]
        grid = g.op("Reshape", [grid, g.const([0, cfg.hidden_size, side, side])], f"{p}/grid")
        pooled = g.op("AveragePool", [grid], f"{p}/AveragePool", kernel_shape=[cfg.pool_size] * 2, strides=[cfg.pool_size] * 2)
        tokens = g.op("Reshape", [pooled, g.const([0, cfg.hidden_size, -1])], f"{p}/flatten")
        tokens = g.op("Transpose", [tokens], f"{p}/tokens", perm=[0, 2, 1])  # [n, T², hidden]
        scale = 1.0 + self.tensor("projector.norm.weight").astype(np.float64)
        tokens = rms_norm_f32(g, tokens, scale, cfg.layer_norm_eps, f"{p}/mm_soft_emb_norm")
        weight = g.weight("vision.projector.projection", self.tensor("projector.projection").astype(self.np_dtype))
        fp32 = self.dtype == "fp32"
        tokens = self.to_model_dtype(g, tokens, f"{p}/projection")
        y = g.op("MatMul", [tokens, weight], f"{p}/projection/MatMul", out=io.IMAGE_FEATURES if fp32 else None)
        return y if fp32 else g.op("Cast", [y], f"{p}/projection/Cast_out", out=io.IMAGE_FEATURES, to=TensorProto.FLOAT)

    # -- helpers ---------------------------------------------------------------------
    def layer_norm(self, g: Graph, x: str, weights: str, name: str) -> str:
        """LayerNormalization (opset 17) in float32."""
        w = g.const(self.tensor(f"{weights}.weight"), np.float32)
        b = g.const(self.tensor(f"{weights}.bias"), np.float32)
        return g.op("LayerNormalization", [x, w, b], f"{name}/LayerNormalization", axis=-1, epsilon=self.cfg.layer_norm_eps)

    def linear(self, g: Graph, x: str, names: list[str], name: str, cast_in: bool = True, cast_out: bool = True) -> str:
        """x @ concat(W)ᵀ + concat(b) of HF [out, in] weights in the model dtype; x and the result
        float32 unless `cast_in` / `cast_out` is False (then of the model dtype)."""
        w = np.concatenate([self.tensor(f"{n}.weight") for n in names], axis=0).T.astype(self.np_dtype)
        b = np.concatenate([self.tensor(f"{n}.bias") for n in names]).astype(self.np_dtype)
        x = self.to_model_dtype(g, x, name) if cast_in else x
        y = g.op("MatMul", [x, g.weight(f"{name}.weight", np.ascontiguousarray(w))], f"{name}/MatMul")
        y = g.op("Add", [y, g.const(b, self.np_dtype)], f"{name}/Add")
        return self.to_f32(g, y, name) if cast_out else y

    def to_model_dtype(self, g: Graph, x: str, name: str) -> str:
        return x if self.dtype == "fp32" else g.op("Cast", [x], f"{name}/Cast_in", to=self.onnx_dtype)

    def to_f32(self, g: Graph, x: str, name: str) -> str:
        return x if self.dtype == "fp32" else g.op("Cast", [x], f"{name}/Cast_out", to=TensorProto.FLOAT)
