"""Partitions -> devices: which execution provider runs which layers.

A partition needs its weights plus the KV pools of its own layers on its device (the pools
are split by layer, so each device holds the pools of the layers it runs and the pager's
tier 0 is per device). Hidden states cross devices between partitions.

    --devices auto                    fill the first accelerator ONNX Runtime offers (up to 90%
                                      of its free memory), spill the remaining partitions to the CPU
    --devices cuda:0,cuda:1           shorter list than partitions: consecutive partitions shared
                                      out by size, e.g. two cards sharing one model
    --devices openvino:CPU,cpu,cpu    as many devices as partitions: one to one

A multimodal export's vision partition runs on the first partition's device (which takes its
embeddings), or on `--vision-device` (a CPU beside a full GPU, or a second card).

A device whose free memory cannot be read is assumed to have room; every plan is checked
against the free memory that can be read.

What a partition holds is what its session keeps in memory, not what its files hold. Gemma's tied
token table is both the first partition's embedding and the last one's LM head; a multi-partition
export stores it once (embed_tokens.data) and both graphs name it. On the CPU EP ONNX Runtime maps
an external table that only lookups read (Gather) and leaves it in the file: only the rows read
become resident, as page cache. A table a MatMul reads is copied (and packed), and on an
accelerator every session copies all its weights to the device (sessions share no initializers).
So on the CPU EP a 3-partition 270M holds the table once, in its last partition (measured in
tests/devices/test_placement.py: its sessions' private memory grows by the plan's 1.00 GiB, not
by the 1.62 GiB its graphs name); on a GPU twice, once per session, and the plan says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from wicore.devices.providers import Device, DeviceError, available_devices, parse_device
from wicore.graph.manifest import Manifest, PartitionRecord, VisionRecord

HEADROOM = 0.9
GIB = 1 << 30
LOOKUPS = frozenset({"Gather", "GatherBlockQuantized"})  # ops that read a table row by row


@dataclass(frozen=True)
class Placement:
    partition: PartitionRecord
    device: Device
    weight_bytes: int  # what its session holds on the device
    kv_bytes: int
    mapped_bytes: int = 0  # lookup tables its session reads in place from the mapped file (CPU EP)
    copied_files: frozenset[str] = frozenset()  # external weight files its session copies from


@dataclass(frozen=True)
class VisionPlacement:
    record: VisionRecord
    device: Device
    weight_bytes: int


@dataclass(frozen=True)
class Plan:
    placements: tuple[Placement, ...]
    vision: VisionPlacement | None = None

    @property
    def devices(self) -> list[Device]:
        """The device of each partition, in partition order."""
        return [p.device for p in self.placements]

    def describe(self) -> str:
        """A row per partition: the weights its session holds on its device (a table it only reads
        rows of from the mapped file is named below), its share of the KV pool; then the totals."""
        lines = [f"{'partition':<14}{'layers':<10}{'device':<16}{'weights':>10}{'kv pool':>10}"]
        for p in self.placements:
            layers = f"{p.partition.start}-{p.partition.stop - 1}"
            lines.append(
                f"{p.partition.file:<14}{layers:<10}{p.device.label:<16}{p.weight_bytes / GIB:>9.2f}G{p.kv_bytes / GIB:>9.2f}G"
            )
        if self.vision is not None:
            v = self.vision
            lines.append(f"{v.record.file:<14}{'images':<10}{v.device.label:<16}{v.weight_bytes / GIB:>9.2f}G{'-':>10}")
        weights = sum(p.weight_bytes for p in self.placements) + (self.vision.weight_bytes if self.vision else 0)
        lines.append(f"{'total':<40}{weights / GIB:>9.2f}G{sum(p.kv_bytes for p in self.placements) / GIB:>9.2f}G")
        for file in sorted({f for p in self.placements for f in p.copied_files}):
            holders = [p.partition.file for p in self.placements if file in p.copied_files]
            if len(holders) > 1:
                lines.append(f"{file} is copied by {' and '.join(holders)}: each session holds its own copy, counted in each")
        for p in self.placements:
            if p.mapped_bytes:
                lines.append(
                    f"{p.partition.file} also looks up rows of {p.mapped_bytes / GIB:.2f}G in place in its mapped weight "
                    "file (page cache: resident as far as loading and lookups read it, until the kernel needs the memory)"
                )
        return "\n".join(lines)


@dataclass(frozen=True)
class PartitionWeights:
    total: int  # bytes of the graph's initializers
    copied: int  # inline, or read by an op other than a lookup: copied into the session on any EP
    looked_up: int  # external tables a lookup reads (the token embedding; also copied if a MatMul reads it too)
    files: frozenset[str]  # its external weight files
    files_copied_on_cpu: frozenset[str]  # those holding a tensor an op other than a lookup reads

    def held_on(self, device: Device) -> tuple[int, int, frozenset[str]]:
        """(bytes the session holds, bytes it reads in place from the mapped file, files it copies from) on `device`."""
        if device.capability.name == "cpu":
            return self.copied, self.looked_up, self.files_copied_on_cpu
        return self.total, 0, self.files


def partition_weights(model_dir: Path, record: PartitionRecord | VisionRecord) -> PartitionWeights:
    """The partition's initializer bytes, read from the graph without loading the weights."""
    model = onnx.load(str(Path(model_dir) / record.file), load_external_data=False)
    sizes, external = {}, {}
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entries = {e.key: e.value for e in tensor.external_data}
            sizes[tensor.name] = int(entries["length"])
            external[tensor.name] = entries["location"]
        else:
            sizes[tensor.name] = int(np.prod(tensor.dims)) * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    readers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    is_copied = {name: name not in external or bool(readers.get(name, set()) - LOOKUPS) for name in sizes}
    return PartitionWeights(
        total=sum(sizes.values()),
        copied=sum(size for name, size in sizes.items() if is_copied[name]),
        looked_up=sum(sizes[name] for name in external if readers.get(name, set()) & LOOKUPS),
        files=frozenset(external.values()),
        files_copied_on_cpu=frozenset(file for name, file in external.items() if is_copied[name]),
    )


