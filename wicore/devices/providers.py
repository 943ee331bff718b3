"""ONNX Runtime execution providers: what is installed, what each can run, where its memory is.

Every ONNX Runtime build installs the same `onnxruntime` module, so which one is present
decides the hardware; WiCore depends on none of them directly. Everything that differs
between execution providers lives in the CAPABILITIES table below: the rest of WiCore asks
a `Device` what it can do and never tests an EP's name.

    device spec      provider                       allocations (OrtValue device)
    cpu              CPUExecutionProvider           cpu
    cuda:N           CUDAExecutionProvider          cuda, N
    tensorrt:N       TensorrtExecutionProvider      cuda, N
    openvino:TYPE    OpenVINOExecutionProvider      cpu (OpenVINO copies in and out)
    migraphx:N       MIGraphXExecutionProvider      cpu (host memory); gpu, N with WICORE_DEVICE_POOLS
    cann:N           CANNExecutionProvider          cpu (host memory); cann, N with WICORE_DEVICE_POOLS
    dml:N            DmlExecutionProvider           cpu (host memory); dml, N with WICORE_DEVICE_POOLS
    webgpu:0         WebGpuExecutionProvider        webgpu (a plugin EP: onnxruntime-ep-webgpu)

A plugin EP ships as a library of its own, outside the `onnxruntime` wheel; ONNX Runtime offers it
once the library is registered with its environment (register_plugin_eps, which the first look at
the installed providers does). The WebGPU plugin picks its adapter itself (Dawn over Vulkan, Metal
or D3D12); ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1 in the environment before that first look lets it
take a CPU one (Mesa's lavapipe: how CI runs it, docs/HARDWARE.md).

MIGraphX, CANN and DirectML can keep their OrtValues in their own memory too (`device_memory`), by
the CUDA pools' mechanism; no run has shown it yet, so it stays off unless WICORE_DEVICE_POOLS names
the EP (wicore.devices.device_pools says what each name means to ONNX Runtime).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from types import ModuleType
from typing import Any

from wicore.devices.device_pools import requested
from wicore.devices.free_memory import host_free_bytes, nvidia_free_bytes, unknown_free_bytes
from wicore.devices.plugins import plugin_refusals, register_plugin_eps
from wicore.errors import RuntimeMissingError, WiCoreError

log = logging.getLogger(__name__)

# WiCore installs from its checkout (it is not on a package index): the extra picks the runtime.
EXTRAS = (
    "in the WiCore checkout, pip install '.[cpu]' (or '.[cuda]' for NVIDIA, '.[openvino]' for Intel, "
    "'.[webgpu]' for any GPU through WebGPU)"
)


class DeviceError(WiCoreError):
    """A device spec names a provider that is not installed, or a model it cannot run."""


def onnxruntime() -> ModuleType:
    """The installed ONNX Runtime module, or a RuntimeMissingError naming the extras."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise RuntimeMissingError(f"no ONNX Runtime is installed: {EXTRAS}") from exc
    return ort


FPA_INTB_ENV = "ORT_FPA_INTB_GEMM"  # ONNX Runtime's own switch; when set, WiCore leaves the choice to it


def session_options(
    num_threads: int | None, profile_prefix: str | None = None, devices: Sequence[Device] = (), share_arena: bool = True
) -> Any:
    """Options of every WiCore session; `profile_prefix` turns on ONNX Runtime's profiler. Sessions on
    the CUDA `devices` allocate from one arena a device (shared_cuda_arena) unless `share_arena` is
    False (CUDA graphs replayed while other sessions allocate: wicore.executor.cuda_graphs)."""
    ort = onnxruntime()
    opts = ort.SessionOptions()
    if (
        share_arena
        and os.environ.get(SHARED_ARENA_ENV, "1") != "0"
        and any(shared_cuda_arena(int(d.index)) for d in devices if d.capability.shares_cuda_arena)
    ):
        opts.add_session_config_entry("session.use_env_allocators", "1")
    if any(d.ort_device[0] == "cuda" for d in devices):
        # Each initializer its own allocation instead of one planned buffer, so one that a kernel
        # prepacked into a buffer of its own (MatMulNBits with fpA_intB, below) can be freed.
        # Measured: 1.5 GiB less at the 27B's full depth in 4 bits (docs/PERFORMANCE.md, "full depth").
        opts.add_session_config_entry("session.use_device_allocator_for_initializers", "1")
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if num_threads:
        opts.intra_op_num_threads = num_threads
        opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    if FPA_INTB_ENV not in os.environ:
        # 4/8-bit MatMulNBits on CUDA through ONNX Runtime's CUTLASS mixed-input (fp16 x int) GEMM and
        # GEMV: 2.6x faster at 32 rows on the 27B shape, 9% slower at one row, ~45% more device memory for
        # the quantized weights (docs/PERFORMANCE.md). Off in ONNX Runtime by default; other EPs and
        # float models ignore the key. ORT_FPA_INTB_GEMM=0 in the environment keeps the old kernels.
        opts.add_session_config_entry("ep.cuda.fpa_intb_gemm", "1")
    if profile_prefix is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    return opts


