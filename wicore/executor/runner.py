"""The model runner: scheduled rows in, sampled tokens (or per-row failures) out.

    rows ──► by length ──► build_batch ──► ModelGraphs.run ──► logits per row ──► Sampler ──► RunResult
                                                          └──► greedy tokens (argmax in the graph) ──┘

When every row of a batch decodes greedily (no penalties, no logprobs, no prompt logits) only the
graph's argmax comes back to the host, not [rows, vocab] float32 logits (1 MB a row for Gemma 3).
An export with the sampling head (wicore/graph/sampling.py) draws tempered rows in the graph too:
a row that keeps the whole distribution passes its uniform draw in and reads its token back, a
top-k / top-p row picks from the head's 64 candidates, and the logits are read only for a row
they cannot decide (a nucleus past the candidates) or that needs them (penalties, logprobs).

A model with a vision partition also gets, per batch, the embeddings of the image tokens its
rows run and where their images end (wicore.executor.vision); each image of the step is encoded
once, or taken from the encoder's cache.

A verification row (a decode with draft tokens, wicore.engine.speculative) gets logits at each of
its positions and keeps the drafts its request's sampler agrees with.

A constrained row (a request with a grammar, wicore.executor.constrained) has its grammar's mask
computed on a thread while the graphs run. Where the sampling head takes masks it draws there like
a free row (a greedy one takes the head's best candidate: the masked argmax), its mask bound beside
the draws, so a batch with constrained rows reads back no logits; else (an older head, penalties,
logprobs, a verification row) it samples on the host from its logits and mask. The graph's argmax
never picks its token (it sees the unmasked logits).

Rows of the same length run as one batch, so nothing is padded: the decode rows (one token
each) together, prefill chunks of equal length (prompts of one size, or chunks cut at the
prefill chunk) together, any other chunk alone. The runner keeps each request's Sampler (its
seeded generator and penalty counts) from the request's first row until the scheduler says it
ended; rows carry only plain data.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
from collections.abc import Mapping, Sequence

import numpy as np

from wicore.executor.batch import build_batch
from wicore.executor.constrained import NO_MASKS, MaskWorker, StepMasks
from wicore.executor.graph_io import Draws, GraphOutputs, SamplingInputs
from wicore.executor.graphs import ModelGraphs
from wicore.executor.prepared import DeviceResult, Draw, PreparedBatch, PreparedStep
from wicore.executor.sampler import MIN_TEMPERATURE, Sampler, verify_row
from wicore.executor.vision import VisionEncoder
from wicore.graph.sampling import TOP_CANDIDATES
from wicore.kv.offload import KVOffloader
from wicore.structured.bitmask import is_allowed, num_words
from wicore.types.sampling import Sample, SamplingParams
from wicore.types.step import RunResult, ScheduledRow


class ModelRunner:
    """Rows in, sampled tokens out, over the model's graphs (see the module docstring)."""

    def __init__(
        self, graphs: ModelGraphs, block_size: int, vision: VisionEncoder | None = None, offloader: KVOffloader | None = None
    ) -> None:
        self.graphs = graphs
        self.block_size = block_size
        self.vision = vision
        self.offloader = offloader  # stages the blocks of offloaded rows (wicore.kv.offload)
        self._samplers: dict[str, Sampler] = {}
        self.masks = MaskWorker()

    def execute(self, rows: Sequence[ScheduledRow], ended_request_ids: Sequence[str] = ()) -> RunResult:
        """Run `rows` (any mix of prefill chunks and decodes) and sample where a row asks.

        A row whose sampling fails gets no sample and its traceback in `failed`; the other rows
        go on. `ended_request_ids` are requests the scheduler finished: their samplers go.
        Async scheduling calls the three parts on two threads (wicore.executor.prepared)."""
        return self.execute_prepared(self.prepare(rows, ended_request_ids))

    def execute_prepared(self, step: PreparedStep) -> RunResult:
        """Run a prepared step (`prepare`, `repeat`) and sample where a row asks."""
        try:
            device = self.run_device(step, feeds=False)
        except BaseException:
            step.masks.wait()
            raise
        return self.finish(step, device)

    def prepare(
        self, rows: Sequence[ScheduledRow], ended_request_ids: Sequence[str] = (), feeds: Mapping[str, int] | None = None
    ) -> PreparedStep:
        """The step's batches, built (on the engine thread); `feeds`: request id -> slot in the fed
        tokens of the step before, for each row whose input is one (`ScheduledRow.fed`). The
        constrained rows' masks start computing now, while the graphs run."""
        for request_id in ended_request_ids:
            self._samplers.pop(request_id, None)
        masks = self.masks.start(rows)  # the constrained rows' masks, computed while the graphs run
        try:
            return self._prepare(rows, masks, feeds or {})
        except BaseException:
            masks.wait()
            raise

    def _prepare(self, rows: Sequence[ScheduledRow], masks: StepMasks, feeds: Mapping[str, int]) -> PreparedStep:
        by_length: dict[int, list[ScheduledRow]] = {}
        for row in rows:
            by_length.setdefault(len(row.token_ids), []).append(row)
        vision = self.vision
        features = vision.features(span.image for row in rows for span in row.images) if vision is not None else {}
        step = PreparedStep(list(rows), [], masks, {})
        for length, group in by_length.items():
            images = vision.decoder_inputs(group, length, features) if vision is not None else None
            drawn = self._drawn_rows(group)
            sampling = self._sampling_inputs(group, drawn, masks) if drawn else None
            logits = any(_needs_logits(row) and row.request_id not in drawn for row in group)
            batch_rows, staged = group, None
            if any(row.full_locations for row in group):  # a row is offloaded: every row's blocks are staged
                if self.offloader is None:
                    raise ValueError("an offloaded row, but the engine has no KV stages (kv_offload_tokens)")
                staged = self.offloader.run(group, self.block_size)
                batch_rows = staged.plan.rows
            batch = build_batch(batch_rows, self.block_size)
            replay = self.graphs.prepare_replay(batch, sampling) if staged is None and not images else None
            prepared = PreparedBatch(group, batch, logits, drawn, images, sampling, staged, replay)
            self._plan_feeds(prepared, step.fed, feeds)
            step.batches.append(prepared)
        return step

    def can_repeat(self, step: PreparedStep) -> bool:
        """Whether `repeat` can give the step after `step` from it: one batch of plain decode rows (a token
        and a logit each, sampled; no draft, image, grammar, KV staging, fed input, penalty, logit bias,
        logprobs or prompt logits: their state changes with every token or comes from elsewhere)."""
        if len(step.batches) != 1:
            return False
        prepared = step.batches[0]
        if prepared.staged is not None or prepared.images or len(prepared.feed_rows):
            return False
        return all(_repeatable(row) for row in prepared.rows)

    def repeat(self, step: PreparedStep, rows: list[ScheduledRow]) -> PreparedStep:
        """The step after `step` (one `can_repeat` accepts), whose rows are its rows one token further
        (`rows`, in the same order, as Scheduler.repeat_decodes gives them; a row whose tables changed
        is a new one, with new tables): the batch advanced by a position, the sampling head's draws
        drawn again, what depends only on the rows' parameters kept (which rows are drawn, fed, read
        back). The step `prepare(rows)` would give."""
        prepared = step.batches[0]
        changed = [i for i, (row, last) in enumerate(zip(rows, prepared.rows)) if row.block_table is not last.block_table]
        batch = prepared.batch.next_decode(rows, self.block_size, changed)
        if batch is None:  # a table's width changes
            batch = build_batch(rows, self.block_size)
        sampling = self._sampling_inputs(rows, prepared.drawn, NO_MASKS) if prepared.drawn else None
        replay = self.graphs.prepare_replay(batch, sampling)
        again = dataclasses.replace(prepared, rows=rows, batch=batch, images=None, sampling=sampling, staged=None, replay=replay)
        return PreparedStep(rows, [again], NO_MASKS, step.fed)

    def _plan_feeds(self, prepared: PreparedBatch, fed: dict[str, int], feeds: Mapping[str, int]) -> None:
        """Which of the batch's rows are fed from the step before (their input ids), and which feed the
        step after (their tokens decided on the device): slots in `fed` (wicore.executor.prepared)."""
        greedy: list[tuple[int, int]] = []
        drawn: list[tuple[int, int]] = []
        takes: list[tuple[int, int]] = []
        offset = 0
        for i, row in enumerate(prepared.rows):
            offset += row.num_logits
            if row.fed:
                if row.request_id not in feeds or len(row.token_ids) != 1:
                    raise ValueError(f"row of {row.request_id} takes a token no step in flight feeds")
                takes.append((i, feeds[row.request_id]))
            if not row.needs_sample or row.draft_ids:
                continue
            draw = prepared.drawn.get(row.request_id)
            if draw is None and not prepared.logits and self.graphs.has_greedy_tokens:
                greedy.append((offset - 1, fed.setdefault(row.request_id, len(fed))))
            elif draw is Draw.WHOLE and row.grammar is None:
                drawn.append((offset - 1, fed.setdefault(row.request_id, len(fed))))
        prepared.greedy_ids = frozenset(
            r.request_id for r in prepared.rows if r.request_id in fed and r.request_id not in prepared.drawn
        )
        prepared.greedy_fed, prepared.drawn_fed = _pairs(greedy), _pairs(drawn)
        prepared.feed_rows, prepared.feed_slots = _pairs(takes)

    def run_device(self, step: PreparedStep, previous: DeviceResult | None = None, feeds: bool = True) -> DeviceResult:
        """The step's graphs (on the worker under async scheduling): the fed rows' input ids taken
        from `previous` (the step before's result), the runs, and this step's fed tokens (none without
        `feeds`: no step takes them, as in a synchronous step; two NumPy gathers fewer, issue 37)."""
        outputs = []
        seconds = 0.0
        fed_tokens = np.zeros(len(step.fed) if feeds else 0, np.int64)
        for prepared in step.batches:
            if len(prepared.feed_rows):
                if previous is None:
                    raise ValueError("a step with fed rows, but no step before it")
                prepared.input_ids()[prepared.feed_rows, 0] = previous.fed_tokens[prepared.feed_slots]
            started = time.perf_counter()
            out = self.graphs.run(
                prepared.batch, prepared.logits, prepared.images, prepared.sampling, prepared.staged, prepared.replay
            )
            seconds += time.perf_counter() - started
            outputs.append(out)
            if not feeds:
                continue
            rows, slots = prepared.greedy_fed
            if len(rows):
                assert out.greedy_tokens is not None
                fed_tokens[slots] = out.greedy_tokens[rows]
            rows, slots = prepared.drawn_fed
            if len(rows):
                assert out.draws is not None
                fed_tokens[slots] = out.draws.tokens[rows]
        return DeviceResult(outputs, fed_tokens, seconds)

    def finish(self, step: PreparedStep, device: DeviceResult) -> RunResult:
        """The step's tokens from its runs' outputs (on the engine thread): host sampling where a row
        needs it, each row's logits and attention mass."""
        result = RunResult(graphs_seconds=device.graphs_seconds)
        try:
            for prepared, out in zip(step.batches, device.outputs):
                self._collect(prepared, out, result, step.masks)
        finally:  # no mask thread outlives the step (the scheduler advances the grammars next)
            step.masks.wait()
        return result

    def _collect(self, prepared: PreparedBatch, out: GraphOutputs, result: RunResult, masks: StepMasks) -> None:
        drawn = prepared.drawn
        host_logits = out.logits
        greedy = out.greedy_tokens.tolist() if out.greedy_tokens is not None else None  # one conversion, not one a row
        offset = 0
        for i, row in enumerate(prepared.rows):
            offset += row.num_logits
            if out.attention_mass is not None:
                result.attention[row.request_id] = out.attention_mass[i, : len(row.block_ids)]
            if row.draft_ids:
                self._verify(row, host_logits, out.greedy_tokens, offset, result, masks)
                continue
            if row.request_id in prepared.greedy_ids:  # the token the next step was fed
                assert greedy is not None
                result.sampled[row.request_id] = Sample(greedy[offset - 1])
                continue
            if row.request_id in drawn:
                assert out.draws is not None
                if self._from_draws(row, out.draws, offset - 1, drawn[row.request_id], result, masks):
                    continue
                if host_logits is None:  # the candidates did not hold the nucleus: the logits decide
                    host_logits = out.read_logits()
            if host_logits is None:  # every row samples greedily: the graph's argmax is the token
                if row.needs_sample:
                    assert greedy is not None
                    result.sampled[row.request_id] = Sample(greedy[offset - 1])
            else:
                row_logits = host_logits[offset - row.num_logits : offset]
                if row.num_logits and out.logits is not None:
                    result.logits[row.request_id] = row_logits  # a view: no copy for a decode row
                if row.needs_sample:
                    self._sample(row, row_logits[-1], result, masks)

    def _drawn_rows(self, group: Sequence[ScheduledRow]) -> dict[str, Draw]:
        """The rows whose token the graph's sampling head draws (request id -> how)."""
        if not self.graphs.has_sampling_head:
            return {}
        drawn = {}
        for row in group:
            if row.needs_sample and not row.draft_ids:
                draw = _head_draw(row.params, row.grammar is not None, self.graphs.can_mask_in_head)
                if draw is not None:
                    drawn[row.request_id] = draw
        return drawn

    def _sampling_inputs(self, group: Sequence[ScheduledRow], drawn: dict[str, Draw], masks: StepMasks) -> SamplingInputs:
        num_logits = sum(row.num_logits for row in group)
        temperature = np.ones(num_logits, np.float32)
        uniform = np.zeros(num_logits, np.float32)
        constrained = []  # (logits row, request id) of the rows drawn under a grammar
        offset = 0
        for row in group:
            offset += row.num_logits
            draw = drawn.get(row.request_id)
            if draw is None:
                continue
            if row.grammar is not None:
                constrained.append((offset - 1, row.request_id))
            if draw is not Draw.BEST:
                temperature[offset - 1] = max(row.params.temperature, MIN_TEMPERATURE)
            if draw is Draw.WHOLE:
                uniform[offset - 1] = self._sampler(row).uniform()
        if not constrained:
            return SamplingInputs(temperature, uniform)
        words = num_words(self.graphs.manifest.config.vocab_size)
        return SamplingInputs(temperature, uniform, lambda num_rows: masks.bitmask(constrained, num_rows, words))

    def _from_draws(self, row: ScheduledRow, draws: Draws, index: int, draw: Draw, result: RunResult, masks: StepMasks) -> bool:
        """The row's token from the sampling head's draws, into `result`; False when they cannot
        decide it (the candidates do not hold the nucleus, or a rounding at the edge of a block
        landed a constrained row on a token its mask refuses: then the host samples it)."""
        try:
            if draw is Draw.WHOLE:
                token: int | None = int(draws.tokens[index])
            elif draw is Draw.BEST:
                token = int(draws.top_ids[index, 0])
            else:
                token = self._sampler(row).from_candidates(draws.top_probs[index], draws.top_ids[index])
            if token is not None and row.grammar is not None:
                mask = masks.get(row.request_id)
                assert mask is not None
                token = token if is_allowed(mask[0], token) else None
        except Exception:  # this request's sampling failed: it fails alone
            result.failed[row.request_id] = traceback.format_exc()
            return True
        if token is not None:
            result.sampled[row.request_id] = Sample(token)
        return token is not None

    def _verify(
        self,
        row: ScheduledRow,
        logits: np.ndarray | None,
        greedy: np.ndarray | None,
        end: int,
        result: RunResult,
        masks: StepMasks,
    ) -> None:
        """A verification row's tokens (wicore.engine.speculative), from its logits, or from the
        graph's argmax when every row of the batch decodes greedily."""
        start = end - row.num_logits
        try:
            result.verified[row.request_id] = verify_row(
                row.draft_ids,
                self._sampler(row),
                None if logits is None else logits[start:end],
                None if greedy is None else greedy[start:end],
                masks.get(row.request_id),
            )
        except Exception:  # this request's sampling failed: it fails alone
            result.failed[row.request_id] = traceback.format_exc()

    def _sampler(self, row: ScheduledRow) -> Sampler:
        sampler = self._samplers.get(row.request_id)
        if sampler is None:
            sampler = self._samplers[row.request_id] = Sampler(row.params, row.prompt_ids)
        return sampler

    def _sample(self, row: ScheduledRow, logits: np.ndarray, result: RunResult, masks: StepMasks) -> None:
        try:
            mask = masks.get(row.request_id)
            result.sampled[row.request_id] = self._sampler(row).sample(logits, None if mask is None else mask[0])
        except Exception:  # this request's sampling failed: it fails alone
            result.failed[row.request_id] = traceback.format_exc()


