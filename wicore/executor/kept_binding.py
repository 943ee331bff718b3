"""A CPU partition's IO binding kept from one greedy decode step to the next.

A tiny model's decode step spent ~0.1 ms of its 1.3-2 ms on the CPU making the same binding again
(docs/PERFORMANCE.md, issue 37, 2026-11-29 07:33): a new IOBinding, each layer's key and value
buffers bound as inputs and as in-place outputs, the greedy tokens' output, and `get_outputs`
wrapping every bound output (the KV buffers too) in Python objects, each step on caches the head's
weights had just flushed. Where a partition runs on the CPU and the step reads only its greedy
tokens, the binding of the step before is reused:

    step's key: (num_logits, the KV buffers' OrtValues) ──► as the kept binding's? ──► inputs written in place
                                                          └─ no: a new binding, the KV buffers and the
                                                             greedy tokens' array bound once
    run ──► the greedy tokens, written by the graph into the kept array ──► copied out

The graph reads the same inputs and buffers as through a fresh binding and writes the tokens
into an array of ours instead of one ONNX Runtime allocates: the same tokens
(tests/executor/test_kept_binding.py). The kept binding holds the buffers it bound, so an engine
that replaces them (another KVBuffers) gets a new binding, never a stale one. One binding a
partition: the partition's runs must not overlap (ModelGraphs keeps this path to the engine's
own sequential runs, without a pipeline of workers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wicore.graph import io


@dataclass(frozen=True)
class HostTokens:
    """Greedy tokens copied out of a kept binding's array, read as an OrtValue is (`numpy()`)."""

    tokens: np.ndarray

    def numpy(self) -> np.ndarray:
        return self.tokens


@dataclass(frozen=True)
class KeptBinding:
    binding: Any  # onnxruntime.IOBinding
    buffers: tuple[Any, ...]  # the KV OrtValues bound, held: compared by identity
    greedy: np.ndarray  # [num_logits] int64, where the graph writes its greedy tokens
    ort: Any
    inputs: dict[str, np.ndarray] = field(default_factory=dict)  # bound, by name: the graph reads them in place
    sources: dict[str, np.ndarray] = field(default_factory=dict)  # the arrays their values came from, held

    def bind_input(self, name: str, array: np.ndarray) -> None:
        """`array`'s values as input `name`: nothing to do where they came from this very array last step
        (a steady decode step keeps its block tables and logits rows: BatchInputs.next_decode; a batch's
        arrays are never written once bound), else written into the array bound last step where it has
        the same shape and type (a copy of a few integers), else a copy of it bound in its place."""
        if self.sources.get(name) is array:
            return
        self.sources[name] = array
        bound = self.inputs.get(name)
        if bound is not None and bound.shape == array.shape and bound.dtype == array.dtype:
            np.copyto(bound, array)
            return
        bound = self.inputs[name] = np.array(array, order="C")
        self.binding.bind_ortvalue_input(name, self.ort.OrtValue.ortvalue_from_numpy(bound))

    def matches(self, num_logits: int, buffers: Sequence[Any]) -> bool:
        if len(self.greedy) != num_logits:
            return False
        return self.buffers is buffers or (
            len(self.buffers) == len(buffers) and all(a is b for a, b in zip(self.buffers, buffers))
        )


class KeptBindings:
    """One kept binding a partition, made anew when the step's key changes (`binding`)."""

    def __init__(self, ort: Any) -> None:
        self._ort = ort
        self._kept: dict[int, KeptBinding] = {}

    def binding(
        self, partition: int, session: Any, num_logits: int, buffers: Sequence[Any], bind_kv: Callable[[Any], None]
    ) -> KeptBinding:
        """Partition's binding for a step of `num_logits` rows over `buffers` (its layers' KV
        OrtValues in bind_kv's order): the kept one where both are as before, else a new one
        with `bind_kv(binding)` done and the greedy tokens' output bound to an array of ours."""
        kept = self._kept.get(partition)
        if kept is not None and kept.matches(num_logits, buffers):
            return kept
        binding = session.io_binding()
        bind_kv(binding)
        greedy = np.zeros(num_logits, np.int64)
        binding.bind_ortvalue_output(io.GREEDY_TOKENS, self._ort.OrtValue.ortvalue_from_numpy(greedy))
        kept = self._kept[partition] = KeptBinding(binding, tuple(buffers), greedy, self._ort)
        return kept

    def get(self, partition: int) -> KeptBinding | None:
        """The partition's kept binding, if a step made one."""
        return self._kept.get(partition)

    def clear(self) -> None:
        self._kept.clear()
