"""What `Engine.stats()` reports (and /v1/stats, /metrics, the Ray board read): typed, not a dict.

    EngineStats
    ├── running / waiting / swapped          requests by state
    ├── blocks_in_use / _referenced / _free  TierCounts (device, host, nvme): both block groups summed
    ├── kv_groups: {"full", "window"}        GroupStats: the same per block group, with its shape
    ├── prompt / cached / computed / generated token counters, preemptions, corrupt blocks
    ├── tokens_per_second, steps
    └── speculative: SpeculativeReport | None

`to_dict()` is the JSON shape /v1/stats has always served (and the Ray board sums).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from wicore.blocks.tier import Tier
from wicore.engine.scheduler import Scheduler
from wicore.engine.speculative import Speculator
from wicore.kv.cache import KVCache
from wicore.kv.layout import KVLayout


@dataclass(frozen=True)
class TierCounts:
    """Blocks in each tier."""

    device: int = 0
    host: int = 0
    nvme: int = 0

    @classmethod
    def of(cls, counts: dict[str, int]) -> TierCounts:
        return cls(**{t.name.lower(): counts.get(t.name.lower(), 0) for t in Tier})

    def __add__(self, other: TierCounts) -> TierCounts:
        return TierCounts(self.device + other.device, self.host + other.host, self.nvme + other.nvme)

    @property
    def total(self) -> int:
        return self.device + self.host + self.nvme


@dataclass(frozen=True)
class GroupStats:
    """One block group (the full-attention layers, or the sliding-window ones)."""

    layers: int
    window: int | None  # tokens a sliding layer attends to; None for full attention
    blocks_in_use: TierCounts  # referenced by a request, or kept for the prefix cache
    blocks_referenced: TierCounts
    blocks_free: TierCounts
    block_bytes: int


@dataclass(frozen=True)
class SpeculativeReport:
    """Speculative decoding's counters, with vLLM's meaning."""

    method: str
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    acceptance_rate: float
    mean_acceptance_length: float
    accepted_per_position: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class EngineStats:
    running: int
    waiting: int
    swapped: int
    blocks_in_use: TierCounts
    blocks_referenced: TierCounts
    blocks_free: TierCounts
    kv_groups: dict[str, GroupStats]  # "full", "window"
    prefix_hit_rate: float
    prompt_tokens: int
    cached_prompt_tokens: int
    computed_prompt_tokens: int
    generated_tokens: int
    preempted_swap: int
    preempted_recompute: int
    long_rope_recomputes: int  # sequences prefilled again past LongRoPE's switch (Phi-3-128k)
    corrupt_blocks: int
    tokens_per_second: float
    steps: int
    speculative: SpeculativeReport | None = None  # None when the engine does not speculate

    def to_dict(self) -> dict[str, object]:
        """The JSON shape of /v1/stats."""
        return asdict(self)


def engine_stats(
    s: Scheduler, kv: KVCache, layout: KVLayout, speculator: Speculator | None, tokens_per_second: float, num_steps: int
) -> EngineStats:
    names = zip(("full", "window"), (layout.full_layers, layout.window_layers), kv.groups)
    groups = {}
    for i, (name, layers, g) in enumerate(names):
        usage = kv.group_usage(i)
        groups[name] = GroupStats(
            layers=len(layers),
            window=g.window,
            blocks_in_use=TierCounts.of(usage["blocks_in_use"]),
            blocks_referenced=TierCounts.of(usage["blocks_referenced"]),
            blocks_free=TierCounts.of(usage["blocks_free"]),
            block_bytes=layout.block_bytes(i),
        )
    parts = list(groups.values())
    spec = None
    if speculator is not None:
        st = speculator.stats
        spec = SpeculativeReport(
            speculator.config.method,
            st.num_drafts,
            st.num_draft_tokens,
            st.num_accepted_tokens,
            st.acceptance_rate,
            st.mean_acceptance_length,
            list(st.accepted_per_position),
        )
    return EngineStats(
        running=len(s.running),
        waiting=len(s.waiting),
        swapped=len(s.swapped),
        blocks_in_use=sum((g.blocks_in_use for g in parts), TierCounts()),
        blocks_referenced=sum((g.blocks_referenced for g in parts), TierCounts()),
        blocks_free=sum((g.blocks_free for g in parts), TierCounts()),
        kv_groups=groups,
        prefix_hit_rate=s.stats.prefix_hit_rate,
        prompt_tokens=s.stats.num_prompt_tokens,
        cached_prompt_tokens=s.stats.num_cached_tokens,
        computed_prompt_tokens=s.stats.num_computed_prompt_tokens,
        generated_tokens=s.stats.num_generated_tokens,
        preempted_swap=s.stats.num_preempted_swap,
        preempted_recompute=s.stats.num_preempted_recompute,
        long_rope_recomputes=s.stats.num_long_rope_recomputes,
        corrupt_blocks=kv.num_corrupt,
        tokens_per_second=tokens_per_second,
        steps=num_steps,
        speculative=spec,
    )
