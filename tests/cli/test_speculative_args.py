"""The speculative-decoding flags: what they set, and the combinations that are refused."""

from __future__ import annotations

import subprocess
import sys

import pytest

from wicore.cli.main import parse_command_line
from wicore.cli.speculative_args import speculative_config


def config(*flags: str):
    return speculative_config(parse_command_line(["serve", *flags]))


def test_flags_set_the_speculative_config(tmp_path):
    assert config() is None
    spec = config("--speculative", "ngram", "--num-speculative-tokens", "6")
    assert (spec.method, spec.num_speculative_tokens, spec.draft_model_dir) == ("ngram", 6, None)
    (tmp_path / "wicore.json").write_text("{}")
    spec = config("--draft-model", str(tmp_path), "--speculative-max-batch", "2")
    assert (spec.method, spec.draft_model_dir, spec.max_batch, spec.num_speculative_tokens) == ("draft", tmp_path, 2, 4)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--speculative", "ngram", "--num-speculative-tokens", "0"], "at least 1, got 0"),
        (["--speculative", "ngram", "--draft-model", "."], "give one of them"),
        (["--num-speculative-tokens", "3"], "need --speculative ngram or --draft-model"),
        (["--draft-model", "/nonexistent"], "not an exported model folder"),
    ],
)
def test_bad_combinations_are_refused(flags, message):
    with pytest.raises(ValueError, match=message):
        config(*flags)


def test_bad_flags_exit_non_zero_with_the_reason(tiny_export):
    folder = tiny_export(1)[0]
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "wicore.cli",
            "generate",
            "--model",
            str(folder),
            "--prompt",
            "hi",
            "--speculative",
            "ngram",
            "--num-speculative-tokens",
            "-1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert "the number of speculative tokens must be at least 1, got -1" in res.stderr
