"""--pipeline-groups: every command that takes the engine flags sets EngineConfig.pipeline_groups, and a
value the engine refuses is a usage error."""

from __future__ import annotations

from pathlib import Path

import pytest

from wicore.cli.engine_args import engine_config
from wicore.cli.main import parse_command_line
from wicore.errors import UsageError

COMMANDS = [["serve"], ["generate", "--model", "m", "--prompt", "hi"], ["bench", "throughput", "--model", "m"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_the_flag_sets_pipeline_groups(command):
    for flags, expected in (([], 1), (["--pipeline-groups", "3"], 3), (["--pipeline-groups", "2"], 2)):
        args = parse_command_line([*command, "--kv-pool-gb", "1", *flags])
        assert engine_config(args, Path("m")).pipeline_groups == expected


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--pipeline-groups", "0"], "pipeline_groups must be >= 1"),
        (["--pipeline-groups", "2", "--async-scheduling"], "pipeline_groups > 1 does not combine with async_scheduling"),
    ],
)
def test_refused_values_are_usage_errors(flags, message):
    args = parse_command_line(["serve", "--kv-pool-gb", "1", *flags])
    with pytest.raises(UsageError, match=message):
        engine_config(args, Path("m"))
