"""The engine process's loop (wicore.engine_process.child.CoreLoop) over a socket pair, in a thread,
around a core that makes one token a step: what the API process reads back, frame by frame."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from wicore.engine.stats import EngineStats, TierCounts
from wicore.engine_process.child import CoreLoop
from wicore.engine_process.frames import Abort, Add, Step, Stop, encode, read
from wicore.errors import RequestError
from wicore.types.outputs import Priority, RequestOutput
from wicore.types.sampling import SamplingParams

REFUSED = [13]  # a prompt the core refuses


class CountingCore:
    """A SteppedCore whose step gives each running request its next token: 100, 101, ..."""

    def __init__(self) -> None:
        self.running: dict[str, list[int]] = {}  # id -> [tokens made, tokens to make]
        self.num_steps = 0

    @property
    def has_work(self) -> bool:
        return bool(self.running)

    @property
    def num_waiting(self) -> int:
        return 0  # every request runs from its add

    def make_request(self, ids, params, request_id, priority=Priority.NORMAL, deadline=None, images=()):  # type: ignore[no-untyped-def]
        if ids == REFUSED:
            raise RequestError("refused")
        return request_id, params.max_tokens

    def add(self, request: tuple[str, int]) -> None:
        self.running[request[0]] = [0, request[1]]

    def abort(self, request_id: str) -> None:
        if request_id in self.running:  # unknown ids are ignored, as EngineCore ignores them
            self.running[request_id][1] = self.running[request_id][0]

    def step(self) -> list[RequestOutput]:
        time.sleep(0.001)  # a step takes a while: an abort arrives while its request runs
        outputs = []
        for request_id, counts in list(self.running.items()):
            if counts[0] < counts[1]:
                outputs.append(RequestOutput(request_id, [100 + counts[0]], counts[0] + 1 == counts[1], None))
                counts[0] += 1
                if counts[0] < counts[1]:
                    continue
            else:
                outputs.append(RequestOutput(request_id, [], True, "abort"))
            del self.running[request_id]
        self.num_steps += 1
        return outputs

    def stats(self) -> EngineStats:
        none = TierCounts()
        return EngineStats(len(self.running), 0, 0, none, none, none, {}, 0.0, 0, 0, 0, 0, 0, 0, 0, 0, 0.0, self.num_steps)

    def close(self) -> None:
        pass


@pytest.fixture
def child() -> Iterator[tuple[socket.socket, threading.Thread]]:
    ours, theirs = socket.socketpair()
    loop = threading.Thread(target=CoreLoop(CountingCore(), theirs).run, daemon=True)
    loop.start()
    yield ours, loop
    ours.close()
    loop.join(timeout=10)
    theirs.close()


def add(request_id: str, prompt: list[int], max_tokens: int) -> Add:
    return Add(request_id, prompt, SamplingParams(max_tokens=max_tokens), Priority.NORMAL, None)


def steps_until(sock: socket.socket, request_id: str) -> list[Step]:
    """Every Step read until `request_id`'s final output."""
    steps: list[Step] = []
    while not any(o.request_id == request_id and o.finished for s in steps for o in s.outputs):
        steps += read(sock)
    return steps


def test_outputs_refusals_and_the_adds_taken_come_back_in_steps(child) -> None:
    sock, _ = child
    sock.sendall(encode([add("a", [1, 2], 3), add("b", REFUSED, 3)]))
    steps = steps_until(sock, "a")
    tokens = [(o.request_id, o.new_token_ids, o.finished) for s in steps for o in s.outputs]
    assert tokens == [("a", [100], False), ("a", [101], False), ("a", [102], True)]
    refusals = [(request_id, str(error)) for s in steps for request_id, error in s.refusals]
    assert refusals == [("b", "refused")]
    assert isinstance(steps[0].refusals[0][1], RequestError)  # the error itself, for the client to raise
    assert steps[0].num_taken == steps[-1].num_taken == 2
    assert steps[-1].stats.running == 0


def test_stats_ride_only_on_steps_where_a_request_arrived_or_ended(child, monkeypatch) -> None:
    """With STATS_EVERY out of reach, the steps in between carry none (the API process keeps the
    last); every step still says how many wait."""
    monkeypatch.setattr("wicore.engine_process.child.STATS_EVERY", 3600.0)
    sock, _ = child
    sock.sendall(encode([add("a", [1], 20)]))
    steps = [s for s in steps_until(sock, "a") if s.outputs]
    assert len(steps) == 20
    assert [s.stats is not None for s in steps] == [True] + [False] * 18 + [True]
    assert (steps[0].stats.running, steps[-1].stats.running) == (1, 0)  # type: ignore[union-attr]
    assert {s.waiting for s in steps} == {0}


def test_an_abort_ends_a_request_at_the_next_step(child) -> None:
    sock, _ = child
    sock.sendall(encode([add("a", [1], 10**9)]))
    first = read(sock)[0]
    assert [(o.request_id, o.new_token_ids) for o in first.outputs] == [("a", [100])]
    sock.sendall(encode([Abort("a")]))
    last = steps_until(sock, "a")[-1].outputs[-1]
    assert (last.finished, last.finish_reason, last.new_token_ids) == (True, "abort", [])


def test_stop_and_a_closed_socket_end_the_loop(child) -> None:
    sock, loop = child
    sock.sendall(encode([Stop()]))
    loop.join(timeout=10)
    assert not loop.is_alive()


def test_the_api_process_gone_ends_the_loop(child) -> None:
    sock, loop = child
    sock.sendall(encode([add("a", [1], 1000)]))
    read(sock)
    sock.close()  # the API process died: the receiver reads EOF
    loop.join(timeout=10)
    assert not loop.is_alive()
