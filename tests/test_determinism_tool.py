"""tools/check_determinism_gpu.py on the CPU, the tiny chat model exported in two partitions with the
sampling head: two engines in one process draw the same tokens from the same logits (no divergence,
the head run again agrees), decode steps through the CUDA graphs' buckets record the same rows, and
`--compare` names the kind of a divergence put into a dump."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source

REPO = Path(__file__).resolve().parent.parent
TOOL = [sys.executable, str(REPO / "tools" / "check_determinism_gpu.py")]
WORKLOAD = ["--devices", "cpu", "--sampled", "3", "--greedy", "1", "--new-tokens", "5", "--block-size", "4"]


@pytest.fixture(scope="module")
def split_with_head(tiny_chat, tmp_path_factory):
    """The tiny chat model in two partitions (hidden states between them), with the sampling head."""
    out = tmp_path_factory.mktemp("tiny_chat_split_head") / "model"
    config = ExportConfig(sampling_head="on", num_partitions=2)
    export_model(open_source(str(tiny_chat[1])), out, config, progress=lambda _: None)
    return out


def tool(*args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": str(REPO), "PATH": ""}
    return subprocess.run([*TOOL, *args], capture_output=True, text=True, cwd=REPO, env=env, check=False)


@pytest.mark.slow  # an export and a subprocess that runs two engines: ~10 s
def test_two_cpu_runs_do_not_diverge_and_compare_names_what_was_changed(split_with_head, tmp_path):
    dumped = tmp_path / "a.json"
    ran = tool("--model", str(split_with_head), *WORKLOAD, "--kv-pool-gb", "0.01", "--rerun-head", "--dump", str(dumped))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    # 3 sampled requests x 5 tokens; the greedy one's 4 decode rows (its prefill batch draws nothing)
    assert lines[0].startswith("run 0: 19 rows recorded over ")
    assert lines[-3:] == [
        "run 0 against run 1: requests whose tokens differ: 0 of 4 []",
        "run 0 against run 1: rows whose logits or hidden states differ: 0 of 19, at steps []",
        "run 0 against run 1: first divergence: no divergence",
    ]
    data = json.loads(dumped.read_text())
    records = data["records"]
    assert len(records) == 19 and all(len(r["hidden"]) == 1 for r in records)
    assert all(r["head_again"] == r["token"] for r in records if r["request"] != "g3")
    assert sorted(data["tokens"]) == ["g3", "s0", "s1", "s2"] and {len(t) for t in data["tokens"].values()} == {5}

    # decode steps through the CUDA graphs' buckets (the CPU EP ignores the graph ids): the same rows, bit for bit
    bucketed = tmp_path / "buckets.json"
    ran = tool(
        "--model",
        str(split_with_head),
        *WORKLOAD,
        "--kv-pool-gb",
        "0.05",
        "--rerun-head",
        "--relaunch",
        "--buckets",
        "--runs",
        "1",
        "--dump",
        str(bucketed),
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    replayed = json.loads(bucketed.read_text())["records"]
    assert all(r["head_again"] == r["token"] for r in replayed if r["request"] != "g3")
    # --relaunch: each of the 4 decode steps' 4 rows launched again gives the same rows (prefills run uncaptured)
    relaunched = [r for r in replayed if r["relaunched"] is not None]
    assert len(relaunched) == 16 and all(r["relaunched"] == [r["logits"], *r["hidden"]] for r in relaunched)
    same = tool("--compare", str(dumped), str(bucketed))
    assert (same.returncode, same.stdout.splitlines()[-1]) == (0, "dumps: first divergence: no divergence")
    last = records[-1]
    where, token = f"step {last['step']}, request {last['request']}", last["token"]
    for change, expected in (
        ({"uniform": 0.5}, f"host: {where}: uniforms differ ({last['uniform']!r} against 0.5)"),
        (
            {"hidden": ["0" * 16]},
            f"logits: {where}: hidden states after partition 0 differ (the model's kernels); tokens {token} and {token}",
        ),
        (
            {"logits": "0" * 16},
            f"logits: {where}: logits differ, hidden states equal (the last partition's kernels); tokens {token} and {token}",
        ),
        ({"token": token + 1}, f"head: {where}: logits equal, tokens differ ({token} against {token + 1})"),
    ):
        doctored = tmp_path / "b.json"
        doctored.write_text(json.dumps({**data, "records": [*records[:-1], {**last, **change}]}))
        found = tool("--compare", str(dumped), str(doctored))
        assert (found.returncode, found.stdout.splitlines()[-1]) == (1, f"dumps: first divergence: {expected}")


@pytest.mark.slow  # a subprocess that imports ONNX Runtime: ~3 s
def test_head_only_repeats_the_head_on_the_same_logits():
    ran = tool("--head-only", "--devices", "cpu", "--rows", "3", "--vocab", "1000", "--repeats", "2")
    assert (ran.returncode, ran.stdout) == (
        0,
        "head alone on cpu, 3 x 1000: 0 of 4 runs differ from the first\nthe same rows with 8 more beside them: the same outputs\n",
    )
