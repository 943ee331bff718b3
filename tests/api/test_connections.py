"""Connection limits on a real server and port (wicore/api/connections.py): a cap on open
connections answered with an OpenAI-shaped 503, and half-sent headers dropped after the header
timeout. A body dripping past its timeout is a 408 (tests/api/test_hardening.py)."""

from __future__ import annotations

import json
import signal
import socket
import time

import httpx
import pytest

from wicore.api.connections import ConnectionLimits
from wicore.api.server import ServerThread

HALF_HEADERS = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # no blank line: the headers never end


def read_all(sock: socket.socket) -> bytes:
    """What the server sends until it closes the connection."""
    sock.settimeout(30)
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def wait_for(predicate, what: str) -> None:
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def limited(tiny_server):
    """limited(header_timeout_seconds): the tiny model's app behind a second server that holds 4 connections."""
    servers: list[ServerThread] = []

    def start(header_timeout_seconds: float) -> ServerThread:
        limits = ConnectionLimits(max_connections=4, header_timeout_seconds=header_timeout_seconds)
        server = ServerThread(tiny_server().app, limits=limits).start()
        servers.append(server)
        assert server.num_connections == 0
        return server

    yield start
    for server in servers:
        server.stop()


def test_past_the_limit_a_connection_gets_a_503_and_a_freed_slot_serves_again(limited):
    limited = limited(header_timeout_seconds=60)
    held = [socket.create_connection(("127.0.0.1", limited.port)) for _ in range(4)]
    for sock in held:
        sock.sendall(HALF_HEADERS)
    wait_for(lambda: limited.num_connections == 4, "four open connections")
    with socket.create_connection(("127.0.0.1", limited.port)) as extra:
        reply = read_all(extra)
    head, body = reply.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and b"retry-after: 1" in head
    assert json.loads(body) == {
        "error": {
            "message": "the server has 4 connections open, its limit; retry later",
            "type": "server_error",
            "param": None,
            "code": "too_many_connections",
        }
    }
    held.pop().close()
    wait_for(lambda: limited.num_connections == 3, "the closed connection to be counted out")
    assert httpx.get(f"{limited.url}/health").status_code == 200
    for sock in held:
        sock.close()


def test_half_sent_headers_are_dropped_after_the_header_timeout(limited):
    """Many clients that never finish their headers (slowloris) hold no slot past the timeout."""
    limited = limited(header_timeout_seconds=1)
    held = [socket.create_connection(("127.0.0.1", limited.port)) for _ in range(4)]
    for sock in held:
        sock.sendall(HALF_HEADERS)
    assert [read_all(sock) for sock in held] == [b""] * 4  # closed by the server, no response
    wait_for(lambda: limited.num_connections == 0, "the dropped connections to be counted out")
    assert httpx.get(f"{limited.url}/health").status_code == 200
    for sock in held:
        sock.close()


@pytest.mark.slow  # 3 s on the 2-core VM, loaded
def test_wicore_serve_takes_the_limits_from_its_flags(tiny_export, launch):
    """--max-connections 2: of three silent connections at least one is refused (launch's own
    health check may still hold a slot: Hypercorn keeps a connection its client closed while
    idle until the header timeout ends); the held ones are closed after --header-timeout 1; a
    body that stops is a 408 after --body-timeout 1."""
    folder, _ = tiny_export()
    proc, url = launch(folder, "--max-connections", "2", "--header-timeout", "1", "--body-timeout", "1")
    port = int(url.rsplit(":", 1)[1])
    try:
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
        replies = [read_all(sock) for sock in silent]
        refused = [r.startswith(b"HTTP/1.1 503 ") for r in replies]
        assert all(r == b"" or is_refused for r, is_refused in zip(replies, refused)), replies
        assert any(refused) and not all(refused)
        body = b'{"prompt": [1, 2], "max_tokens": 1}'
        head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        with socket.create_connection(("127.0.0.1", port)) as slow_body:
            slow_body.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body[:5])  # the rest never comes
            assert read_all(slow_body).startswith(b"HTTP/1.1 408 ")
        for sock in silent:
            sock.close()
        assert httpx.get(f"{url}/health").status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"NOT HTTP\r\n\r\n", b"400"),  # h11 cannot parse it
        (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n", b"431"),  # past 16 KiB
    ],
)
def test_what_hypercorn_answers_itself_has_an_empty_body(tiny_server, request_bytes, status):
    """Before the app sees a request Hypercorn answers on its own, with no body to shape
    (documented in wicore/api/errors.py and docs/API.md); the server goes on serving."""
    server = tiny_server().server
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(request_bytes)
        reply = read_all(sock)
    head, body = reply.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 " + status + b" ") and b"content-length: 0" in head and body == b""
    assert httpx.get(f"{server.url}/health").status_code == 200
