"""What BlockPool's tests share: tiny pools (block_size 4), a clock the test moves, the tiers' short names."""

from __future__ import annotations

from typing import TypeVar

from hypothesis import strategies as st

from wicore.blocks.block_pool import Allocation, BlockPool, Move
from wicore.blocks.policy import EvictionPolicy, LRUPolicy
from wicore.blocks.tier import Tier

BS = 4
TOKENS = st.lists(st.integers(0, 1), min_size=1, max_size=10)  # two token ids, so prefixes collide
D, H, N = Tier.DEVICE, Tier.HOST, Tier.NVME
Plan = TypeVar("Plan", Allocation, list[Move])


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_pool(
    device: int = 10, host: int = 0, nvme: int = 0, cache: bool = True, policy: EvictionPolicy | None = None
) -> tuple[BlockPool, FakeClock]:
    clock = FakeClock()
    return BlockPool(device, host, nvme, BS, policy or LRUPolicy(), cache, clock=clock), clock
