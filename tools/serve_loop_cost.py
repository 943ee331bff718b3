"""The event loop's CPU a streamed token in `wicore serve`'s app, without sockets or a client.

At 256 streams the server's event loop does, for every token of every stream, the work from the
engine's output to the bytes of one SSE event (issue 32). On a shared 2-core VM the load generator
competes with the server for the cores, and the server's CPU seconds then move with it; this drives
the real app (Starlette, wicore's middlewares and routes, tokenizer, channels) through ASGI calls
in one process, with an engine stepped on the same loop, and counts the CPU the process spent:

    every step: one token (random ids of the model's vocabulary) to each running request, all at
    once (wicore.engine.channel.put_all, as the engine process's client delivers a step), then
    the loop runs until every stream has taken its token (one SSE event a token, the regime of a
    GPU whose step is longer than the loop's work) or, with --steps-ahead K, K steps are put
    before the loop catches up (a loop that fell behind: its streams merge what is ready).

Hypercorn's send path (h11 framing, the socket write: about a third of the loop's time in a
py-spy profile of the real server) is not in this count; `send` only keeps the bytes.

    PYTHONPATH=. python tools/serve_loop_cost.py --model M --streams 256 --tokens 128 [--chat] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import random
import sys
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from wicore.api.app import ServerSettings, create_app
from wicore.engine.channel import Channel, put_all
from wicore.inputs.tokenizer import Tokenizer
from wicore.model.tokenizer_info import TokenizerInfo
from wicore.types.outputs import RequestOutput
from wicore.types.sampling import SamplingParams


class LoopEngine:
    """The ServingEngine interface; `step()` is called by the driver on the server's loop."""

    vision = None
    grammars = None
    max_sequence_tokens = 1 << 20
    max_waiting = 1 << 20

    def __init__(self, tokenizer: Tokenizer, vocab: range, seed: int = 0) -> None:
        self.tokenizer = tokenizer
        self.vocab = vocab
        self._rng = random.Random(seed)
        self.channels: dict[str, Channel] = {}
        self.left: dict[str, int] = {}
        self.num_tokens = 0

    def expand_images(self, text: str) -> str:
        return text

    def add_request(self, prompt: Any, params: SamplingParams, priority: Any = "normal", deadline: Any = None,
                    request_id: str | None = None, images: Sequence[Any] = ()) -> str:  # fmt: skip
        request_id = request_id or f"req-{len(self.channels)}"
        self.channels[request_id] = Channel()
        self.left[request_id] = params.max_tokens or 16
        return request_id

    def abort(self, request_id: str) -> None:
        self.left.pop(request_id, None)

    def cancel(self, request_id: str) -> None:
        self.abort(request_id)

    def outputs(self, request_id: str) -> AsyncIterator[RequestOutput]:
        return self.channels[request_id].__aiter__()

    def stats_json(self) -> dict[str, object]:
        return {}

    def step(self) -> None:
        delivered = []
        for request_id, left in list(self.left.items()):
            done = left == 1
            out = RequestOutput(request_id, [self._rng.choice(self.vocab)], done, "length" if done else None, 64)
            delivered.append((self.channels[request_id], out))
            self.left[request_id] = left - 1
            if done:
                del self.left[request_id]
        self.num_tokens += len(delivered)
        put_all(delivered)


async def drive(app: Any, engine: LoopEngine, streams: int, tokens: int, chat: bool, ahead: int) -> tuple[int, int]:
    """Run `streams` streamed requests to the end; (SSE events, bytes) they received."""
    prompt = [engine.vocab[0]] * 64
    body = {"max_tokens": tokens, "stream": True, "ignore_eos": True}
    if chat:
        body["messages"] = [{"role": "user", "content": "hello"}]
    else:
        body["prompt"] = prompt
    raw = json.dumps(body).encode()
    path = "/v1/chat/completions" if chat else "/v1/completions"
    counts = [0, 0]

    async def one() -> None:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
                 "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
                 "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8000)}  # fmt: skip
        sent = False
        done = asyncio.Event()

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            await done.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                data = message.get("body", b"")
                counts[0] += data.count(b"data: ")
                counts[1] += len(data)

        await app(scope, receive, send)
        done.set()

    tasks = [asyncio.create_task(one()) for _ in range(streams)]
    while len(engine.channels) < streams:  # every request queued
        await asyncio.sleep(0)
    while engine.left:
        for _ in range(ahead):
            engine.step()
        while any(ch._items for ch in engine.channels.values()):  # every stream took its tokens
            await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    return counts[0], counts[1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="an exported model folder (its tokenizer is used)")
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--steps-ahead", type=int, default=1)
    p.add_argument("--chat", action="store_true", help="/v1/chat/completions (default /v1/completions with token ids)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--profile", help="write cProfile stats of one more run here, print the top")
    args = p.parse_args()
    manifest = json.loads((Path(args.model) / "wicore.json").read_text())
    tokenizer = Tokenizer(Path(args.model), TokenizerInfo.from_dict(manifest["tokenizer"]))
    vocab = range(max(tokenizer.info.eos_token_ids or (0,)) + 1, tokenizer.vocab_size)
    for r in range(args.repeat + (1 if args.profile else 0)):
        engine = LoopEngine(tokenizer, vocab, seed=r)
        app = create_app(engine, ServerSettings(model_name="loop-engine"))  # type: ignore[arg-type]
        profiler = cProfile.Profile() if args.profile and r == args.repeat else None
        cpu = time.process_time()
        if profiler is not None:
            profiler.enable()
        events, size = asyncio.run(drive(app, engine, args.streams, args.tokens, args.chat, args.steps_ahead))
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(args.profile)
            pstats.Stats(args.profile).sort_stats("tottime").print_stats(25)
            continue
        cpu = time.process_time() - cpu
        us = 1e6 * cpu / engine.num_tokens
        print(f"run {r}: {engine.num_tokens} tokens, {events} events, {size} bytes, CPU {cpu:.3f} s: {us:.1f} us a token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
