"""A step cut in three for async scheduling: what the engine thread prepares, what the worker runs on
the device, and what comes back.

    engine thread   ModelRunner.prepare(rows) ─► PreparedStep    batches built, captured inputs written
    worker thread   ModelRunner.run_device(step, previous) ─► DeviceResult    fed ids in, ONNX Runtime's runs
    engine thread   ModelRunner.finish(step, result) ─► RunResult    tokens sampled on the host, per row

The worker's part is the ONNX Runtime runs (which release the GIL) and a few array copies around
them, so that it seldom waits for the GIL the engine thread holds while it plans the next step.

Fed tokens. A row's sampled token is *fed* when the device run alone decides it: the graph's argmax
of a plain greedy row (its batch reads no logits on the host), or the sampling head's draw of a row
that samples the whole tempered distribution (no grammar). Each fed row of a step gets a slot in the
step's `fed_tokens`; a row of the next step whose input is that token (`ScheduledRow.fed`) names the
slot, and the worker writes the token into the next batch's input ids before its run, on the host:
the sampled ids come back to the host for the engine's accounting anyway, and a step's inputs go to
the device in one copy anyway, so feeding them adds no transfer and no ONNX Runtime run.

    step N      rows  a  b  c          fed_tokens  [ta, tc]       (b samples on the host: not fed)
    step N+1    rows  a' c' d          input ids   [ta, tc, d's]  (a', c': fed from slots 0, 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from wicore.executor.batch import BatchInputs
from wicore.executor.constrained import StepMasks
from wicore.executor.cuda_graphs import Replay
from wicore.executor.graph_io import GraphOutputs, SamplingInputs
from wicore.kv.offload import StagedRun
from wicore.types.step import ScheduledRow


class Draw(Enum):
    """How the sampling head decides a row's token."""

    WHOLE = "whole"  # the whole tempered distribution: the head's inverse-CDF token
    CANDIDATES = "candidates"  # top-k / top-p: the host picks from the head's K candidates
    BEST = "best"  # greedy under a grammar: the head's first candidate, the masked argmax


def _no_ints() -> np.ndarray:
    return np.zeros(0, np.int64)


@dataclass
class PreparedBatch:
    """One graph run of a step: rows of one length, their inputs built."""

    rows: list[ScheduledRow]
    batch: BatchInputs
    logits: bool  # the logits come back to the host
    drawn: dict  # request id -> Draw: the rows the sampling head draws
    images: dict[str, np.ndarray] | None = None
    sampling: SamplingInputs | None = None
    staged: StagedRun | None = None
    replay: Replay | None = None  # the inputs already in a captured decode graph's host buffer
    greedy_ids: frozenset[str] = frozenset()  # rows whose token is the graph's argmax, fed
    # fed rows: their logits rows, and their slots in the step's fed tokens (argmax, then head draws)
    greedy_fed: tuple[np.ndarray, np.ndarray] = field(default_factory=lambda: (_no_ints(), _no_ints()))
    drawn_fed: tuple[np.ndarray, np.ndarray] = field(default_factory=lambda: (_no_ints(), _no_ints()))
    # rows whose input is a token of the step before: their indices here, and that step's slots
    feed_rows: np.ndarray = field(default_factory=_no_ints)
    feed_slots: np.ndarray = field(default_factory=_no_ints)

    def input_ids(self) -> np.ndarray:
        """The [rows, seq] token ids the run reads: the captured graph's host side, or the batch's."""
        return self.replay.input_ids if self.replay is not None else self.batch.input_ids


@dataclass
class PreparedStep:
    """A step's batches, built on the engine thread; `fed`: request id -> slot in the fed tokens."""

    rows: list[ScheduledRow]
    batches: list[PreparedBatch]
    masks: StepMasks
    fed: dict[str, int]


@dataclass(frozen=True)
class DeviceResult:
    """What a step's runs gave: each batch's outputs, the fed rows' tokens by slot, and the seconds
    inside the graphs' runs."""

    outputs: list[GraphOutputs]
    fed_tokens: np.ndarray
    graphs_seconds: float
