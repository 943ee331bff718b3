"""tools/check_families_gpu.py's `divergences`: where an export's greedy tokens part from its twin's, the first
differing step of each such prompt and how far apart the two tokens are, in the export's logits and in HF
float32's (on the CPU here: the fp32 export's logits are HF's to float32 rounding)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from check_families_gpu import divergences

from tests.conftest import hf_logits
from wicore.engine.engine import Engine, EngineConfig
from wicore.types.sampling import SamplingParams


def test_it_finds_each_prompts_first_difference_and_the_two_tokens_margins(tiny_export) -> None:
    folder, model = tiny_export()
    prompts = [[5, 9, 2, 7, 11], [3, 1, 4, 1, 5, 9, 2, 6]]
    config = EngineConfig(model_dir=folder, devices="cpu", num_host_blocks=0, num_nvme_blocks=0)
    with Engine(config) as engine:
        mine = [c.token_ids for c in engine.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))]
        assert divergences(engine, model, prompts, mine, mine) == []
        theirs = [list(mine[0]), list(mine[1])]
        other = (mine[1][3] + 1) % 64  # a token the greedy decode did not pick at step 3
        theirs[1][3:] = [other, *mine[1][4:]]
        (found,) = divergences(engine, model, prompts, mine, theirs)
    assert (found["prompt"], found["step"], found["tokens"]) == (1, 3, [mine[1][3], other])
    want = hf_logits(model, prompts[1] + mine[1][:3])[-1]
    assert found["margin_hf"] == pytest.approx(float(want[mine[1][3]] - want[other]), abs=1e-5)
    assert found["margin"] == pytest.approx(found["margin_hf"], abs=1e-3)  # the fp32 export against HF float32
    assert found["margin"] > 0  # greedy picked its own token
    top2 = np.sort(want)[-2:]
    assert found["hf_top2_gap"] == pytest.approx(float(top2[1] - top2[0]), abs=1e-5)
