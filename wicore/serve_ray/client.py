"""The engine the ingress's app talks to (wicore.api.serving.ServingEngine): every request runs on
an engine replica, reached through a Ray Serve DeploymentHandle.

    app.add_request ─► handle.generate.remote(EngineCall)   (routing starts: wicore.serve_ray.router)
    app.outputs     ─► async for over that streaming call   (RequestOutput, ..., finished)
    app.abort       ─► the call cancelled (the replica aborts the request in its engine)

What differs from an Engine in the same process:
- `add_request` only starts the call, so a refusal by the replica's engine (context too long,
  queue full) comes out of `outputs`: for a streamed request, as the stream's error event.
- A replica that dies ends its requests with a 503 `replica_died` error at once; Ray replaces it.
- No output-constraint compiler here (`grammars` is None): the replica compiles on arrival, so a
  bad schema comes out of `outputs` like the other refusals.
- No images yet: the image encoder would have to run in the ingress or travel with the call.
- `stats_json()` is the board's last reading (wicore.serve_ray.board), refreshed every second.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

from ray.exceptions import RayActorError, TaskCancelledError
from ray.serve.exceptions import DeploymentUnavailableError, ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle, DeploymentResponseGenerator

from wicore.api.errors import APIError, from_wicore
from wicore.errors import RequestError, WiCoreError
from wicore.inputs.tokenizer import Tokenizer
from wicore.serve_ray.board import combine, stats_board
from wicore.serve_ray.replica import EngineCall, EngineInfo
from wicore.types.images import ImageInput
from wicore.types.outputs import Priority, RequestOutput
from wicore.types.sampling import SamplingParams

log = logging.getLogger("wicore.serve_ray")

NO_IMAGES = "images are not served through Ray Serve yet: run one `wicore serve` for a model that takes images"
STATS_PERIOD_S = 1.0
STATS_MAX_AGE_S = 3.0  # a replica silent this long is gone from the stats


class RemoteEngine:
    def __init__(self, handle: DeploymentHandle, info: EngineInfo, tokenizer: Tokenizer | None, app_name: str) -> None:
        self._handle = handle.options(method_name="generate", stream=True)
        self._info = info
        self._tokenizer = tokenizer
        self._app_name = app_name
        self._calls: dict[str, DeploymentResponseGenerator] = {}
        self._aborted: set[str] = set()
        self._stats: dict[str, Any] = combine([])
        self._name = f"ingress-{uuid.uuid4().hex[:12]}"  # on the stats board
        self._requests = 0  # taken so far
        self._refresher: asyncio.Task | None = None

    # -- what the app reads ----------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            raise RequestError("this model was exported without a tokenizer: send token ids")
        return self._tokenizer

    @property
    def vision(self) -> None:
        return None

    @property
    def grammars(self) -> None:
        """None: a constraint is compiled by the replica's engine, whose compiler (and its index of
        the vocabulary) lives in that process; a schema that does not compile is its refusal there."""
        return None

    @property
    def max_sequence_tokens(self) -> int:
        return self._info.max_sequence_tokens

    @property
    def max_waiting(self) -> int:
        return self._info.max_waiting

    def expand_images(self, text: str) -> str:
        raise RequestError(NO_IMAGES)

    # -- requests --------------------------------------------------------------------
    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        priority: Priority | str = Priority.NORMAL,
        deadline: float | None = None,
        request_id: str | None = None,
        images: Sequence[ImageInput] = (),
    ) -> str:
        """ServingEngine.add_request, less what a replica cannot take yet (images, deadlines: a
        RequestError now); the replica's own refusals come out of `outputs` (module docstring)."""
        if images:
            raise RequestError(NO_IMAGES)
        if deadline is not None:
            raise RequestError("deadlines are not passed to engine replicas yet")
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        request_id = request_id or f"req-{uuid.uuid4().hex}"
        if request_id in self._calls:
            raise RequestError(f"request id {request_id!r} is already in use")
        call = EngineCall(request_id, ids, params, Priority.parse(priority))
        self._calls[request_id] = cast(DeploymentResponseGenerator, self._handle.remote(call))  # stream=True
        self._requests += 1
        return request_id

    def abort(self, request_id: str) -> None:
        call = self._calls.get(request_id)
        if call is not None:
            self._aborted.add(request_id)
            call.cancel()

    def cancel(self, request_id: str) -> None:
        self.abort(request_id)
        self._calls.pop(request_id, None)
        self._aborted.discard(request_id)

    async def outputs(self, request_id: str) -> AsyncIterator[RequestOutput]:
        call = self._calls.get(request_id)
        if call is None:
            raise RequestError(f"unknown request id {request_id!r} (or its outputs were already claimed)")
        finished = False
        try:
            async for item in call:
                if isinstance(item, WiCoreError):  # the replica's engine refused the request (a 400 or 503)
                    raise from_wicore(item)
                finished = item.finished
                yield item
        except (TaskCancelledError, asyncio.CancelledError):
            if request_id not in self._aborted:
                raise
            finished = True
            yield RequestOutput(request_id, [], True, "abort")
        except (RayActorError, ReplicaUnavailableError) as exc:
            log.warning("request %s: its engine replica died: %s", request_id, exc)
            raise APIError(
                503,
                f"request {request_id}: the engine replica running it died; it is being replaced: retry the request",
                code="replica_died",
                headers={"Retry-After": "1"},
            ) from None
        except DeploymentUnavailableError as exc:
            raise APIError(503, f"no engine replica is available: {exc.message}", code="unavailable") from None
        finally:
            if not finished:
                call.cancel()  # the reader left early: the replica aborts the request
            self._calls.pop(request_id, None)
            self._aborted.discard(request_id)

    # -- stats -----------------------------------------------------------------------
    def stats_json(self) -> dict[str, object]:
        """All replicas' stats, summed and per replica, as of the last reading (at most ~1 s old)."""
        return self._stats

    async def start(self) -> RemoteEngine:
        """Read the stats board now and then every second (call on the ingress's event loop)."""
        await self._read_board()
        self._refresher = asyncio.get_running_loop().create_task(self._refresh())
        return self

    def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()

    async def _read_board(self) -> None:
        reports, ingresses = await stats_board(self._app_name).read_as.remote(self._name, self._requests, STATS_MAX_AGE_S)
        self._stats = combine(reports, ingresses)

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(STATS_PERIOD_S)
            try:
                await self._read_board()
            except Exception:  # the board died with its owner and is being made again: next time
                log.debug("could not read the stats board", exc_info=True)
