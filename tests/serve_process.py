"""`wicore serve` in a subprocess on a free port, handed back once /health answers: the API tests'
served_app.launch and the CLI tests' serve_process share this wait, which fails with the server's
own output when it exits first."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from wicore.api.server import free_port

REPO = Path(__file__).resolve().parents[1]


def spawn_serve(args: list[str], env: dict[str, str] | None = None, timeout: float = 120) -> tuple[subprocess.Popen, str]:
    """`python -m wicore.cli serve ARGS --port P --threads 2` with this checkout first on the path and
    `env` added to the environment; (process, base URL) once /health answers within `timeout` s."""
    port = free_port()
    environ = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    command = [sys.executable, "-m", "wicore.cli", "serve", *args, "--port", str(port), "--threads", "2"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environ)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"wicore serve exited early:\n{proc.stdout.read()}")  # type: ignore[union-attr]
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"wicore serve did not come up within {timeout:.0f} s")
