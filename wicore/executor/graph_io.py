"""Plain data between a step and the graphs: what a run returns, and the sampling head's inputs.

`GraphOutputs` holds what came back to the host: logits only when a row needs them on the host,
the graph's greedy choice, the attention mass of an export with statistics, and the sampling
head's draws (wicore.graph.sampling) with the logits left on the device, to be read only for a
row the candidates cannot decide.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wicore.graph import io


@dataclass(frozen=True)
class Draws:
    """The sampling head's outputs (wicore.graph.sampling), one entry per logits row."""

    tokens: np.ndarray  # [num_logits] int64: the inverse CDF of the tempered distribution at the row's uniform
    top_probs: np.ndarray  # [num_logits, K] float32: the K most likely tokens' tempered probabilities
    top_ids: np.ndarray  # [num_logits, K] int64


@dataclass(frozen=True)
class SamplingInputs:
    """The sampling head's inputs: each logits row's temperature (> 0) and uniform draw, and the
    constrained rows' grammar masks.

    `token_bitmask(num_rows)`: the [num_rows, ceil(vocab / 32)] int32 masks (all ones for a free
    row; num_rows >= the step's rows, a CUDA graph bucket's), called by the head only once the
    model has run, so the masks are computed meanwhile (wicore.executor.constrained). None: no
    row of the step has a grammar."""

    temperature: np.ndarray  # [num_logits] float32
    uniform: np.ndarray  # [num_logits] float32
    token_bitmask: Callable[[int], np.ndarray] | None = None

    @classmethod
    def unused(cls, num_logits: int) -> SamplingInputs:
        """Inputs for a step that reads no draws (the head's inputs are required all the same)."""
        return cls(np.ones(num_logits, np.float32), np.zeros(num_logits, np.float32))


@dataclass(frozen=True)
class GraphOutputs:
    logits: np.ndarray | None  # [num_logits, vocab] float32; None when only the greedy tokens were asked for
    greedy_tokens: np.ndarray | None  # [num_logits] int64: argmax of each logits row, when the graph gives it
    attention_mass: np.ndarray | None  # [batch, max_blocks], when the model was exported with it
    draws: Draws | None = None  # when the step passed SamplingInputs
    unread_logits: Any = None  # with draws and no logits: the logits' OrtValue, left where the graph wrote them

    def read_logits(self) -> np.ndarray:
        """The logits on the host: those returned, or a copy of those left on the device."""
        if self.logits is not None:
            return self.logits
        assert self.unread_logits is not None, "a step without draws returns its logits when asked"
        return self.unread_logits.numpy()


def graph_outputs(out: Mapping[str, Any], logits: bool, draws: bool, mass: np.ndarray | None) -> GraphOutputs:
    """The last partition's outputs, by name (values with `.numpy()`: OrtValues, or a bucket's rows),
    as a GraphOutputs: the logits copied to the host only with `logits`; with `draws` the sampling
    head's outputs, and the logits otherwise left unread where the graph wrote them."""
    greedy = out[io.GREEDY_TOKENS].numpy() if io.GREEDY_TOKENS in out else None
    host_logits = out[io.LOGITS].numpy() if logits else None
    if not draws:
        return GraphOutputs(host_logits, greedy, mass)
    found = Draws(*(out[name].numpy() for name in (io.SAMPLED_TOKENS, io.TOP_PROBS, io.TOP_IDS)))
    return GraphOutputs(host_logits, greedy, mass, found, None if logits else out[io.LOGITS])


def join_outputs(parts: Sequence[GraphOutputs]) -> GraphOutputs:
    """The outputs of consecutive micro-batches of one batch (wicore.executor.pipeline) as the
    batch's: every array joined along its rows, logits left on a device read on demand."""
    first = parts[0]

    def cat(get: Callable[[GraphOutputs], Any]) -> Any:
        return None if get(first) is None else np.concatenate([get(p) for p in parts])

    draws = None
    if first.draws is not None:
        draws = Draws(*(np.concatenate([getattr(p.draws, f) for p in parts]) for f in ("tokens", "top_probs", "top_ids")))
    unread = None if first.unread_logits is None else _Joined([p.unread_logits for p in parts])
    return GraphOutputs(cat(lambda p: p.logits), cat(lambda p: p.greedy_tokens), cat(lambda p: p.attention_mass), draws, unread)


@dataclass(frozen=True)
class _Joined:
    """Logits of several micro-batches, each where its graph wrote them: read (`numpy`) as one array."""

    parts: list[Any]

    def numpy(self) -> np.ndarray:
        return np.concatenate([p.numpy() for p in self.parts])