SHARED_ARENA_ENV = "WICORE_CUDA_SHARED_ARENA"  # "0": every CUDA session keeps an arena of its own


@cache
def shared_cuda_arena(index: int) -> bool:
    """Register one arena for CUDA device `index` with ONNX Runtime's environment, for the sessions
    on it to share. A model in partitions runs a session each, one after another; each with its own
    arena keeps its largest step's buffers for itself (1.0-1.9 GiB a partition at the 27B shape,
    docs/PERFORMANCE.md). Same tokens either way. False where ONNX Runtime refuses it (the sessions
    then keep their own).

    A captured CUDA graph (cuda_graphs.py) replays into the scratch memory it was captured with,
    which the arena counts as free between runs. An engine creates all of its sessions before it
    captures, so nothing of its own can be placed there; a second engine started in the same
    process while the first keeps replaying could be: run such engines with
    WICORE_CUDA_SHARED_ARENA=0 (not measured either way)."""
    ort = onnxruntime()
    try:
        info = ort.OrtMemoryInfo("Cuda", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, index, ort.OrtMemType.DEFAULT)
        arena = ort.OrtArenaCfg(0, 1, -1, -1)  # no cap; grow by what is asked (kSameAsRequested); defaults
        ort.create_and_register_allocator_v2("CUDAExecutionProvider", info, {"device_id": str(index)}, arena)
    except Exception as exc:
        log.warning("CUDA sessions on device %d keep an arena each: ONNX Runtime did not register a shared one (%s)", index, exc)
        return False
    return True


@dataclass(frozen=True)
class Capability:
    """What one execution provider is and can do."""

    name: str  # the device spec prefix: "cuda" in "cuda:0"
    provider: str  # ONNX Runtime's name
    device_kind: str  # "cpu", "gpu" or "npu"
    dtypes: tuple[str, ...]  # export dtypes it runs
    # graph flavours it runs, the first the one a refusal suggests (ort-quant: com.microsoft MatMulNBits kernels, 4/8 bits;
    # webgpu: fused norms, RoPE and GELU, int32 index arithmetic, wicore/graph/fused_ops.py)
    op_flavours: tuple[str, ...]
    default_index: str  # "0", or OpenVINO's device type "CPU"
    ort_device: str  # where OrtValues for this EP are allocated ("cpu" or "cuda")
    free_bytes: Callable[[str], int | None]  # free memory of a device, None if unknown
    option_key: str | None  # provider option that selects the device
    # attention graphs it runs: standard ops (portable, batch-invariant) or paged: com.microsoft.PagedAttention
    attentions: tuple[str, ...] = ("portable", "batch-invariant")
    # the op flavours whose paged graphs it runs: the EP's PagedAttention takes its own inputs (the CUDA EP's
    # a slot mapping and q/k norm weights; the WebGPU EP's neither, graph/paged_attention.py paged_values)
    paged_op_flavours: tuple[str, ...] = ("portable", "ort-quant")
    # vision partition flavours it runs: standard ops (portable) or fused: com.microsoft MultiHeadAttention, FastGelu
    vision_flavours: tuple[str, ...] = ("portable",)
    options: tuple[tuple[str, str], ...] = ()  # provider options it always gets
    shares_cuda_arena: bool = False  # its sessions on one device may allocate from one arena (shared_cuda_arena)
    absent_hint: str = ""  # what else, beyond its package, it needs to be offered (said when it is not)
    # Its own memory as ONNX Runtime's Python API names it, where ort_device is "cpu" only until a run
    # shows the pools work there (WICORE_DEVICE_POOLS switches it on: wicore.devices.device_pools);
    # `device_vendor`: the PCI vendor an allocation there asks for, where the name carries none.
    device_memory: str | None = None
    device_vendor: int | None = None
    # the provider option with which it captures a session's runs and replays them (None: it cannot;
    # wicore.executor.cuda_graphs replays the decode steps), and whether its captures need ONNX
    # Runtime's memory patterns off and every bound value a whole device OrtValue (the WebGPU EP's: its
    # replay reuses the capture's buffers, and a WebGPU buffer is a handle that no binding offsets into)
    graph_capture: tuple[str, str] | None = None
    capture_whole_values: bool = False

    def provider_options(self, index: str) -> dict[str, str]:
        return {**dict(self.options), **({self.option_key: index} if self.option_key else {})}

    def with_device_pools(self) -> Capability:
        """This EP with its OrtValues (the KV pools first) in its own memory."""
        return dataclasses.replace(self, ort_device=self.device_memory or self.ort_device)


