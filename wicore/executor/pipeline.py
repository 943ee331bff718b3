"""Micro-batched steps over partitions on several devices: every card busy at once (pipeline parallelism).

Run whole, a step's batch goes through the partitions one after the other, and each device waits
while the others compute. Cut into micro-batches of rows, partition i works on micro-batch m while
partition i + 1 works on micro-batch m - 1, each partition on a worker thread of its own (ONNX
Runtime releases the GIL while it runs):

    cuda:0  │ mb 0 │ mb 1 │ mb 2 │ mb 3 │
    cuda:1         │ mb 0 │ mb 1 │ mb 2 │ mb 3 │       (M + S - 1 slots of a 1/M step, S devices)

This pays where a step's time grows with its rows: prefill chunks, whose matmuls are compute
bound. A decode step reads every weight once whatever its rows, so cutting it would read them M
times: only steps of at least `tokens` tokens a micro-batch are cut (a decode step of 256 rows is
not, at the default of 512). Rows are independent in every graph (their KV blocks are their own;
padding writes only to the sink block), so the micro-batches' outputs, joined, are the batch's.

With steps in flight over groups of requests (wicore.engine.groups), every step goes through the
workers, whole or cut: each partition then runs one step at a time, in the order their inputs
became ready, while the other partitions run the other groups' steps.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from wicore.executor.batch import BatchInputs
from wicore.executor.graph_io import GraphOutputs, SamplingInputs, graph_outputs, join_outputs
from wicore.graph import io

if TYPE_CHECKING:
    from wicore.executor.graphs import ModelGraphs

# A stage's result: the partition's outputs, and the attention mass summed over the partitions so far
Staged = tuple[dict[str, Any], np.ndarray | None]

DEFAULT_TOKENS = 512  # the fewest tokens a micro-batch; decode steps (a token a row) stay whole below it


class Pipeline:
    """A worker thread per partition, fed micro-batches in order."""

    def __init__(self, graphs: ModelGraphs, tokens: int = DEFAULT_TOKENS) -> None:
        if tokens < 0:
            raise ValueError(f"a micro-batch needs at least 1 token (0: steps run whole), got {tokens}")
        self.graphs = graphs
        self.tokens = tokens
        self.num_steps = 0  # steps run as micro-batches
        self.workers = [ThreadPoolExecutor(1, thread_name_prefix=f"wicore-part{i}") for i in range(len(graphs.sessions))]

    def spans(self, batch: BatchInputs) -> list[tuple[int, int]]:
        """The micro-batches' row ranges: as many as hold `tokens` tokens each, at most one a row."""
        rows = batch.input_ids.shape[0]
        count = min(rows, batch.input_ids.size // self.tokens) if self.tokens else 1
        bounds = np.linspace(0, rows, max(count, 1) + 1).round().astype(int)
        return [(int(lo), int(hi)) for lo, hi in itertools.pairwise(bounds.tolist())]

    def run(
        self, batch: BatchInputs, spans: list[tuple[int, int]], want_logits: bool, sampling: SamplingInputs | None
    ) -> GraphOutputs:
        self.num_steps += 1
        done = []
        first_logit = 0
        step_masks = None
        if sampling is not None and sampling.token_bitmask is not None:  # made once, for every logits row
            step_masks = functools.cache(functools.partial(sampling.token_bitmask, len(batch.logits_indices)))
        for lo, hi in spans:
            part = batch.rows(lo, hi)
            n = len(part.logits_indices)
            draws = None if sampling is None else _rows(sampling, first_logit, n, step_masks)
            first_logit += n
            done.append((self._submit(0, part, None, want_logits, draws), draws))
        return join_outputs([self._outputs(stage.result(), want_logits, draws) for stage, draws in done])

    def run_in_order(self, stages: list[Callable[[], None]]) -> None:
        """Stage i on partition i's worker, queued once stage i - 1 is done (as `_submit` queues a
        micro-batch's partitions); returns when the last is done, raises what a stage raised.
        A captured decode step (wicore.executor.cuda_graphs) runs its partitions' replays this way."""
        done: Future[None] = Future()

        def submit(i: int) -> None:
            stage = self.workers[i].submit(stages[i])
            if i + 1 < len(stages):
                stage.add_done_callback(lambda ran: _settle(done, ran) if ran.exception() is not None else submit(i + 1))
            else:
                stage.add_done_callback(functools.partial(_settle, done))

        submit(0)
        done.result()

    def _submit(
        self,
        i: int,
        part: BatchInputs,
        before: Future[Staged] | None,
        want_logits: bool,
        sampling: SamplingInputs | None,
        last: Future[Staged] | None = None,
    ) -> Future[Staged]:
        """Queue partition i's run of `part` on its worker, and partition i + 1's once it is done: a
        partition's queue holds only runs whose inputs are ready, in the order they became so (with
        several steps in flight, one step's later stage never waits behind another's earlier one).
        Returns the last partition's result."""
        last = last if last is not None else Future()
        stage = self.workers[i].submit(self._stage, i, part, before, want_logits, sampling)
        if i + 1 < len(self.workers):
            stage.add_done_callback(lambda done: self._submit(i + 1, part, done, want_logits, sampling, last))
        else:
            stage.add_done_callback(functools.partial(_settle, last))
        return last

    def _stage(
        self,
        i: int,
        part: BatchInputs,
        before: Future[Staged] | None,
        want_logits: bool,
        sampling: SamplingInputs | None,
    ) -> Staged:
        """Partition i on one micro-batch, once partition i - 1 has run it: its outputs and the
        attention mass summed over the partitions so far."""
        out, mass = before.result() if before is not None else ({}, None)
        out = self.graphs.run_partition(i, part, out.get(io.HIDDEN_STATES_OUT), want_logits, sampling)
        if io.ATTENTION_MASS in out:
            here = out[io.ATTENTION_MASS].numpy()
            mass = here if mass is None else mass + here
        head = self.graphs.head
        if i == len(self.workers) - 1 and sampling is not None and head is not None:
            out |= head.run(out[io.LOGITS], sampling)
        return out, mass

    @staticmethod
    def _outputs(result: Staged, want_logits: bool, sampling: SamplingInputs | None) -> GraphOutputs:
        out, mass = result
        return graph_outputs(out, want_logits, sampling is not None, mass)

    def close(self) -> None:
        for worker in self.workers:
            worker.shutdown(wait=True)


def _rows(sampling: SamplingInputs, first: int, count: int, step_masks: Callable[[], np.ndarray] | None) -> SamplingInputs:
    """The sampling inputs of logits rows first .. first + count - 1; `step_masks`: the step's masks, all rows."""
    sub = None
    if step_masks is not None:

        def sub(rows: int) -> np.ndarray:
            return step_masks()[first : first + rows]

    return SamplingInputs(sampling.temperature[first : first + count], sampling.uniform[first : first + count], sub)


def _settle(future: Future[Any], done: Future[Any]) -> None:
    """`future` takes `done`'s result or exception."""
    error = done.exception()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(done.result())
