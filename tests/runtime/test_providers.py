"""Session options every WiCore session gets."""

from __future__ import annotations

import pytest

from wicore.runtime.providers import FPA_INTB_ENV, session_options

FPA_KEY = "ep.cuda.fpa_intb_gemm"


def test_int4_cuda_kernels_are_turned_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FPA_INTB_ENV, raising=False)
    opts = session_options(2)
    assert opts.get_session_config_entry(FPA_KEY) == "1"  # type: ignore[attr-defined]
    assert opts.intra_op_num_threads == 2  # type: ignore[attr-defined]


def test_a_user_setting_of_onnxruntimes_switch_is_left_to_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # The session key would win over the environment variable, so WiCore does not set it then.
    monkeypatch.setenv(FPA_INTB_ENV, "0")
    with pytest.raises(RuntimeError, match=FPA_KEY):
        session_options(2).get_session_config_entry(FPA_KEY)  # type: ignore[attr-defined]
