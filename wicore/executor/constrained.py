"""Constrained decoding in the engine: grammars compiled at admission, masks computed beside the step.

    add_request ──► Grammars.start(params) ──► Request.grammar (GrammarState, or None)
    schedule    ──► rows carry it; a draft is cut at the first token it refuses
    execute     ──► MaskWorker.start(rows) ─┐ (its own thread: llguidance drops the GIL)
                    graphs.run(...)         │ the model runs meanwhile
                    sampler(logits, mask) ◄─┘ waits only if the masks are not done yet
    update      ──► GrammarState.accept(token) for each new token; finished grammar -> "stop"

A verification row gets one mask per position: the current one, then one after each draft prefix.
A constrained row draws in the sampling head where the head takes masks (wicore.graph.sampling,
`StepMasks.bitmask` packs the step's masks for it once the model has run), else on the host, from
its logits and mask; a verification row and one that needs the logits (penalties, logprobs) always
on the host.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from wicore.errors import RequestError, StructuredOutputError
from wicore.inputs.tokenizer import Tokenizer
from wicore.structured.compiler import GrammarCompiler, GrammarLimits, vocabulary
from wicore.structured.spec import StructuredOutput
from wicore.structured.state import GrammarState
from wicore.types.sampling import SamplingParams
from wicore.types.step import ScheduledRow


class Grammars:
    """The engine's grammar compiler, built on the first constrained request: its vocabulary bridge
    takes 3-12 s for Gemma 3's 262K-token tokenizer on 2 busy cores (docs/PERFORMANCE.md), so a
    server starts building it in the background at startup (`warm_up`) and the first constrained
    request waits only for what is left."""

    def __init__(
        self,
        tokenizer: Callable[[], Tokenizer],
        vocab_size: int,
        eos_token_ids: Sequence[int],
        limits: GrammarLimits | None = None,
    ) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.limits = limits
        self._compiler: GrammarCompiler | None = None
        self._lock = threading.Lock()

    def start(self, params: SamplingParams) -> GrammarState | None:
        """A fresh grammar state for a constrained request (None for any other); raises
        StructuredOutputError when the constraint cannot be compiled, or the model has no tokenizer."""
        return None if params.structured is None else self.state(params.structured)

    def state(self, spec: StructuredOutput) -> GrammarState:
        """A fresh state of `spec` (compiled now unless cached): `start`, or, discarding the state,
        a compile ahead of queuing (the API does it off its event loop)."""
        try:
            compiler = self.compiler
        except RequestError as exc:  # no tokenizer: no vocabulary to constrain
            raise StructuredOutputError(
                f"{spec.field}: structured output needs the model's tokenizer ({exc})", spec.field
            ) from exc
        return compiler.start(spec)

    def warm_up(self) -> None:
        """Build the compiler on a thread of its own now (a model without a tokenizer: nothing)."""
        threading.Thread(target=self._try_build, name="wicore-grammar-vocabulary", daemon=True).start()

    def _try_build(self) -> None:
        try:
            self.compiler  # noqa: B018  (built and kept)
        except Exception:  # no tokenizer: constrained requests are refused when they come
            pass

    @property
    def compiler(self) -> GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                vocab = vocabulary(self._tokenizer().to_json(), self.vocab_size, self.eos_token_ids)
                self._compiler = GrammarCompiler(vocab, self.vocab_size, self.limits)
            return self._compiler


@dataclass
class MaskStats:
    """How the mask thread kept up: steps with constrained rows, and how long sampling waited for
    their masks after the graphs had run (0 when the masks were ready first)."""

    num_steps: int = 0
    num_waits: int = 0  # steps whose sampling found the masks not yet done
    wait_seconds: float = 0.0


class StepMasks:
    """The masks of one step's constrained rows (request id -> [positions, words] int32),
    being computed; `get` waits for them."""

    def __init__(self, future: Future[dict[str, np.ndarray]] | None, stats: MaskStats | None = None) -> None:
        self._future = future
        self._stats = stats

    def get(self, request_id: str) -> np.ndarray | None:
        if self._future is None:
            return None
        if self._stats is not None:  # the first look of the step: did the masks make it in time?
            stats, self._stats = self._stats, None
            if not self._future.done():
                started = time.perf_counter()
                self._future.exception()
                stats.num_waits += 1
                stats.wait_seconds += time.perf_counter() - started
        return self._future.result().get(request_id)

    def bitmask(self, rows: Sequence[tuple[int, str]], num_rows: int, num_words: int) -> np.ndarray:
        """The sampling head's masks: [num_rows, num_words] int32, all ones but at each (logits row,
        request id) of `rows`, that request's current mask (waited for)."""
        out = np.full((num_rows, num_words), -1, np.int32)
        for index, request_id in rows:
            mask = self.get(request_id)
            if mask is None:
                raise ValueError(f"request {request_id} has no mask this step")
            out[index] = mask[0]
        return out

    def wait(self) -> None:
        if self._future is not None:
            self._future.exception()  # done, whether it raised or not


NO_MASKS = StepMasks(None)


class MaskWorker:
    """Computes a step's masks on one thread of its own, started before the step's graphs run."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self.stats = MaskStats()

    def start(self, rows: Sequence[ScheduledRow]) -> StepMasks:
        wanted = [row for row in rows if row.grammar is not None and row.needs_sample]
        if not wanted:
            return NO_MASKS
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="wicore-masks")
        self.stats.num_steps += 1
        return StepMasks(self._pool.submit(_masks, wanted), self.stats)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def _masks(rows: list[ScheduledRow]) -> dict[str, np.ndarray]:
    out = {}
    for row in rows:
        assert row.grammar is not None
        out[row.request_id] = row.grammar.masks(row.draft_ids)
    return out
