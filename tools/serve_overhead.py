"""The server's own cost at many streams, on any machine: the real app, Hypercorn, tokenizer and
output channels in front of a stand-in engine whose steps cost what a GPU's do.

`wicore serve` lost 25-30% of the engine's rate at 256 streams on an H200 (issue 32), where a
step is ~20 ms of GPU time and a few ms of Python. On a CPU the real engine's step is slower than
the server's per-token work, so the server's cost hides; this engine's step is instead

    hold the GIL for --host-ms (the engine's Python: schedule, batch, update)
    release it for --device-ms (the GPU's run: ONNX Runtime and CUDA release the GIL)
    emit one token to every running request (wicore.engine.channel.put_all, as Engine._emit)

so its rate alone is streams x 1000 / (host + device) tokens a second, and what the server costs
shows as the rate it reaches through HTTP with `wicore bench serve`, and as the server's CPU.
The tokens are random ids of the given model's vocabulary, decoded by its tokenizer.

With `--engine-process on` the same steps (`StepCore`) run in a child process behind `wicore
serve`'s client (wicore.engine_process), as `wicore serve --engine-process on` runs the engine's: the
server's GIL is then the event loop's alone. /v1/stats is then the child's EngineStats (steps), not
the GIL lateness and arrival spans the in-process stand-in reports.

    PYTHONPATH=. python tools/serve_overhead.py --model M --host-ms 4 --device-ms 16 --port 8130 &
    wicore bench serve --base-url http://127.0.0.1:8130 --concurrency 256 --num-prompts 256 \\
        --input-len 64 --output-len 256 --vocab-size V --processes 2
    PYTHONPATH=. python tools/serve_overhead.py --model M --host-ms 4 --device-ms 16 --alone 256x256
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import queue
import random
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from wicore.engine.channel import Channel, put_all
from wicore.engine.stats import EngineStats, TierCounts
from wicore.engine_process.frames import EngineInfo
from wicore.inputs.tokenizer import Tokenizer
from wicore.model.tokenizer_info import TokenizerInfo
from wicore.types.outputs import RequestOutput
from wicore.types.sampling import SamplingParams


class StepCore:
    """Fixed-cost steps with EngineCore's interface (wicore.engine_process.info.SteppedCore): the
    stand-in's engine, stepped by StepEngine's thread in the server's process, or by the engine
    process's loop in a child (--engine-process on)."""

    def __init__(self, vocab: range, host_ms: float, device_ms: float, max_num_seqs: int, seed: int = 0) -> None:
        self.vocab, self.host_s, self.device_s, self.max_num_seqs = vocab, host_ms / 1e3, device_ms / 1e3, max_num_seqs
        self._rng = random.Random(seed)
        self.waiting: deque[tuple[str, int]] = deque()
        self.running: dict[str, int] = {}  # request id -> tokens still to make
        self.aborted: list[str] = []
        self.num_steps = 0
        self.late_s = 0.0  # summed over steps: how long past --device-ms the thread got the GIL back
        self.arrivals: list[float] = []  # when each request was queued (perf_counter)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.aborted)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def make_request(self, ids: Any, params: SamplingParams, request_id: str, *args: Any, **kwargs: Any) -> Any:
        return request_id, params.max_tokens or 16

    def add(self, request: Any) -> None:
        self.arrivals.append(time.perf_counter())
        self.waiting.append(request)

    def abort(self, request_id: str) -> None:
        if self.running.pop(request_id, None) is not None:
            self.aborted.append(request_id)

    def step(self) -> list[RequestOutput]:
        while self.waiting and len(self.running) < self.max_num_seqs:
            request_id, num_tokens = self.waiting.popleft()
            self.running[request_id] = num_tokens
        end = time.perf_counter() + self.host_s
        while time.perf_counter() < end:  # the engine's Python: holds the GIL
            pass
        slept = time.perf_counter()
        time.sleep(self.device_s)  # the GPU's part: the GIL is free
        self.late_s += time.perf_counter() - slept - self.device_s
        outputs = [RequestOutput(request_id, [], True, "abort") for request_id in self.aborted]
        self.aborted = []
        for request_id, left in list(self.running.items()):
            done = left == 1
            outputs.append(RequestOutput(request_id, [self._rng.choice(self.vocab)], done, "length" if done else None))
            self.running[request_id] = left - 1
            if done:
                del self.running[request_id]
        self.num_steps += 1
        return outputs

    def stats(self) -> EngineStats:
        none = TierCounts()
        return EngineStats(len(self.running), len(self.waiting), 0, none, none, none, {}, 0.0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0, self.num_steps)  # fmt: skip

    def close(self) -> None:
        pass


def accept(ids: list[int], params: SamplingParams, images: Sequence[Any] = ()) -> None:
    """The stand-in's admission check: everything fits."""


def start_step_core(vocab: range, host_ms: float, device_ms: float, max_num_seqs: int) -> tuple[StepCore, EngineInfo]:
    """The child's core for --engine-process on (picklable as a partial of this module's function)."""
    core = StepCore(vocab, host_ms, device_ms, max_num_seqs)
    return core, EngineInfo(accept, None, 1 << 20, 4096, "step engine", core.stats())


