"""A real server on a free port in front of a started engine, for the API tests (tests/api/conftest.py's
fixtures and the tests that start their own). Its own module, not conftest: `from conftest import` finds
whichever conftest pytest imported first, tests/api/tools' when both folders are collected in one run."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from serve_process import spawn_serve

from wicore.api.app import ServerSettings, create_app
from wicore.api.server import ServerThread
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
    return spawn_serve(["--model", str(model), *flags])
