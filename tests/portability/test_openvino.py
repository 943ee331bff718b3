"""The same exported model on the CPU EP, the OpenVINO EP, and both (partition 0 on OpenVINO).

Runs in its own virtualenv with onnxruntime-openvino, which cannot share one with the plain
onnxruntime wheel (.ci/run makes it): `python -m pytest -m openvino tests/portability`.
"""

from __future__ import annotations

import numpy as np
import pytest

from wicore.devices.providers import installed_providers
from wicore.engine.engine import Engine, EngineConfig
from wicore.types.sampling import SamplingParams

pytestmark = [pytest.mark.openvino, pytest.mark.slow]

PLACEMENTS = ["openvino:CPU,openvino:CPU,openvino:CPU", "openvino:CPU,cpu,cpu"]
PROMPT = "The history of the printing press begins in the fifteenth century, when"
LOGIT_TOLERANCE = 1e-3  # measured 4.6e-5 (all OpenVINO) and 3.2e-5 (mixed) on logits up to ~30


def test_openvino_provider_is_installed():
    assert "OpenVINOExecutionProvider" in installed_providers()


def engine(folder, devices: str) -> Engine:
    """An engine on the 270M, no host tier; no prefix cache, so every request computes its prompt."""
    config = EngineConfig(model_dir=folder, num_threads=2, devices=devices, host_tier_gb=0, enable_prefix_cache=False)
    return Engine(config)


def logits_and_tokens(engine: Engine, ids: list[int]) -> tuple[np.ndarray, list[int]]:
    """The prompt's logits at every position, and 40 greedy tokens after it."""
    (scored,) = engine.generate([ids], SamplingParams(max_tokens=1, prompt_logits=True))
    (greedy,) = engine.generate([ids], SamplingParams(max_tokens=40, ignore_eos=True))
    assert scored.error is None and greedy.error is None and len(greedy.token_ids) == 40
    return scored.prompt_logits, greedy.token_ids


@pytest.fixture(scope="module")
def reference(gemma_270m):
    with engine(gemma_270m(3), "cpu") as cpu:
        ids = cpu.tokenizer.encode(PROMPT)
        return ids, *logits_and_tokens(cpu, ids)


@pytest.mark.parametrize("devices", PLACEMENTS)
def test_openvino_matches_the_cpu_ep(gemma_270m, reference, devices):
    ids, ref_logits, ref_tokens = reference
    with engine(gemma_270m(3), devices) as ov:
        assert [d.label for d in ov.devices] == devices.split(",")
        logits, tokens = logits_and_tokens(ov, ids)
    assert np.abs(logits - ref_logits).max() < LOGIT_TOLERANCE
    assert (logits.argmax(-1) == ref_logits.argmax(-1)).all()
    assert tokens == ref_tokens