def _head_draw(p: SamplingParams, constrained: bool, can_mask: bool) -> Draw | None:
    """How the sampling head draws a row, or None where it cannot: a tempered draw, top-k within
    the head's candidates, a greedy one only under a grammar (a free greedy row is the graph's
    argmax), a grammar only where the head takes masks (`can_mask`); nothing that needs the logits
    on the host (penalties, logit bias, min-p, logprobs, prompt logits: the host sampler applies those)."""
    host_only = p.changes_logits or p.min_p > 0.0 or p.prompt_logits or p.logprobs is not None
    if host_only or p.top_k > TOP_CANDIDATES or (constrained and not can_mask):
        return None
    if p.is_greedy:
        return Draw.BEST if constrained else None
    return Draw.WHOLE if p.top_k == 0 and p.top_p == 1.0 else Draw.CANDIDATES


def _repeatable(row: ScheduledRow) -> bool:
    """A plain decode row (ModelRunner.can_repeat)."""
    p = row.params
    plain = not p.changes_logits and p.logprobs is None and not p.prompt_logits and p.structured is None
    one = len(row.token_ids) == 1 and row.num_logits == 1 and row.needs_sample
    return plain and one and not (row.draft_ids or row.images or row.full_locations or row.fed or row.grammar)


def _needs_logits(row: ScheduledRow) -> bool:
    """Whether the row needs its logits on the host: prompt logits, or a sampler that is more
    than the graph's argmax (temperature, penalties, logit bias, logprobs, a grammar's mask)."""
    p = row.params
    plain_argmax = p.is_greedy and not p.changes_logits and p.logprobs is None and p.structured is None
    return p.prompt_logits or (row.needs_sample and not plain_argmax)


def _pairs(pairs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """[(a, b), ...] as two int64 arrays, a's and b's: two NumPy calls (a step makes three such pairs, most
    of them empty or of one row; six calls each cost a tiny model's step ~10 us, issue 37)."""
    if not pairs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    firsts, seconds = zip(*pairs)
    return np.array(firsts, np.int64), np.array(seconds, np.int64)
