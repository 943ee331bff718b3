"""stress.py's server under test: spawned or found by its port, its RSS sampled, its routes polled.

spawn_server   `python -m wicore.cli serve` on a free loopback port, up once /health answers, SIGTERM at the end
listening_pid  the process listening on a port, from /proc/net/tcp{,6} and /proc/*/fd (Linux)
RssSampler     VmRSS from /proc/PID/status every second, in a thread
StatsSampler   /v1/stats every few seconds, in a thread: how full each KV tier is over time
ServerApi      /v1/models, /v1/stats, a greedy completion, and the drain: /v1/stats until nothing is referenced
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx


def listening_pid(port: int) -> int | None:
    """The process with a TCP socket listening on `port` (any address), from /proc; None if not found."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                return int(proc.name)
        except OSError:  # gone, or not ours to read
            continue
    return None


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class RssSampler:
    """`with RssSampler(pid) as rss:` ... `rss.samples`: (seconds from the start, bytes), every second."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)

    def _run(self) -> None:
        start = time.perf_counter()
        while True:
            value = rss_bytes(self.pid)
            if value is not None:
                self.samples.append((round(time.perf_counter() - start, 2), value))
            if self._stop.wait(1.0):
                return

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        value = rss_bytes(self.pid)  # the state at the end, after the drain
        if value is not None:
            self.samples.append((self.samples[-1][0] + 0.01 if self.samples else 0.0, value))


class StatsSampler:
    """`with StatsSampler(url, key) as stats:` ... `stats.samples`: (seconds from the start, running,
    waiting, {tier: blocks in use}, {tier: blocks in all}) every `interval_s`. A slow answer is
    skipped (a busy server may take seconds); a server that no longer takes connections ends the
    sampling, quietly (the report says whether it went away)."""

    def __init__(self, url: str, api_key: str | None, interval_s: float = 5.0) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=30)
        self.interval_s = interval_s
        self.samples: list[tuple[float, int, int, dict[str, int], dict[str, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stats", daemon=True)

    def _run(self) -> None:
        start = time.perf_counter()
        while not self._stop.is_set():
            try:
                stats = self.http.get("/v1/stats").json()
            except httpx.TimeoutException:
                continue
            except (httpx.HTTPError, ValueError):
                return
            used, free = stats["blocks_in_use"], stats["blocks_free"]
            total = {tier: used[tier] + free[tier] for tier in used}
            self.samples.append((round(time.perf_counter() - start, 2), stats["running"], stats["waiting"], used, total))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> StatsSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.http.close()


def tiers_full_at(samples: Sequence[tuple[float, int, int, dict[str, int], dict[str, int]]], share: float = 0.9) -> float | None:
    """The first sample time at which every tier that has blocks is at least `share` in use."""
    for t, _, _, used, total in samples:
        tiers = [tier for tier, n in total.items() if n > 0]
        if tiers and all(used[tier] >= share * total[tier] for tier in tiers):
            return t
    return None


@dataclass
class Spawned:
    url: str
    pid: int
    log_path: Path
    proc: subprocess.Popen
    exit_code: int | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def spawn_server(serve_args: Sequence[str], log_path: Path | None, start_timeout_s: float) -> Iterator[Spawned]:
    """`wicore serve SERVE_ARGS --port P` on a free loopback port, once /health answers; SIGTERM
    (SIGKILL after 90 s) on exit. Its output goes to `log_path` (default: a temporary file)."""
    port = free_port()
    log_path = log_path or Path(tempfile.mkstemp(prefix="wicore-stress-", suffix=".log")[1])
    command = [sys.executable, "-m", "wicore.cli", "serve", *serve_args, "--port", str(port)]
    print(f"[spawn] {shlex.join(command)} (log: {log_path})", file=sys.stderr, flush=True)
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    spawned = Spawned(f"http://127.0.0.1:{port}", proc.pid, log_path, proc)
    try:
        deadline = time.monotonic() + start_timeout_s
        while not is_healthy(spawned.url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"wicore serve did not come up (exit code {proc.poll()}); see {log_path}")
            time.sleep(0.5)
        yield spawned
    finally:
        if proc.poll() is None:  # not stopped already (stress.py's SIGTERM under load stops it itself)
            proc.send_signal(signal.SIGTERM)
        try:
            spawned.exit_code = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            spawned.exit_code = proc.wait()
            print("warning: the spawned server ignored SIGTERM for 90 s; killed", file=sys.stderr)


def is_healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def server_error_lines(log_path: Path) -> list[str]:
    """Lines of a spawned server's log that report an error or a traceback (at most 20)."""
    words = ("Traceback", " ERROR ", " CRITICAL ", "Exception")
    lines = [line for line in log_path.read_text(errors="replace").splitlines() if any(w in line for w in words)]
    return lines[:20]


class ServerApi:
    """The non-OpenAI routes, and the greedy probe, over plain httpx."""

    def __init__(self, url: str, api_key: str | None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=url, headers=headers, timeout=120)

    def model(self) -> str:
        response = self.http.get("/v1/models")
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])

    def check_chat(self, model: str) -> None:
        """Half the load is chats: a server whose model has no chat template would answer each with a
        400, so say so before the run rather than count an hour of refusals as errors."""
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        response = self.http.post("/v1/chat/completions", json=body)
        if response.status_code == 400 and response.json().get("error", {}).get("code") == "no_chat_template":
            raise RuntimeError(
                f"{model} has no chat template and half the requests are chats: serve it with --chat-template FILE "
                "(with --spawn: --serve-args='--chat-template FILE')"
            )
        response.raise_for_status()

    def stats(self) -> dict:
        response = self.http.get("/v1/stats")
        response.raise_for_status()
        return response.json()

    def greedy(self, model: str, prompt: str, max_tokens: int) -> str:
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        response = self.http.post("/v1/completions", json=body)
        response.raise_for_status()
        return str(response.json()["choices"][0]["text"])

    def drain(self, timeout_s: float) -> tuple[dict, float]:
        """/v1/stats polled until nothing runs, waits or is referenced (or `timeout_s`): (last stats, seconds)."""
        start = time.perf_counter()
        while True:
            stats = self.stats()
            if is_drained(stats) or time.perf_counter() - start > timeout_s:
                return stats, time.perf_counter() - start
            time.sleep(0.5)


def is_drained(stats: dict) -> bool:
    return stats["running"] == 0 and stats["waiting"] == 0 and not any(stats["blocks_referenced"].values())
