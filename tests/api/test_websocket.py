"""/v1/ws on a real Hypercorn server and a tiny random model (no tokenizer): messages the server
refuses, auth, origins and the rate limit, each answered as the HTTP endpoints answer it."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest
from multimodal import png
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect


def ws_url(served) -> str:
    return served.url.replace("http://", "ws://") + "/v1/ws"


def open_socket(served, **options: Any) -> ClientConnection:
    return connect(ws_url(served), open_timeout=10, **options)


def ask(ws: ClientConnection, message: Any) -> dict[str, Any]:
    """Send one message (JSON unless str / bytes); the next frame."""
    ws.send(message if isinstance(message, (str, bytes)) else json.dumps(message))
    return json.loads(ws.recv(timeout=30))


def http_error(served, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    r = httpx.post(f"{served.url}{path}", content=json.dumps(body), headers=headers, timeout=30)
    return r.status_code, r.json()["error"]


@pytest.fixture(scope="module")
def open_server(tiny_server):
    return tiny_server(max_body_bytes=4096, cors_origins=("https://app.example",))


@pytest.fixture(scope="module")
def locked_server(tiny_server):
    return tiny_server(api_keys=("secret-1",), rate_limit_rpm=1, rate_limit_burst=2, body_timeout_seconds=0.5)


@pytest.mark.parametrize(
    ("kind", "path", "body"),
    [
        ("completion", "/v1/completions", {"prompt": [1, 2, 3]}),  # no tokenizer: the answer could not be decoded
        ("completion", "/v1/completions", {"prompt": "a", "top_p": "high"}),
        ("completion", "/v1/completions", {"model": "gpt-9", "prompt": [1, 2]}),
        ("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": 5}),
        ("chat", "/v1/chat/completions", {"messages": "hi"}),
        ("chat", "/v1/chat/completions", None),
    ],
)
def test_a_request_gets_the_error_object_and_status_http_gives_the_same_body(open_server, kind, path, body):
    status, error = http_error(open_server, path, body)
    with open_socket(open_server) as ws:
        frame = ask(ws, {"type": kind, "id": "r1", "body": body})
    assert frame == {"type": "error", "id": "r1", "status": status, "error": error}


def test_bad_messages_get_error_frames_and_the_socket_goes_on(open_server):
    def error(frame: dict[str, Any]) -> tuple[object, int, str | None, str]:
        assert frame["type"] == "error" and set(frame["error"]) == {"message", "type", "param", "code"}
        return frame["id"], frame["status"], frame["error"]["param"], frame["error"]["code"]

    with open_socket(open_server) as ws:
        assert error(ask(ws, "{not json")) == (None, 400, None, "invalid_json")
        assert error(ask(ws, "[" * 3000)) == (None, 400, None, "invalid_json")
        assert error(ask(ws, b"\x00binary")) == (None, 400, None, "invalid_message")
        assert error(ask(ws, [1])) == (None, 400, "type", "invalid_message")
        assert error(ask(ws, {"type": "poem", "id": "a"})) == ("a", 400, "type", "invalid_message")  # its id kept
        assert error(ask(ws, {"type": "poem", "id": ""})) == (None, 400, "type", "invalid_message")  # not an id
        assert error(ask(ws, {"type": ["chat"], "id": "a"})) == ("a", 400, "type", "invalid_message")
        assert error(ask(ws, {"type": "chat", "body": {}})) == (None, 400, "id", "invalid_message")
        assert error(ask(ws, {"type": "chat", "id": "", "body": {}})) == (None, 400, "id", "invalid_message")
        assert error(ask(ws, {"type": "cancel", "id": "never-sent"})) == ("never-sent", 404, "id", "not_running")
        too_big = {"type": "completion", "id": "big", "body": {"prompt": "x" * 5000}}
        frame = ask(ws, too_big)
        assert error(frame) == (None, 413, None, "body_too_large") and "4096" in frame["error"]["message"]
        # The same socket still takes requests: integer ids come back as strings.
        assert error(ask(ws, {"type": "completion", "id": 7, "body": {"prompt": [1]}})) == ("7", 400, None, "invalid_request")
    assert httpx.get(f"{open_server.url}/health").json() == {"status": "ok"}


def test_origins_are_those_of_cors_or_the_page_itself(open_server):
    with pytest.raises(InvalidStatus) as info:
        open_socket(open_server, origin="https://evil.example")
    assert info.value.response.status_code == 403
    assert json.loads(info.value.response.body)["error"]["code"] == "bad_origin"
    host = open_server.url.removeprefix("http://")
    for origin in (f"http://{host}", "https://app.example"):
        with open_socket(open_server, origin=origin) as ws:
            assert ask(ws, {"type": "completion", "id": "a", "body": {"prompt": [1]}})["status"] == 400


def test_auth_by_first_message_or_header_and_the_rate_limit_per_message(locked_server):
    body = {"prompt": [1]}  # passes auth and the rate limit, then fails for want of a tokenizer (400)
    with open_socket(locked_server) as ws:
        refused = ask(ws, {"type": "completion", "id": "a", "body": body})
        assert (refused["id"], refused["status"], refused["error"]["code"]) == ("a", 401, "invalid_api_key")
        wrong = ask(ws, {"type": "auth", "api_key": "secret-2"})
        assert (wrong["id"], wrong["status"], wrong["error"]["message"]) == (None, 401, "incorrect API key")
        assert ask(ws, {"type": "auth", "api_key": "secret-1"}) == {"type": "auth", "ok": True}
        assert ask(ws, {"type": "completion", "id": "b", "body": body})["status"] == 400
    with open_socket(locked_server, additional_headers={"Authorization": "Bearer secret-1"}) as ws:
        assert ask(ws, {"type": "completion", "id": "c", "body": body})["status"] == 400
        limited = ask(ws, {"type": "completion", "id": "d", "body": body})  # the key's burst of 2 is spent
        assert (limited["status"], limited["error"]["code"]) == (429, "rate_limit_exceeded")
        assert limited["retry_after"] in (59, 60)  # a request a minute: the next one in a minute
    with pytest.raises(InvalidStatus) as info:
        open_socket(locked_server, additional_headers={"Authorization": "Bearer wrong"})
    assert info.value.response.status_code == 401


def test_a_socket_that_never_authenticates_is_closed(locked_server):
    with open_socket(locked_server) as ws, pytest.raises(ConnectionClosed) as info:
        ws.recv(timeout=30)  # the server's body timeout is 0.5 s
    assert info.value.rcvd is not None and info.value.rcvd.code == 1008


def test_frames_before_auth_do_not_extend_the_auth_deadline(locked_server):
    """Issue 35: the deadline restarted with every frame, so keyless sockets sending junk held their
    connection slots forever. Junk every 0.2 s: closed 0.5 s after the upgrade all the same."""
    import time

    with open_socket(locked_server) as ws:
        opened = time.monotonic()
        with pytest.raises(ConnectionClosed) as info:
            for _ in range(20):
                ws.send(json.dumps({"type": "ping"}))
                assert json.loads(ws.recv(timeout=5))["status"] == 400
                time.sleep(0.2)
        assert info.value.rcvd is not None and info.value.rcvd.code == 1008
        assert time.monotonic() - opened < 1.5


def test_without_the_page_the_socket_stays(tiny_server):
    served = tiny_server(web=False)
    assert httpx.get(f"{served.url}/").status_code == 404
    with open_socket(served) as ws:
        assert ask(ws, "{")["error"]["code"] == "invalid_json"


def test_an_image_chat_streams_the_http_answer(multimodal_server):
    """image_url parts go through the HTTP endpoint's image code: the same greedy text and usage."""
    served = multimodal_server()
    image = f"data:image/png;base64,{base64.b64encode(png(3, (64, 48))).decode()}"
    content = [{"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "What is in this picture?"}]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0}
    expected = httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=60).json()
    with open_socket(served) as ws:
        ws.send(json.dumps({"type": "chat", "id": "img", "body": body}))
        text, frame = "", {"type": "chunk"}
        while frame["type"] == "chunk":
            frame = json.loads(ws.recv(timeout=60))
            text += "".join(c["delta"].get("content", "") for c in frame.get("chunk", {}).get("choices", []))
    assert text == expected["choices"][0]["message"]["content"] != ""
    # The same prompt again: its full blocks of 16 tokens come from the prefix cache.
    cached = {"cached_tokens": expected["usage"]["prompt_tokens"] // 16 * 16}
    usage = {**expected["usage"], "prompt_tokens_details": cached}
    assert frame == {"type": "done", "id": "img", "usage": usage, "cancelled": False}
