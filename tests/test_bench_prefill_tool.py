"""tools/bench_prefill.py: every step of its pass is a prefill step of at most the budget's tokens, and
each prompt gets its one token, whatever the budget (whole prompts where they fit; split where not)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from bench_prefill import main, parse_args


@pytest.mark.parametrize(("budget", "steps"), [(64, 1), (32, 2), (16, 4), (24, 3)])
def test_the_prompts_pass_in_steps_of_the_budget(tiny_export, tmp_path, budget, steps) -> None:
    folder, _ = tiny_export(vocab_size=1100)  # prompt ids are drawn from 1000 up
    record = tmp_path / "prefill.json"
    argv = ["--model-dir", str(folder), "--prompts", "4", "--input-len", "16", "--batched-tokens", str(budget)]
    main(parse_args([*argv, "--json", str(record)]))
    (result,) = json.loads(record.read_text())["records"]
    assert result["batched_tokens"] == budget
    assert result["steps"] == steps  # 64 prompt tokens, `budget` a step
    assert result["prompt_tok_s"] > 0


def test_it_says_what_is_missing() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--prompts", "4"])  # neither an export nor an HF checkpoint
