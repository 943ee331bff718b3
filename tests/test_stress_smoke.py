"""tools/stress.py end to end (slow layer): it spawns `wicore serve` on the cached Gemma 3 270M export,
8 streaming clients drop a fifth of their streams, and the server must drain to nothing referenced."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).parents[1]


def test_stress_spawned_server_drains(gemma_270m: Callable[[int], Path], tmp_path: Path) -> None:
    record = tmp_path / "stress.json"
    load = "--clients 8 --ramp 5 --duration 30 --disconnect-fraction 0.2 --disconnect-chunks 1,2 --max-tokens 4,16"
    command = [sys.executable, str(REPO / "tools" / "stress.py"), "--spawn", "--model", str(gemma_270m(1)), "--threads", "2"]
    command += [*load.split(), "--server-log", str(tmp_path / "server.log"), "--json", str(record)]
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
