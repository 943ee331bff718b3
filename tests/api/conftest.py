"""Real Hypercorn servers on free loopback ports, in front of real engines.

`tiny_server(**settings)`: a random tiny Gemma 3 (no tokenizer): auth, limits, errors, metrics.
`multimodal_server(**settings)`: a random tiny multimodal Gemma 3 with a tokenizer: images.
`gemma_server`: the real Gemma 3 270M (slow layer): text endpoints driven by the openai package.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator

import openai
import pytest
from served_app import Served, start
from served_app import launch as launch_server

from wicore.api.app import ServerSettings
from wicore.export.tokenizer import GEMMA3_CHAT_TEMPLATE  # the packaged base model chats through it (--chat-template)


@pytest.fixture(scope="module")
def tiny_server(tiny_export) -> Iterator[Callable[..., Served]]:
    started: list[Served] = []

    def make(**settings: object) -> Served:
        folder, _ = tiny_export()
        served = start(folder, ServerSettings(model_name="tiny", **settings))  # type: ignore[arg-type]
        started.append(served)
        return served

    yield make
    for served in started:
        served.server.stop()
        served.engine.stop()


@pytest.fixture(scope="module")
def multimodal_server(tiny_multimodal) -> Iterator[Callable[..., Served]]:
    """multimodal_server(**settings): the tiny random multimodal Gemma 3 (tests/multimodal.py)."""
    started: list[Served] = []

    def make(**settings: object) -> Served:
        served = start(tiny_multimodal.export(), ServerSettings(model_name="tiny-mm", **settings), num_device_blocks=128)  # type: ignore[arg-type]
        started.append(served)
        return served

    yield make
    for served in started:
        served.server.stop()
        served.engine.stop()


@pytest.fixture(scope="module")
def gemma_server(gemma_270m) -> Iterator[Served]:
    # A small device pool (1,520 tokens) so that the context-limit tests run short prompts.
    served = start(
        gemma_270m(1), ServerSettings(model_name="gemma3-270m", chat_template=GEMMA3_CHAT_TEMPLATE), num_device_blocks=96
    )
    yield served
    served.server.stop()
    served.engine.stop()


@pytest.fixture(scope="module")
def gemma_client(gemma_server: Served) -> openai.OpenAI:
    """The official openai client of `gemma_server`."""
    return openai.OpenAI(base_url=f"{gemma_server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def small_gemma_server(gemma_270m) -> Iterator[Served]:
    """The real model with a 64-token context: every generation is short."""
    from wicore.engine.scheduler import SchedulerConfig

    served = start(
        gemma_270m(1),
        ServerSettings(model_name="gemma3-270m", chat_template=GEMMA3_CHAT_TEMPLATE),
        num_device_blocks=32,
        scheduler=SchedulerConfig(max_context=64),
    )
    yield served
    served.server.stop()
    served.engine.stop()


@pytest.fixture
def launch() -> Callable[..., tuple[subprocess.Popen, str]]:
    return launch_server
