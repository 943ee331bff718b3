"""A real server on a free port in front of a started engine, for the API tests (tests/api/conftest.py's
fixtures and the tests that start their own). Its own module, not conftest: `from conftest import` finds
whichever conftest pytest imported first, tests/api/tools' when both folders are collected in one run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from wicore.api.app import ServerSettings, create_app
from wicore.api.server import ServerThread, free_port
from wicore.engine.engine import Engine, EngineConfig


@dataclass
class Served:
    engine: Engine
    server: ServerThread
    app: object

    @property
    def url(self) -> str:
        return self.server.url


def start(model_dir, settings: ServerSettings, **engine_options: object) -> Served:
    engine = Engine(EngineConfig(model_dir=model_dir, num_threads=2, verify_files=False, **engine_options)).start()
    app = create_app(engine, settings)
    return Served(engine, ServerThread(app).start(), app)


def launch(model: Path | str, *flags: str) -> tuple[subprocess.Popen, str]:
    """`wicore serve --model MODEL FLAGS` in a subprocess on a free port, once /health answers."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "wicore.cli", "serve", "--model", str(model), "--port", str(port), "--threads", "2", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"wicore serve exited early:\n{proc.stdout.read()}")  # type: ignore[union-attr]
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError("wicore serve did not come up")
