"""Hidden states handed from one card to the next between the partitions of a captured decode step
(wicore.executor.cuda_graphs), when the model is split over two CUDA devices (only with
`--cuda-graphs on` or WICORE_SPLIT_CUDA_GRAPHS set, wicore.executor.graphs: one run on two H200s so far).

A session captures only its own device's work, so each partition replays its graph on its card, the
step's inputs copied to each card, and the hidden states copied between the buffers bound on the two
cards: `handoff` "device" by a one-node session on the next card (wicore.devices.micrographs.handoff_graph:
ONNX Runtime copies an input bound on another device), "host" through a NumPy array. ONNX Runtime
makes that copy when the input is bound (IOBinding::BindInput), not when the session runs, so the
handoff binds the source again before each run: bound once, every step's copy repeated the bind-time
contents, and cuda:1 decoded stale hidden states (the wrong tokens of the first runs on two H200s,
docs/PERFORMANCE.md):

    cuda:0  replay part-00 ──► hidden [rows, 1, H] ──copy──► cuda:1  hidden ──► replay part-01 ──► tokens
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable

HANDOFFS = ("device", "host")  # how hidden states cross between cards: a handoff session, or through host memory
CUDNN_SDPA_ENV = "ORT_ENABLE_CUDNN_FLASH_ATTENTION"  # read by ONNX Runtime's attention kernels as a session makes them

log = logging.getLogger(__name__)


def cudnn_sdpa_off_for_steps_in_flight() -> bool:
    """Turn ONNX Runtime's cuDNN paged SDPA off for the sessions made after this call, unless the
    environment already chooses: a model split over two cards with steps in flight and CUDA graphs
    failed at its first step with it on, in ORT's PagedAttention on cuda:0 ("cuCtxPushCurrent ...
    invalid device context", the 27B at 62 layers over two H200s, 2026-11-29), and ran with it off,
    every token equal to the whole-step split's (docs/PERFORMANCE.md). The setting is the process's:
    sessions made later in it decode on ORT's other kernels too. True where this call turned it off."""
    if CUDNN_SDPA_ENV in os.environ:
        return False
    os.environ[CUDNN_SDPA_ENV] = "0"
    log.warning(
        "a model split over several cards with steps in flight and CUDA graphs: %s=0 (cuDNN's paged SDPA fails there)",
        CUDNN_SDPA_ENV,
    )
    return True


def handoff_session(graphs, partition: int) -> object:
    """A session on partition + 1's device of ModelGraphs `graphs` that copies partition `partition`'s
    hidden states there."""
    from onnx import TensorProto

    from wicore.devices.micrographs import handoff_graph
    from wicore.devices.providers import onnxruntime, session_options

    device = graphs.devices[partition + 1]
    model = handoff_graph(TensorProto.FLOAT, ("rows", 1, graphs.manifest.config.hidden_size)).SerializeToString()
    return onnxruntime().InferenceSession(model, sess_options=session_options(1, devices=[device]), providers=device.providers())


def card_handoff(session: object | None, source: object, target: object) -> Callable[[], None]:
    """What copies `source` into `target` (device buffers of one shape on two cards) each step: by
    `session` (handoff_session's), or through the host where there is none (a copy to the host and one
    back: 2 x rows x hidden x 4 bytes)."""
    if session is None:
        return functools.partial(_through_host, source, target)
    return _Handoff(session, source, target)


class _Handoff:
    """target = source by a handoff session on the target's card that `source` is bound to again
    before each run: a binding made once would hand on the bind-time contents at every step."""

    def __init__(self, session: object, source: object, target: object) -> None:
        self.session = session
        self.source = source
        self.binding = session.io_binding()  # type: ignore[attr-defined]
        self.binding.bind_ortvalue_output("x_out", target)

    def __call__(self) -> None:
        self.binding.bind_ortvalue_input("x", self.source)  # the copy to the target's card, now
        self.session.run_with_iobinding(self.binding)  # type: ignore[attr-defined]


def _through_host(source: object, target: object) -> None:
    """target = source, two device buffers of one shape, through a NumPy array."""
    target.update_inplace(source.numpy())  # type: ignore[attr-defined]
