"""The same exported models on the WebGPU plugin EP and on the CPU EP: equal greedy text.

Without a GPU, WebGPU runs on Mesa's lavapipe (Vulkan on the CPU, Mesa >= 25: Debian 12's Mesa 22
is refused by Dawn) once ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1 in the environment lets the plugin
take a CPU adapter; .ci/run installs both and sets it:

    ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1 python -m pytest -ra -m webgpu tests/portability

The variable is read once a process, when the plugin registers, and then makes WebGPU a device
that `--devices auto` picks, so these tests leave it to the caller rather than set it for every
test that shares their process. Where the plugin, an adapter or a working session is missing,
every test here is skipped and says which.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from wicore.devices.providers import installed_providers, onnxruntime, parse_device
from wicore.engine.engine import Engine, EngineConfig
from wicore.types.sampling import SamplingParams

pytestmark = [pytest.mark.webgpu, pytest.mark.slow]

PROMPT = "The history of the printing press begins in the fifteenth century, when"
TINY_IDS = [2, 17, 301, 44, 9, 250, 3, 77, 128, 5]
NUM_TOKENS_270M = 3  # lavapipe: ~30 s a 270M step on the shared 2-core VM (docs/HARDWARE.md)
NUM_TOKENS_TINY = 12
MESA = (
    "without a GPU, install mesa-vulkan-drivers and libvulkan1 from bookworm-backports (Mesa >= 25: lavapipe) "
    "and set ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1"
)


def add_graph() -> object:
    """a + b on float vectors: one node the EP takes."""
    vector = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("a", "b", "total")]
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["total"])], "add", vector[:2], vector[2:])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def why_no_webgpu() -> str | None:
    """Why WebGPU cannot run here, or None: the plugin, an adapter, and a session on it."""
    try:
        import onnxruntime_ep_webgpu  # noqa: F401
    except ImportError:
        return "onnxruntime-ep-webgpu is not installed (pip install '.[webgpu]')"
    if "WebGpuExecutionProvider" not in installed_providers():
        return f"the WebGPU plugin found no adapter: {MESA}"
    device = parse_device("webgpu")
    try:
        ort = onnxruntime()
        session = ort.InferenceSession(add_graph().SerializeToString(), providers=device.providers())
        (total,) = session.run(None, {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)})
        assert (total == 2).all(), total
    except Exception as exc:  # Mesa 22's llvmpipe: Dawn refuses the adapter here
        return f"a WebGPU session failed ({str(exc).splitlines()[0]}): {MESA}"
    return None


@pytest.fixture(scope="module", autouse=True)
def webgpu() -> Iterator[None]:
    reason = why_no_webgpu()
    if reason is not None:
        pytest.skip(f"WEBGPU NOT TESTED: {reason}")
    yield


def engine(folder: Path, devices: str) -> Engine:
    """No host tier and no prefix cache: every request computes its prompt on `devices`."""
    config = EngineConfig(model_dir=folder, num_threads=2, devices=devices, host_tier_gb=0, enable_prefix_cache=False)
    return Engine(config)


def greedy(folder: Path, devices: str, ids: list[int], num_tokens: int) -> list[int]:
    with engine(folder, devices) as eng:
        assert [d.label for d in eng.devices] == [devices]
        (result,) = eng.generate([ids], SamplingParams(max_tokens=num_tokens, ignore_eos=True))
    assert result.error is None and len(result.token_ids) == num_tokens
    return result.token_ids


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_a_tiny_model_decodes_the_cpu_eps_tokens(tiny_export, dtype):
    folder, _ = tiny_export(dtype=dtype)
    assert greedy(folder, "webgpu:0", TINY_IDS, NUM_TOKENS_TINY) == greedy(folder, "cpu", TINY_IDS, NUM_TOKENS_TINY)


def test_gemma_270m_writes_the_cpu_eps_text(gemma_270m):
    folder = gemma_270m(1)
    with engine(folder, "cpu") as cpu:
        ids = cpu.tokenizer.encode(PROMPT)
        (reference,) = cpu.generate([ids], SamplingParams(max_tokens=NUM_TOKENS_270M, ignore_eos=True))
        tokens = greedy(folder, "webgpu:0", ids, NUM_TOKENS_270M)
        assert cpu.tokenizer.decode(tokens) == cpu.tokenizer.decode(reference.token_ids)
    assert tokens == reference.token_ids


# -- the webgpu op flavour (wicore/graph/fused_ops.py) -----------------------------------------
@pytest.fixture(scope="module")
def tiny_webgpu_flavour(tiny_model, tmp_path_factory) -> Callable[[str], Path]:
    """tiny_webgpu_flavour(dtype) -> the tiny Gemma 3 exported in the webgpu flavour."""
    from wicore.export.exporter import ExportConfig, export_model
    from wicore.export.sources import open_source

    made: dict[str, Path] = {}

    def export(dtype: str) -> Path:
        if dtype not in made:
            folder, _ = tiny_model()
            made[dtype] = tmp_path_factory.mktemp("webgpu_flavour") / "model"
            config = ExportConfig(dtype=dtype, op_flavour="webgpu")
            export_model(open_source(str(folder)), made[dtype], config, progress=lambda _: None)
        return made[dtype]

    return export


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_the_webgpu_flavour_decodes_the_cpu_eps_tokens(tiny_webgpu_flavour, tiny_export, dtype):
    portable, _ = tiny_export(dtype=dtype)
    expected = greedy(portable, "cpu", TINY_IDS, NUM_TOKENS_TINY)
    assert greedy(tiny_webgpu_flavour(dtype), "webgpu:0", TINY_IDS, NUM_TOKENS_TINY) == expected
    assert greedy(tiny_webgpu_flavour(dtype), "cpu", TINY_IDS, NUM_TOKENS_TINY) == expected


def test_the_webgpu_flavour_leaves_the_cpu_only_int64_shape_math_and_one_copy(tiny_webgpu_flavour, tmp_path):
    """ONNX Runtime's placement and its optimized graph: every node left to the CPU computes on int64
    shapes or the fed int64 paging inputs (the EP takes no int64 op), and one copy a run crosses to the
    adapter (the packed int32 index values; the portable graphs copy 10)."""
    import onnx

    from wicore.devices.graph_nodes import graph_nodes
    from wicore.devices.providers import session_options

    device = parse_device("webgpu")
    options = session_options(1, devices=[device])
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    model = tiny_webgpu_flavour("fp32") / "part-00.onnx"
    session = onnxruntime().InferenceSession(str(model), sess_options=options, providers=device.providers())
    on_cpu = {
        n.name
        for sub in session.get_provider_graph_assignment_info()
        if sub.ep_name != device.capability.provider
        for n in sub.get_nodes()
    }
    types = {n.name: n.dtype for n in graph_nodes(onnx.load(str(model), load_external_data=False))}
    assert on_cpu and all(name.startswith("/model/shared/") and types[name] == "int64" for name in on_cpu), on_cpu
    optimized = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False)
    copies = [n.input[0] for n in optimized.graph.node if n.op_type.startswith("Memcpy")]
    assert copies == ["/model/shared/index/packed/Cast_int32/output_0"]


def test_gemma_270m_in_the_webgpu_flavour_writes_the_cpu_eps_text(export_cached, gemma_270m):
    folder = export_cached("gemma3-270m-webgpu", "gemma3-270m", op_flavour="webgpu")
    with engine(gemma_270m(1), "cpu") as cpu:
        ids = cpu.tokenizer.encode(PROMPT)
        (reference,) = cpu.generate([ids], SamplingParams(max_tokens=NUM_TOKENS_270M, ignore_eos=True))
        tokens = greedy(folder, "webgpu:0", ids, NUM_TOKENS_270M)
        assert cpu.tokenizer.decode(tokens) == cpu.tokenizer.decode(reference.token_ids)
    assert tokens == reference.token_ids
