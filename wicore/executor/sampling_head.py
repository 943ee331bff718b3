"""The sampling head (wicore.graph.sampling) as its own session, after the last partition.

    last partition ──► logits (left on its device) ──► greedy tokens ─────────────────────► host
                                 └─ only when a row samples ─► SamplingHead.run ─► draws ──► host

A constrained row's grammar mask goes in with its draw (io.SAMPLING_TOKEN_BITMASK), so it draws here
beside the free rows; a step without one binds all-ones masks kept on the device (no copy).

A greedy step never runs it, so its TopK over the vocabulary costs nothing there; a sampling step
runs it on the logits where the partition (or a replayed CUDA graph) wrote them, uncaptured: its
cost is the head's kernels and a few launches, not a copy of [rows, vocab] logits to the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wicore.devices.providers import Device, onnxruntime, session_options
from wicore.executor.graph_io import SamplingInputs
from wicore.graph import io
from wicore.graph.sampling import head_model
from wicore.structured.bitmask import num_words

HEAD_OUTPUTS = (io.SAMPLED_TOKENS, io.TOP_PROBS, io.TOP_IDS)


class SamplingHead:
    """One session of the head graph on the last partition's device."""

    def __init__(self, vocab_size: int, device: Device, num_threads: int | None = None, token_bitmask: bool = True) -> None:
        """`token_bitmask` False: a head without the mask input, as built before it (tests)."""
        ort = onnxruntime()
        model = head_model(vocab_size, token_bitmask).SerializeToString()
        opts = session_options(num_threads, None, [device])
        self.session = ort.InferenceSession(model, sess_options=opts, providers=device.providers(False))
        self.device = device
        self.num_words = num_words(vocab_size)
        self.has_token_bitmask = io.SAMPLING_TOKEN_BITMASK in {i.name for i in self.session.get_inputs()}
        self._all_allowed: dict[int, Any] = {}  # rows -> an all-ones mask OrtValue on the device
        self.num_runs = 0  # steps that drew here (a greedy step runs none)

    def run(self, logits: Any, sampling: SamplingInputs) -> dict[str, Any]:
        """The draws for `logits` (an OrtValue [n, vocab] on the device, n >= the sampling rows:
        a CUDA graph bucket's rows past the batch draw at temperature 1 and go unread)."""
        rows = logits.shape()[0]
        temperature = np.ones(rows, np.float32)
        uniform = np.zeros(rows, np.float32)
        temperature[: len(sampling.temperature)] = sampling.temperature
        uniform[: len(sampling.uniform)] = sampling.uniform
        binding = self.session.io_binding()
        binding.bind_ortvalue_input(io.LOGITS, logits)
        binding.bind_cpu_input(io.SAMPLING_TEMPERATURE, temperature)
        binding.bind_cpu_input(io.SAMPLING_UNIFORM, uniform)
        if self.has_token_bitmask:
            if sampling.token_bitmask is None:
                binding.bind_ortvalue_input(io.SAMPLING_TOKEN_BITMASK, self._free_rows(rows))
            else:
                binding.bind_cpu_input(io.SAMPLING_TOKEN_BITMASK, sampling.token_bitmask(rows))
        elif sampling.token_bitmask is not None:
            raise ValueError("this sampling head takes no grammar masks: constrained rows sample on the host")
        for name in HEAD_OUTPUTS:
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding)
        self.num_runs += 1
        return dict(zip(HEAD_OUTPUTS, binding.get_outputs()))

    def _free_rows(self, rows: int) -> Any:
        """All-ones masks for `rows` rows, made on the device once per row count."""
        value = self._all_allowed.get(rows)
        if value is None:
            ones = np.full((rows, self.num_words), -1, np.int32)
            value = self._all_allowed[rows] = onnxruntime().OrtValue.ortvalue_from_numpy(ones, *self.device.ort_device)
        return value