CAPABILITIES: dict[str, Capability] = {
    c.name: c
    for c in (
        Capability(
            "cpu",
            "CPUExecutionProvider",
            "cpu",
            ("fp32", "fp16"),
            ("portable", "ort-quant", "webgpu", "webgpu-quant"),
            "0",
            "cpu",
            host_free_bytes,
            None,
            vision_flavours=("portable", "fused"),
        ),
        Capability(
            "cuda",
            "CUDAExecutionProvider",
            "gpu",
            ("fp16", "fp32"),
            ("portable", "ort-quant", "webgpu", "webgpu-quant"),
            "0",
            "cuda",
            nvidia_free_bytes,
            "device_id",
            attentions=("portable", "paged", "batch-invariant"),
            vision_flavours=("portable", "fused"),
            # The arena grows by what is asked, not to the next power of two: at 128K a prefill's
            # buffers are GBs, and rounding them up is what keeps a 27B from a 24 GB card.
            options=(("arena_extend_strategy", "kSameAsRequested"),),
            shares_cuda_arena=True,
            graph_capture=("enable_cuda_graph", "1"),
        ),
        Capability(
            "tensorrt",
            "TensorrtExecutionProvider",
            "gpu",
            ("fp16", "fp32"),
            ("portable",),
            "0",
            "cuda",
            nvidia_free_bytes,
            "device_id",
        ),
        Capability(
            "openvino",
            "OpenVINOExecutionProvider",
            "cpu",
            ("fp32", "fp16"),
            ("portable",),
            "CPU",
            "cpu",
            host_free_bytes,
            "device_type",
        ),
        Capability(
            "migraphx",
            "MIGraphXExecutionProvider",
            "gpu",
            ("fp16", "fp32"),
            ("portable",),
            "0",
            "cpu",
            unknown_free_bytes,
            "device_id",
            device_memory="gpu",
            device_vendor=0x1002,  # AMD: "gpu" alone names no vendor (ONNX Runtime has no "migraphx" alias)
        ),
        Capability(
            "cann",
            "CANNExecutionProvider",
            "npu",
            ("fp16", "fp32"),
            ("portable",),
            "0",
            "cpu",
            unknown_free_bytes,
            "device_id",
            device_memory="cann",
        ),
        Capability(
            "dml",
            "DmlExecutionProvider",
            "gpu",
            ("fp16", "fp32"),
            ("portable",),
            "0",
            "cpu",
            unknown_free_bytes,
            "device_id",
            device_memory="dml",
        ),
        # The plugin selects its adapter itself (no option picks a device): one device, index 0.
        # OrtValues live on the adapter ("webgpu" memory), so the KV pools stay there.
        Capability(
            "webgpu",
            "WebGpuExecutionProvider",
            "gpu",
            ("fp32", "fp16"),
            ("webgpu", "webgpu-quant", "portable", "ort-quant"),  # webgpu: its fused kernels (graph/fused_ops.py)
            "0",
            "webgpu",
            unknown_free_bytes,
            None,
            attentions=("portable", "paged", "batch-invariant"),
            paged_op_flavours=("webgpu", "webgpu-quant"),  # not the default: slower than its portable attention
            # the paged graphs only: the portable attention's index arithmetic leaves int64 nodes to the CPU,
            # and their copies keep ONNX Runtime from capturing (docs/PERFORMANCE.md)
            graph_capture=("enableGraphCapture", "1"),
            capture_whole_values=True,
            absent_hint=(
                "the WebGPU plugin offers a device only where it finds an adapter: a GPU's Vulkan, Metal or D3D12 "
                "driver (on Linux with the system's libvulkan.so.1), or with ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1 "
                "a CPU one such as Mesa >= 25's lavapipe"
            ),
        ),
    )
}


