"""Hypercorn in front of the app: `serve()` for `wicore serve`, `ServerThread` for tests and tools.

Shutdown (SIGTERM or SIGINT, i.e. Ctrl-C): Hypercorn stops accepting, WebSockets with no request
in flight close at once (wicore/api/websocket.py), in-flight requests get `grace_seconds` to
finish, then their connections are cancelled, which aborts their engine requests; the engine
stops last. Streams still open a second before the grace period ends are cut with an error
event and `[DONE]` (wicore/api/streaming.py), so their clients see why. The console says so,
and a second signal quits at once (exit code 130).

Connections: at most ConnectionLimits.max_connections open, headers within its
header_timeout_seconds (wicore/api/connections.py).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypercorn.asyncio.run import worker_serve
from hypercorn.config import Config, Sockets
from hypercorn.utils import wrap_app

from wicore.api.app import ServerSettings, create_app
from wicore.api.connections import DEFAULT_LIMITS, ConnectionLimits, LimitedListener
from wicore.engine.engine import Engine, EngineConfig
from wicore.engine_process.client import EngineClient, model_tokenizer
from wicore.engine_process.heap import freeze_startup_heap
from wicore.engine_process.info import describe, start_core

log = logging.getLogger("wicore.api")


def hypercorn_config(
    host: str, port: int, grace_seconds: float = 30.0, access_log: bool = False, limits: ConnectionLimits = DEFAULT_LIMITS
) -> Config:
    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.graceful_timeout = grace_seconds
    config.keep_alive_timeout = limits.header_timeout_seconds  # also closes connections that never finish their headers
    # Hypercorn's own loggers, through logging's handlers: with "-" it adds a stream handler of its
    # own and the records also reach the root handler (every line twice, in two formats).
    config.accesslog = logging.getLogger("hypercorn.access") if access_log else None
    config.errorlog = logging.getLogger("hypercorn.error")
    return config


def serve(
    engine_config: EngineConfig,
    settings: ServerSettings,
    host: str,
    port: int,
    grace_seconds: float = 30.0,
    limits: ConnectionLimits = DEFAULT_LIMITS,
    switch_interval: float | None = None,
    engine_process: bool = False,
) -> int:
    """Run until SIGTERM / SIGINT; returns the process exit code. `switch_interval`: seconds a
    thread may hold the GIL while another waits (sys.setswitchinterval, for this process; None keeps
    Python's 5 ms). The engine thread gives the GIL up for every step's graphs and, back, waits up to
    that long for the event loop's thread, busy writing the streams (docs/PERFORMANCE.md, issue 32).
    `engine_process`: the engine runs in a child process (wicore.engine_process), and this process's
    GIL is the event loop's alone."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if switch_interval is not None:
        sys.setswitchinterval(switch_interval)
    engine: Engine | EngineClient
    if engine_process:
        model_dir = Path(engine_config.model_dir)
        engine = EngineClient.spawn(functools.partial(start_core, engine_config), model_tokenizer(model_dir))
        summary = f"{engine.info.summary}; in engine process {engine.pid}"
    else:
        engine = Engine(engine_config).start()
        engine.grammars.warm_up()  # the first constrained request need not wait for the vocabulary
        summary = describe(engine.core)
    freeze_startup_heap()  # this process serves until it exits (wicore/engine_process/heap.py)
    try:
        return serve_engine(engine, settings, summary, host, port, grace_seconds, limits)
    finally:
        engine.stop()


def serve_engine(
    engine: Engine | EngineClient,
    settings: ServerSettings,
    summary: str,
    host: str,
    port: int,
    grace_seconds: float = 30.0,
    limits: ConnectionLimits = DEFAULT_LIMITS,
) -> int:
    """Serve a started engine (`summary`: its half of the startup line) until SIGTERM / SIGINT: 0;
    or until its process dies: 1, that said in one line; stopping the engine stays with the caller."""
    app = create_app(engine, settings)
    log.info("%s", startup_summary(summary, settings))
    log.info("serving %s on http://%s:%d", settings.model_name, host, port)
    config = hypercorn_config(host, port, grace_seconds, True, limits)
    died: list[str] = []

    async def main() -> None:
        stop = asyncio.Event()
        if isinstance(engine, EngineClient):

            def on_death(why: str) -> None:
                died.append(why)
                print(f"wicore: error: {why}; the server stops", file=sys.stderr, flush=True)
                stop.set()

            await engine.attach(on_death)
        await _serve_until_signal(app, config, limits, lambda: _in_flight(engine), stop)

    asyncio.run(main())
    return 1 if died else 0


def startup_summary(engine_summary: str, settings: ServerSettings) -> str:
    """One line of what is serving: the export, where it runs, the KV tiers (`engine_summary`:
    wicore.engine_process.info.describe), and the guards."""
    rate = f"{settings.rate_limit_rpm:g}/min a key" if settings.rate_limit_rpm else "off"
    auth = f"{len(settings.api_keys)} key(s)" if settings.api_keys else "off"
    return f"{settings.model_name}: {engine_summary}; auth {auth}; rate limit {rate}"


def _in_flight(engine: Engine | EngineClient) -> int:
    """Requests the engine still runs or holds (what a shutdown waits for)."""
    stats = engine.stats()
    return stats.running + stats.waiting + stats.swapped


async def _serve_until_signal(
    app: Any,
    config: Config,
    limits: ConnectionLimits,
    in_flight: Callable[[], int] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Serve until SIGTERM / SIGINT (or `stop` is set); `in_flight` counts what the shutdown waits
    for (the console says)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(name: str) -> None:
        if stop.is_set():  # the second one: nothing more to wait for
            print(f"wicore: {name} again: quitting now", file=sys.stderr, flush=True)
            os._exit(130)
        stop.set()
        count = in_flight() if in_flight is not None else 0
        waiting = f"{count} request(s) still generating get up to {config.graceful_timeout:g} s (--grace-seconds)"
        print(
            f"wicore: {name}: shutting down, draining: {waiting if count else 'nothing is generating'}; "
            "press Ctrl-C again to quit now",
            file=sys.stderr,
            flush=True,
        )

    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, on_signal, "Ctrl-C" if sig == signal.SIGINT else sig.name)
        except (NotImplementedError, RuntimeError):  # not the main thread, or no signals (Windows)
            pass
    await run_hypercorn(app, config, listening_sockets(config, limits), stop)


def listening_sockets(config: Config, limits: ConnectionLimits) -> Sockets:
    """`config`'s addresses bound, the plain-HTTP ones wrapped to hold at most `limits` connections."""
    sockets = config.create_sockets()
    limited = [LimitedListener(listener, limits) for listener in sockets.insecure_sockets]
    return Sockets(sockets.secure_sockets, limited, sockets.quic_sockets)  # type: ignore[arg-type]


async def run_hypercorn(app: Any, config: Config, sockets: Sockets, stop: asyncio.Event) -> None:
    """Serve `app` on `sockets` until `stop` is set, then shut down as the module docstring says
    (hypercorn.asyncio.serve, given the sockets)."""
    asyncio.get_running_loop().set_exception_handler(_ignore_cancelled_connections)
    await worker_serve(
        wrap_app(app, config.wsgi_max_body_size, None),
        config,
        sockets=sockets,
        shutdown_trigger=lambda: _until_stopped(stop, app, config.graceful_timeout),
    )


def _ignore_cancelled_connections(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's exception handler: as the default, less one traceback. When the grace period
    ends, Hypercorn cancels the connections still open (a body still arriving, say), and Python
    3.11's asyncio.streams asks each cancelled connection task for its exception in a done
    callback, which raises CancelledError there: logged as "Exception in callback" with a
    traceback (Python 3.12 checks first). Those connections were cut on purpose."""
    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)


async def _until_stopped(stop: asyncio.Event, app: Any, grace_seconds: float) -> None:
    """Hypercorn's shutdown trigger: returns when `stop` is set, having scheduled the cut of
    the streams still open just before the grace period runs out."""
    await stop.wait()
    api = getattr(getattr(app, "state", None), "api", None)
    if api is not None:
        cut_at = max(0.0, grace_seconds - min(1.0, grace_seconds / 2))
        asyncio.get_running_loop().call_later(cut_at, api.streams.cut)
        await api.sockets.drain()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ServerThread:
    """A real Hypercorn server for an app, on its own event loop thread (tests, benchmarks)."""

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int | None = None,
        grace_seconds: float = 5.0,
        limits: ConnectionLimits = DEFAULT_LIMITS,
    ) -> None:
        self.app = app
        self.host = host
        self.port = port or free_port(host)
        self.config = hypercorn_config(host, self.port, grace_seconds, limits=limits)
        self.sockets = listening_sockets(self.config, limits)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def num_connections(self) -> int:
        """Connections open now (accepted and not yet closed)."""
        return sum(s.num_open for s in self.sockets.insecure_sockets if isinstance(s, LimitedListener))

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread = threading.Thread(target=self._run, name="wicore-http", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the HTTP server did not start")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # wait until the sockets listen (no probe: it would hold a connection)
            if all(s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) for s in self.sockets.insecure_sockets):
                return self
            threading.Event().wait(0.05)
        raise RuntimeError(f"nothing listens on {self.url}")

    def _run(self) -> None:
        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self._ready.set()
            await run_hypercorn(self.app, self.config, self.sockets, self._stop)

        asyncio.run(main())

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
