"""The scripted model behind the real app (tests/api/tools/scripted.py), served once per module,
and the openai client on it. A module that needs another tokenizer defines its own `served`."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from scripted import ScriptedEngine, byte_tokenizer

from wicore.api.app import ServerSettings, create_app
from wicore.api.server import ServerThread


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[ScriptedEngine, str]]:
    engine = ScriptedEngine(byte_tokenizer(tmp_path_factory.mktemp("tok")))
    server = ServerThread(create_app(engine, ServerSettings(model_name="m"))).start()  # type: ignore[arg-type]
    yield engine, server.url
    server.stop()


@pytest.fixture
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served[1]}/v1", api_key="unused", max_retries=0, timeout=30)
