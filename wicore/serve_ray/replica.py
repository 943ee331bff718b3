"""The engine deployment: each replica owns one WiCore Engine on the devices Ray gave it.

    ingress (wicore.serve_ray.client) ──handle.generate(EngineCall)──► EngineReplica ──► Engine
                                      ◄── RequestOutput, ..., final ──┘   (a streaming call)

A replica is built exactly as `wicore serve` builds its engine (the same EngineConfig); on GPUs
Ray sets CUDA_VISIBLE_DEVICES for each replica, so `--devices cuda:0` means "the GPU Ray gave
this replica". Every second a thread posts the engine's stats to the application's stats board
(wicore.serve_ray.board).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass

import ray
from ray import serve

from wicore.engine.engine import Engine, EngineConfig
from wicore.errors import WiCoreError
from wicore.serve_ray.board import stats_board
from wicore.types.outputs import Priority, RequestOutput, merge_outputs
from wicore.types.sampling import SamplingParams

log = logging.getLogger("wicore.serve_ray")

REPORT_PERIOD_S = 1.0
# Streamed outputs one ingress passes a second, shared by the replicas: each output is a Ray message
# to the ingress and an SSE event back through Ray Serve's proxy. Measured on one H100 host (Gemma 3
# 1B shape, 64 streams): one message a token held the ingress at ~2,000 tokens/s, whatever the
# number of replicas (docs/PERFORMANCE.md, "Ray Serve on GPUs").
STREAM_MESSAGES_PER_S = 1500.0


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

    def __init__(self, config: EngineConfig, app_name: str, messages_per_s: float = STREAM_MESSAGES_PER_S) -> None:
        self.engine = Engine(config).start()
        self.app_name = app_name
        self.messages_per_s = messages_per_s
        self._streams = 0  # generate calls running
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
        channel = self.engine.outputs(call.request_id)
        loop = asyncio.get_running_loop()
        sent = -math.inf
        self._streams += 1
        try:
            async for out in channel:
                batch = [out]
                if not out.finished:
                    # Keep this replica's messages under its share of what the ingress passes: with
                    # n streams, one message a stream each n / rate seconds, the tokens between merged.
                    # The first token and the end go at once.
                    wait = sent + self._streams / self.messages_per_s - loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)
                    batch += channel.take_ready()
                merged = merge_outputs(batch)
                sent = loop.time()
                finished = merged.finished
                yield merged
                if finished:
                    return
        finally:
            self._streams -= 1
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
