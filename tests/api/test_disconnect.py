"""Clients that leave (HTTP/1.1, HTTP/2), take more than their share of the queue, or are cut by
a shutdown (issue 35).

The tiny multimodal model (it has a tokenizer, which /v1/inference needs) with a 4,096-token
context: a request for 4,000 tokens runs for many seconds on the CPU, long enough to be cut.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import h2.config
import h2.connection
import h2.events
import httpx
import pytest

from wicore.api.app import ServerSettings, create_app
from wicore.api.server import ServerThread
from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.stats import EngineStats

LONG = 4000
BODIES = {
    "/v1/inference": {"prompt": "hello world", "max_tokens": LONG},
    "/v1/completions": {"prompt": "hello world", "max_tokens": LONG, "ignore_eos": True, "temperature": 0},
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": "hello world"}],
        "max_tokens": LONG,
        "ignore_eos": True,
        "temperature": 0,
    },
}


@pytest.fixture(scope="module")
def engine(tiny_multimodal_long):
    eng = Engine(
        EngineConfig(model_dir=tiny_multimodal_long.export(), num_threads=2, verify_files=False, num_device_blocks=300)
    ).start()
    yield eng
    eng.stop()


@pytest.fixture(scope="module")
def server(engine):
    served = ServerThread(create_app(engine, ServerSettings(model_name="long"))).start()
    yield served
    served.stop()


def wait_running(engine: Engine, num_running: int, timeout: float) -> EngineStats:
    deadline = time.monotonic() + timeout
    while (stats := engine.stats()).running != num_running:
        assert time.monotonic() < deadline, f"{stats.running} running after {timeout} s, not {num_running}"
        time.sleep(0.02)
    return stats


def count_499(server: ServerThread, route: str) -> float:
    for line in httpx.get(f"{server.url}/metrics").text.splitlines():
        if line.startswith(f'wicore_requests_total{{route="{route}",status="499"}}'):
            return float(line.split()[-1])
    return 0.0


@pytest.mark.parametrize("route", list(BODIES))
def test_a_client_that_closes_its_connection_aborts_its_request(engine, server, route):
    """Issue 35: /v1/inference had no disconnect watcher; 40 dropped clients kept 40 requests running."""
    body = json.dumps(BODIES[route]).encode()
    before = count_499(server, route)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        head = (
            f"POST {route} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body)
        wait_running(engine, 1, timeout=60)
        generated = engine.stats().generated_tokens
    stats = wait_running(engine, 0, timeout=5)
    assert stats.generated_tokens - generated < LONG // 2  # aborted, not run to its end
    assert stats.blocks_referenced.total == 0
    deadline = time.monotonic() + 5
    while count_499(server, route) != before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert count_499(server, route) == before + 1


@pytest.mark.parametrize("route", list(BODIES))
def test_an_http2_stream_reset_aborts_its_request_and_the_connection_goes_on(engine, server, route):
    """RST_STREAM cancels one request of an HTTP/2 connection (h2c with prior knowledge); the
    connection stays open and answers its next stream."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        conn.initiate_connection()
        sock.sendall(conn.data_to_send())
        body = json.dumps(BODIES[route]).encode()
        headers = [
            (":method", "POST"),
            (":path", route),
            (":scheme", "http"),
            (":authority", f"127.0.0.1:{server.port}"),
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
        ]
        conn.send_headers(1, headers)
        conn.send_data(1, body, end_stream=True)
        sock.sendall(conn.data_to_send())
        wait_running(engine, 1, timeout=60)
        generated = engine.stats().generated_tokens
        conn.reset_stream(1)
        sock.sendall(conn.data_to_send())
        stats = wait_running(engine, 0, timeout=5)
        assert stats.generated_tokens - generated < LONG // 2
        conn.send_headers(
            3, [(":method", "GET"), (":path", "/health"), (":scheme", "http"), (":authority", "x")], end_stream=True
        )
        sock.sendall(conn.data_to_send())
        answer = b""
        sock.settimeout(10)
        while True:
            events = conn.receive_data(sock.recv(65536))
            sock.sendall(conn.data_to_send())
            answer += b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived) and e.stream_id == 3)
            if any(isinstance(e, h2.events.StreamEnded) and e.stream_id == 3 for e in events):
                break
    assert json.loads(answer) == {"status": "ok"}


