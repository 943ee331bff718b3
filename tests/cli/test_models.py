"""Which export of a packaged model `wicore serve` / `wicore generate` make for the devices asked."""

from __future__ import annotations

import pytest

from wicore.cli.models import (
    CPU_KERNELS_ENV,
    _cpu_flags,
    cpu_kernels,
    export_folder_name,
    export_targets,
    packaged_export,
    resolve_model,
    suited_export,
)
from wicore.devices.providers import DeviceError, available_devices


def test_cpu_gets_the_gguf_quantized_graphs():
    assert packaged_export("gemma3-270m", "cpu") == ("fp32", "ort-quant", "portable")


def test_auto_follows_the_installed_runtime():
    accelerators = [d for d in available_devices() if d.capability.device_kind != "cpu"]
    expected = ("fp32", "ort-quant", "portable")
    if accelerators and "fp16" in accelerators[0].capability.dtypes:
        capability = accelerators[0].capability
        paged = "paged" in capability.attentions
        expected = ("fp16", "portable" if paged else capability.op_flavours[0], "paged" if paged else "portable")
    assert packaged_export("gemma3-270m", "auto") == expected


@pytest.mark.parametrize(
    ("devices", "source", "expected"),
    [
        ("cpu", "model.gguf", ("fp32", "ort-quant", "portable")),  # the GGUF's own blocks
        ("cpu", "hf-folder", ("fp32", "portable", "portable")),  # ort-quant would quantize float weights
        ("cpu", "smollm2-135m-instruct", ("fp32", "ort-quant", "portable")),  # its Q4_1 blocks, float activations
        ("cuda", "model.gguf", ("fp16", "portable", "paged")),
        ("cuda:0,cuda:1", "hf-folder", ("fp16", "portable", "paged")),
        ("migraphx", "hf-folder", ("fp16", "portable", "portable")),
        ("webgpu", "model.gguf", ("fp16", "webgpu", "portable")),  # its fused kernels (graph/fused_ops.py)
        ("webgpu,migraphx", "hf-folder", ("fp16", "portable", "portable")),
        ("cuda,cpu", "model.gguf", ("fp32", "portable", "portable")),  # one graph for both: the portable one
        ("openvino", "model.gguf", ("fp32", "portable", "portable")),
    ],
)
def test_an_export_for_named_devices_suits_them_whatever_is_installed(devices, source, expected):
    assert suited_export(export_targets(devices), source) == expected


def test_export_for_an_unknown_device_names_the_known_ones():
    with pytest.raises(DeviceError, match="--for 'tpu': name devices among cpu, cuda"):
        export_targets("tpu")


def test_an_unknown_device_is_refused_before_any_export(tmp_path, monkeypatch):
    monkeypatch.setenv("WICORE_CACHE", str(tmp_path))
    with pytest.raises(DeviceError, match="unknown device 'tpu:0'"):
        resolve_model("gemma3-270m", "tpu:0")
    assert not any(tmp_path.iterdir())


