"""--async-scheduling: every command that takes the engine flags sets EngineConfig.async_scheduling,
and the combination with speculative decoding is a one-line usage error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from wicore.cli.engine_args import engine_config
from wicore.cli.main import parse_command_line
from wicore.errors import UsageError

COMMANDS = [["serve"], ["generate", "--model", "m", "--prompt", "hi"], ["bench", "throughput", "--model", "m"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_the_flag_sets_async_scheduling(command):
    for flags, expected in (([], False), (["--async-scheduling"], True)):
        args = parse_command_line([*command, "--kv-pool-gb", "1", *flags])
        assert engine_config(args, Path("m")).async_scheduling is expected


def test_async_scheduling_with_speculative_decoding_is_refused():
    args = parse_command_line(["serve", "--kv-pool-gb", "1", "--async-scheduling", "--speculative", "ngram"])
    with pytest.raises(UsageError, match="async scheduling does not combine with speculative decoding"):
        engine_config(args, Path("m"))


def test_the_refusal_is_one_line_and_a_non_zero_exit(tiny_export):
    folder = tiny_export(1)[0]
    command = ["generate", "--model", str(folder), "--prompt", "hi", "--async-scheduling", "--speculative", "ngram"]
    res = subprocess.run([sys.executable, "-m", "wicore.cli", *command], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "wicore: error: async scheduling does not combine with speculative decoding: turn one of them off"
    ]
