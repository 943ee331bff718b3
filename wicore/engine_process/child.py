"""The engine process: one core, stepped by the main thread, between two threads on the socket.

    receiver thread   read a frame of commands ─► Add: core.make_request (checks, the grammar
                      compiled, off the step) ─► inbox; Abort, Stop ─► inbox; EOF ─► Stop
    main thread       take the inbox ─► core.add / core.abort ─► core.step() ─► outbox
    sender thread     outbox ─► one frame of every Step queued since its last write

What `Engine` does behind its inbox in one process (wicore.engine.engine), with the channels
replaced by one message a step for all requests. The sender never makes a step wait for the API
process: when it lags, the steps queued meanwhile go as one frame.

The child ignores SIGINT and SIGTERM: Ctrl-C reaches the whole process group, and the server
drains its requests before it sends `Stop`. When the API process dies, the socket's EOF stops it.
"""

from __future__ import annotations

import logging
import queue
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass

from wicore.engine.engine import IDLE_WAIT
from wicore.engine.request import Request
from wicore.engine_process.frames import Abort, Add, EngineInfo, Failed, Ready, Step, Stop, encode, read
from wicore.engine_process.heap import freeze_startup_heap
from wicore.engine_process.info import SteppedCore
from wicore.errors import WiCoreError
from wicore.types.outputs import RequestOutput

log = logging.getLogger("wicore.engine_process")
STATS_EVERY = 0.1  # s: a Step carries the engine's stats at least this often while it steps


@dataclass(frozen=True)
class _Admitted:
    request: Request


@dataclass(frozen=True)
class _Refused:
    request_id: str
    error: WiCoreError


_Command = _Admitted | _Refused | Abort | Stop


def serve_core(start: Callable[[], tuple[SteppedCore, EngineInfo]], sock: socket.socket) -> None:
    """The child process's target: build the core (`start`), say `Ready` (or `Failed`), then step
    until `Stop` or the API process goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        core, info = start()
    except WiCoreError as exc:
        sock.sendall(encode(Failed(exc, str(exc))))
        return
    except Exception as exc:
        traceback.print_exc()
        sock.sendall(encode(Failed(None, f"{type(exc).__name__}: {exc}")))
        return
    try:
        freeze_startup_heap()  # the core's long-lived objects out of the collector's walks (heap.py)
        sock.sendall(encode(Ready(info)))
        CoreLoop(core, sock).run()
    except OSError:  # the API process went away while the core was built (Ctrl-C during startup)
        pass
    finally:
        core.close()


class CoreLoop:
    def __init__(self, core: SteppedCore, sock: socket.socket) -> None:
        self.core = core
        self.sock = sock
        self._inbox: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue[Step | None] = queue.SimpleQueue()  # None: the last
        self._num_taken = 0  # Adds handed to the core or refused
        self._refusals: list[tuple[str, WiCoreError]] = []
        self._news = False  # commands taken since the last Step
        self._stats_due = 0.0  # time.monotonic() when a Step next carries the stats regardless

    def run(self) -> None:
        receiver = threading.Thread(target=self._receive, name="wicore-engine-receive", daemon=True)
        sender = threading.Thread(target=self._send, name="wicore-engine-send", daemon=True)
        receiver.start()
        sender.start()
        try:
            self._loop()
        finally:
            self._outbox.put(None)
            sender.join()

    def _loop(self) -> None:
        core = self.core
        while True:
            # Block for news when there is nothing to step; else take what came and step.
            if not self._take(block=not core.has_work):
                return
            outputs: list[RequestOutput] = []
            steps = core.num_steps
            if core.has_work:
                outputs = core.step()
            if outputs or core.num_steps != steps or self._news:
                self._publish(outputs)
            idle = core.has_work and core.num_steps == steps and not outputs  # wait for news or a deadline
            if idle and not self._take(block=True, timeout=IDLE_WAIT):
                return

    def _take(self, block: bool, timeout: float | None = None) -> bool:
        """Hand the inbox's commands to the core (waiting for the first if `block`); False on stop."""
        try:
            command = self._inbox.get(block=block, timeout=timeout)
        except queue.Empty:
            return True
        self._news = True
        while True:
            if isinstance(command, Stop):
                return False
            if isinstance(command, _Admitted):
                self.core.add(command.request)
                self._num_taken += 1
            elif isinstance(command, _Refused):
                self._refusals.append((command.request_id, command.error))
                self._num_taken += 1
            else:
                self.core.abort(command.request_id)
            try:
                command = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _publish(self, outputs: list[RequestOutput]) -> None:
        """A Step out; the stats with it where something ended or arrived (what /v1/stats and a
        shutdown's wait read right after) or STATS_EVERY has passed: building and pickling them
        every step costs ~0.1 ms, a few percent of a small model's step on a GPU."""
        now = time.monotonic()
        due = self._news or bool(self._refusals) or any(o.finished for o in outputs) or now >= self._stats_due
        stats = self.core.stats() if due else None
        if due:
            self._stats_due = now + STATS_EVERY
        self._outbox.put(Step(outputs, stats, self.core.num_waiting, self._num_taken, self._refusals))
        self._refusals = []
        self._news = False

    def _receive(self) -> None:
        """The receiver thread: commands in, checked and made into requests here (a big schema
        compiles here, not in the step), in order through the inbox."""
        try:
            while True:
                for command in read(self.sock):
                    if isinstance(command, Add):
                        try:
                            request = self.core.make_request(
                                command.prompt_ids,
                                command.params,
                                command.request_id,
                                command.priority,
                                command.deadline,
                                command.images,
                            )
                        except WiCoreError as exc:
                            self._inbox.put(_Refused(command.request_id, exc))
                            continue
                        self._inbox.put(_Admitted(request))
                    else:
                        self._inbox.put(command)
                        if isinstance(command, Stop):
                            return
        except (EOFError, OSError):  # the API process is gone: nobody reads what we make
            self._inbox.put(Stop())

    def _send(self) -> None:
        """The sender thread: every Step queued since the last write, as one frame."""
        while True:
            steps = [self._outbox.get()]
            while True:
                try:
                    steps.append(self._outbox.get_nowait())
                except queue.Empty:
                    break
            last = steps[-1] is None
            batch = [s for s in steps if s is not None]
            try:
                if batch:
                    self.sock.sendall(encode(batch))
            except OSError:  # the API process is gone; the receiver stops the loop
                log.debug("could not send a step", exc_info=True)
            if last:
                return
