"""Execution-provider records and partition placement."""

from __future__ import annotations

import dataclasses

import pytest

from wicore.graph.manifest import Manifest
from wicore.runtime.engine import Engine, EngineConfig
from wicore.runtime.placement import _fill, _share, plan_placement
from wicore.runtime.providers import CAPABILITIES, Device, DeviceError, host_free_bytes, parse_device
from wicore.runtime.sampler import SamplingParams

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


def test_plan_reads_partition_sizes_without_loading_weights(tiny_export):
    folder, _ = tiny_export(2)
    manifest = Manifest.read(folder)
    plan = plan_placement(folder, manifest, "cpu,cpu", kv_pool_bytes=4096)
    assert [p.device.label for p in plan.placements] == ["cpu", "cpu"]
    embed = 512 * 64 * 4  # tied embedding, in both the first and the last partition
    per_layer = 4 * (64 * (4 * 32 + 2 * 2 * 32) + 4 * 32 * 64 + 64 * 2 * 128 + 128 * 64)  # qkv, o, gate|up, down
    for placement in plan.placements:
        inline = placement.weight_bytes - (embed + 2 * per_layer)  # norm weights, RoPE frequencies, shapes
        assert 0 < inline < 4096
    assert [p.kv_bytes for p in plan.placements] == [2048, 2048]
    assert "part-01.onnx  2-3" in plan.describe()


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
            assert [d.label for d in engine.runner.graphs.devices] == ["cpu", "cpu"]
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
