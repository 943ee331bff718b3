"""A base model (no chat template of its own): chat requests are refused with a 400 that says
so, unless the server was given a template (--chat-template); the page is told to continue text."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect

from wicore.api.app import ServerSettings, create_app
from wicore.api.server import ServerThread
from wicore.engine.engine import Engine, EngineConfig

MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def base_model(tiny_multimodal, tmp_path_factory) -> Path:
    """The tiny multimodal export with its manifest saying the source shipped no chat template
    (as the packaged Gemma 3 270M's GGUF), its files linked, not copied."""
    source = tiny_multimodal.export()
    folder = tmp_path_factory.mktemp("base") / "model"
    folder.mkdir()
    for path in source.iterdir():
        if path.name != "wicore.json":
            (folder / path.name).symlink_to(path)
    manifest = json.loads((source / "wicore.json").read_text())
    manifest["tokenizer"]["has_chat_template"] = False
    (folder / "wicore.json").write_text(json.dumps(manifest))
    return folder


@pytest.fixture(scope="module")
def serve(base_model):
    started = []

    def make(**settings: object) -> str:
        engine = Engine(EngineConfig(model_dir=base_model, num_threads=2, verify_files=False, num_device_blocks=128)).start()
        server = ServerThread(create_app(engine, ServerSettings(model_name="base", **settings))).start()  # type: ignore[arg-type]
        started.append((server, engine))
        return server.url

    yield make
    for server, engine in started:
        server.stop()
        engine.stop()


def test_chat_on_a_base_model_is_a_400_that_says_what_to_do(serve):
    url = serve()
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2}, timeout=60)
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "the model 'base' has no chat template (a base model: it continues text): send prompts to "
        "/v1/completions, or start the server with --chat-template FILE",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "no_chat_template",
    }
    done = httpx.post(f"{url}/v1/completions", json={"prompt": "hello", "max_tokens": 2}, timeout=60)
    assert done.status_code == 200  # it continues text
    assert httpx.get(f"{url}/web/config.json").json()["chat"] is False  # the page offers continuation
    with connect(url.replace("http", "ws") + "/v1/ws", open_timeout=10) as ws:
        ws.send(json.dumps({"type": "chat", "id": "c", "body": {"messages": MESSAGES}}))
        frame = json.loads(ws.recv(timeout=30))
    assert (frame["id"], frame["status"], frame["error"]["code"]) == ("c", 400, "no_chat_template")


def test_a_chat_template_given_to_the_server_makes_it_chat(serve):
    url = serve(chat_template="{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}<assistant>")
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200
    ids = httpx.post(f"{url}/tokenize", json={"prompt": "<user>hello<assistant>", "add_special_tokens": False}).json()
    assert r.json()["usage"]["prompt_tokens"] == ids["count"]  # the prompt is the server's template's
    assert httpx.get(f"{url}/web/config.json").json()["chat"] is True
