"""How the engine's KV cache is laid out: block groups, blocks per tier, and the cache built on them.

The full-attention layers and the sliding-window layers are two block groups
(wicore.kv.cache). Each tier's byte budget is shared between them: the window group
gets what its running sequences can use at most, its window (plus a prefill chunk)
each, capped at an even split; the full group gets the rest. So at long context most
of the memory goes to the full-attention layers, whose blocks cover the whole context.

    bytes per block   full:   num_full_layers   * 2 * block_size * kv_heads * row
                      window: num_window_layers * 2 * block_size * kv_heads * row
                      row = head_dim * itemsize (int8 KV: (head_dim + 1) bytes, graph/kv_quant.py)
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from wicore.blocks.block_groups import FULL, WINDOW
from wicore.devices.placement import GIB
from wicore.graph.kv_quant import kv_row_width
from wicore.graph.manifest import Manifest
from wicore.graph.paged_attention import flash_page_size
from wicore.model.config import DecoderConfig

log = logging.getLogger(__name__)


def default_block_size(manifest: Manifest) -> int:
    """16 tokens (as vLLM), or for a paged-attention export the block its FlashAttention kernels need."""
    return block_size_for(manifest.config, manifest.attention)


def block_size_for(cfg: DecoderConfig, attention: str) -> int:
    """`default_block_size` of a model exported with `attention` (also for a config alone: `wicore plan`)."""
    return flash_page_size(cfg.head_dim) if attention == "paged" else 16


def choose_block_size(manifest: Manifest, requested: int | None) -> int:
    """`requested`, or the model's default; a paged export warned where its kernels will be slow."""
    size = requested or default_block_size(manifest)
    tile = flash_page_size(manifest.config.head_dim)
    if manifest.attention == "paged" and size % tile:
        log.warning("KV blocks of %d tokens: the paged attention runs FlashAttention on multiples of %d only", size, tile)
    return size


