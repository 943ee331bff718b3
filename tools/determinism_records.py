"""check_determinism_gpu.py's records and their comparison: per step and request that drew, the
uniform, digests of the logits row and hidden states, the token; which run differs first, and how.

    Record, Run        one row at one step; a run's rows (raw arrays kept in memory, digests dumped)
    first_divergence   the first row where two runs part, by kind (host, model, head, schedule)
    report             what a comparison prints; dump / load: a run's records as JSON
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


def digest(array: Any) -> str:
    """The first 16 hex digits of the sha1 of an array's bytes (float32 rows: bitwise equality)."""
    return hashlib.sha1(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


@dataclass
class Record:
    """One request's row at one step that ran the sampling head."""

    step: int  # the engine's step (counted from 0 in each run)
    request: str
    uniform: float  # float32 as the head took it (0 for a greedy row)
    logits: str  # digest of the row's float32 logits
    hidden: list[str]  # digest of the row's hidden states after each partition but the last
    token: int  # the head's draw (a sampled row) or the graph's argmax (a greedy one)
    head_again: int | None = None  # --rerun-head: the head's draw, run again on the same logits
    relaunched: list[str] | None = None  # --relaunch: digests of logits and hidden states, the step replayed again


@dataclass
class Run:
    records: list[Record] = field(default_factory=list)
    tokens: dict[str, list[int]] = field(default_factory=dict)  # what the engine returned
    rows: dict[tuple[int, str], list[np.ndarray]] = field(default_factory=dict)  # logits, hidden (not dumped)


@dataclass(frozen=True)
class Divergence:
    message: str
    key: tuple[int, str] | None = None  # the record's (step, request)
    array: int | None = None  # which of its rows differ: 0 the logits, 1 + k the hidden states after partition k


def first_divergence(a: Run, b: Run) -> Divergence | None:
    """The first record (by step, then request) where two runs differ, named by kind; None: none."""
    keyed = {(r.step, r.request): r for r in b.records}
    for x in a.records:
        key = (x.step, x.request)
        y = keyed.get(key)
        where = f"step {x.step}, request {x.request}"
        if y is None:
            return Divergence(f"schedule: {where} ran in the first run only")
        tokens = f"; tokens {x.token} and {y.token}"
        if x.uniform != y.uniform:
            return Divergence(f"host: {where}: uniforms differ ({x.uniform!r} against {y.uniform!r})")
        if x.hidden != y.hidden:
            part = next(k for k, (h, g) in enumerate(zip(x.hidden, y.hidden)) if h != g)
            return Divergence(
                f"logits: {where}: hidden states after partition {part} differ (the model's kernels){tokens}", key, 1 + part
            )
        if x.logits != y.logits:
            return Divergence(
                f"logits: {where}: logits differ, hidden states equal (the last partition's kernels){tokens}", key, 0
            )
        if x.token != y.token:
            return Divergence(f"head: {where}: logits equal, tokens differ ({x.token} against {y.token})")
    if len(b.records) != len(a.records):
        return Divergence(f"schedule: {len(a.records)} rows recorded against {len(b.records)}")
    if a.tokens != b.tokens:
        return Divergence("tokens: the engine returned other tokens, every recorded row equal (a row drawn on the host)")
    return None


def head_disagreements(run: Run) -> list[str]:
    """--rerun-head: rows whose head gave another token when run again on the same logits."""
    return [f"step {r.step}, {r.request}" for r in run.records if r.head_again is not None and r.head_again != r.token]


def relaunch_disagreements(run: Run) -> list[str]:
    """--relaunch: rows whose captured step, launched again on the same inputs, gave other logits or hidden states."""
    return [
        f"step {r.step}, {r.request}" for r in run.records if r.relaunched is not None and r.relaunched != [r.logits, *r.hidden]
    ]


def how_far(x: np.ndarray, y: np.ndarray) -> str:
    """How two arrays of one shape differ: how many values, by how much, in units in the last place."""
    x, y = x.ravel(), y.ravel()
    moved = np.flatnonzero(x != y)
    wide = np.abs(x.astype(np.float64) - y.astype(np.float64))
    ints = {2: np.int16, 4: np.int32}.get(x.dtype.itemsize)
    ulps = int(np.abs(x.view(ints).astype(np.int64) - y.view(ints).astype(np.int64)).max()) if ints else -1
    return f"{len(moved)} of {x.size} values differ, max |a - b| {wide.max():.3g}, max {ulps} ulp ({x.dtype})"


def report(a: Run, b: Run, label: str, rows_out: Path | None = None) -> int:
    differ = sorted(k for k in a.tokens if a.tokens[k] != b.tokens.get(k))
    print(f"{label}: requests whose tokens differ: {len(differ)} of {len(a.tokens)} {differ[:12]}")
    keyed = {(r.step, r.request): r for r in b.records}
    moved = [
        r for r in a.records if (o := keyed.get((r.step, r.request))) is not None and (r.logits, r.hidden) != (o.logits, o.hidden)
    ]
    steps = sorted({r.step for r in moved})
    print(f"{label}: rows whose logits or hidden states differ: {len(moved)} of {len(a.records)}, at steps {steps[:20]}")
    found = first_divergence(a, b)
    print(f"{label}: first divergence: {found.message if found else 'no divergence'}")
    if found is not None and found.key in a.rows and found.key in b.rows and found.array is not None:
        x, y = a.rows[found.key][found.array], b.rows[found.key][found.array]
        print(f"{label}: there {how_far(x, y)}")
        if rows_out is not None:
            rows_out.parent.mkdir(parents=True, exist_ok=True)
            np.savez(rows_out, a=x, b=y, step=found.key[0], request=found.key[1])
            print(f"{label}: wrote both rows to {rows_out}")
    return 0 if found is None else 1


def dump(run: Run, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"records": [asdict(r) for r in run.records], "tokens": run.tokens}))


def load(path: Path) -> Run:
    data = json.loads(path.read_text())
    return Run([Record(**r) for r in data["records"]], data["tokens"])
