"""The engine the child process runs, and what it tells the API process about it.

`SteppedCore` is what the child's loop asks of a core: `EngineCore` is one, and so is the
stand-in of tools/serve_overhead.py (fixed-cost steps, to measure the server on any machine).
`start_core` is what `wicore serve --engine-process on` hands the child to build its core.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from wicore.engine.core import EngineCore
from wicore.engine.engine import EngineConfig
from wicore.engine.request import Request
from wicore.engine.stats import EngineStats
from wicore.engine_process.frames import EngineInfo
from wicore.types.images import ImageInput
from wicore.types.outputs import Priority, RequestOutput
from wicore.types.sampling import SamplingParams


class SteppedCore(Protocol):
    """What the child's loop (wicore.engine_process.child) calls, as EngineCore names it."""

    @property
    def has_work(self) -> bool: ...

    @property
    def num_steps(self) -> int: ...

    @property
    def num_waiting(self) -> int: ...

    def make_request(
        self,
        ids: list[int],
        params: SamplingParams,
        request_id: str,
        priority: Priority = Priority.NORMAL,
        deadline: float | None = None,
        images: Sequence[ImageInput] = (),
    ) -> Request: ...

    def add(self, request: Request) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def step(self) -> list[RequestOutput]: ...

    def stats(self) -> EngineStats: ...

    def close(self) -> None: ...


def describe(core: EngineCore) -> str:
    """The engine half of `wicore serve`'s startup line: the export, where it runs, the KV tiers."""
    m, free = core.manifest, core.stats().blocks_free
    devices = ", ".join(dict.fromkeys(d.label for d in core.devices))
    return (
        f"{m.config.num_layers} layers, {m.dtype} {m.op_flavour}, {m.attention} attention; "
        f"on {devices}, {core.config.num_threads or 'all'} CPU threads; KV blocks of {core.layout.block_size} "
        f"tokens free: {free.device} device, {free.host} host, {free.nvme} NVMe; "
        f"CUDA graphs {'on' if core.config.cuda_graphs else 'off'}"
    )


def start_core(config: EngineConfig) -> tuple[EngineCore, EngineInfo]:
    """The child's core for `config`, and what the API process needs of it: the admission check
    and where images go in a prompt (the image encoder itself, its session, stays in the child)."""
    core = EngineCore(config)
    core.grammars.warm_up()  # the first constrained request need not wait for the vocabulary
    info = EngineInfo(
        core.limits.check,
        core.limits.vision,
        core.max_sequence_tokens,
        core.scheduler.config.max_waiting,
        describe(core),
        core.stats(),
    )
    return core, info
