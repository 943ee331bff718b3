"""The page at / on a real server: its files come from the package, every one under the
Content-Security-Policy, with nothing inline and nothing from another origin."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from importlib import resources

import httpx
import pytest

from wicore.api.web import CSP

STATIC = resources.files("wicore.api") / "static"


class Tags(HTMLParser):
    """Every start tag of a document, with its attributes, and the text inside <script> / <style>."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.inline: list[str] = []
        self._inside: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._inside = tag if tag in ("script", "style") else None

    def handle_endtag(self, tag: str) -> None:
        self._inside = None

    def handle_data(self, data: str) -> None:
        if self._inside and data.strip():
            self.inline.append(data)


@pytest.fixture(scope="module")
def open_server(tiny_server):
    return tiny_server()


@pytest.fixture(scope="module")
def locked_server(tiny_server):
    return tiny_server(api_keys=("secret-1",))


def test_the_page_and_its_files_are_served_under_the_policy(open_server):
    page = httpx.get(f"{open_server.url}/")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["content-security-policy"] == CSP
    assert page.text == (STATIC / "index.html").read_text()
    tags = Tags()
    tags.feed(page.text)
    assert tags.inline == []  # no inline script or style: the policy allows neither
    assert not [name for _, attrs in tags.tags for name in attrs if name == "style" or name.startswith("on")]
    linked = [attrs.get("src") or attrs.get("href") for tag, attrs in tags.tags if tag in ("script", "link")]
    assert linked == ["data:,", "/web/style.css", "/web/app.js"]
    types = {"style.css": "text/css", "app.js": "text/javascript", "chat.js": "text/javascript", "engine.js": "text/javascript"}
    for name, media_type in types.items():
        r = httpx.get(f"{open_server.url}/web/{name}")
        assert r.status_code == 200 and r.headers["content-type"] == f"{media_type}; charset=utf-8"
        assert r.headers["content-security-policy"] == CSP and r.headers["x-content-type-options"] == "nosniff"
        assert r.content == (STATIC / name).read_bytes()


def test_the_page_fetches_nothing_from_another_origin():
    sources = {entry.name: entry.read_text() for entry in STATIC.iterdir()}
    assert sorted(sources) == ["app.js", "chat.js", "engine.js", "index.html", "style.css"]
    for name, text in sources.items():
        assert re.findall(r"(?:https?:)?//[\w.-]+\.\w", text) == [], name  # no absolute URL, no CDN
        assert "eval(" not in text and "new Function" not in text, name
    imports = re.findall(r'from "([^"]+)"', sources["app.js"])
    assert imports == ["./chat.js", "./engine.js"]


def test_only_the_page_files_are_served(open_server):
    for path in ("/web/web.py", "/web/..%2Fweb.py", "/web/static", "/web/", "/index.html"):
        r = httpx.get(f"{open_server.url}{path}")
        assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}, path


def test_the_page_config_says_the_model_and_needs_the_key(open_server, locked_server):
    config = httpx.get(f"{open_server.url}/web/config.json").json()
    assert config == {"model": "tiny", "images": False, "chat": False, "max_context": open_server.engine.max_sequence_tokens}
    assert httpx.get(f"{locked_server.url}/web/config.json").status_code == 401
    assert httpx.get(f"{locked_server.url}/").status_code == 200  # the page itself asks for the key
    r = httpx.get(f"{locked_server.url}/web/config.json", headers={"Authorization": "Bearer secret-1"})
    assert r.json()["model"] == "tiny"


def test_serve_no_web_turns_the_page_off(tiny_export, launch):
    proc, url = launch(tiny_export()[0], "--no-web")
    try:
        assert httpx.get(f"{url}/").status_code == 404
        assert httpx.get(f"{url}/web/app.js").status_code == 404
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
