"""The same exported model on the CPU EP, the OpenVINO EP, and both (partition 0 on OpenVINO).

Runs in its own virtualenv with onnxruntime-openvino, which cannot share one with the plain
onnxruntime wheel (.ci/run makes it): `python -m pytest -m openvino tests/portability`.
"""

from __future__ import annotations

import numpy as np
import pytest

from wicore.runtime.generator import Generator
from wicore.runtime.providers import installed_providers
from wicore.runtime.sampler import SamplingParams

pytestmark = [pytest.mark.openvino, pytest.mark.slow]

PLACEMENTS = ["openvino:CPU,openvino:CPU,openvino:CPU", "openvino:CPU,cpu,cpu"]
PROMPT = "The history of the printing press begins in the fifteenth century, when"
LOGIT_TOLERANCE = 1e-3  # measured 4.6e-5 (all OpenVINO) and 3.2e-5 (mixed) on logits up to ~30


def test_openvino_provider_is_installed():
    assert "OpenVINOExecutionProvider" in installed_providers()


@pytest.fixture(scope="module")
def reference(gemma_270m):
    gen = Generator.load(gemma_270m(3), num_threads=2, devices="cpu")
    ids = gen.tokenizer.encode(PROMPT)
    return ids, gen.prompt_logits(ids), gen.generate([ids], SamplingParams(max_tokens=40, ignore_eos=True)).token_ids[0]


@pytest.mark.parametrize("devices", PLACEMENTS)
def test_openvino_matches_the_cpu_ep(gemma_270m, reference, devices):
    ids, ref_logits, ref_tokens = reference
    gen = Generator.load(gemma_270m(3), num_threads=2, devices=devices)
    assert [d.label for d in gen.devices] == devices.split(",")
    logits = gen.prompt_logits(ids)
    assert np.abs(logits - ref_logits).max() < LOGIT_TOLERANCE
    assert (logits.argmax(-1) == ref_logits.argmax(-1)).all()
    assert gen.generate([ids], SamplingParams(max_tokens=40, ignore_eos=True)).token_ids[0] == ref_tokens
