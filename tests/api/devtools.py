"""Headless Chromium driven over the DevTools protocol (the `websockets` package): no driver
binary, no browser download. The system's `chromium` (Debian's package) or nothing.

    with Chromium.launch(tmp_path) as browser:
        browser.open("http://127.0.0.1:8000/")
        browser.click("#send"); browser.wait("document.querySelector('.msg') !== null")
        browser.screenshot(path)
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


class Chromium:
    def __init__(self, process: subprocess.Popen, socket: ClientConnection, stack: contextlib.ExitStack) -> None:
        self.process = process
        self.socket = socket
        self.stack = stack
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    @classmethod
    def launch(cls, profile: Path, width: int = 1280, height: int = 860, timeout: float = 60.0) -> Chromium:
        binary = find_chromium()
        if binary is None:
            raise FileNotFoundError("no chromium on PATH")
        process = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",  # root in CI containers
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--disable-extensions",
                "--disable-background-networking",
                "--hide-scrollbars",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (port_file.is_file() and port_file.read_text().count("\n") >= 1):
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"{binary} did not start its DevTools endpoint (exit code {process.poll()})")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        pages = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        url = next(p["webSocketDebuggerUrl"] for p in pages if p["type"] == "page")
        stack = contextlib.ExitStack()  # websockets wants its connection used as a context manager
        browser = cls(process, stack.enter_context(connect(url, max_size=None, open_timeout=timeout)), stack)
        for domain in ("Page", "Runtime", "Log"):
            browser.call(f"{domain}.enable")
        # Before any page script: note every Content-Security-Policy violation the page causes.
        browser.call(
            "Page.addScriptToEvaluateOnNewDocument",
            source="window.cspViolations = []; document.addEventListener('securitypolicyviolation',"
            " e => window.cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));",
        )
        return browser

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stack.close()
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    # -- the protocol ----------------------------------------------------------------
    def call(self, method: str, timeout: float = 60.0, **params: Any) -> dict[str, Any]:
        """Send one command; events that arrive meanwhile are kept in `events`."""
        call_id = next(self.ids)
        self.socket.send(json.dumps({"id": call_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            message = json.loads(self.socket.recv(timeout=max(0.01, deadline - time.monotonic())))
            if message.get("id") == call_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def js(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait(self, expression: str, timeout: float = 120.0) -> Any:
        """Poll `expression` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout:g} s: {expression}")
            time.sleep(0.05)

    # -- what a user does --------------------------------------------------------------
    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait("document.readyState === 'complete'")

    def click(self, selector: str) -> None:
        """A real mouse click at the middle of the element."""
        box = self.wait(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e || e.disabled) return null;"
            " const r = e.getBoundingClientRect(); return r.width ? {x: r.x + r.width / 2, y: r.y + r.height / 2} : null; })()"
        )
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=box["x"], y=box["y"], button="left", clickCount=1)

    def type(self, selector: str, text: str) -> None:
        self.click(selector)
        self.js(f"document.querySelector({json.dumps(selector)}).select?.()")
        self.call("Input.insertText", text=text)

    def upload(self, selector: str, path: Path) -> None:
        """Choose `path` in the file input `selector` (its change event fires, as when a user picks it)."""
        root = self.call("DOM.getDocument")["root"]["nodeId"]
        node = self.call("DOM.querySelector", nodeId=root, selector=selector)["nodeId"]
        self.call("DOM.setFileInputFiles", files=[str(path)], nodeId=node)

    def set_value(self, selector: str, value: str) -> None:
        """Set an input (a range slider, say) as a user would leave it: the value, then its input event."""
        self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.value = {json.dumps(value)};"
            " e.dispatchEvent(new Event('input', {bubbles: true})); })()"
        )

    def screenshot(self, path: Path) -> bytes:
        data = base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"])
        path.write_bytes(data)
        return data

    def console_errors(self) -> list[str]:
        """Errors the page logged (console.error, failed loads, refused scripts)."""
        errors = []
        for event in self.events:
            if event.get("method") == "Log.entryAdded" and event["params"]["entry"]["level"] == "error":
                errors.append(event["params"]["entry"]["text"])
            if event.get("method") == "Runtime.consoleAPICalled" and event["params"]["type"] == "error":
                errors.append(" ".join(str(a.get("value", a.get("description"))) for a in event["params"]["args"]))
            if event.get("method") == "Runtime.exceptionThrown":
                errors.append(event["params"]["exceptionDetails"].get("text", "exception"))
        return errors