def test_plan_takes_the_packaged_name_that_serve_takes(gemma_270m, tmp_path, monkeypatch, capsys):
    """`wicore plan --model gemma3-270m` plans the export serve would use (here already cached)."""
    from wicore.cli.main import main

    monkeypatch.setenv("WICORE_CACHE", str(tmp_path))
    (tmp_path / "models").mkdir()
    name = export_folder_name("gemma3-270m", *packaged_export("gemma3-270m"), cpu_kernels("ort-quant"))
    (tmp_path / "models" / name).symlink_to(gemma_270m(1))  # where the CPU export goes (its kernels aside)
    assert main(["plan", "--model", "gemma3-270m", "--devices", "cpu"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    table = [row[:3] for row in rows if row and row[0].endswith(".onnx") and row[1] != "also"]  # not the notes under it
    assert table == [["part-00.onnx", "0-17", "cpu"]]


def test_wicore_export_for_cuda_writes_the_paged_fp16_graphs_on_a_cpu_machine(tiny_model, tmp_path, capsys):
    """`wicore-export --for cuda` on a machine without CUDA: the fp16 paged export a GPU serves;
    an explicit flag still wins over what --for suits; an unknown device exits 2 with nothing written."""
    from wicore.cli.export import main as export_main
    from wicore.graph.manifest import Manifest

    folder, _ = tiny_model()
    assert export_main(["--model", str(folder), "--out", str(tmp_path / "gpu"), "--for", "cuda"]) == 0
    manifest = Manifest.read(tmp_path / "gpu")
    assert (manifest.dtype, manifest.op_flavour, manifest.attention) == ("fp16", "portable", "paged")
    assert (
        export_main(["--model", str(folder), "--out", str(tmp_path / "mixed"), "--for", "cuda", "--attention", "portable"]) == 0
    )
    assert (Manifest.read(tmp_path / "mixed").dtype, Manifest.read(tmp_path / "mixed").attention) == ("fp16", "portable")
    assert export_main(["--model", str(folder), "--out", str(tmp_path / "tpu"), "--for", "tpu"]) == 2
    assert "--for 'tpu': name devices among" in capsys.readouterr().err and not (tmp_path / "tpu").exists()


def test_wicore_export_weight_bits_quantize_for_the_gpu(tiny_model, tmp_path, capsys):
    """`--weight-bits` alone picks the quantized (ort-quant) flavour, here with --for cuda's fp16 paged
    graphs: every linear layer and the head are 8-bit MatMulNBits; with --op-flavour portable it is
    refused (exit 2, nothing written)."""
    import onnx

    from wicore.cli.export import main as export_main
    from wicore.graph.manifest import Manifest

    folder, _ = tiny_model()
    out = tmp_path / "gpu-int8"
    assert export_main(["--model", str(folder), "--out", str(out), "--for", "cuda", "--weight-bits", "8"]) == 0
    manifest = Manifest.read(out)
    assert (manifest.dtype, manifest.op_flavour, manifest.attention) == ("fp16", "ort-quant", "paged")
    nodes = onnx.load(out / manifest.partitions[0].file, load_external_data=False).graph.node
    bits = {next(a.i for a in n.attribute if a.name == "bits") for n in nodes if n.op_type == "MatMulNBits"}
    assert bits == {8} and not [n for n in nodes if n.op_type == "MatMul"]
    bad = tmp_path / "bad"
    assert export_main(["--model", str(folder), "--out", str(bad), "--op-flavour", "portable", "--weight-bits", "4"]) == 2
    assert "--weight-bits quantizes the weights" in capsys.readouterr().err and not bad.exists()
    assert export_main(["--model", str(folder), "--out", str(bad), "--quantize-embedding"]) == 2
    assert "--quantize-embedding needs quantized weights" in capsys.readouterr().err and not bad.exists()


def test_a_damaged_cached_export_names_the_folder_to_delete(tiny_export, tmp_path):
    """Issue 35: a corrupted cached export said "re-export the model", which `wicore serve
    --model gemma3-270m` never does and its user never did: name the folder to delete."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    folder, _ = tiny_export()
    # the folder resolve_model names on this CPU
    cached = tmp_path / "models" / export_folder_name("gemma3-270m", *packaged_export("gemma3-270m"), cpu_kernels("ort-quant"))
    shutil.copytree(folder, cached)
    weights = next(p for p in sorted(cached.iterdir()) if p.suffix == ".onnx")
    weights.write_bytes(weights.read_bytes()[:-10])  # truncated
    env = {**os.environ, "WICORE_CACHE": str(tmp_path), "PYTHONPATH": str(Path(__file__).parents[2])}
    res = subprocess.run(
        [sys.executable, "-m", "wicore.cli", "generate", "--model", "gemma3-270m", "--prompt", "hi", "--threads", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        f"wicore: error: {cached}: {weights.name} does not match its sha256 in wicore.json (modified or truncated); "
        f"re-export the model -- {cached} is WiCore's cached export of gemma3-270m: delete that folder and run again "
        "to export it anew"
    )


# -- WiCore's CPU kernels for a GGUF's quantized graphs (issue 37) ------------------------------------
VNNI = frozenset({"avx2", "fma", "avx512f", "avx512vl", "avx512_vnni"})
AVX2 = frozenset({"avx", "avx2", "fma", "f16c"})


@pytest.mark.parametrize(
    ("flavour", "flags", "has_compiler", "expected"),
    [
        ("ort-quant", VNNI, True, "wicore"),
        ("ort-quant", VNNI, False, "ort"),  # nothing to build the library with
        ("ort-quant", VNNI - {"avx512_vnni"}, True, "wicore"),  # MatMulQ's AVX2 path: faster than MLAS's
        ("ort-quant", AVX2, True, "wicore"),  # an AMD EPYC (Zen 3): no AVX-512 at all
        ("ort-quant", AVX2, False, "ort"),
        ("ort-quant", AVX2 - {"fma"}, True, "ort"),  # MatMulQ's scalar path
        ("ort-quant", frozenset({"sse4_2", "avx"}), True, "ort"),
        ("ort-quant", frozenset(), True, "ort"),  # no /proc/cpuinfo (not Linux)
        ("portable", VNNI, True, "ort"),  # float weights: no MatMulQ
        ("webgpu", VNNI, True, "ort"),
    ],
)
def test_cpu_kernels_where_they_pay_and_build(monkeypatch, flavour, flags, has_compiler, expected):
    monkeypatch.delenv(CPU_KERNELS_ENV, raising=False)
    assert cpu_kernels(flavour, flags, has_compiler) == expected


def test_cpu_kernels_opt_out(monkeypatch):
    monkeypatch.setenv(CPU_KERNELS_ENV, "ort")
    assert cpu_kernels("ort-quant", VNNI, True) == "ort"


def test_export_folders_of_the_two_kernels_differ():
    assert export_folder_name("smollm2-135m-instruct", "fp32", "ort-quant", "portable") == "smollm2-135m-instruct-ort-quant"
    assert (
        export_folder_name("smollm2-135m-instruct", "fp32", "ort-quant", "portable", "wicore")
        == "smollm2-135m-instruct-ort-quant-wicore"
    )
    assert export_folder_name("gemma3-270m", "fp16", "portable", "paged") == "gemma3-270m-fp16-paged"


def test_cpu_flags_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512_vnni\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert _cpu_flags(cpuinfo) == {"fpu", "avx2", "avx512_vnni"}
    assert _cpu_flags(tmp_path / "absent") == frozenset()


def test_a_cached_export_of_older_graphs_is_made_again(tiny_model, tmp_path, monkeypatch):
    """A cache folder written before GRAPHS_REVISION rose (no field: revision 1) still loads, but
    resolve_model exports it again, so `wicore serve --model M` picks up what the exporter now writes
    (the int8 prompts of 2026-11-29); a current one is reused as it is."""
    import json

    from wicore.cli.models import resolve_model
    from wicore.graph.manifest import GRAPHS_REVISION, MANIFEST, Manifest

    monkeypatch.setenv("WICORE_CACHE", str(tmp_path))
    folder, _ = tiny_model()
    target = resolve_model(str(folder), "cpu")
    assert Manifest.read(target).graphs_revision == GRAPHS_REVISION == 2
    manifest = json.loads((target / MANIFEST).read_text())
    del manifest["graphs_revision"]
    (target / MANIFEST).write_text(json.dumps(manifest))
    assert Manifest.read(target).graphs_revision == 1  # an older export still reads
    (target / "stale-marker").write_text("")  # overwrite=True empties the folder when it exports again
    assert resolve_model(str(folder), "cpu") == target
    assert Manifest.read(target).graphs_revision == 2 and not (target / "stale-marker").exists()
    (target / "current-marker").write_text("")
    assert resolve_model(str(folder), "cpu") == target and (target / "current-marker").exists()
