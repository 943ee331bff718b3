"""The Starlette app: OpenAI routes in front of one running engine (wicore.api.serving.ServingEngine).

request ─► guard (auth, rate limit) ─► read body (size limit) ─► schemas.parse_*
        ─► images (wicore.api.images) ─► prompt ids (chat template / tokenizer)
        ─► one run_choice per choice ─► JSON body, or SSE chunks (streaming.event_stream)
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute

from wicore.api import compat, responses, websocket
from wicore.api.connections import InFlight, connection_of, until_disconnect
from wicore.api.docs_page import docs_route
from wicore.api.errors import APIError, CORSMiddleware, from_wicore
from wicore.api.gate import Gate
from wicore.api.generation import ChoiceStats, Generation, Job, run_choice
from wicore.api.http import client_error, internal_error_response
from wicore.api.images import ImagePart, load_images
from wicore.api.logprobs import LogprobFormatter, TokenLogprobs
from wicore.api.metrics import Metrics, StatusCounter
from wicore.api.middleware import HeaderLimit, InternalErrors
from wicore.api.openapi import openapi_route
from wicore.api.queueing import queue_choices
from wicore.api.schemas import Options, parse_chat, parse_completion
from wicore.api.serving import ServingEngine
from wicore.api.settings import ServerSettings
from wicore.api.streaming import EventStream, Streams, chunks, event_stream, merge
from wicore.api.tokenize import parse_detokenize, parse_tokenize
from wicore.api.tools.plan import ToolPlan, chat_prompt, tool_format, with_tool_grammar
from wicore.api.tools.request import ToolRequest
from wicore.api.tools.stream import message, tool_pieces
from wicore.api.web import WebPage
from wicore.errors import WiCoreError
from wicore.executor.vision import NO_VISION
from wicore.types.images import ImageInput

if TYPE_CHECKING:
    from wicore.inputs.tokenizer import Tokenizer

log = logging.getLogger("wicore.api")


class API(Gate):
    """The routes over one engine; the Gate (wicore.api.gate) checks who asks and reads what they send."""

    def __init__(self, engine: ServingEngine, settings: ServerSettings) -> None:
        super().__init__(settings, settings.body_limit(engine.vision is not None, engine.max_sequence_tokens))
        self.engine = engine
        self.metrics = Metrics()
        self.streams = Streams()  # open event streams, cut by a shutdown (wicore/api/server.py)
        self.sockets = websocket.OpenSockets()  # open /v1/ws sockets, closed when idle by a shutdown
        self.created = int(time.time())
        self.in_flight = InFlight(settings.requests_per_connection(engine.max_waiting))  # one client's share

    # -- routes ----------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    def model_card(self) -> dict[str, Any]:
        return {
            "id": self.settings.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "wicore",
            "max_model_len": self.engine.max_sequence_tokens,  # what this server accepts: the context, or the KV pool
        }

    async def models(self, request: Request) -> Response:
        self.guard(request)
        return JSONResponse({"object": "list", "data": [self.model_card()]})

    async def model(self, request: Request) -> Response:
        """GET /v1/models/{id}: the model's card (the openai client's models.retrieve), or a 404."""
        self.guard(request)
        self._check_model(request.path_params["model_id"])
        return JSONResponse(self.model_card())

    async def tokenize(self, request: Request) -> Response:
        """vLLM's /tokenize (wicore.api.tokenize)."""
        self.guard(request)
        req = parse_tokenize(await self.read_json(request))
        self._check_model(req.model)
        tok = self._tokenizer()
        if req.messages is not None:
            ids = tok.encode(self.render_chat(req.messages, req.add_generation_prompt)[0], add_bos=req.add_special_tokens)
        else:
            assert req.prompt is not None
            ids = tok.encode(req.prompt, add_bos=req.add_special_tokens and tok.info.add_bos)
        strs = [tok.id_to_token(i) or "" for i in ids] if req.return_token_strs else None
        return JSONResponse(
            {"count": len(ids), "max_model_len": self.engine.max_sequence_tokens, "tokens": ids, "token_strs": strs}
        )

    async def detokenize(self, request: Request) -> Response:
        """vLLM's /detokenize: token ids to text (special tokens left out, as the endpoints' text)."""
        self.guard(request)
        tok = self._tokenizer()
        ids, model = parse_detokenize(await self.read_json(request), tok.vocab_size)
        self._check_model(model)
        return JSONResponse({"prompt": tok.decode(ids)})

    async def stats(self, request: Request) -> Response:
        self.guard(request)
        return JSONResponse(self.engine.stats_json())

    async def metrics_route(self, request: Request) -> Response:
        self.guard(request)
        return Response(self.metrics.render(self.engine.stats_json()), media_type="text/plain; version=0.0.4")

    async def chat(self, request: Request) -> Response:
        self.guard(request)
        return await self.complete(request, await self.prepare(True, await self.read_json(request)))

    async def completions(self, request: Request) -> Response:
        self.guard(request)
        return await self.complete(request, await self.prepare(False, await self.read_json(request)))

    async def responses(self, request: Request) -> Response:
        """OpenAI's Responses API, over the chat path (wicore.api.responses)."""
        self.guard(request)
        body = await self.read_json(request)
        chat, origins = responses.chat_body(body)
        try:
            job = await self.prepare(True, chat)
        except APIError as exc:
            raise responses.renamed(exc, origins) from None
        gen = self.start(job, connection_of(request))
        builder = responses.ResponseBuilder(responses.response_base(body, self.settings.model_name))
        events = responses.events(gen, builder, merge(gen.choices, self.streams))
        if job.options.stream:
            return EventStream(responses.event_stream(events, builder), on_close=gen.abort)
        final: dict[str, Any] = {}

        async def collect() -> None:
            async for event in events:
                final.update(event)

        try:
            await until_disconnect(request, collect())
        finally:
            gen.abort()
        return JSONResponse(final["response"])

    async def inference(self, request: Request) -> Response:
        """The original WiCore endpoint (wicore.api.compat)."""
        self.guard(request)
        body = await self.read_json(request)
        return JSONResponse(await until_disconnect(request, compat.inference(self, body, connection_of(request))))

    @property
    def can_chat(self) -> bool:
        """Whether chat requests are served: the model ships a chat template, or the server was given one."""
        if self.settings.chat_template is not None:
            return True
        try:
            return self.engine.tokenizer.has_chat_template
        except WiCoreError:  # a model exported without a tokenizer takes token ids only
            return False

    # -- generation ------------------------------------------------------------------
    async def prepare(self, is_chat: bool, body: Any) -> Job:
        """A chat or completion body, checked and tokenized (its images loaded): what both the HTTP
        endpoints and /v1/ws (wicore.api.websocket) queue."""
        # Templates and tokenization run on a worker thread: a long prompt must not stall the event loop.
        if not is_chat:
            req = parse_completion(body)
            self._check_model(req.options.model)
            await self.compile_constraint(req.options)
            tok = self._tokenizer()  # the text is decoded from it (a 400 for a model exported without one)
            if all(isinstance(p, list) for p in req.prompts):  # token ids: nothing to tokenize, no thread hop
                return Job(False, [p for p in req.prompts if isinstance(p, list)], req.options)
            prompts = await asyncio.to_thread(lambda: [tok.encode(p) if isinstance(p, str) else p for p in req.prompts])
            return Job(False, prompts, req.options)
        chat = parse_chat(body)
        self._check_model(chat.options.model)
        images = await self.images(chat.images)
        tok = self._tokenizer()

        def render() -> tuple[list[int], ToolPlan | None]:
            messages, literals = tok.guard_specials(chat.messages)  # message text never writes a control token
            prompt, plan = self.render_chat(messages, tools=chat.tools)
            if images:
                prompt = self.engine.expand_images(prompt)
            return tok.encode(prompt, add_bos=False, literals=literals), plan

        ids, plan = await asyncio.to_thread(render)
        options = with_tool_grammar(chat.options, plan)  # tool_choice required / named: the calls' grammar
        await self.compile_constraint(options)
        return Job(True, [ids], options, images, plan)

    def render_chat(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, tools: ToolRequest | None = None
    ) -> tuple[str, ToolPlan | None]:
        """The prompt text of a conversation, through the server's or the model's chat template, and
        with `tools` the plan their calls follow (wicore.api.tools); a 400 where there is no template
        (a base model) or the template refuses the messages."""
        if not self.can_chat:
            raise APIError(
                400,
                f"the model {self.settings.model_name!r} has no chat template (a base model: it continues text): "
                "send prompts to /v1/completions, or start the server with --chat-template FILE",
                param="messages",
                code="no_chat_template",
            )
        try:
            tok = self._tokenizer()
            fmt = tool_format(self.settings.tool_call_parser, tok)
            if tools is None and not fmt.reads_every_answer:  # harmony reads every answer, tools or not
                return tok.apply_chat_template(messages, add_generation_prompt, self.settings.chat_template), None
            return chat_prompt(tok, messages, tools, fmt, self.settings.chat_template, add_generation_prompt)
        except WiCoreError as exc:  # the template refused these messages (roles out of order, say)
            raise from_wicore(exc, "messages") from exc

    async def compile_constraint(self, opts: Options) -> None:
        """Compile the request's output constraint on a worker thread, not the event loop (a big
        schema, or the vocabulary still being indexed after startup, takes seconds): queuing then
        finds it in the engine's cache. One that does not compile is its 400 here."""
        grammars = self.engine.grammars  # None: an engine elsewhere (Ray) compiles when it queues
        if opts.structured is None or grammars is None:
            return
        try:
            await asyncio.to_thread(grammars.state, opts.structured)
        except WiCoreError as exc:
            raise from_wicore(exc) from exc

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
        keep_specials = job.tools is not None and job.tools.format.reads_special_tokens
        stats = [ChoiceStats(num_prompt_tokens=len(prompts[i // opts.n])) for i in range(len(request_ids))]
        choices = [
            run_choice(self.engine, request_id, prompts[i // opts.n], opts.stop, s, keep_specials, self._observe)
            for i, (request_id, s) in enumerate(zip(request_ids, stats))
        ]
        if job.tools is not None:  # content and tool calls, read from each choice's text
            choices = [tool_pieces(choice, job.tools) for choice in choices]

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
        calls: list[list[dict[str, Any]]] = [[] for _ in choices]
        thoughts = [""] * len(choices)

        async def collect() -> None:  # cut by a shutdown as streams are: a 503 server_shutting_down
            async for index, piece in merge(choices, self.streams):
                texts[index] += piece.text
                reasons[index] = piece.finish_reason or reasons[index]
                tokens[index] += piece.logprobs
                calls[index] += piece.tool_calls
                thoughts[index] += piece.reasoning

        try:
            await until_disconnect(request, collect())
        finally:
            abort_all()
        results: list[dict[str, Any]] = []
        for i, (text, reason, toks) in enumerate(zip(texts, reasons, tokens)):
            shaped = None if formatter is None else (formatter.chat(toks) if is_chat else formatter.completion(toks))
            content = {"message": message(text, calls[i], thoughts[i])} if is_chat else {"text": text}
            results.append({"index": i, **content, "logprobs": shaped, "finish_reason": reason})
        obj = "chat.completion" if is_chat else "text_completion"
        return JSONResponse({**gen.base, "object": obj, "choices": results, "usage": gen.usage()})

    def _observe(self, stats: ChoiceStats) -> None:
        self.metrics.observe_choice(stats, time.monotonic())

    def add_requests(
        self, rid: str, prompts: list[list[int]], opts: Options, param: str, images: list[ImageInput] | None = None
    ) -> list[str]:
        """Queue every choice of every prompt in the engine, or none (wicore.api.queueing)."""
        return queue_choices(self.engine, rid, prompts, opts, param, images or [])

    def _check_model(self, model: str | None) -> None:
        if model is not None and model != self.settings.model_name:
            raise APIError(
                404,
                f"model {model!r} does not exist; this server serves {self.settings.model_name!r}",
                param="model",
                code="model_not_found",
            )

    def _tokenizer(self) -> Tokenizer:
        try:
            return self.engine.tokenizer
        except WiCoreError as exc:
            raise from_wicore(exc) from exc


def create_app(engine: ServingEngine, settings: ServerSettings) -> Starlette:
    """The app for a started engine; stopping the engine stays with the caller."""
    api = API(engine, settings)
    routes: list[Route | WebSocketRoute] = [
        Route("/health", api.health, methods=["GET"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", api.model, methods=["GET"]),
        Route("/tokenize", api.tokenize, methods=["POST"]),
        Route("/detokenize", api.detokenize, methods=["POST"]),
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/responses", api.responses, methods=["POST"]),
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
    handlers = {
        APIError: client_error,
        WiCoreError: client_error,
        HTTPException: client_error,
        Exception: internal_error_response,
    }
    app = Starlette(routes=routes, middleware=middleware, exception_handlers=handlers)
    app.state.api = api
    return app
