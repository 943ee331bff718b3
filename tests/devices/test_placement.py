"""Execution-provider records and partition placement."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from wicore.devices.placement import _fill, _share, plan_placement
from wicore.devices.providers import CAPABILITIES, Device, DeviceError, host_free_bytes, parse_device
from wicore.engine.engine import Engine, EngineConfig
from wicore.graph.manifest import Manifest
from wicore.types.sampling import SamplingParams

GIB = 1 << 30


def device_with_free(name: str, free: int | None) -> Device:
    cap = dataclasses.replace(CAPABILITIES[name], free_bytes=lambda _: free)
    return Device(cap, cap.default_index)


def test_fill_spills_to_the_next_device_when_the_first_is_full():
    gpu, cpu = device_with_free("cuda", 10 * GIB), device_with_free("cpu", None)
    # 90% of 10 GiB holds the first two 4 GiB partitions, not the third.
    assert _fill([4 * GIB, 4 * GIB, 4 * GIB, 1 * GIB], [gpu, cpu]) == [0, 0, 1, 1]


def test_share_cuts_consecutive_partitions_by_size():
    assert _share([1, 1, 1, 1], 2) == [0, 0, 1, 1]
    assert _share([6, 1, 1, 1, 1, 6], 2) == [0, 0, 0, 1, 1, 1]
    assert _share([8, 1, 1, 8], 3) == [0, 1, 1, 2]


def test_unknown_and_uninstalled_devices_are_refused():
    with pytest.raises(DeviceError, match="unknown device 'tpu:0'"):
        parse_device("tpu:0")
    with pytest.raises(DeviceError, match="CANNExecutionProvider is not in this ONNX Runtime build"):
        parse_device("cann:0")


def test_a_dtype_the_provider_cannot_run_is_refused_naming_what_works():
    fp32_only = Device(dataclasses.replace(CAPABILITIES["cpu"], dtypes=("fp32",)), "0")
    with pytest.raises(DeviceError, match="cpu cannot run fp16 graphs; re-export with --dtype fp32"):
        fp32_only.check_can_run("fp16", "portable")
    with pytest.raises(DeviceError, match="cannot run the 'fast' op flavour; re-export with --op-flavour portable"):
        fp32_only.check_can_run("fp32", "fast")


def test_the_fused_vision_flavour_runs_where_contrib_ops_do():
    for name in ("cpu", "cuda"):
        Device(CAPABILITIES[name], "0").check_can_run_vision("fp16", "fused")
    openvino = Device(CAPABILITIES["openvino"], "CPU")
    openvino.check_can_run_vision("fp32", "portable")
    with pytest.raises(
        DeviceError, match="openvino:CPU cannot run the 'fused' vision flavour; re-export with --vision-flavour portable"
    ):
        openvino.check_can_run_vision("fp32", "fused")


EMBED = 512 * 64 * 4  # the tiny model's tied embedding: part-00's lookup table, part-01's LM head
PER_LAYER = 4 * (64 * (4 * 32 + 2 * 2 * 32) + 4 * 32 * 64 + 64 * 2 * 128 + 128 * 64)  # qkv, o, gate|up, down


def test_plan_reads_partition_sizes_without_loading_weights(tiny_export):
    """On the CPU EP the first partition looks its embedding rows up in the mapped file; the last
    one copies the table for its LM head. The shared file is held once."""
    folder, _ = tiny_export(2)
    manifest = Manifest.read(folder)
    plan = plan_placement(folder, manifest, "cpu,cpu", kv_pool_bytes=4096)
    assert [p.device.label for p in plan.placements] == ["cpu", "cpu"]
    first, last = plan.placements
    assert (first.mapped_bytes, last.mapped_bytes) == (EMBED, 0)
    for placement, table in ((first, 0), (last, EMBED)):
        inline = placement.weight_bytes - (table + 2 * PER_LAYER)  # norm weights, RoPE frequencies, shapes
        assert 0 < inline < 4096
    assert [p.kv_bytes for p in plan.placements] == [2048, 2048]
    text = plan.describe()
    assert "part-01.onnx  2-3" in text
    assert f"part-00.onnx also looks up rows of {EMBED / GIB:.2f}G in place in its mapped weight file" in text
    assert "is copied by" not in text


def test_on_an_accelerator_each_session_holds_its_own_copy_of_the_tied_table(tiny_export, monkeypatch):
    folder, _ = tiny_export(2)
    gpu = device_with_free("cuda", 80 * GIB)
    monkeypatch.setattr("wicore.devices.placement.device_list", lambda spec, is_installed=True: [gpu])
    plan = plan_placement(folder, Manifest.read(folder), "cuda:0")
    assert [p.mapped_bytes for p in plan.placements] == [0, 0]
    assert all(p.weight_bytes > EMBED + 2 * PER_LAYER for p in plan.placements)
    assert (
        "embed_tokens.data is copied by part-00.onnx and part-01.onnx: each session holds its own copy, counted in each"
        in plan.describe()
    )


# Run in a fresh process: one that already freed memory (earlier tests) reuses it without growing.
HOLD = """
import sys
from pathlib import Path
from wicore.graph.manifest import Manifest
from wicore.executor.graphs import ModelGraphs
from wicore.kv.buffers import CacheConfig, KVBuffers
from wicore.devices.placement import plan_placement

