"""What a pool holds for one sequence, and the chain hash that names its reusable blocks.

A sequence's logical blocks are `first_block` released ones (out of the sliding window, or
never held) followed by its live `block_ids`; the leading `num_hashed` of them have a chain
hash (wicore.blocks.block_pool's docstring draws the regions). A block's chain hash covers
its parent's hash, its tokens and its extra key, so that equal hashes mean equal KV.
"""

from __future__ import annotations

import dataclasses
import hashlib
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from wicore.blocks.block_space import Move


@dataclass(frozen=True)
class Allocation:
    """A new sequence's blocks: its first `num_cached_tokens` prompt tokens need no compute.

    `moves` (promotions of reused blocks to DEVICE, and the demotions/drops that made
    room) must be executed, in order, before the step runs.
    """

    num_cached_tokens: int
    moves: list[Move]


@dataclass
class SequenceBlocks:
    """One sequence's blocks in a pool, and where its hash chain stands."""

    block_ids: list[int]  # live blocks; the first holds logical block `first_block`
    num_hashed: int  # leading blocks whose chain hash is known (cached here or held by another block)
    last_hash: bytes  # chain hash of block num_hashed - 1 (b"" before the first block)
    is_swapped: bool = False
    first_block: int = 0  # leading logical blocks released (out of the window) or never held
    extra_keys: Mapping[int, bytes] = dataclasses.field(default_factory=dict)  # hashed with the blocks' tokens
    # DEVICE frames of block_ids, kept in step with them while the pool's layout_version is
    # frames_version (no referenced block moved since): a step's block table is not rebuilt a block at a time.
    frames: list[int] | None = None
    frames_version: int = -1

    @property
    def num_blocks(self) -> int:
        """Logical blocks, released ones included."""
        return self.first_block + len(self.block_ids)


def chain_hash(parent: bytes, block_tokens: Sequence[int], extra_key: bytes = b"") -> bytes:
    """sha256 of the parent block's chain hash, a block's token ids (int64) and its extra key
    (a fixed number of token bytes precede it, so the parts cannot run together).

    A cryptographic hash, not Python's 64-bit hash(): a collision would serve one
    prompt another prompt's KV.
    """
    return hashlib.sha256(parent + array("q", block_tokens).tobytes() + extra_key).digest()


def block_tokens(token_ids: Sequence[int], block_size: int, index: int) -> Sequence[int]:
    """The token ids of logical block `index`."""
    return token_ids[index * block_size : (index + 1) * block_size]


def prefix_hashes(token_ids: Sequence[int], block_size: int, extra_keys: Mapping[int, bytes] | None = None) -> list[bytes]:
    """Chain hashes of the prompt's leading full blocks that could be reused: all but the
    block of the last token, which is always computed."""
    hashes: list[bytes] = []
    parent = b""
    for i in range((len(token_ids) - 1) // block_size):
        parent = chain_hash(parent, block_tokens(token_ids, block_size, i), (extra_keys or {}).get(i, b""))
        hashes.append(parent)
    return hashes
