"""`wicore serve` as users run it: a subprocess, Hypercorn, SIGTERM ends it cleanly."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from wicore.api.server import free_port
from wicore.graph.manifest import Manifest


def test_serve_with_keys_from_flags_and_file_then_sigterm(tiny_export, tmp_path, launch):
    folder, _ = tiny_export()
    keys = tmp_path / "keys"
    keys.write_text("from-file\n")
    proc, url = launch(folder, "--api-key", "from-flag", "--api-key-file", str(keys), "--served-model-name", "tiny")
    try:
        assert httpx.get(f"{url}/v1/models").status_code == 401
        for key in ("from-flag", "from-file"):
            r = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert r.json()["data"][0]["id"] == "tiny"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        log = proc.stdout.read()
    finally:
        proc.kill()
    m = Manifest.read(folder)  # one startup line says what is serving, where, and with which guards
    assert f"tiny: {m.config.num_layers} layers, {m.dtype} {m.op_flavour}, portable attention; on cpu, 2 CPU threads; " in log
    assert "KV blocks of 16 tokens free: " in log and "; CUDA graphs off; auth 2 key(s); rate limit off\n" in log
    assert log.count("Running on http://") == 1  # Hypercorn's lines go through logging once


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.slow  # 6 s on the 2-core VM, loaded
def test_shutdown_cuts_a_body_still_arriving_without_a_traceback(tiny_export, launch, sig):
    """The grace period ends with a request body half sent: Hypercorn cancels that connection,
    and the server exits 0 with nothing in its log but the access line (Python 3.11 used to log
    a CancelledError traceback from asyncio.streams there)."""
    folder, _ = tiny_export()
    proc, url = launch(folder, "--grace-seconds", "1")
    try:
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=10) as sock:
            head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            sock.sendall(f'{head}Content-Length: 100\r\n\r\n{{"mo'.encode())
            time.sleep(0.5)  # the request has reached the app, which waits for the rest of its body
            proc.send_signal(sig)
            assert proc.wait(timeout=60) == 0
        log = proc.stdout.read()
    finally:
        proc.kill()
    assert "Traceback" not in log and "CancelledError" not in log and "ERROR" not in log, log


def test_serve_rejects_a_folder_that_is_not_an_export(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "wicore.cli", "serve", "--model", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 2 and "no exported model here" in res.stderr


@pytest.mark.slow
def test_sigterm_lets_an_inflight_stream_finish(gemma_270m, launch):
    proc, url = launch(gemma_270m(1), "--grace-seconds", "60", "--kv-pool-gb", "0.1")
    body = {"model": "gemma3-270m-p1", "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "stream": True}
    events: list[dict] = []
    done = threading.Event()

    def read() -> None:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done.set()
                elif line.startswith("data: "):
                    events.append(json.loads(line[6:]))

    reader = threading.Thread(target=read)
    try:
        reader.start()
        while len(events) < 3:
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        reader.join(timeout=120)
        assert done.is_set() and events[-1]["choices"][0]["finish_reason"] == "length"
        assert proc.wait(timeout=60) == 0
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{url}/health", timeout=2)
    finally:
        proc.kill()


@pytest.mark.parametrize("kind", ["a file", "larger than the disk"])
def test_serve_refuses_an_nvme_dir_that_cannot_hold_the_tier_in_one_line(tiny_export, tmp_path, kind):
    """Issue 35: a bad --nvme-dir was a traceback and left a 0-byte tier file behind."""
    import shutil

    folder, _ = tiny_export()
    nvme_dir = tmp_path / "nvme"
    if kind == "a file":
        nvme_dir.write_bytes(b"x")
        gb, expected = "0.01", f"cannot use the NVMe KV tier folder {nvme_dir} (--nvme-dir): Not a directory"
    else:
        nvme_dir.mkdir()
        gb, expected = f"{shutil.disk_usage(tmp_path).free / (1 << 30) + 100:.0f}", "GiB free: lower --nvme-tier-gb"
    res = subprocess.run(
        [sys.executable, "-m", "wicore.cli", "serve", "--model", str(folder), "--threads", "2"]
        + ["--port", str(free_port()), "--nvme-tier-gb", gb, "--nvme-dir", str(nvme_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    [line] = [line for line in res.stderr.splitlines() if line.startswith("wicore: error:")]
    assert expected in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nvme"]
    assert nvme_dir.is_file() or list(nvme_dir.iterdir()) == []


def test_ctrl_c_closes_an_idle_websocket_and_exits_at_once(tiny_export, launch):
    """The page's idle /v1/ws used to count as in flight: Ctrl-C waited the whole grace period."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    proc, url = launch(tiny_export()[0], "--grace-seconds", "30")
    try:
        with connect(url.replace("http", "ws") + "/v1/ws", open_timeout=10) as ws:
            ws.send(json.dumps({"type": "poem", "id": "x"}))  # the socket is open and answering
            assert json.loads(ws.recv(timeout=10))["id"] == "x"
            started = time.monotonic()
            proc.send_signal(signal.SIGINT)
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001  # going away
            assert proc.wait(timeout=10) == 0
            elapsed = time.monotonic() - started
        log = proc.stdout.read()
    finally:
        proc.kill()
    assert elapsed < 3.0, elapsed
    assert "wicore: Ctrl-C: shutting down, draining: nothing is generating; press Ctrl-C again to quit now" in log
    assert "Traceback" not in log


@pytest.mark.slow
def test_a_second_ctrl_c_quits_while_a_request_generates(gemma_270m, launch):
    proc, url = launch(gemma_270m(1), "--grace-seconds", "60", "--kv-pool-gb", "0.1")
    body = {"model": "gemma3-270m-p1", "prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            while not next(lines).startswith("data: {"):  # tokens are coming
                pass
            proc.send_signal(signal.SIGINT)
            time.sleep(1.0)
            assert proc.poll() is None  # draining: the stream goes on
            started = time.monotonic()
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=5) == 130
            elapsed = time.monotonic() - started
        log = proc.stdout.read()
    finally:
        proc.kill()
    assert elapsed < 1.0, elapsed
    assert "draining: 1 request(s) still generating get up to 60 s (--grace-seconds)" in log
    assert "wicore: Ctrl-C again: quitting now" in log
