"""tools/stress.py end to end (slow layer): it spawns `wicore serve` on the cached Gemma 3 270M export,
8 streaming clients drop a fifth of their streams, and the server must drain to nothing referenced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from wicore.export.tokenizer import GEMMA3_CHAT_TEMPLATE

pytestmark = pytest.mark.slow

REPO = Path(__file__).parents[1]


def test_stress_spawned_server_drains(gemma_270m: Callable[[int], Path], tmp_path: Path) -> None:
    record = tmp_path / "stress.json"
    template = tmp_path / "gemma3-chat.jinja"  # the packaged 270M is a base model: its chats go through Gemma's template
    template.write_text(GEMMA3_CHAT_TEMPLATE)
    # 12 s of load: seed 0 drops client 1's first stream and keeps client 0's, so both outcomes
    # happen however slow the machine; the 30 s this ran before bought only more of the same.
    load = "--clients 8 --ramp 2 --duration 12 --disconnect-fraction 0.2 --disconnect-chunks 1,2 --max-tokens 4,16"
    command = [sys.executable, str(REPO / "tools" / "stress.py"), "--spawn", "--model", str(gemma_270m(1)), "--threads", "2"]
    command += [*load.split(), "--server-log", str(tmp_path / "server.log"), "--json", str(record)]
    command += [f"--serve-args=--chat-template {template}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}\n{(tmp_path / 'server.log').read_text()[-4000:]}"

    result = json.loads(record.read_text())
    final = result["stats_final"]
    assert result["passed"] and all(result["checks"].values())
    assert final["running"] == final["waiting"] == 0
    assert set(final["blocks_referenced"].values()) == {0}
    outcomes = result["figures"]["outcomes"]
    assert outcomes.get("ok", 0) > 0
    assert outcomes.get("disconnected", 0) > 0
    assert result["figures"]["errors"] == {}
    assert result["probe"][0] == result["probe"][1]
    assert result["server"]["exit_code"] == 0


def test_stress_writes_its_record_when_the_server_goes_away(tiny_multimodal, tmp_path: Path) -> None:
    """Issue 35: with --url, a server that died mid-run left no record. Here it is killed inside a
    20 s run, once requests have finished (its clients retry the dead server until the end, so a
    longer run only waits longer; 20 s leaves a loaded machine's kill well inside the run):
    the tool ends, exit code 1, and the record says what was measured and what failed.
    (The tiny model's context is 256 tokens: the long prompts are 400s, the short ones run.)"""
    import signal
    import time

    from wicore.api.server import free_port

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    serve = [sys.executable, "-m", "wicore.cli", "serve", "--model", str(tiny_multimodal.export()), "--port", str(port)]
    server = subprocess.Popen([*serve, "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        record = tmp_path / "stress.json"
        command = [sys.executable, str(REPO / "tools" / "stress.py"), "--url", f"http://127.0.0.1:{port}"]
        command += ["--server-pid", str(server.pid), "--clients", "2", "--ramp", "0", "--duration", "20"]
        command += ["--max-tokens", "8,16", "--no-probe", "--json", str(record)]
        for _ in range(600):  # until it answers
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        tool = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert tool.stderr is not None
        while not (line := tool.stderr.readline()).startswith("[stress] 2 clients against"):  # the load starts
            assert line, "the tool ended before its clients started"
        # Kill it once requests have finished (not after a fixed time: on a loaded 2-core CI machine a
        # fixed 4 s once passed with none done). Two clients of at most 16 tokens each hold at most 32
        # generated tokens in flight, so past 64 at least two requests have finished; the pause lets
        # their last chunks reach the clients.
        deadline = time.monotonic() + 120
        while httpx.get(f"http://127.0.0.1:{port}/v1/stats", timeout=5).json()["generated_tokens"] <= 64:
            assert time.monotonic() < deadline, "no request finished within 120 s"
            time.sleep(0.2)
        time.sleep(0.5)
        server.send_signal(signal.SIGKILL)
        out, err = tool.communicate(timeout=120)
    finally:
        server.kill()
    assert tool.returncode == 1 and record.exists(), f"{out}\n{err}"
    result = json.loads(record.read_text())
    assert result["passed"] is False
    assert result["checks"]["the server answered to the end"] is False
    assert result["server"]["gone"].startswith("ConnectError")
    assert result["stats_before"]["running"] == 0 and result["stats_final"] is None
    assert result["figures"]["outcomes"].get("ok", 0) > 0  # what ran before the kill is recorded
    assert "| server | WENT AWAY: ConnectError" in out
