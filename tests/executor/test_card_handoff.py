"""wicore.executor.card_handoff: the switch a model split over cards with steps in flight and CUDA
graphs turns: ONNX Runtime's cuDNN paged SDPA off (it failed there on two H200s), unless the
environment already chooses."""

from __future__ import annotations

import logging
import os

import pytest

from wicore.executor.card_handoff import CUDNN_SDPA_ENV, cudnn_sdpa_off_for_steps_in_flight


def test_cudnn_sdpa_goes_off_where_nothing_chose(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv(CUDNN_SDPA_ENV, "unset below")  # so that monkeypatch restores the variable's absence too
    monkeypatch.delenv(CUDNN_SDPA_ENV)
    with caplog.at_level(logging.WARNING, logger="wicore.executor.card_handoff"):
        assert cudnn_sdpa_off_for_steps_in_flight() is True
    assert os.environ[CUDNN_SDPA_ENV] == "0"
    assert f"{CUDNN_SDPA_ENV}=0" in caplog.text
    assert cudnn_sdpa_off_for_steps_in_flight() is False  # once set, left as it is


@pytest.mark.parametrize("chosen", ["1", "0"])
def test_a_users_choice_stands(monkeypatch: pytest.MonkeyPatch, chosen: str) -> None:
    monkeypatch.setenv(CUDNN_SDPA_ENV, chosen)
    assert cudnn_sdpa_off_for_steps_in_flight() is False
    assert os.environ[CUDNN_SDPA_ENV] == chosen
