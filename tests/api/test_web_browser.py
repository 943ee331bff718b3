"""The page in a real headless Chromium, from a real `wicore serve --api-key` on the Gemma 3 270M:
the key dialog, a greedy reply streamed over /v1/ws equal to the HTTP API's, stop on a long
reply (0 referenced blocks after), the engine view; the same base model without a chat template
(text continuation) and the failed-key lockout. Screenshots go to tmp_path, and to
$WICORE_SCREENSHOTS when set (`WICORE_SCREENSHOTS=docs python -m pytest tests/api/test_web_browser.py`
renews the ones in docs/).

Needs Debian's `chromium` (.ci/run installs it; without it this test is skipped, saying so).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import httpx
import pytest
from devtools import Chromium, find_chromium
from multimodal import png

import wicore

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        find_chromium() is None, reason="no chromium on PATH: apt-get install chromium (.ci/run tries, and warns if it cannot)"
    ),
]

KEY = "sk-web-test"
AUTH = {"Authorization": f"Bearer {KEY}"}
REPLY = "#messages .msg.assistant:last-child"


def state_of_reply(browser: Chromium) -> str:
    return browser.js(f"document.querySelector({json.dumps(REPLY)}).dataset.state")


def reply(browser: Chromium) -> tuple[str, str]:
    """(text, meta line) of the last reply."""
    return tuple(browser.js(f"document.querySelector('{REPLY} {part}').textContent") for part in (".text", ".meta"))  # type: ignore[return-value]


def save(browser: Chromium, tmp_path: Path, name: str) -> None:
    data = browser.screenshot(tmp_path / name)
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("WICORE_SCREENSHOTS"):
        (Path(os.environ["WICORE_SCREENSHOTS"]) / name).write_bytes(data)


def wait_idle(url: str) -> dict:
    deadline = time.monotonic() + 30
    while True:
        stats = httpx.get(f"{url}/v1/stats", headers=AUTH).json()
        if stats["running"] == stats["waiting"] == 0 or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


@pytest.fixture
def served(gemma_270m, launch, tmp_path):
    from wicore.export.tokenizer import GEMMA3_CHAT_TEMPLATE

    template = tmp_path / "gemma3.jinja"  # the packaged model is a base model: it chats through a given template
    template.write_text(GEMMA3_CHAT_TEMPLATE, encoding="utf-8")
    proc, url = launch(gemma_270m(1), "--api-key", KEY, "--chat-template", str(template))
    yield url
    proc.terminate()
    proc.wait(timeout=60)


def test_chat_stop_and_engine_view_in_chromium(served, tmp_path):
    url = served
    model = httpx.get(f"{url}/v1/models", headers=AUTH).json()["data"][0]["id"]
    with Chromium.launch(tmp_path / "profile") as browser:
        browser.open(f"{url}/")
        # The server has a key: the page asks for it, and keeps it for this tab only.
        browser.wait("document.getElementById('key-dialog').open")
        browser.type("#key-input", KEY)
        browser.click("#key-form button")
        browser.wait("document.getElementById('status').textContent === 'connected'")
        assert browser.js("document.getElementById('model').textContent") == model
        assert browser.js("[sessionStorage.getItem('wicore.api_key'), localStorage.length]") == [KEY, 0]

        # A greedy reply: the same text and token count as the HTTP API gives for the same body.
        browser.set_value("#temperature", "0")
        browser.set_value("#max-tokens", "24")
        browser.type("#prompt", "What is the capital of France?")
        browser.click("#send")
        browser.wait(f"document.querySelector({json.dumps(REPLY)})?.dataset.state === 'done'")
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0,
            "top_p": 0.95,
            "max_tokens": 24,
        }
        expected = httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH, timeout=120).json()
        text, meta = reply(browser)
        assert text == expected["choices"][0]["message"]["content"]
        tokens, reason = expected["usage"]["completion_tokens"], expected["choices"][0]["finish_reason"]
        assert re.fullmatch(rf"{tokens} tokens · [\d.]+ tok/s · TTFT \d+ ms · {reason}", meta), meta

        # A long reply: text appears while it streams; the engine view shows it running; Stop cancels it.
        browser.set_value("#max-tokens", "400")
        browser.type("#prompt", "Tell me a long story about a dragon.")
        browser.click("#send")
        browser.wait(
            f"(() => {{ const m = document.querySelector({json.dumps(REPLY)});"
            " return m.dataset.state === 'streaming' && m.querySelector('.text').textContent.length >= 40; })()"
        )
        browser.click("#tab-engine")
        browser.wait("document.querySelector('#tiles .tile[data-name=running] .value')?.textContent === '1'")
        assert browser.js("document.getElementById('view-chat').hidden") is True
        if os.environ.get("WICORE_SCREENSHOTS"):
            time.sleep(4)  # a few seconds of samples on the charts, for the screenshot kept; the test reads none
        save(browser, tmp_path, "web-engine.png")
        browser.click("#tab-chat")
        browser.click("#stop")
        browser.wait(f"document.querySelector({json.dumps(REPLY)}).dataset.state === 'stopped'")
        text, meta = reply(browser)
        stopped_tokens = int(meta.split(" ")[0])
        assert len(text) >= 40 and 1 < stopped_tokens < 400, meta
        assert browser.js("[document.getElementById('send').disabled, document.getElementById('stop').disabled]") == [False, True]
        stats = wait_idle(url)
        assert stats["blocks_referenced"] == {"device": 0, "host": 0, "nvme": 0}
        save(browser, tmp_path, "web-chat.png")

        # Many long replies scroll inside the messages; the page itself never gets a second scrollbar.
        browser.js(
            "(() => { const m = document.getElementById('messages'); for (let i = 0; i < 40; i++) {"
            " const d = document.createElement('div'); d.className = 'msg assistant';"
            " d.textContent = 'a long reply '.repeat(60); m.appendChild(d); } })()"
        )
        overflow = "[document.documentElement.scrollHeight - innerHeight, (e => e.scrollHeight - e.clientHeight)(messages)]"
        page, inner = browser.js(overflow.replace("messages)", "document.getElementById('messages'))"))
        assert page <= 0 < inner, (page, inner)

        # Back on the engine view, idle: its tiles are the engine's numbers.
        browser.click("#tab-engine")
        browser.wait("document.querySelector('#tiles .tile[data-name=running] .value')?.textContent === '0'")
        tiles = browser.js(
            "Object.fromEntries([...document.querySelectorAll('#tiles .tile')]"
            ".map(t => [t.dataset.name, t.querySelector('.value').textContent]))"
        )
        assert (tiles["running"], tiles["waiting"], tiles["swapped"]) == ("0", "0", "0")
        assert tiles["tokens generated"] == str(httpx.get(f"{url}/v1/stats", headers=AUTH).json()["generated_tokens"])
        legends = browser.js(
            "['requests', 'blocks', 'hit', 'tps'].map(id => document.getElementById('legend-' + id).textContent)"
        )
        assert legends[0] == "runningwaitingswapped" and legends[1].startswith("device ")

        # The page kept to its Content-Security-Policy; its only errors were the 401 before the key.
        assert browser.js("window.cspViolations") == []
        assert [e for e in browser.console_errors() if "401" not in e] == []


def test_an_uploaded_image_goes_with_the_prompt(tiny_multimodal, launch, tmp_path):
    """A model that takes images (the tiny random multimodal Gemma 3): the page offers upload, and
    the reply equals the HTTP API's for the same image (the data: URL the page sent) and text."""
    proc, url = launch(tiny_multimodal.export())
    try:
        picture = tmp_path / "picture.png"
        picture.write_bytes(png(3, (64, 48)))
        with Chromium.launch(tmp_path / "profile") as browser:
            browser.open(f"{url}/")
            browser.wait("document.getElementById('status').textContent === 'connected'")
            browser.wait("!document.getElementById('image-label').hidden")
            browser.upload("#image", picture)
            browser.wait("document.querySelector('#attachments img') !== null")
            browser.set_value("#temperature", "0")
            browser.set_value("#max-tokens", "8")
            browser.type("#prompt", "What is in this picture?")
            browser.click("#send")
            browser.wait(f"document.querySelector({json.dumps(REPLY)})?.dataset.state === 'done'")
            sent = browser.js("document.querySelector('#messages .msg.user img').src")
            assert sent.startswith("data:image/jpeg;base64,")
            assert browser.js("document.querySelectorAll('#attachments img').length") == 0  # it went with that message
            content = [{"type": "image_url", "image_url": {"url": sent}}, {"type": "text", "text": "What is in this picture?"}]
            body = {"messages": [{"role": "user", "content": content}], "temperature": 0, "top_p": 0.95, "max_tokens": 8}
            expected = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
            assert reply(browser)[0] == expected["choices"][0]["message"]["content"] != ""
            assert browser.js("window.cspViolations") == [] and browser.console_errors() == []
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_a_base_model_page_continues_text_and_the_key_lockout_shows_the_dialog(gemma_270m, launch, tmp_path):
    """The packaged 270M without --chat-template: the page offers continuation, not a chat. Before
    that, wrong keys until the failed-key lockout: the dialog stays up and says it is the lockout."""
    proc, url = launch(gemma_270m(1), "--api-key", KEY)
    try:
        with Chromium.launch(tmp_path / "profile") as browser:
            browser.open(f"{url}/")
            for attempt in range(11):  # the keyless first load and 9 wrong keys fail; then the lockout's 429s
                browser.wait("document.getElementById('key-dialog').open")
                browser.type("#key-input", f"wrong-{attempt}")
                browser.click("#key-form button")  # closes the dialog; the answer opens it again
            lockout = "document.getElementById('key-error').textContent.startsWith('failed-key lockout')"
            browser.wait(f"document.getElementById('key-dialog').open && {lockout}")  # the dialog, saying why
            assert browser.js("document.getElementById('status').dataset.state") != "error"
            save(browser, tmp_path, "web-lockout.png")
            browser.type("#key-input", KEY)  # the right key still works during the lockout
            browser.click("#key-form button")
            browser.wait("document.getElementById('status').textContent === 'connected'")

            # A base model: the composer asks for text to continue, and the reply is the completion's.
            assert browser.js("document.getElementById('send').textContent") == "Continue"
            assert browser.js("document.getElementById('prompt').placeholder") == "Text to continue"
            assert "is a base model (no chat template)" in browser.js("document.getElementById('empty').textContent")
            browser.set_value("#max-tokens", "8")
            browser.type("#prompt", "The capital of France is")
            browser.click("#send")
            browser.wait(f"document.querySelector({json.dumps(REPLY)})?.dataset.state === 'done'")
            body = {"prompt": "The capital of France is", "temperature": 0, "top_p": 0.95, "max_tokens": 8}
            expected = httpx.post(f"{url}/v1/completions", json=body, headers=AUTH, timeout=120).json()
            assert reply(browser)[0] == expected["choices"][0]["text"] != ""
            save(browser, tmp_path, "web-continuation.png")
            assert browser.js("window.cspViolations") == []

            # /docs: titled with the package's version; seed's 64-bit limits as written, not rounded to a double.
            browser.open(f"{url}/docs")
            browser.wait("document.querySelectorAll('#endpoints table').length > 0")
            assert browser.js("document.getElementById('title').textContent") == f"WiCore API (WiCore {wicore.__version__})"
            seed = browser.js(
                "[...document.querySelectorAll('#endpoints tr')].find(r => r.cells[0].textContent === 'seed').cells[3].textContent"
            )
            assert seed == '{"minimum":-9223372036854775808,"maximum":18446744073709551615}'

    finally:
        proc.terminate()
        proc.wait(timeout=60)
