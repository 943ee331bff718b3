"""The tiers a KV block can lie in, fastest first."""

from __future__ import annotations

from enum import IntEnum


class Tier(IntEnum):
    """Where a block's bytes lie, fastest first: a demoted block goes to the next tier down that exists."""

    DEVICE = 0  # the pool bound to the graph (device memory, or host NumPy on the CPU EP)
    HOST = 1  # host NumPy
    NVME = 2  # files, checksummed per block
