"""/v1/ws on the real Gemma 3 270M: the same text as the HTTP API, several requests on one socket,
cancel and close abort in the engine (0 referenced blocks after)."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest
from app_checks import wait_idle
from websockets.sync.client import ClientConnection, connect

from wicore.api.app import ServerSettings, create_app
from wicore.api.server import ServerThread
from wicore.export.tokenizer import GEMMA3_CHAT_TEMPLATE  # the packaged base model chats through it (--chat-template)

pytestmark = pytest.mark.slow

CHAT = {"messages": [{"role": "user", "content": "Say hello in French"}], "max_tokens": 16, "temperature": 0}
COMPLETION = {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0}
LONG = {"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0}
NO_BLOCKS = {"device": 0, "host": 0, "nvme": 0}


def open_socket(served) -> ClientConnection:
    return connect(served.url.replace("http://", "ws://") + "/v1/ws", open_timeout=10)


def send(ws: ClientConnection, kind: str, request_id: str, body: Any) -> None:
    ws.send(json.dumps({"type": kind, "id": request_id, "body": body}))


def read_until_done(ws: ClientConnection, ids: set[str]) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    """(chunks by id, the last frame by id) once every id in `ids` has ended (done or error)."""
    chunks: dict[str, list[dict]] = {i: [] for i in ids}
    last: dict[str, dict] = {}
    while set(last) != ids:
        frame = json.loads(ws.recv(timeout=120))
        if frame["type"] == "chunk":
            assert frame["id"] not in last, "a chunk after the request ended"
            chunks[frame["id"]].append(frame["chunk"])
        else:
            last[frame["id"]] = frame
    return chunks, last


def joined(chunks: list[dict]) -> tuple[str, str | None]:
    """The text of choice 0 and its finish reason."""
    text, reason = "", None
    for chunk in chunks:
        for choice in chunk["choices"]:
            text += choice["delta"].get("content", "") if "delta" in choice else choice["text"]
            reason = choice["finish_reason"] or reason
    return text, reason


def test_streamed_text_equals_the_http_answer_with_requests_in_flight_together(gemma_server):
    chat = httpx.post(f"{gemma_server.url}/v1/chat/completions", json=CHAT, timeout=120).json()
    completion = httpx.post(f"{gemma_server.url}/v1/completions", json=COMPLETION, timeout=120).json()
    with open_socket(gemma_server) as ws:
        send(ws, "chat", "c", CHAT)
        send(ws, "completion", "p", COMPLETION)
        chunks, last = read_until_done(ws, {"c", "p"})
    assert chunks["c"][0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {c["object"] for c in chunks["c"]} == {"chat.completion.chunk"}
    assert {c["object"] for c in chunks["p"]} == {"text_completion"}
    assert joined(chunks["c"]) == (chat["choices"][0]["message"]["content"], chat["choices"][0]["finish_reason"])
    assert joined(chunks["p"]) == (completion["choices"][0]["text"], completion["choices"][0]["finish_reason"])
    assert last["c"] == {"type": "done", "id": "c", "usage": chat["usage"], "cancelled": False}
    assert last["p"] == {"type": "done", "id": "p", "usage": completion["usage"], "cancelled": False}


def test_cancel_ends_one_request_and_frees_its_blocks(gemma_server):
    with open_socket(gemma_server) as ws:
        send(ws, "completion", "long", LONG)
        send(ws, "completion", "short", COMPLETION)
        num_chunks = 0
        while num_chunks < 3:
            frame = json.loads(ws.recv(timeout=120))
            num_chunks += frame["type"] == "chunk" and frame["id"] == "long"
        ws.send(json.dumps({"type": "cancel", "id": "long"}))
        _, last = read_until_done(ws, {"long", "short"})
        assert last["long"]["cancelled"] is True and last["short"]["cancelled"] is False
        assert 3 <= last["long"]["usage"]["completion_tokens"] < LONG["max_tokens"]
        # The id is free again once its request ended.
        send(ws, "completion", "long", COMPLETION)
        _, again = read_until_done(ws, {"long"})
        assert again["long"]["usage"]["completion_tokens"] == last["short"]["usage"]["completion_tokens"]
    stats = wait_idle(gemma_server)
    assert (stats["running"], stats["waiting"], stats["blocks_referenced"]) == (0, 0, NO_BLOCKS)


def test_closing_the_socket_aborts_its_requests(gemma_server):
    before = gemma_server.engine.stats().generated_tokens
    with open_socket(gemma_server) as ws:
        send(ws, "completion", "a", LONG)
        send(ws, "chat", "b", {**CHAT, "max_tokens": 400})
        num_chunks = 0
        while num_chunks < 6:
            num_chunks += json.loads(ws.recv(timeout=120))["type"] == "chunk"
    stats = wait_idle(gemma_server)
    assert (stats["running"], stats["waiting"], stats["blocks_referenced"]) == (0, 0, NO_BLOCKS)
    assert stats["generated_tokens"] - before < 2 * 400  # aborted, not run to the end


def test_bad_messages_mid_stream_get_error_frames_and_the_stream_goes_on(gemma_server):
    expected = httpx.post(f"{gemma_server.url}/v1/completions", json=COMPLETION, timeout=120).json()
    frames = []
    with open_socket(gemma_server) as ws:
        send(ws, "completion", "x", COMPLETION)
        ws.send("{not json")
        send(ws, "completion", "x", COMPLETION)  # x is still running
        send(ws, "completion", "y", COMPLETION)
        while not {("done", "x"), ("done", "y")} <= {(f["type"], f["id"]) for f in frames}:
            frames.append(json.loads(ws.recv(timeout=120)))
    errors = [(f["id"], f["status"], f["error"]["code"]) for f in frames if f["type"] == "error"]
    assert errors == [(None, 400, "invalid_json"), ("x", 400, "duplicate_id")]
    for request_id in ("x", "y"):
        assert (
            joined([f["chunk"] for f in frames if f["type"] == "chunk" and f["id"] == request_id])[0]
            == expected["choices"][0]["text"]
        )
        [done] = [f for f in frames if f["type"] == "done" and f["id"] == request_id]
        assert done["usage"] == expected["usage"]


def test_a_stream_cut_by_shutdown_ends_with_a_503_error_frame(gemma_server):
    """A second server on the same engine, 2 s of grace: a request still running when the grace
    runs out gets a 503 error frame (not a silent close), and is aborted in the engine."""
    server = ServerThread(
        create_app(gemma_server.engine, ServerSettings(model_name="gemma3-270m", chat_template=GEMMA3_CHAT_TEMPLATE)),
        grace_seconds=2.0,
    ).start()
    stopper = threading.Thread(target=server.stop)
    with connect(server.url.replace("http://", "ws://") + "/v1/ws", open_timeout=10) as ws:
        send(ws, "completion", "a", {**LONG, "max_tokens": 1000})
        assert json.loads(ws.recv(timeout=120))["type"] == "chunk"
        stopper.start()
        frame = {"type": "chunk"}
        while frame["type"] == "chunk":
            frame = json.loads(ws.recv(timeout=60))
    stopper.join(timeout=60)
    assert (frame["type"], frame["id"], frame["status"], frame["error"]["code"]) == ("error", "a", 503, "server_shutting_down")
    stats = wait_idle(gemma_server)
    assert (stats["running"], stats["blocks_referenced"]) == (0, NO_BLOCKS)
