"""The scripted model behind the real app (tests/api/tools/scripted.py), served once per module,
and the openai client on it. A module that needs another tokenizer defines its own `served`."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from scripted import ScriptedEngine, byte_tokenizer, serving


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[ScriptedEngine, str]]:
    with serving(byte_tokenizer(tmp_path_factory.mktemp("tok"))) as served:
        yield served


@pytest.fixture
def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{served[1]}/v1", api_key="unused", max_retries=0, timeout=30)
