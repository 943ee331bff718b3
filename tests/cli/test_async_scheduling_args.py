"""--async-scheduling: every command that takes the engine flags sets EngineConfig.async_scheduling,
and the combination with speculative decoding is a one-line usage error."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from wicore.cli.engine_args import engine_config
from wicore.cli.main import parse_command_line
from wicore.engine.config import EngineConfig, async_by_default
from wicore.engine.speculative import SpeculativeConfig
from wicore.errors import UsageError

COMMANDS = [["serve"], ["generate", "--model", "m", "--prompt", "hi"], ["bench", "throughput", "--model", "m"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_the_flag_sets_async_scheduling(command):
    cases = (
        ([], None),
        (["--async-scheduling"], True),
        (["--async-scheduling", "on"], True),
        (["--async-scheduling", "off"], False),
        (["--async-scheduling", "auto"], None),
    )
    for flags, expected in cases:
        args = parse_command_line([*command, "--kv-pool-gb", "1", *flags])
        assert engine_config(args, Path("m")).async_scheduling is expected


def test_an_unknown_value_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_command_line(["serve", "--async-scheduling", "sometimes"])
    assert exit_info.value.code == 2
    assert "wicore serve: error: argument --async-scheduling: invalid choice: 'sometimes'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("settings", "one_card", "expected"),
    [
        ({}, True, True),
        ({}, False, False),
        ({"async_scheduling": False}, True, False),
        ({"async_scheduling": True}, False, True),
        ({"kv_offload_tokens": 1024}, True, False),
        ({"pipeline_groups": None}, True, True),
        ({"speculative": SpeculativeConfig("ngram")}, True, False),
    ],
)
def test_auto_is_on_where_steps_replay_cuda_graphs_on_one_card(settings, one_card, expected):
    assert async_by_default(EngineConfig(model_dir=Path("m"), **settings), one_card) is expected


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
