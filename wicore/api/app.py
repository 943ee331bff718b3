"""The Starlette app: OpenAI routes in front of one running engine (wicore.api.serving.ServingEngine).

request ─► guard (auth, rate limit) ─► read body (size limit) ─► schemas.parse_*
        ─► images (wicore.api.images) ─► prompt ids (chat template / tokenizer)
        ─► one run_choice per choice ─► JSON body, or SSE chunks (streaming.event_stream)
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Hashable
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from wicore.api import compat, websocket
from wicore.api.auth import Authenticator, client_address
from wicore.api.connections import InFlight, connection_of, until_disconnect
from wicore.api.docs_page import docs_route
from wicore.api.errors import APIError, CORSMiddleware, error_response, from_wicore
from wicore.api.generation import ChoiceStats, Generation, Job, Piece, run_choice
from wicore.api.images import ImagePart, check_placeholders, load_images
from wicore.api.logprobs import LogprobFormatter, TokenLogprobs
from wicore.api.metrics import Metrics, StatusCounter
from wicore.api.middleware import HeaderLimit, InternalErrors, internal_error
from wicore.api.openapi import openapi_route
from wicore.api.ratelimit import RateLimiter
from wicore.api.schemas import Options, parse_chat, parse_completion
from wicore.api.serving import ServingEngine
from wicore.api.settings import ServerSettings
from wicore.api.streaming import EventStream, Streams, chunks, event_stream, merge
from wicore.api.web import WebPage
from wicore.errors import WiCoreError
from wicore.runtime.images import ImageInput
from wicore.runtime.sampler import SamplingParams
from wicore.runtime.vision import NO_VISION

if TYPE_CHECKING:
    from wicore.runtime.tokenizer import Tokenizer


class API:
    def __init__(self, engine: ServingEngine, settings: ServerSettings) -> None:
        self.engine = engine
        self.settings = settings
        self.auth = Authenticator(settings.api_keys)
        self.limiter = RateLimiter(settings.rate_limit_rpm, settings.rate_limit_burst) if settings.rate_limit_rpm else None
        self.failed_auth = RateLimiter(settings.failed_auth_per_minute, burst=10)
        self.metrics = Metrics()
        self.streams = Streams()  # open event streams, cut by a shutdown (wicore/api/server.py)
        self.created = int(time.time())
        self.body_limit = settings.body_limit(engine.vision is not None, engine.max_sequence_tokens)
        self.in_flight = InFlight(settings.requests_per_connection(engine.max_waiting))  # one client's share

    # -- guards ----------------------------------------------------------------------
    def guard(self, request: Request) -> None:
        client = client_address(request)
        self.check_host(request)
        key = self.authenticate(client, request.headers.get("authorization"))
        self.check_rate(key or client)

    def authenticate(self, client: str, authorization: str | None) -> str | None:
        """The key an Authorization header carries (None when auth is off), or a 401."""
        try:
            return self.auth.check(authorization)
        except APIError:
            self.failed_auth.check(client)  # past 10 quick failures from one address: 429s
            raise

    def check_rate(self, key: str) -> None:
        """A 429 when `key` (the API key, or the client address without keys) is over its rate."""
        if self.limiter is not None:
            self.limiter.check(key)

    def check_host(self, conn: HTTPConnection) -> None:
        allowed = self.settings.allowed_hosts
        if allowed:
            host = conn.headers.get("host", "")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if name.strip("[]") not in allowed:
                raise APIError(400, f"Host {host!r} is not served here (set an API key to serve other names)", code="bad_host")

    async def read_json(self, request: Request) -> Any:
        limit = self.body_limit
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise APIError(413, f"the request body has {declared} bytes; the limit is {limit}", code="body_too_large")
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if not self.settings.api_keys and kind != "application/json":  # a cross-site form cannot send JSON
            raise APIError(415, f"Content-Type must be application/json, not {kind or 'none'!r}", code="unsupported_media_type")
        body = bytearray()

        async def receive() -> None:
            async for chunk in request.stream():
                body.extend(chunk)
                if len(body) > limit:
                    raise APIError(413, f"the request body is over the limit of {limit} bytes", code="body_too_large")

        timeout = self.settings.body_timeout_seconds
        try:
            await asyncio.wait_for(receive(), timeout)
        except ClientDisconnect:  # gone mid-body: nobody to answer, nothing to log
            raise APIError(499, "the client closed the connection", code="client_closed") from None
        except asyncio.TimeoutError:
            raise APIError(408, f"the request body did not arrive within {timeout:g} s", code="request_timeout") from None
        return parse_json(body)

    def read_message(self, text: str) -> Any:
        """A WebSocket message (wicore.api.websocket) as JSON, held to the body limit."""
        limit = self.body_limit
        if len(text) > limit or len(text.encode("utf-8", "surrogatepass")) > limit:
            raise APIError(413, f"the message is over the limit of {limit} bytes", code="body_too_large")
        return parse_json(text)

    # -- routes ----------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> Response:
        self.guard(request)
        card = {
            "id": self.settings.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "wicore",
            "max_model_len": self.engine.max_sequence_tokens,  # what this server accepts: the context, or the KV pool
        }
        return JSONResponse({"object": "list", "data": [card]})

    async def stats(self, request: Request) -> Response:
        self.guard(request)
        return JSONResponse(self.engine.stats())

    async def metrics_route(self, request: Request) -> Response:
        self.guard(request)
        return Response(self.metrics.render(self.engine.stats()), media_type="text/plain; version=0.0.4")

    async def chat(self, request: Request) -> Response:
        self.guard(request)
        return await self.complete(request, await self.prepare(True, await self.read_json(request)))

    async def completions(self, request: Request) -> Response:
        self.guard(request)
        return await self.complete(request, await self.prepare(False, await self.read_json(request)))

    async def inference(self, request: Request) -> Response:
        """The original WiCore endpoint (wicore.api.compat)."""
        self.guard(request)
        body = await self.read_json(request)
        return JSONResponse(await until_disconnect(request, compat.inference(self, body, connection_of(request))))

    # -- generation ------------------------------------------------------------------
    async def prepare(self, is_chat: bool, body: Any) -> Job:
        """A chat or completion body, checked and tokenized (its images loaded): what both the HTTP
        endpoints and /v1/ws (wicore.api.websocket) queue."""
        if not is_chat:
            req = parse_completion(body)
            self._check_model(req.options)
            tok = self._tokenizer()
            return Job(False, [tok.encode(p) if isinstance(p, str) else p for p in req.prompts], req.options)
        chat = parse_chat(body)
        self._check_model(chat.options)
        images = await self.images(chat.images)
        tok = self._tokenizer()
        messages, literals = tok.guard_specials(chat.messages)  # message text never writes a control token
        try:
            prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
        except WiCoreError as exc:  # the template refused these messages (roles out of order, say)
            raise from_wicore(exc, "messages") from exc
        if images:
            prompt = self.engine.expand_images(prompt)
        return Job(True, [tok.encode(prompt, add_bos=False, literals=literals)], chat.options, images)

    async def images(self, parts: tuple[ImagePart, ...]) -> list[ImageInput]:
        """The request's images, loaded for the model; a 400 naming the part when there is something wrong."""
        if not parts:
            return []
        vision = self.engine.vision
        if vision is None:
            raise APIError(400, f"{parts[0].param}: {NO_VISION}", param=parts[0].param, code="images_not_supported")
        return await load_images(parts, vision.config.preprocessing, self.settings.images)

    def start(self, job: Job, connection: Hashable | None = None) -> Generation:
        """Queue the job's choices in the engine (all or none); nothing runs until they are read.
        They count toward `connection`'s share of the queue (a 429 past it) until aborted."""
        is_chat, prompts, opts = job.is_chat, job.prompts, job.options
        rid = f"{'chatcmpl' if is_chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        base = {"id": rid, "created": int(time.time()), "model": self.settings.model_name}
        release = self.in_flight.claim(connection, len(prompts) * opts.n)
        try:
            request_ids = self.add_requests(rid, prompts, opts, "messages" if is_chat else "prompt", job.images)
        except BaseException:
            release()
            raise
        stats = [ChoiceStats(num_prompt_tokens=len(prompts[i // opts.n])) for i in range(len(request_ids))]
        choices = [
            self._observed(run_choice(self.engine, request_id, prompts[i // opts.n], opts.stop, s), s)
            for i, (request_id, s) in enumerate(zip(request_ids, stats))
        ]

        def usage() -> dict[str, Any]:
            prompt = sum(len(ids) for ids in prompts)
            completion = sum(s.num_completion_tokens for s in stats)
            cached = sum(s.num_cached_tokens for s in stats[:: opts.n])
            return {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached},
            }

        def abort_all() -> None:  # whatever way the response ends, no request outlives it
            for request_id in request_ids:
                self.engine.abort(request_id)
            release()

        formatter = None if opts.logprobs is None else LogprobFormatter(self._tokenizer())
        return Generation(base, is_chat, choices, usage, abort_all, formatter)

    async def complete(self, request: Request, job: Job) -> Response:
        """The HTTP answer to a job: an event stream, or one JSON body once every choice ends."""
        gen = self.start(job, connection_of(request))
        is_chat, opts, choices, formatter, abort_all = job.is_chat, job.options, gen.choices, gen.logprobs, gen.abort
        if opts.stream:
            objects = chunks(gen.base, is_chat, choices, gen.usage, opts.include_usage, formatter, self.streams)
            body = event_stream(objects, gen.base.get("id"))
            return EventStream(body, on_close=abort_all)
        texts = [""] * len(choices)
        reasons: list[str | None] = [None] * len(choices)
        tokens: list[list[TokenLogprobs]] = [[] for _ in choices]

        async def collect() -> None:  # cut by a shutdown as streams are: a 503 server_shutting_down
            async for index, piece in merge(choices, self.streams):
                texts[index] += piece.text
                reasons[index] = piece.finish_reason or reasons[index]
                tokens[index] += piece.logprobs

        try:
            await until_disconnect(request, collect())
        finally:
            abort_all()
        body = []
        for i, (text, reason, toks) in enumerate(zip(texts, reasons, tokens)):
            shaped = None if formatter is None else (formatter.chat(toks) if is_chat else formatter.completion(toks))
            content = {"message": {"role": "assistant", "content": text}} if is_chat else {"text": text}
            body.append({"index": i, **content, "logprobs": shaped, "finish_reason": reason})
        obj = "chat.completion" if is_chat else "text_completion"
        return JSONResponse({**gen.base, "object": obj, "choices": body, "usage": gen.usage()})

    async def _observed(self, choice: AsyncIterator[Piece], stats: ChoiceStats) -> AsyncIterator[Piece]:
        try:
            async for piece in choice:
                yield piece
        finally:
            await choice.aclose()  # type: ignore[attr-defined]
            self.metrics.observe_choice(stats, time.monotonic())

    def add_requests(
        self, rid: str, prompts: list[list[int]], opts: Options, param: str, images: list[ImageInput] | None = None
    ) -> list[str]:
        """Queue every choice of every prompt (n per prompt) in the engine, or none: the engine's
        admission errors become the 400 / 503 they stand for, naming `param` for the prompt.
        `images` go with every prompt (the engine encodes each distinct image once)."""
        if self.engine.vision is not None:
            check_placeholders(prompts, len(images or ()), self.engine.vision.config.boi_token_id, param)
        num_choices = len(prompts) * opts.n
        if num_choices > self.engine.max_waiting:  # never fits: a 400, not a 503 to retry
            raise APIError(
                400,
                f"this request has {num_choices} choices ({len(prompts)} prompts x n={opts.n}); the server "
                f"queues at most {self.engine.max_waiting}: send fewer prompts or a smaller n",
                param="n" if opts.n > 1 else param,
                code="too_many_choices",
            )
        request_ids: list[str] = []
        try:
            for ids in prompts:
                for j in range(opts.n):
                    seed = None if opts.seed is None else (opts.seed + j) % (1 << 64)
                    params = SamplingParams(
                        max_tokens=opts.max_tokens,
                        temperature=opts.temperature,
                        top_k=opts.top_k,
                        top_p=opts.top_p,
                        seed=seed,
                        presence_penalty=opts.presence_penalty,
                        frequency_penalty=opts.frequency_penalty,
                        logprobs=opts.logprobs,
                        speculative=opts.speculative,
                        ignore_eos=opts.ignore_eos,
                    )
                    request_ids.append(
                        self.engine.add_request(
                            ids, params, opts.priority, request_id=f"{rid}-{len(request_ids)}", images=images or ()
                        )
                    )
        except WiCoreError as exc:
            for request_id in request_ids:
                self.engine.cancel(request_id)
            raise from_wicore(exc, param) from exc
        return request_ids

    def _check_model(self, opts: Options) -> None:
        if opts.model is not None and opts.model != self.settings.model_name:
            raise APIError(
                404,
                f"model {opts.model!r} does not exist; this server serves {self.settings.model_name!r}",
                param="model",
                code="model_not_found",
            )

    def _tokenizer(self) -> Tokenizer:
        try:
            return self.engine.tokenizer
        except WiCoreError as exc:
            raise from_wicore(exc) from exc


def parse_json(body: bytes | str) -> Any:
    """A request body (or a WebSocket message) as JSON, or the 400 that says what is wrong with it."""
    try:
        value = json.loads(body)
    except ValueError as exc:
        raise APIError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise APIError(400, "the request body's JSON is nested too deeply", code="invalid_json") from None
    try:  # JSON's \ud800 escapes can make strings no tokenizer (or UTF-8) takes
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(
            400, "the request body has a lone surrogate (an unpaired \\ud800-\\udfff escape)", code="invalid_json"
        ) from None
    return value


async def _client_error(request: Request, exc: Exception) -> Response:
    """An APIError as it is; WiCore's errors and Starlette's own (404, 405) as the APIError they stand for."""
    if isinstance(exc, WiCoreError):
        exc = from_wicore(exc)
    elif isinstance(exc, HTTPException):  # its headers too: a 405's Allow
        exc = APIError(exc.status_code, str(exc.detail), code="http_error", headers=dict(exc.headers or {}))
    assert isinstance(exc, APIError)
    return error_response(exc)


async def _internal_error(request: Request, exc: Exception) -> Response:
    """Starlette's last resort, for a bug in the middleware around InternalErrors (wicore.api.middleware)."""
    return internal_error(request.scope, exc)


def create_app(engine: ServingEngine, settings: ServerSettings) -> Starlette:
    """The app for a started engine; stopping the engine stays with the caller."""
    api = API(engine, settings)
    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/inference", api.inference, methods=["POST"]),
        Route("/v1/stats", api.stats, methods=["GET"]),
        Route("/metrics", api.metrics_route, methods=["GET"]),
        Route("/openapi.json", openapi_route, methods=["GET"]),
        Route("/docs", docs_route, methods=["GET"]),
        WebSocketRoute(websocket.ROUTE, websocket.websocket_route),
        *(WebPage().routes() if settings.web else []),
    ]
    middleware = [Middleware(StatusCounter, metrics=api.metrics, routes=frozenset(r.path for r in routes))]
    if settings.cors_origins:
        middleware.append(
            Middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["*"], allow_headers=["*"])
        )
    middleware += [Middleware(HeaderLimit), Middleware(InternalErrors)]  # wicore.api.middleware
    handlers = {APIError: _client_error, WiCoreError: _client_error, HTTPException: _client_error, Exception: _internal_error}
    app = Starlette(routes=routes, middleware=middleware, exception_handlers=handlers)  # type: ignore[arg-type]
    app.state.api = api
    return app