@dataclass(frozen=True)
class Device:
    capability: Capability
    index: str

    @property
    def label(self) -> str:
        return self.capability.name if self.capability.name == "cpu" else f"{self.capability.name}:{self.index}"

    @property
    def ort_device(self) -> tuple[str, int]:
        """(device type, id) for OrtValue allocations and IOBinding outputs."""
        if self.capability.ort_device == "cpu":
            return ("cpu", 0)
        return (self.capability.ort_device, int(self.index))

    def providers(self, cuda_graphs: bool = False) -> list:
        """The session's provider list: this EP, with the CPU EP behind it for any op it lacks.
        `cuda_graphs`: the EP may capture runs and replay them (Capability.graph_capture: CUDA graphs,
        the WebGPU EP's recorded command buffers; wicore.executor.cuda_graphs)."""
        options = self.capability.provider_options(self.index)
        if cuda_graphs:
            if self.capability.graph_capture is None:
                raise DeviceError(f"{self.label} captures no graphs: run it with --cuda-graphs off")
            key, value = self.capability.graph_capture
            options[key] = value
        own = (self.capability.provider, options)
        return [own] if self.capability.name == "cpu" else [own, "CPUExecutionProvider"]

    def free_bytes(self) -> int | None:
        return self.capability.free_bytes(self.index)

    def check_can_run(self, dtype: str, op_flavour: str, attention: str = "portable") -> None:
        """Raise DeviceError, naming what would work, if this EP cannot run such graphs."""
        cap = self.capability
        if attention not in cap.attentions:
            raise DeviceError(
                f"{self.label} cannot run the {attention!r} attention; re-export with --attention {cap.attentions[0]}"
            )
        if attention == "paged" and op_flavour not in cap.paged_op_flavours:
            raise DeviceError(
                f"{self.label} runs the paged attention in the op flavours {', '.join(cap.paged_op_flavours)} only "
                f"(its PagedAttention's inputs); re-export with --op-flavour {cap.paged_op_flavours[0]} or --attention portable"
            )
        if dtype not in cap.dtypes:
            raise DeviceError(f"{self.label} cannot run {dtype} graphs; re-export with --dtype {cap.dtypes[0]}")
        if op_flavour not in cap.op_flavours:
            raise DeviceError(
                f"{self.label} cannot run the {op_flavour!r} op flavour; re-export with --op-flavour {cap.op_flavours[0]}"
            )

    def check_can_run_vision(self, dtype: str, flavour: str) -> None:
        """Raise DeviceError, naming what would work, if this EP cannot run such a vision partition."""
        self.check_can_run(dtype, "portable")
        if flavour not in self.capability.vision_flavours:
            raise DeviceError(
                f"{self.label} cannot run the {flavour!r} vision flavour; "
                f"re-export with --vision-flavour {self.capability.vision_flavours[0]}"
            )


def installed_providers() -> list[str]:
    register_plugin_eps(onnxruntime())
    return list(onnxruntime().get_available_providers())


def available_devices() -> list[Device]:
    """One Device per installed provider WiCore knows (index 0 / the default device type)."""
    installed = set(installed_providers())
    return [device_of(c, c.default_index) for c in CAPABILITIES.values() if c.provider in installed]


def device_of(capability: Capability, index: str) -> Device:
    """The Device of `capability` at `index`, its OrtValues in its own memory where WICORE_DEVICE_POOLS says."""
    on_device = requested({name: cap.device_memory for name, cap in CAPABILITIES.items()})
    return Device(capability.with_device_pools() if capability.name in on_device else capability, index)


def parse_device(spec: str, is_installed: bool = True) -> Device:
    """`cpu`, `cuda:1`, `openvino:GPU`, ... -> Device, checking the provider is installed (unless
    `is_installed` is False: a plan for devices elsewhere, which loads nothing)."""
    name, _, index = spec.strip().partition(":")
    cap = CAPABILITIES.get(name.lower())
    if cap is None:
        raise DeviceError(f"unknown device {spec!r}; known: {', '.join(CAPABILITIES)}")
    if is_installed and cap.provider not in installed_providers():
        have = ", ".join(d.label for d in available_devices()) or "none"
        refused = plugin_refusals.get(cap.name)
        hint = f"; {refused}" if refused else (f"; {cap.absent_hint}" if cap.absent_hint else "")
        raise DeviceError(f"{spec}: {cap.provider} is not in this ONNX Runtime build (available: {have}); {EXTRAS}{hint}")
    return device_of(cap, index or cap.default_index)
