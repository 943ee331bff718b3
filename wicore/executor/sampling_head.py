"""The sampling head (wicore.graph.sampling) as its own session, after the last partition.

    last partition ──► logits (left on its device) ──► greedy tokens ─────────────────────► host
                                 └─ only when a row samples ─► SamplingHead.run ─► draws ──► host

A constrained row's grammar mask goes in with its draw (io.SAMPLING_TOKEN_BITMASK), so it draws here
beside the free rows. A step without one runs a second session of the head, built without that
input: no masks to copy, and no buffer made on the device after the CUDA graphs were captured (all
of an engine's device buffers come before capture: wicore.devices.providers.shared_cuda_arena).

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
    """The head graph on the last partition's device: a session with the grammar-mask input, one without."""

    def __init__(self, vocab_size: int, device: Device, num_threads: int | None = None, token_bitmask: bool = True) -> None:
        """`token_bitmask` False: a head without the mask input, as built before it (tests)."""
        self.device = device
        self.num_words = num_words(vocab_size)
        self._free = self._session(vocab_size, False, num_threads)  # steps without grammars
        self._masked = self._session(vocab_size, True, num_threads) if token_bitmask else None
        self.num_runs = 0  # steps that drew here (a greedy step runs none)

    @property
    def has_token_bitmask(self) -> bool:
        return self._masked is not None

    def _session(self, vocab_size: int, token_bitmask: bool, num_threads: int | None) -> Any:
        ort = onnxruntime()
        model = head_model(vocab_size, token_bitmask).SerializeToString()
        opts = session_options(num_threads, None, [self.device])
        return ort.InferenceSession(model, sess_options=opts, providers=self.device.providers(False))

    def run(self, logits: Any, sampling: SamplingInputs) -> dict[str, Any]:
        """The draws for `logits` (an OrtValue [n, vocab] on the device, n >= the sampling rows:
        a CUDA graph bucket's rows past the batch draw at temperature 1 and go unread)."""
        rows = logits.shape()[0]
        temperature = np.ones(rows, np.float32)
        uniform = np.zeros(rows, np.float32)
        temperature[: len(sampling.temperature)] = sampling.temperature
        uniform[: len(sampling.uniform)] = sampling.uniform
        session = self._free
        if sampling.token_bitmask is not None:
            if self._masked is None:
                raise ValueError("this sampling head takes no grammar masks: constrained rows sample on the host")
            session = self._masked
        binding = session.io_binding()
        binding.bind_ortvalue_input(io.LOGITS, logits)
        binding.bind_cpu_input(io.SAMPLING_TEMPERATURE, temperature)
        binding.bind_cpu_input(io.SAMPLING_UNIFORM, uniform)
        if sampling.token_bitmask is not None:
            binding.bind_cpu_input(io.SAMPLING_TOKEN_BITMASK, sampling.token_bitmask(rows))
        for name in HEAD_OUTPUTS:
            binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
        self.num_runs += 1
        return dict(zip(HEAD_OUTPUTS, binding.get_outputs()))
