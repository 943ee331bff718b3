"""The stress run's report (tools/stress.py): outcomes, figures, the checks that decide its exit code, the table.

A `Report` holds what one run of the load measured (each request's result, the server's RSS and /v1/stats
samples, the greedy probe before and after); `Shutdown` the second run cut by SIGTERM. `checks()` are
what stress.py's exit code reads; `table()` the Markdown it prints.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from benchlib import percentile
from stress_clients import CUT, RequestResult
from stress_server import tiers_full_at

MIB = 1024 * 1024


@dataclass
class Shutdown:
    """The second run of the load, cut by SIGTERM (--sigterm-under-load)."""

    results: list[RequestResult]
    sigterm_s: float  # from the second run's start
    exit_code: int | None
    exit_s: float | None  # from SIGTERM to the process's exit
    grace_s: float

    def outcomes(self) -> dict[str, int]:
        return dict(sorted(Counter(r.outcome for r in self.results).items()))

    def checks(self) -> dict[str, bool]:
        return {
            "under SIGTERM every stream ended: finished, dropped on purpose, or cut with its 503 event": set(self.outcomes())
            <= {"ok", "disconnected", CUT},
            f"exit 0 within the grace ({self.grace_s:g} s + 10 s) after SIGTERM": self.exit_code == 0
            and self.exit_s is not None
            and self.exit_s <= self.grace_s + 10,
        }


@dataclass
class Report:
    results: list[RequestResult]
    wall_s: float
    stats_before: dict  # after the first probe, before the clients
    stats_drained: dict | None  # once the clients' requests drained (None: the server went away)
    stats_final: dict | None  # after the second probe too: what the checks read
    drain_s: float
    rss: list[tuple[float, int]]
    probe: tuple[str, str] | None  # greedy text before and after
    server: dict = field(default_factory=dict)  # pid, url, spawned, exit code, log, error lines, gone
    stats_series: list = field(default_factory=list)  # StatsSampler.samples
    shutdown: Shutdown | None = None

    def outcomes(self) -> Counter[str]:
        return Counter(r.outcome for r in self.results)

    def errors(self) -> dict[str, int]:
        return {k: n for k, n in sorted(self.outcomes().items()) if k not in ("ok", "disconnected")}

    def checks(self) -> dict[str, bool]:
        final = self.stats_final
        checks = {"the server answered to the end": not self.server.get("gone"), "no unexpected errors": not self.errors()}
        checks["drained: 0 running, 0 waiting"] = final is not None and final["running"] == 0 and final["waiting"] == 0
        checks["0 referenced blocks in every tier"] = final is not None and not any(final["blocks_referenced"].values())
        if self.probe is not None:
            checks["same greedy text before and after"] = self.probe[0] == self.probe[1]
        if self.shutdown is not None:
            checks.update(self.shutdown.checks())
        elif self.server.get("spawned"):
            checks["spawned server exited 0 on SIGTERM"] = self.server.get("exit_code") == 0
        return checks

    def rss_at(self, t: float | None) -> int | None:
        """The first RSS sample at or after `t` seconds (the samplers start together, near enough)."""
        if t is None:
            return None
        return next((b for s, b in self.rss if s >= t), None)

    def figures(self) -> dict[str, object]:
        ok = [r for r in self.results if r.outcome == "ok"]
        ttfts = [r.ttft_s for r in self.results if r.ttft_s is not None and r.outcome in ("ok", "disconnected")]
        latencies = [r.latency_s for r in ok]
        num_tokens = sum(r.num_tokens for r in self.results)
        span = max((r.started_s + r.latency_s for r in self.results), default=0.0) - min(
            (r.started_s for r in self.results), default=0.0
        )
        drained = self.stats_drained
        server_tokens = None if drained is None else drained["generated_tokens"] - self.stats_before["generated_tokens"]
        rss = [b for _, b in self.rss]
        full_s = tiers_full_at(self.stats_series)
        rss_full = self.rss_at(full_s)
        return {
            "num_requests": len(self.results),
            "outcomes": dict(sorted(self.outcomes().items())),
            "num_planned_disconnects": sum(r.plan.disconnect_after is not None for r in self.results),
            "errors": self.errors(),
            "error_samples": {k: next(r.error for r in self.results if r.outcome == k) for k in self.errors()},
            **{f"ttft_p{q}_s": finite(percentile(ttfts, q)) for q in (50, 90, 99)},
            **{f"latency_p{q}_s": finite(percentile(latencies, q)) for q in (50, 90, 99)},
            "num_client_tokens": num_tokens,
            "num_server_tokens": server_tokens,
            "client_tokens_per_s": num_tokens / span if span > 0 else 0.0,
            "server_tokens_per_s": (server_tokens or 0) / span if span > 0 else 0.0,
            "wall_s": self.wall_s,
            "rss_start_bytes": rss[0] if rss else None,
            "rss_peak_bytes": max(rss) if rss else None,
            "rss_end_bytes": rss[-1] if rss else None,
            "tiers_90pct_full_s": full_s,  # every tier that has blocks at least 90% in use
            "rss_at_tiers_full_bytes": rss_full,
            "rss_growth_after_tiers_full_bytes": None if rss_full is None or not rss else rss[-1] - rss_full,
        }


def finite(value: float) -> float | None:
    """None for NaN (the percentile of no values), which JSON cannot hold."""
    return None if math.isnan(value) else value


def seconds(value: object) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def table(report: Report) -> str:
    f = report.figures()
    final = report.stats_final or {"running": "?", "waiting": "?", "swapped": "?", "blocks_referenced": {}}
    outcomes = ", ".join(f"{k} {n}" for k, n in f["outcomes"].items())  # type: ignore[attr-defined]
    rss = (
        "n/a"
        if f["rss_start_bytes"] is None
        else f"start {f['rss_start_bytes'] / MIB:.0f}, peak {f['rss_peak_bytes'] / MIB:.0f}, end {f['rss_end_bytes'] / MIB:.0f} MiB "
        f"({len(report.rss)} samples)"
    )
    referenced = ", ".join(f"{tier} {n}" for tier, n in final["blocks_referenced"].items()) or "?"
    if f["tiers_90pct_full_s"] is not None and f["rss_at_tiers_full_bytes"] is not None:
        rss += (
            f"; every tier 90% full at {f['tiers_90pct_full_s']:.0f} s, RSS then {f['rss_at_tiers_full_bytes'] / MIB:.0f} MiB, "
            f"{f['rss_growth_after_tiers_full_bytes'] / MIB:+.1f} MiB after"
        )
    rows = [
        ("requests", f"{f['num_requests']} ({outcomes}); {f['num_planned_disconnects']} planned drops"),
        ("errors", ", ".join(f"{k}: {n}" for k, n in f["errors"].items()) or "none"),  # type: ignore[attr-defined]
        ("TTFT p50 / p90 / p99", " / ".join(seconds(f[f"ttft_p{q}_s"]) for q in (50, 90, 99)) + " s"),
        ("latency p50 / p90 / p99", " / ".join(seconds(f[f"latency_p{q}_s"]) for q in (50, 90, 99)) + " s"),
        (
            "generated tok/s",
            f"{f['client_tokens_per_s']:.1f} received ({f['num_client_tokens']} tokens), "
            f"{f['server_tokens_per_s']:.1f} computed by the server ({f['num_server_tokens']})",
        ),
        ("wall", f"{f['wall_s']:.1f} s"),
        ("server RSS", rss),
        (
            "final /v1/stats",
            f"running {final['running']}, waiting {final['waiting']}, swapped {final['swapped']}; "
            f"blocks_referenced {referenced} (after {report.drain_s:.1f} s)",
        ),
    ]
    if report.probe is not None:
        rows.append(("greedy probe", "same text" if report.probe[0] == report.probe[1] else f"CHANGED: {report.probe!r}"))
    if report.server.get("gone"):
        rows.append(("server", f"WENT AWAY: {report.server['gone']}"))
    if report.shutdown is not None:
        down = report.shutdown
        ended = ", ".join(f"{k} {n}" for k, n in down.outcomes().items())
        exited = "did not exit" if down.exit_s is None else f"exit {down.exit_code} {down.exit_s:.1f} s after SIGTERM"
        rows.append(("SIGTERM under load", f"at {down.sigterm_s:.0f} s: {len(down.results)} requests ({ended}); {exited}"))
    for name, ok in report.checks().items():
        rows.append(("check", f"{'pass' if ok else 'FAIL'}: {name}"))
    return "\n".join(["| figure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)])