def device_list(spec: str, is_installed: bool = True) -> list[Device]:
    """The devices of a --devices spec; `auto`: the first accelerator installed (not a CPU, whatever
    its EP: OpenVINO's default device is the CPU), then the plain CPU to spill to. `is_installed`
    False: named devices whose EP this ONNX Runtime lacks are taken too (`wicore plan`)."""
    if spec.strip() == "auto":
        found = available_devices()
        accelerators = [d for d in found if d.capability.device_kind != "cpu"]
        devices = accelerators[:1] + [d for d in found if d.capability.name == "cpu"]
    else:
        devices = [parse_device(s, is_installed) for s in spec.split(",") if s.strip()]
    if not devices:
        raise DeviceError(f"--devices {spec!r} names no device")
    return devices


def plan_placement(
    model_dir: Path,
    manifest: Manifest,
    devices: str = "cpu",
    kv_pool_bytes: int = 0,
    vision_device: str | None = None,
    is_installed: bool = True,
) -> Plan:
    """Assign every partition a device (see the module docstring for the three modes), and the
    vision partition, if any, `vision_device` or the first partition's. `is_installed` False: a
    plan for named devices this ONNX Runtime build lacks (their free memory unknown)."""
    candidates = device_list(devices, is_installed)
    for device in candidates:
        device.check_can_run(manifest.dtype, manifest.op_flavour, manifest.attention)
    num_layers = manifest.config.num_layers
    weights = [partition_weights(model_dir, r) for r in manifest.partitions]
    kv = [kv_pool_bytes * (r.stop - r.start) // num_layers for r in manifest.partitions]
    sizes = [w.total + k for w, k in zip(weights, kv)]  # the most a partition can hold, to choose devices
    if devices.strip() == "auto":
        owners = _fill(sizes, candidates)
    elif len(candidates) == len(sizes):
        owners = list(range(len(sizes)))
    else:
        owners = _share(sizes, len(candidates))
    held = [w.held_on(candidates[o]) for w, o in zip(weights, owners)]
    sizes = [h + k for (h, _, _), k in zip(held, kv)]
    vision = None
    if manifest.vision is not None:
        device = candidates[owners[0]] if vision_device is None else parse_device(vision_device, is_installed)
        device.check_can_run_vision(manifest.dtype, manifest.vision.flavour)
        vision = VisionPlacement(manifest.vision, device, partition_weights(model_dir, manifest.vision).held_on(device)[0])
        if device in candidates:  # its weights count with the partitions' on that device
            sizes, owners = sizes + [vision.weight_bytes], owners + [candidates.index(device)]
        elif not _fits(device, vision.weight_bytes):
            raise DeviceError(f"{device.label} has no room for the {vision.weight_bytes / GIB:.2f} GiB of {manifest.vision.file}")
    _check_memory(sizes, owners, candidates, manifest)
    placements = tuple(
        Placement(r, candidates[o], h, k, mapped, files)
        for r, (h, mapped, files), k, o in zip(manifest.partitions, held, kv, owners)
    )
    return Plan(placements, vision)


def _fill(sizes: list[int], devices: list[Device]) -> list[int]:
    """Each partition on the first device (in order, never going back) with room for it."""
    owners, used, current = [], [0] * len(devices), 0
    for size in sizes:
        while current < len(devices) - 1 and not _fits(devices[current], used[current] + size):
            current += 1
        used[current] += size
        owners.append(current)
    return owners


def _share(sizes: list[int], num_devices: int) -> list[int]:
    """Consecutive partitions to devices, cutting where the running total is nearest i / n of it."""
    total, owners, running = sum(sizes), [], 0
    for size in sizes:
        middle = running + size / 2
        owners.append(min(num_devices - 1, int(middle * num_devices // total)))
        running += size
    return owners


def _fits(device: Device, need: int) -> bool:
    free = device.free_bytes()
    return free is None or need <= free * HEADROOM


def _check_memory(sizes: list[int], owners: list[int], devices: list[Device], manifest: Manifest) -> None:
    for index, device in enumerate(devices):
        need = sum(s for s, o in zip(sizes, owners) if o == index)
        if need and not _fits(device, need):
            files = ", ".join(r.file for r, o in zip(manifest.partitions, owners) if o == index)
            raise DeviceError(
                f"{device.label} would need {need / GIB:.2f} GiB for {files} but has "
                f"{(device.free_bytes() or 0) / GIB:.2f} GiB free; add a device, lower kv_pool_gb, "
                "or re-export with more --partitions"
            )
