"""The stats board: each engine replica posts its `Engine.stats_json()` here every second; each ingress
reads them all for /v1/stats and /metrics, per replica and summed, and by reading says it is alive
and how many requests it has taken (so /v1/stats also lists the ingress replicas).

A Ray Serve handle sends each call to one replica of its choosing, so it cannot ask every
replica; the replicas report instead. A replica that stops reporting (it died, or was scaled
down) drops off the board after `max_age_s`. The board is a named actor per application,
created by whichever process asks first, and made again the same way if its owner dies.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import ray

# Counters and gauges summed over replicas; the rest of a replica's stats is only shown per replica.
SUMMED = (
    "running",
    "waiting",
    "swapped",
    "prompt_tokens",
    "cached_prompt_tokens",
    "computed_prompt_tokens",
    "generated_tokens",
    "preempted_swap",
    "preempted_recompute",
    "long_rope_recomputes",
    "corrupt_blocks",
    "tokens_per_second",
    "steps",
)
PER_TIER = ("blocks_in_use", "blocks_referenced", "blocks_free")


def board_name(app_name: str) -> str:
    return f"wicore-stats-board:{app_name}"


@ray.remote(num_cpus=0, max_restarts=0)
class StatsBoard:
    def __init__(self) -> None:
        self._reports: dict[str, tuple[float, dict[str, Any]]] = {}
        self._ingresses: dict[str, tuple[float, int]] = {}  # ingress -> (when it last read, requests taken)

    def post(self, report: dict[str, Any]) -> None:
        """`report`: {"replica", "pid", "node", "stats"} of one replica, as of now."""
        self._reports[report["replica"]] = (time.monotonic(), report)

    def read(self, max_age_s: float) -> list[dict[str, Any]]:
        """The reports fresher than `max_age_s`, ordered by replica (older ones are dropped)."""
        now = time.monotonic()
        self._reports = {k: (t, r) for k, (t, r) in self._reports.items() if now - t <= max_age_s}
        return [r for _, (_, r) in sorted(self._reports.items())]

    def read_as(self, ingress: str, requests: int, max_age_s: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """`read`, by an ingress that has taken `requests` requests so far; also the ingresses that
        read within `max_age_s`, ordered by name: [{"ingress", "requests"}]."""
        now = time.monotonic()
        self._ingresses[ingress] = (now, requests)
        self._ingresses = {k: (t, n) for k, (t, n) in self._ingresses.items() if now - t <= max_age_s}
        ingresses = [{"ingress": k, "requests": n} for k, (_, n) in sorted(self._ingresses.items())]
        return self.read(max_age_s), ingresses


def stats_board(app_name: str) -> Any:
    """The application's board (an actor handle), made if nobody has yet."""
    return StatsBoard.options(name=board_name(app_name), get_if_exists=True).remote()  # type: ignore[attr-defined]  # an actor class


def combine(reports: Sequence[dict[str, Any]], ingresses: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """One stats object for all replicas: `Engine.stats_json()`'s keys summed (the prefix hit rate
    recomputed from the summed tokens), under "replicas" each replica's own report, and under
    "ingresses" the ingress replicas alive."""
    stats = [r["stats"] for r in reports]
    total: dict[str, Any] = {key: sum(s[key] for s in stats) for key in SUMMED}
    for key in PER_TIER:
        total[key] = {tier: sum(s[key][tier] for s in stats) for tier in ("device", "host", "nvme")}
    prompt = total["prompt_tokens"]
    total["prefix_hit_rate"] = total["cached_prompt_tokens"] / prompt if prompt else 0.0
    total["speculative"] = None
    total["num_replicas"] = len(reports)
    total["replicas"] = [dict(r) for r in reports]
    total["ingresses"] = [dict(i) for i in ingresses]
    return total