class StepEngine:
    """The ServingEngine interface over a StepCore stepped by a thread of this process (as Engine)."""

    vision = None
    grammars = None
    max_sequence_tokens = 1 << 20
    max_waiting = 4096

    def __init__(self, tokenizer: Tokenizer, core: StepCore) -> None:
        self.tokenizer = tokenizer
        self.core = core
        self._inbox: queue.SimpleQueue[tuple[str, int] | str] = queue.SimpleQueue()
        self._channels: dict[str, Channel] = {}
        self._ids = iter(range(1 << 62))
        self.http_arrivals: list[float] = []  # when each completion's HTTP request reached the app
        threading.Thread(target=self._loop, name="step-engine", daemon=True).start()

    def expand_images(self, text: str) -> str:
        return text

    def add_request(self, prompt: Any, params: SamplingParams, priority: Any = "normal", deadline: Any = None,
                    request_id: str | None = None, images: Sequence[Any] = ()) -> str:  # fmt: skip
        request_id = request_id or f"req-{next(self._ids)}"
        self._channels[request_id] = Channel()
        self._inbox.put(self.core.make_request(prompt, params, request_id))
        return request_id

    def abort(self, request_id: str) -> None:
        self._inbox.put(request_id)

    def cancel(self, request_id: str) -> None:
        self.abort(request_id)

    def outputs(self, request_id: str) -> AsyncIterator[RequestOutput]:
        return self._channels[request_id].__aiter__()

    def stats_json(self) -> dict[str, object]:
        """/v1/stats: steps so far; how late a step's thread got the GIL back after its device wait,
        on average (the sleep's own overshoot included: compare with --alone); the time over which
        the last 256 requests reached the app (their HTTP request parsed by Hypercorn) and the engine
        (a load of 256 streams is sent at once)."""

        def span_ms(times: list[float]) -> float:  # a load's 256 requests (a bench's probe request left out)
            last = times[-256:]
            return 1e3 * (last[-1] - last[0]) if last else 0.0

        core = self.core
        return {
            "num_steps": core.num_steps,
            "late_ms_a_step": 1e3 * core.late_s / max(core.num_steps, 1),
            "last_256_arrived_over_ms": span_ms(self.http_arrivals),
            "last_256_queued_over_ms": span_ms(core.arrivals),
        }

    def _loop(self) -> None:
        core = self.core
        while True:
            while True:
                try:
                    item = self._inbox.get(block=not core.has_work)
                except queue.Empty:
                    break
                if isinstance(item, str):
                    core.abort(item)
                else:
                    core.add(item)
            outputs = core.step()
            put_all([(self._channels[out.request_id], out) for out in outputs if out.request_id in self._channels])
            for out in outputs:
                if out.finished:
                    self._channels.pop(out.request_id, None)


def alone(engine: StepEngine, num_requests: int, num_tokens: int) -> float:
    """Output tokens a second of the engine with a consumer that only counts them."""

    async def run() -> int:
        ids = [engine.add_request([1], SamplingParams(max_tokens=num_tokens)) for _ in range(num_requests)]

        async def count(request_id: str) -> int:
            return sum([len(out.new_token_ids) async for out in engine.outputs(request_id)])

        return sum(await asyncio.gather(*(count(r) for r in ids)))

    start = time.perf_counter()
    tokens = asyncio.run(run())
    return tokens / (time.perf_counter() - start)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="an exported model folder (its tokenizer is used)")
    p.add_argument("--host-ms", type=float, default=4.0)
    p.add_argument("--device-ms", type=float, default=16.0)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--port", type=int, default=8130)
    p.add_argument("--alone", help="REQUESTSxTOKENS: run them with no server, print tok/s, exit")
    p.add_argument("--gil-switch-ms", type=float, help="sys.setswitchinterval for this process")
    p.add_argument(
        "--engine-process", choices=("on", "off"), default="off", help="on: the steps in a child process, as wicore serve's"
    )
    args = p.parse_args()
    if args.gil_switch_ms is not None:
        sys.setswitchinterval(args.gil_switch_ms / 1e3)
    manifest = json.loads((Path(args.model) / "wicore.json").read_text())
    tokenizer = Tokenizer(Path(args.model), TokenizerInfo.from_dict(manifest["tokenizer"]))
    vocab = range(max(tokenizer.info.eos_token_ids or (0,)) + 1, tokenizer.vocab_size)
    if args.engine_process == "on":  # the stand-in's steps in a child, behind wicore serve's client
        from wicore.api.app import ServerSettings
        from wicore.api.server import serve_engine
        from wicore.engine_process.client import EngineClient

        start = functools.partial(start_step_core, vocab, args.host_ms, args.device_ms, args.max_num_seqs)
        client = EngineClient.spawn(start, tokenizer)
        try:
            return serve_engine(client, ServerSettings(model_name="step-engine"), "step engine", "127.0.0.1", args.port)
        finally:
            client.stop()
    engine = StepEngine(tokenizer, StepCore(vocab, args.host_ms, args.device_ms, args.max_num_seqs))
    if args.alone:
        n, m = (int(x) for x in args.alone.split("x"))
        rate = alone(engine, n, m)
        print(f"alone: {rate:.1f} output tok/s ({n} requests x {m} tokens); {engine.stats_json()}")
        return 0
    from wicore.api.app import ServerSettings, create_app
    from wicore.api.connections import DEFAULT_LIMITS
    from wicore.api.server import _serve_until_signal, hypercorn_config

    app = create_app(engine, ServerSettings(model_name="step-engine"))  # type: ignore[arg-type]

    async def arrivals(scope: Any, receive: Any, send: Any) -> None:  # when each completion reached the app
        if scope["type"] == "http" and scope["path"] == "/v1/completions":
            engine.http_arrivals.append(time.perf_counter())
        await app(scope, receive, send)

    asyncio.run(_serve_until_signal(arrivals, hypercorn_config("127.0.0.1", args.port), DEFAULT_LIMITS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
