"""`wicore-export --verify`: a passing check exits 0; a failed check says what it left on disk."""

from __future__ import annotations

import copy

import pytest

from wicore.cli.export import main
from wicore.graph.manifest import Manifest


@pytest.mark.slow  # 5 s on the loaded 2-core VM
def test_a_quantized_export_that_verifies_exits_0_with_the_summary(tiny_model, tmp_path, capsys):
    """README's `wicore-export ... --op-flavour ort-quant --verify`, on the tiny model: the check runs
    at the quantized flavour's tolerance and passes, exit 0. That the real 270M's ort-quant export
    holds that tolerance on the verify text is test_gemma3_270m_quant.py's
    test_verify_against_hf_holds_the_flavour_to_its_tolerance (the README command itself exported
    the 270M once more and loaded HF once more: 91 s on the 2-core VM for no other check)."""
    folder, _ = tiny_model()
    out = tmp_path / "q"
    assert main(["--model", str(folder), "--out", str(out), "--force", "--op-flavour", "ort-quant", "--verify"]) == 0
    summary = capsys.readouterr().out.strip()
    assert summary.startswith("verify: 64 positions; ") and summary.endswith("-> OK"), summary


def test_a_failed_verify_keeps_the_complete_export_and_says_so(tiny_model, tmp_path, capsys):
    """4-bit weights quantized from a float model with a sharp output (final norm x10) turn clear
    argmaxes: the check fails, the folder stays, whole and loadable, and stderr says what it is."""
    _, model = tiny_model()
    sharp = copy.deepcopy(model)
    sharp.model.norm.weight.data.fill_(10.0)
    sharp.save_pretrained(tmp_path / "hf")
    out = tmp_path / "q4"
    argv = ["--model", str(tmp_path / "hf"), "--out", str(out), "--op-flavour", "ort-quant", "--weight-bits", "4", "--verify"]
    assert main(argv) == 1
    captured = capsys.readouterr()
    assert captured.out.strip().endswith("-> MISMATCH")
    assert f"wicore-export: {out} is a complete export (it loads and serves) that failed the check above" in captured.err
    Manifest.read(out).verify(out)  # every file there, as written


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--weight-bits", "4", "--expert-bits", "4"], "--expert-bits: this gemma3 model has no experts"),
        (["--expert-bits", "4", "--op-flavour", "portable"], "--expert-bits needs quantized weights"),
    ],
    ids=["dense-model", "float-weights"],
)
def test_expert_bits_where_they_mean_nothing_are_one_line_errors(tiny_model, tmp_path, capsys, flags, message):
    folder, _ = tiny_model()
    out = tmp_path / "x"
    capsys.readouterr()  # (the fixture's own output)
    assert main(["--model", str(folder), "--out", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not out.exists()


def test_matmul_i8_without_its_settings_is_a_one_line_error(tiny_model, tmp_path, capsys):
    """`--matmul-i8` on 4-bit weights: exit 2, the line saying what it needs, nothing written."""
    folder, _ = tiny_model()
    out = tmp_path / "x"
    capsys.readouterr()
    argv = ["--model", str(folder), "--out", str(out), "--for", "cuda", "--weight-bits", "4", "--kernels", "wicore"]
    assert main([*argv, "--matmul-i8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--matmul-i8 needs --kernels wicore, --dtype fp16 and --weight-bits 8" in err, err
    assert not out.exists()