def anonymous():
    lines = Path("/proc/self/smaps_rollup").read_text().splitlines()
    return next(int(line.split()[1]) << 10 for line in lines if line.startswith("Anonymous:"))

folder = Path(sys.argv[1])
manifest = Manifest.read(folder)
devices = plan_placement(folder, manifest, "cpu").devices
before = anonymous()
graphs = ModelGraphs(folder, manifest, KVBuffers(manifest, CacheConfig(2, 16), devices), devices, 1)
print(anonymous() - before)
"""


@pytest.mark.slow
def test_the_plan_is_what_the_cpu_sessions_hold(gemma_270m):
    """The 3-partition 270M: loading its sessions grows private memory by the plan's total weights
    (the mapped embedding adds only the pages its lookups read), not by the 1.62 GiB its graphs name."""
    folder = gemma_270m(3)
    plan = plan_placement(folder, Manifest.read(folder), "cpu")
    assert [round(p.weight_bytes / GIB, 2) for p in plan.placements] == [0.12, 0.12, 0.75]
    grown = int(subprocess.run([sys.executable, "-c", HOLD, str(folder)], capture_output=True, text=True, check=True).stdout)
    held = sum(p.weight_bytes for p in plan.placements)
    assert 0.95 * held < grown < 1.1 * held, (grown / GIB, held / GIB)  # measured 1.01 GiB against 1.00


def test_the_vision_partition_goes_with_the_first_partition_or_where_told(tiny_multimodal):
    folder = tiny_multimodal.export()
    manifest = Manifest.read(folder)
    plan = plan_placement(folder, manifest, "cpu")
    assert plan.vision is not None and plan.vision.device == plan.placements[0].device
    assert plan.vision.weight_bytes > 4 * (64 * 32 + 3 * 32 * 32)  # position embedding and the layers' qkv
    assert "vision.onnx   images    cpu" in plan.describe()
    assert plan_placement(folder, manifest, "cpu", vision_device="cpu").vision.device.label == "cpu"
    with pytest.raises(DeviceError, match="unknown device 'tpu:0'"):
        plan_placement(folder, manifest, "cpu", vision_device="tpu:0")


def test_plan_refuses_a_device_without_room(tiny_export):
    folder, _ = tiny_export(2)
    with pytest.raises(DeviceError, match="would need .* GiB for part-00.onnx, part-01.onnx"):
        plan = plan_placement(folder, Manifest.read(folder), "cpu", kv_pool_bytes=64 * GIB * 1024)
        del plan


def test_partitions_on_separate_cpu_devices_generate_the_same(tiny_export):
    import torch

    folder, model = tiny_export(2)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    with torch.no_grad():
        hf = model.generate(torch.tensor([[5, 6, 7]]), max_new_tokens=8, min_new_tokens=8, do_sample=False)[0, 3:].tolist()
    outputs = {}
    for devices in ("cpu", "cpu,cpu"):
        config = EngineConfig(
            model_dir=folder, num_threads=1, block_size=4, num_device_blocks=16, num_host_blocks=0, devices=devices
        )
        with Engine(config) as engine:
            assert [d.label for d in engine.devices] == ["cpu", "cpu"]
            (completion,) = engine.generate([[5, 6, 7]], params)
        assert completion.error is None and len(completion.token_ids) == 8
        outputs[devices] = completion.token_ids
    assert outputs["cpu,cpu"] == outputs["cpu"] == hf


def write_meminfo(root, free_kib: int, available_kib: int):
    (root / "meminfo").write_text(
        f"MemTotal:       24684100 kB\nMemFree:        {free_kib} kB\nMemAvailable:   {available_kib} kB\n"
    )
    return root


def test_host_free_memory_counts_reclaimable_page_cache(tmp_path):
    # A machine that has just written exported models: little MemFree, most of it cache.
    proc = write_meminfo(tmp_path, free_kib=2_883_584, available_kib=22_020_096)
    assert host_free_bytes("0", proc=proc, cgroup=tmp_path / "none") == 22_020_096 << 10


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"memory.max": "8589934592\n", "memory.current": "1073741824\n"}, 7 * GIB),  # cgroup v2
        ({"memory.max": "max\n", "memory.current": "1073741824\n"}, 21 * GIB),  # v2, no limit
        ({"memory/memory.limit_in_bytes": "4294967296\n", "memory/memory.usage_in_bytes": "5368709120\n"}, 0),  # v1, over
        ({"memory/memory.limit_in_bytes": str((1 << 63) - 4096), "memory/memory.usage_in_bytes": "1"}, 21 * GIB),
    ],
)
def test_host_free_memory_stays_within_the_cgroup_limit(tmp_path, files, expected):
    proc = write_meminfo(tmp_path, free_kib=1 << 20, available_kib=21 << 20)
    cgroup = tmp_path / "cgroup"
    for name, text in files.items():
        (cgroup / name).parent.mkdir(parents=True, exist_ok=True)
        (cgroup / name).write_text(text)
    assert host_free_bytes("0", proc=proc, cgroup=cgroup) == expected
