"""What `Engine.stats()` reports (and /v1/stats, /metrics read): queues, KV blocks, counters."""

from __future__ import annotations

from wicore.hmt.kv_cache import KVCache
from wicore.hmt.tiers import Tier
from wicore.runtime.kv_layout import KVLayout
from wicore.runtime.scheduler import Scheduler
from wicore.runtime.speculative import Speculator


def engine_stats(
    s: Scheduler, kv: KVCache, layout: KVLayout, speculator: Speculator | None, tokens_per_second: float, num_steps: int
) -> dict[str, object]:
    tiers = [t.name.lower() for t in Tier]
    names = zip(("full", "window"), (layout.full_layers, layout.window_layers), kv.groups)
    usage = [kv.group_usage(i) for i in range(len(kv.groups))]
    groups = {
        name: {"layers": len(layers), "window": g.window, **usage[i], "block_bytes": layout.block_bytes(i)}
        for i, (name, layers, g) in enumerate(names)
    }
    return {
        "running": len(s.running),
        "waiting": len(s.waiting),
        "swapped": len(s.swapped),
        **{
            key: {t: sum(u[key][t] for u in usage) for t in tiers}
            for key in ("blocks_in_use", "blocks_referenced", "blocks_free")
        },
        "kv_groups": groups,  # the sums above, per block group (full-attention / sliding layers)
        "prefix_hit_rate": s.stats.prefix_hit_rate,
        "prompt_tokens": s.stats.num_prompt_tokens,
        "cached_prompt_tokens": s.stats.num_cached_tokens,
        "computed_prompt_tokens": s.stats.num_computed_prompt_tokens,
        "generated_tokens": s.stats.num_generated_tokens,
        "preempted_swap": s.stats.num_preempted_swap,
        "preempted_recompute": s.stats.num_preempted_recompute,
        "corrupt_blocks": kv.num_corrupt,
        "tokens_per_second": tokens_per_second,
        "steps": num_steps,
        # speculative decoding (None when off): drafts, draft tokens, accepted tokens, rates
        "speculative": None if speculator is None else {"method": speculator.config.method, **speculator.stats.as_dict()},
    }
