"""The paged graphs on the CPU: NumPy versions of the ONNX Runtime contrib ops they use (CUDA kernels
there) for onnx.reference, and a driver that prefills prompts and decodes one batched step.

ONNX Runtime's CPU EP has no PagedAttention, so these ops are written from the op schemas
(`onnxruntime.capi.onnxruntime_pybind11_state.get_all_operator_schema()`): what they check is the
graph around the op (which tensors reach it, norms, scales, windows, soft-capping, the RoPE caches,
LongRoPE's rotation before it), not ONNX Runtime's kernels; tools/check_families_gpu.py runs those.

    BlockAttention (WiCore's, graph/paged_block.py): the attention over the pools, q normed, rotated
        and scaled and the K/V written by graph ops before it.
    BlockAttentionQKV (WiCore's): BlockAttention with that prologue inside, from the packed qkv.
    PagedAttention(packed qkv [tokens, (nh + 2 kvh) hd], pools [blocks, block_size, kvh, hd], ...):
        per token: q, k split; q/k RMSNorm per head (with weights); rotate-half RoPE at position
        past_seqlens[row] + index in row (do_rotary); k, v written at slot_mapping; then
        softmax(softcap(scale q.k) over keys p - window < j <= p, + head_sink) . v
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from wicore.graph import io
from wicore.graph.manifest import Manifest


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate-half RoPE of x [..., heads, hd] with cos / sin [..., 1, hd / 2] (float32)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _rms(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps)) * weight.astype(np.float32)


class SimplifiedLayerNormalization(OpRun):
    op_domain = ""

    def _run(self, x, scale, axis=-1, epsilon=1e-5, stash_type=1):  # type: ignore[no-untyped-def]
        y = _rms(x.astype(np.float32), scale, epsilon)
        return (y.astype(scale.dtype),)


class FastGelu(OpRun):
    op_domain = "com.microsoft"

    def _run(self, x, bias=None):  # type: ignore[no-untyped-def]
        v = x.astype(np.float32) + (0 if bias is None else bias.astype(np.float32))
        y = 0.5 * v * (1 + np.tanh(np.float32(np.sqrt(2 / np.pi)) * (v + np.float32(0.044715) * v**3)))
        return (y.astype(x.dtype),)


class RotaryEmbedding(OpRun):
    op_domain = "com.microsoft"

    def _run(self, x, position_ids, cos_cache, sin_cache, num_heads=0, interleaved=0, rotary_embedding_dim=0, scale=1.0):  # type: ignore[no-untyped-def]
        assert not interleaved and not rotary_embedding_dim
        b, s, width = x.shape
        heads = x.reshape(b, s, num_heads, width // num_heads).astype(np.float32)
        cos = cos_cache[position_ids].astype(np.float32)[:, :, None, :]
        sin = sin_cache[position_ids].astype(np.float32)[:, :, None, :]
        return (_rotate(heads, cos, sin).reshape(b, s, width).astype(x.dtype),)


class PagedAttention(OpRun):
    op_domain = "com.microsoft"

    def _run(  # type: ignore[no-untyped-def]
        self,
        query,
        key,
        value,
        key_cache,
        value_cache,
        cumulative,
        past,
        block_table,
        cos_cache=None,
        sin_cache=None,
        slot_mapping=None,
        head_sink=None,
        q_norm_weight=None,
        k_norm_weight=None,
        k_scale=None,
        v_scale=None,
        attention_metadata=None,
        num_heads=0,
        kv_num_heads=0,
        scale=0.0,
        softcap=0.0,
        local_window_size=-1,
        do_rotary=0,
        qk_norm_epsilon=1e-6,
    ):
        assert key is None and value is None, "WiCore packs q, k and v"
        nh, kvh = num_heads, kv_num_heads
        hd = query.shape[-1] // (nh + 2 * kvh)
        block_size = key_cache.shape[1]
        scale = scale or hd**-0.5
        qkv = query.astype(np.float32)
        q = qkv[:, : nh * hd].reshape(-1, nh, hd)
        k = qkv[:, nh * hd : (nh + kvh) * hd].reshape(-1, kvh, hd)
        v = qkv[:, (nh + kvh) * hd :].reshape(-1, kvh, hd)
        if q_norm_weight is not None:
            q, k = _rms(q, q_norm_weight, qk_norm_epsilon), _rms(k, k_norm_weight, qk_norm_epsilon)
        rows = len(past)
        positions = np.concatenate([past[r] + np.arange(cumulative[r + 1] - cumulative[r]) for r in range(rows)])
        if do_rotary:
            cos = cos_cache[positions].astype(np.float32)[:, None, :]
            sin = sin_cache[positions].astype(np.float32)[:, None, :]
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        k_pool, v_pool = key_cache.copy(), value_cache.copy()
        flat_k = k_pool.reshape(-1, kvh, hd)
        flat_v = v_pool.reshape(-1, kvh, hd)
        flat_k[slot_mapping] = k.astype(k_pool.dtype)
        flat_v[slot_mapping] = v.astype(v_pool.dtype)
        out = np.zeros((len(positions), nh, hd), np.float32)
        groups = nh // kvh
        for r in range(rows):
            for t in range(cumulative[r], cumulative[r + 1]):
                p = positions[t]
                keys = np.arange(p + 1)
                if local_window_size > 0:
                    keys = keys[keys > p - local_window_size]
                slots = block_table[r, keys // block_size] * block_size + keys % block_size
                k_rows = flat_k[slots].astype(np.float32)  # [keys, kvh, hd]
                v_rows = flat_v[slots].astype(np.float32)
                for h in range(nh):
                    scores = k_rows[:, h // groups] @ q[t, h] * np.float32(scale)
                    if softcap:
                        scores = np.float32(softcap) * np.tanh(scores / np.float32(softcap))
                    m = scores.max() if head_sink is None else max(scores.max(), np.float32(head_sink[h]))
                    e = np.exp(scores - m)
                    total = e.sum() + (0 if head_sink is None else np.exp(np.float32(head_sink[h]) - m))
                    out[t, h] = (e / total) @ v_rows[:, h // groups]
        return out.reshape(len(positions), nh * hd).astype(query.dtype), k_pool, v_pool


class BlockAttention(OpRun):
    """wicore.BlockAttention (wicore/kernels/csrc/kernels.h): q carries the scale; keys of logical block i
    at positions (first_block + i) * block_size + offset, visible when p - window < key <= p, key < len."""

    op_domain = "wicore"

    def _run(self, q, k_pool, v_pool, tables, positions, lens, first=None, num_heads=0, num_kv_heads=0, window=0, softcap=0.0):  # type: ignore[no-untyped-def]
        return (_attend(q, k_pool, v_pool, tables, positions, lens, first, num_heads, num_kv_heads, window, softcap),)


def _attend(q, k_pool, v_pool, tables, positions, lens, first, num_heads, num_kv_heads, window, softcap):  # type: ignore[no-untyped-def]
    """BlockAttention's arithmetic (float32), the result in q's type."""
    batch, seq = positions.shape
    _, block_size, kvh, hd = k_pool.shape
    groups = num_heads // num_kv_heads
    queries = q.reshape(batch, seq, num_heads, hd).astype(np.float32)
    out = np.zeros_like(queries)
    for r in range(batch):
        start = 0 if first is None else first[r] * block_size
        keys = start + np.arange(tables.shape[1] * block_size)
        slots = tables[r, (keys - start) // block_size] * block_size + (keys - start) % block_size
        k_rows = k_pool.reshape(-1, kvh, hd)[slots].astype(np.float32)
        v_rows = v_pool.reshape(-1, kvh, hd)[slots].astype(np.float32)
        for t in range(seq):
            p = positions[r, t]
            seen = (keys <= p) & (keys < lens[r]) & ((keys > p - window) if window else True)
            if not seen.any():
                continue
            for h in range(num_heads):
                scores = k_rows[seen, h // groups] @ queries[r, t, h]
                if softcap:
                    scores = np.float32(softcap) * np.tanh(scores / np.float32(softcap))
                e = np.exp(scores - scores.max())
                out[r, t, h] = (e / e.sum()) @ v_rows[seen, h // groups]
    return out.reshape(batch, seq, num_heads * hd).astype(q.dtype)


class BlockAttentionQKV(OpRun):
    """wicore.BlockAttentionQKV (kernels.h): per token q, k, v split from qkv; q, k normed per head (weights
    given), rotated at the token's position (caches given), q times scale, rounded to the graph's type as
    ONNX Runtime's graph ops would; k, v written at slot_mapping; then BlockAttention over the pools with
    context_lens = past_seqlens + seq."""

    op_domain = "wicore"

    def _run(  # type: ignore[no-untyped-def]
        self, qkv, k_pool, v_pool, tables, positions, slot_mapping, past, cos_cache=None, sin_cache=None,
        q_norm=None, k_norm=None, num_heads=0, num_kv_heads=0, window=0, softcap=0.0, scale=1.0, epsilon=1e-6,
    ):  # fmt: skip
        nh, kvh, hd = num_heads, num_kv_heads, k_pool.shape[-1]
        batch, seq = positions.shape
        rows = qkv.reshape(batch * seq, (nh + 2 * kvh) * hd).astype(np.float32)
        q = rows[:, : nh * hd].reshape(-1, nh, hd)
        k = rows[:, nh * hd : (nh + kvh) * hd].reshape(-1, kvh, hd)
        v = rows[:, (nh + kvh) * hd :].reshape(-1, kvh, hd)
        if q_norm is not None:
            q, k = _rms(q, q_norm, epsilon), _rms(k, k_norm, epsilon)
        if cos_cache is not None:
            flat = positions.reshape(-1)
            cos = cos_cache[flat].astype(np.float32)[:, None, :]
            sin = sin_cache[flat].astype(np.float32)[:, None, :]
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        q = (q * np.float32(scale)).astype(qkv.dtype)
        k_out, v_out = k_pool.copy(), v_pool.copy()
        k_out.reshape(-1, kvh, hd)[slot_mapping.reshape(-1)] = k.astype(k_pool.dtype)
        v_out.reshape(-1, kvh, hd)[slot_mapping.reshape(-1)] = v.astype(v_pool.dtype)
        lens = past.astype(np.int64) + seq
        out = _attend(q.reshape(batch, seq, nh * hd), k_out, v_out, tables, positions, lens, None, nh, kvh, window, softcap)
        return out, k_out, v_out


OPS = [SimplifiedLayerNormalization, FastGelu, RotaryEmbedding, PagedAttention, BlockAttention, BlockAttentionQKV]


class PagedRunner:
    """One-partition paged export run by onnx.reference: each prompt prefilled alone, then decode
    steps of all rows batched. Each row owns whole blocks of one shared pool, listed in its table
    in reverse order (so a graph that ignored the tables would read the wrong keys)."""

    def __init__(self, folder: Path, max_rows: int, max_tokens: int, block_size: int = 8, library: str | None = None) -> None:
        """`library`: run the graph on ONNX Runtime's CPU EP with WiCore's kernel library (float32 graphs on
        BlockAttention, graph/paged_block.py) instead of onnx.reference."""
        manifest = Manifest.read(folder)
        (record,) = manifest.partitions
        self.cfg = manifest.config
        model = onnx.load(folder / record.file)
        self.outputs = [o.name for o in model.graph.output]
        if library is None:
            self.session: ReferenceEvaluator | ort.InferenceSession = ReferenceEvaluator(model, new_ops=OPS)
        else:
            options = ort.SessionOptions()
            options.register_custom_ops_library(library)
            self.session = ort.InferenceSession(str(folder / record.file), options, providers=["CPUExecutionProvider"])
        self.inputs = set(record.inputs)
        (pool,) = (v for v in model.graph.input if v.name == io.key_cache(0))
        pool_type = onnx.helper.tensor_dtype_to_np_dtype(pool.type.tensor_type.elem_type)
        self.block_size = block_size
        self.blocks_per_row = -(-max_tokens // block_size)
        shape = (1 + max_rows * self.blocks_per_row, block_size, self.cfg.num_kv_heads, self.cfg.head_dim)
        names = [name for i in range(self.cfg.num_layers) for name in (io.key_cache(i), io.value_cache(i))]
        self.pools = {name: np.zeros(shape, pool_type) for name in names}  # block 0 unused
        self.lengths: list[int] = []

    def _table(self, row: int) -> np.ndarray:
        first = 1 + row * self.blocks_per_row
        return np.arange(first, first + self.blocks_per_row)[::-1].copy()

    def step(self, rows: list[int], tokens: list[list[int]]) -> np.ndarray:
        """Run `tokens[i]` (all of one length) as the next tokens of rows `rows`: logits of every token."""
        seq = len(tokens[0])
        past = np.array([self.lengths[r] for r in rows], np.int32)
        positions = past[:, None].astype(np.int64) + np.arange(seq)
        tables = np.stack([self._table(r) for r in rows])
        bs = self.block_size
        slots = np.take_along_axis(tables, positions // bs, axis=1) * bs + positions % bs
        feed = {
            io.INPUT_IDS: np.array(tokens, np.int64),
            io.POSITIONS: positions,
            io.CUMULATIVE_SEQLENS: np.arange(len(rows) + 1, dtype=np.int32) * seq,
            io.PAST_SEQLENS: past,
            io.ATTENTION_BOUNDS: np.array([seq, past.max() + seq], np.int32),
            io.SLOT_MAPPING: slots,
            io.BLOCK_TABLES: tables,
            io.WINDOW_SLOT_MAPPING: slots,  # nothing released: the window group lists every block
            io.WINDOW_LOGICAL_TABLES: tables,
            io.LOGITS_INDICES: np.arange(len(rows) * seq, dtype=np.int64),
            **self.pools,
        }
        results = dict(
            zip(self.outputs, self.session.run(None, {k: v for k, v in feed.items() if k in self.inputs}), strict=True)
        )
        for i in range(self.cfg.num_layers):
            self.pools[io.key_cache(i)] = results[io.key_cache_out(i)]
            self.pools[io.value_cache(i)] = results[io.value_cache_out(i)]
        for r in rows:
            self.lengths[r] += seq
        return results[io.LOGITS].reshape(len(rows), seq, -1)

    def prefill(self, prompt: list[int]) -> np.ndarray:
        """A new row holding `prompt`: its prompt logits [len, vocab]."""
        self.lengths.append(0)
        row = len(self.lengths) - 1
        return self.step([row], [prompt])[0]