@dataclass(frozen=True)
class KVLayout:
    """The layers of each block group and the bytes of one block of each."""

    full_layers: tuple[int, ...]
    window_layers: tuple[int, ...]
    window: int  # tokens a sliding layer sees
    block_size: int
    layer_block_bytes: int  # K and V of one layer's block

    @classmethod
    def of(cls, manifest: Manifest, block_size: int) -> KVLayout:
        return cls.of_config(manifest.config, manifest.kv_dtype, block_size)

    @classmethod
    def of_config(cls, cfg: DecoderConfig, kv_dtype: str, block_size: int) -> KVLayout:
        """The layout of a model's KV in `kv_dtype` (an export's, or a config's alone: `wicore plan`)."""
        sliding = tuple(i for i in range(cfg.num_layers) if cfg.is_sliding(i))
        full = tuple(i for i in range(cfg.num_layers) if not cfg.is_sliding(i))
        if not full:
            raise ValueError("the engine needs at least one full-attention layer")
        row = kv_row_width(cfg.head_dim, kv_dtype) * np.dtype(kv_dtype).itemsize  # one token's K of one head
        return cls(full, sliding, cfg.sliding_window, block_size, 2 * block_size * cfg.num_kv_heads * row)

    @property
    def has_window(self) -> bool:
        return bool(self.window_layers)

    def block_bytes(self, group: int) -> int:
        return len(self.window_layers if group == WINDOW else self.full_layers) * self.layer_block_bytes

    def window_blocks_per_sequence(self, prefill_chunk: int) -> int:
        """Most window blocks one sequence holds in a step: its window plus a prefill chunk."""
        return math.ceil((self.window - 1 + prefill_chunk) / self.block_size) + 1

    def sequence_blocks(self, tokens: int) -> int:
        """Full-attention blocks a sequence of `tokens` holds (its every token)."""
        return -(-tokens // self.block_size)

    def pool_bytes(self, num_seqs: int, tokens: int, prefill_chunk: int) -> int:
        """Device pool bytes (`--kv-pool-gb`) in which the engine holds `num_seqs` sequences of `tokens`
        each, with `max_num_seqs` = num_seqs: the bytes whose `split` gives the full group their
        blocks and the window group its whole reservation (`plan_tiers`), each plus the sink."""
        full = num_seqs * self.sequence_blocks(tokens) + 1
        if not self.has_window:
            return full * self.block_bytes(FULL)
        window = num_seqs * self.window_blocks_per_sequence(prefill_chunk) + 1
        return max(full, window) * self.block_bytes(FULL) + window * self.block_bytes(WINDOW)

    def one_sequence_bytes(self, tokens: int, prefill_chunk: int, max_num_seqs: int) -> int:
        """The smallest device pool (`--kv-pool-gb`) whose `split` holds one sequence of `tokens`
        while the window group is sized for `max_num_seqs` sequences: what a long prompt needs,
        where `pool_bytes` sizes every one of `max_num_seqs` sequences.

        The window group takes an even split of the pool up to its need, so below that need
        window blocks come along with the full ones. The pool is F full blocks (the sequence's and
        the sink) and w window blocks, for the fewest w >= one sequence's window blocks whose
        `split` gives back at least F full blocks.
        """
        full = self.sequence_blocks(tokens) + 1
        if not self.has_window:
            return full * self.block_bytes(FULL)
        need = max_num_seqs * self.window_blocks_per_sequence(prefill_chunk) + 1
        least = min(self.sequence_blocks(tokens), self.window_blocks_per_sequence(prefill_chunk)) + 1
        for window in range(least, need):
            num_bytes = full * self.block_bytes(FULL) + window * self.block_bytes(WINDOW)
            got_full, got_window = self.split(num_bytes, need)
            if got_full >= full and got_window >= least:
                return num_bytes
        return full * self.block_bytes(FULL) + need * self.block_bytes(WINDOW)  # always holds it (least <= need)

    def split(self, num_bytes: float, window_need: int) -> tuple[int, int]:
        """(full, window) blocks from a byte budget: the window group takes at most
        `window_need` blocks and at most an even split; the full group the rest."""
        if not self.has_window:
            return int(num_bytes // self.block_bytes(FULL)), 0
        window = min(int(num_bytes // (self.block_bytes(FULL) + self.block_bytes(WINDOW))), window_need)
        return int((num_bytes - window * self.block_bytes(WINDOW)) // self.block_bytes(FULL)), window


def pool_gb_flag(num_bytes: int) -> str:
    """`--kv-pool-gb`'s value for a pool of at least `num_bytes`: GiB rounded up to 0.01."""
    return f"{-(-num_bytes * 100 // GIB) / 100:.2f}"


def context_advice(layout: KVLayout, tokens: int, prefill_chunk: int, max_num_seqs: int) -> str:
    """The device pools that hold sequences of `tokens`: one, one with --max-num-seqs 1 (where the
    window group's reservation for --max-num-seqs costs something), and --max-num-seqs of them."""
    one = layout.one_sequence_bytes(tokens, prefill_chunk, max_num_seqs)
    alone = layout.one_sequence_bytes(tokens, prefill_chunk, 1)
    text = f"kv_pool_gb {pool_gb_flag(one)} holds one sequence of {tokens} tokens"
    if pool_gb_flag(alone) != pool_gb_flag(one):
        text += (
            f" beside the sliding-window blocks max_num_seqs {max_num_seqs} reserves "
            f"(max_num_seqs 1: kv_pool_gb {pool_gb_flag(alone)})"
        )
    if max_num_seqs > 1:
        every = layout.pool_bytes(max_num_seqs, tokens, prefill_chunk)
        text += f"; {max_num_seqs} such sequences at once take kv_pool_gb {pool_gb_flag(every)}"
    return text


def default_pool_gb(layout: KVLayout, context: int, prefill_chunk: int, max_num_seqs: int) -> float:
    """The device pool a server gets when none is asked for: one sequence of the model's whole
    `context` fits (`one_sequence_bytes`), and at least 1 GiB (room for many shorter ones)."""
    return max(1.0, float(pool_gb_flag(layout.one_sequence_bytes(context, prefill_chunk, max_num_seqs))))