@pytest.mark.parametrize("route", list(BODIES))
@pytest.mark.slow  # 3 s on the 2-core VM, loaded
def test_a_non_streamed_answer_cut_by_shutdown_is_a_503_with_a_body(engine, route):
    """Issue 35: it was an empty 500. A second server on the same engine, 2 s of grace."""
    server = ServerThread(create_app(engine, ServerSettings(model_name="long")), grace_seconds=2.0).start()
    answers: list[httpx.Response] = []
    asking = threading.Thread(target=lambda: answers.append(httpx.post(f"{server.url}{route}", json=BODIES[route], timeout=60)))
    asking.start()
    wait_running(engine, 1, timeout=60)
    started = time.monotonic()
    server.stop()
    asking.join(timeout=60)
    assert time.monotonic() - started < 4.0
    [answer] = answers
    assert answer.status_code == 503, answer.text
    error = answer.json()["error"]
    assert (error["code"], error["type"]) == ("server_shutting_down", "server_error")
    wait_running(engine, 0, timeout=5)


@pytest.fixture(scope="module")
def shared_server(engine):
    """A server that lets one connection have 2 requests in flight."""
    served = ServerThread(create_app(engine, ServerSettings(model_name="long", max_requests_per_connection=2))).start()
    yield served
    served.stop()


def next_frame(ws, request_id: str, kinds: tuple[str, ...] = ("done", "error")) -> dict:
    """The next frame of `request_id` of one of `kinds` (chunks of others skipped)."""
    while True:
        frame = json.loads(ws.recv(timeout=60))
        if frame.get("id") == request_id and frame["type"] in kinds:
            return frame


def test_one_websocket_cannot_take_more_than_its_share_of_the_queue(engine, shared_server):
    """Issue 35: one socket filled the whole waiting queue. Past its 2 requests in flight it gets a
    429 error frame; another socket is still served, and a request that ends frees its place."""
    from websockets.sync.client import connect

    body = {"prompt": [20, 21, 22], "max_tokens": LONG, "ignore_eos": True}
    url = f"ws://127.0.0.1:{shared_server.port}/v1/ws"
    with connect(url) as greedy, connect(url) as other:
        for request_id in ("a", "b", "c"):
            greedy.send(json.dumps({"type": "completion", "id": request_id, "body": body}))
        refused = next_frame(greedy, "c")
        assert (refused["type"], refused["status"], refused["error"]["code"]) == ("error", 429, "too_many_in_flight")
        assert refused["error"]["message"] == (
            "this connection has 2 requests queued or running and may have at most 2 (each choice counts): "
            "wait for some to finish"
        )
        other.send(json.dumps({"type": "completion", "id": "x", "body": {**body, "max_tokens": 3}}))
        done = next_frame(other, "x")
        assert (done["type"], done["usage"]["completion_tokens"]) == ("done", 3)
        greedy.send(json.dumps({"type": "cancel", "id": "a"}))
        assert next_frame(greedy, "a")["cancelled"] is True
        greedy.send(json.dumps({"type": "completion", "id": "d", "body": body}))
        wait_running(engine, 2, timeout=30)  # b and d
        for request_id in ("b", "d"):
            greedy.send(json.dumps({"type": "cancel", "id": request_id}))
            assert next_frame(greedy, request_id)["type"] == "done"
    wait_running(engine, 0, timeout=10)
    assert shared_server.app.state.api.in_flight.counts == {}


@pytest.mark.slow  # 5 s on the 2-core VM, loaded
def test_the_streams_of_one_http2_connection_share_its_limit(engine, shared_server):
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    body = json.dumps(BODIES["/v1/inference"]).encode()
    with socket.create_connection(("127.0.0.1", shared_server.port)) as sock:
        conn.initiate_connection()
        for stream_id in (1, 3, 5):
            headers = [
                (":method", "POST"),
                (":path", "/v1/inference"),
                (":scheme", "http"),
                (":authority", "127.0.0.1"),
                ("content-type", "application/json"),
            ]
            conn.send_headers(stream_id, headers)
            conn.send_data(stream_id, body, end_stream=True)
        sock.sendall(conn.data_to_send())
        status, answer = None, b""
        sock.settimeout(30)
        while status is None or not answer.endswith(b"}"):
            for event in conn.receive_data(sock.recv(65536)):
                if isinstance(event, h2.events.ResponseReceived):
                    status = dict(event.headers)[b":status"]
                    first = event.stream_id
                elif isinstance(event, h2.events.DataReceived):
                    answer += event.data
            sock.sendall(conn.data_to_send())
        assert (first, status) == (5, b"429")
        assert json.loads(answer)["error"]["code"] == "too_many_in_flight"
        wait_running(engine, 2, timeout=30)
    wait_running(engine, 0, timeout=10)
