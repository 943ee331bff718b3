"""The model runner: scheduled rows in, sampled tokens (or per-row failures) out.

    rows ──► by length ──► build_batch ──► ModelGraphs.run ──► logits per row ──► Sampler ──► RunResult
                                                          └──► greedy tokens (argmax in the graph) ──┘

When every row of a batch decodes greedily (no penalties, no logprobs, no prompt logits) only the
graph's argmax comes back to the host, not [rows, vocab] float32 logits (1 MB a row for Gemma 3).

A model with a vision partition also gets, per batch, the embeddings of the image tokens its
rows run and where their images end (wicore.runtime.vision); each image of the step is encoded
once, or taken from the encoder's cache.

Rows of the same length run as one batch, so nothing is padded: the decode rows (one token
each) together, prefill chunks of equal length (prompts of one size, or chunks cut at the
prefill chunk) together, any other chunk alone. The runner keeps each request's Sampler (its
seeded generator and penalty counts) from the request's first row until the scheduler says it
ended; rows carry only plain data.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence

import numpy as np

from wicore.runtime.batch import build_batch
from wicore.runtime.graphs import ModelGraphs
from wicore.runtime.sampler import Sample, Sampler
from wicore.runtime.step import RunResult, ScheduledRow
from wicore.runtime.vision import VisionEncoder


class ModelRunner:
    """Rows in, sampled tokens out, over the model's graphs (see the module docstring)."""

    def __init__(self, graphs: ModelGraphs, block_size: int, vision: VisionEncoder | None = None) -> None:
        self.graphs = graphs
        self.block_size = block_size
        self.vision = vision
        self._samplers: dict[str, Sampler] = {}

    def execute(self, rows: Sequence[ScheduledRow], ended_request_ids: Sequence[str] = ()) -> RunResult:
        """Run `rows` (any mix of prefill chunks and decodes) and sample where a row asks.

        A row whose sampling fails gets no sample and its traceback in `failed`; the other rows
        go on. `ended_request_ids` are requests the scheduler finished: their samplers go."""
        for request_id in ended_request_ids:
            self._samplers.pop(request_id, None)
        result = RunResult()
        by_length: dict[int, list[ScheduledRow]] = {}
        for row in rows:
            by_length.setdefault(len(row.token_ids), []).append(row)
        vision = self.vision
        features = vision.features(span.image for row in rows for span in row.images) if vision is not None else {}
        for length, group in by_length.items():
            images = vision.decoder_inputs(group, length, features) if vision is not None else None
            out = self.graphs.run(build_batch(group, self.block_size), logits=any(map(_needs_logits, group)), images=images)
            offset = 0
            for i, row in enumerate(group):
                offset += row.num_logits
                if out.logits is None:  # every row samples greedily: the graph's argmax is the token
                    if row.needs_sample:
                        assert out.greedy_tokens is not None
                        result.sampled[row.request_id] = Sample(int(out.greedy_tokens[offset - 1]))
                else:
                    logits = out.logits[offset - row.num_logits : offset]
                    if row.num_logits:
                        result.logits[row.request_id] = logits  # a view: no copy for a decode row
                    if row.needs_sample:
                        self._sample(row, logits[-1], result)
                if out.attention_mass is not None:
                    result.attention[row.request_id] = out.attention_mass[i, : len(row.block_ids)]
        return result

    def _sample(self, row: ScheduledRow, logits: np.ndarray, result: RunResult) -> None:
        sampler = self._samplers.get(row.request_id)
        if sampler is None:
            sampler = self._samplers[row.request_id] = Sampler(row.params)
        try:
            result.sampled[row.request_id] = sampler.sample(logits)
        except Exception:  # this request's sampling failed: it fails alone
            result.failed[row.request_id] = traceback.format_exc()


def _needs_logits(row: ScheduledRow) -> bool:
    """Whether the row needs its logits on the host: prompt logits, or a sampler that is more
    than an argmax (temperature, penalties, logprobs)."""
    p = row.params
    return p.prompt_logits or (row.needs_sample and not (p.is_greedy and not p.has_penalties and p.logprobs is None))
