"""The engine deployment: each replica owns one WiCore Engine on the devices Ray gave it.

    ingress (wicore.serve_ray.client) ──handle.generate(EngineCall)──► EngineReplica ──► Engine
                                      ◄── RequestOutput, ..., final ──┘   (a streaming call)

A replica is built exactly as `wicore serve` builds its engine (the same EngineConfig); on GPUs
Ray sets CUDA_VISIBLE_DEVICES for each replica, so `--devices cuda:0` means "the GPU Ray gave
this replica". Every second a thread posts the engine's stats to the application's stats board
(wicore.serve_ray.board).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

import ray
from ray import serve

from wicore.engine.engine import Engine, EngineConfig
from wicore.errors import WiCoreError
from wicore.serve_ray.board import stats_board
from wicore.types.outputs import Priority, RequestOutput
from wicore.types.sampling import SamplingParams

log = logging.getLogger("wicore.serve_ray")

REPORT_PERIOD_S = 1.0


@dataclass(frozen=True)
class EngineCall:
    """One choice to run: what `Engine.add_request` takes. The router reads `prompt_ids`."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    priority: Priority = Priority.NORMAL


@dataclass(frozen=True)
class EngineInfo:
    """What the ingress must know of the engines (every replica runs the same config)."""

    max_sequence_tokens: int
    max_waiting: int
    block_size: int


class EngineReplica:
    """The engine deployment's class (made a deployment by wicore.serve_ray.app)."""

    def __init__(self, config: EngineConfig, app_name: str) -> None:
        self.engine = Engine(config).start()
        self.app_name = app_name
        context = serve.get_replica_context()
        self.identity = {
            "replica": context.replica_id.unique_id,
            "pid": os.getpid(),
            "node": ray.get_runtime_context().get_node_id(),
        }
        self._stop = threading.Event()
        self._reporter = threading.Thread(target=self._report, name="wicore-stats-report", daemon=True)
        self._reporter.start()
        log.info("engine replica %s (pid %d) ready", self.identity["replica"], os.getpid())

    def info(self) -> EngineInfo:
        return EngineInfo(self.engine.max_sequence_tokens, self.engine.max_waiting, self.engine.layout.block_size)

    async def generate(self, call: EngineCall) -> AsyncIterator[RequestOutput | WiCoreError]:
        """The request's outputs, ending with a finished one; or, if the engine refuses it (context
        too long, queue full), that error as the only item, for the ingress to raise as it is.

        When the caller goes away (its stream is cancelled), the request is aborted."""
        try:
            self.engine.add_request(call.prompt_ids, call.params, call.priority, request_id=call.request_id)
        except WiCoreError as exc:
            yield exc
            return
        finished = False
        try:
            async for out in self.engine.outputs(call.request_id):
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.engine.abort(call.request_id)

    def _report(self) -> None:
        board, posted = None, None
        while not self._stop.wait(REPORT_PERIOD_S):
            try:
                if posted is not None:
                    ray.get(posted, timeout=REPORT_PERIOD_S)  # raises if the board died with its owner
                board = board or stats_board(self.app_name)
                posted = board.post.remote({**self.identity, "stats": self.engine.stats_json()})
            except Exception:  # make the board again next time
                log.warning("could not post stats to the board; retrying", exc_info=True)
                board, posted = None, None

    def __del__(self) -> None:
        """Ray Serve calls this when it stops the replica (scale down, redeploy, shutdown)."""
        self._stop.set()
        self.engine.stop()
