"""Session options every WiCore session gets."""

from __future__ import annotations

import pytest

from wicore.devices import providers
from wicore.devices.providers import CAPABILITIES, FPA_INTB_ENV, Device, DeviceError, session_options

FPA_KEY = "ep.cuda.fpa_intb_gemm"
ENV_ALLOCATORS = "session.use_env_allocators"
OWN_INITIALIZERS = "session.use_device_allocator_for_initializers"


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


def test_cuda_sessions_grow_their_arena_by_what_is_asked_and_other_eps_get_their_device_only() -> None:
    cuda = Device(CAPABILITIES["cuda"], "1")
    assert cuda.providers() == [
        ("CUDAExecutionProvider", {"arena_extend_strategy": "kSameAsRequested", "device_id": "1"}),
        "CPUExecutionProvider",
    ]
    assert cuda.providers(cuda_graphs=True)[0][1]["enable_cuda_graph"] == "1"
    webgpu = Device(CAPABILITIES["webgpu"], "0")
    assert webgpu.providers(cuda_graphs=True) == [
        ("WebGpuExecutionProvider", {"enableGraphCapture": "1"}),
        "CPUExecutionProvider",
    ]
    with pytest.raises(DeviceError, match="captures no graphs"):
        Device(CAPABILITIES["openvino"], "GPU").providers(cuda_graphs=True)
    assert Device(CAPABILITIES["openvino"], "GPU").providers() == [
        ("OpenVINOExecutionProvider", {"device_type": "GPU"}),
        "CPUExecutionProvider",
    ]
    assert Device(CAPABILITIES["cpu"], "0").providers() == [("CPUExecutionProvider", {})]


def test_sessions_on_a_cuda_device_share_its_arena_unless_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    registered: list[int] = []
    monkeypatch.setattr(providers, "shared_cuda_arena", lambda index: registered.append(index) or True)
    monkeypatch.delenv(providers.SHARED_ARENA_ENV, raising=False)
    cpu, cuda = Device(CAPABILITIES["cpu"], "0"), Device(CAPABILITIES["cuda"], "1")
    assert session_options(1, devices=[cpu, cuda]).get_session_config_entry(ENV_ALLOCATORS) == "1"  # type: ignore[attr-defined]
    assert registered == [1]
    for devices in ([], [cpu]):
        with pytest.raises(RuntimeError, match=ENV_ALLOCATORS):  # not set: each session keeps its own
            session_options(1, devices=devices).get_session_config_entry(ENV_ALLOCATORS)  # type: ignore[attr-defined]
    monkeypatch.setenv(providers.SHARED_ARENA_ENV, "0")
    with pytest.raises(RuntimeError, match=ENV_ALLOCATORS):
        session_options(1, devices=[cuda]).get_session_config_entry(ENV_ALLOCATORS)  # type: ignore[attr-defined]


def test_an_onnx_runtime_without_cuda_refuses_the_shared_arena_and_sessions_keep_their_own() -> None:
    assert providers.shared_cuda_arena.__wrapped__(0) is False  # this machine's CPU build


def test_cuda_sessions_allocate_each_initializer_on_its_own_and_others_keep_onnx_runtimes_plan() -> None:
    cpu, cuda = Device(CAPABILITIES["cpu"], "0"), Device(CAPABILITIES["cuda"], "0")
    assert session_options(1, devices=[cpu, cuda]).get_session_config_entry(OWN_INITIALIZERS) == "1"  # type: ignore[attr-defined]
    for devices in ([], [cpu]):
        with pytest.raises(RuntimeError, match=OWN_INITIALIZERS):
            session_options(1, devices=devices).get_session_config_entry(OWN_INITIALIZERS)  # type: ignore[attr-defined]


def test_webgpu_is_one_device_whose_buffers_live_on_the_adapter() -> None:
    # The plugin picks its adapter itself: no provider option, and OrtValues in "webgpu" memory.
    webgpu = providers.parse_device("webgpu", is_installed=False)
    assert webgpu.label == "webgpu:0"
    assert webgpu.ort_device == ("webgpu", 0)
    assert webgpu.providers() == [("WebGpuExecutionProvider", {}), "CPUExecutionProvider"]
    webgpu.check_can_run("fp16", "ort-quant")
    webgpu.check_can_run("fp16", "webgpu-quant", "paged")  # the WebGPU EP's own PagedAttention inputs
    with pytest.raises(providers.DeviceError, match="re-export with --op-flavour webgpu or --attention portable"):
        webgpu.check_can_run("fp16", "portable", "paged")
    with pytest.raises(providers.DeviceError, match="re-export with --op-flavour portable or --attention portable"):
        providers.parse_device("cuda:0", is_installed=False).check_can_run("fp16", "webgpu", "paged")


def test_webgpu_without_an_adapter_is_refused_saying_what_it_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(providers, "installed_providers", lambda: ["CPUExecutionProvider"])
    with pytest.raises(providers.DeviceError, match="ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1"):
        providers.parse_device("webgpu")
