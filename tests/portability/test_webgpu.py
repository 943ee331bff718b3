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

import re
from collections import Counter
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
NUM_TOKENS_SMOLLM2 = 12  # its steps take well under a second there
NUM_TOKENS_TINY = 12
ROWS = [TINY_IDS, [5, 9, 100, 7], [33, 44, 55, 66, 77, 88, 99]]  # three lengths: padded prefill rows
# rows reach 34, 28 and 31 tokens: the sliding layers (window 8) release their first block of 16
# while the rows decode (the WebGPU EP's PagedAttention takes blocks of 16 tokens and up, powers of two)
NUM_TOKENS_ROWS = 24
BLOCK_SIZE_ROWS = 16
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


def engine(folder: Path, devices: str, block_size: int | None = None, captured: bool = False) -> Engine:
    """No host tier and no prefix cache: every request computes its prompt on `devices`. `captured`:
    decode steps replayed from graphs ONNX Runtime captured (EngineConfig.cuda_graphs on)."""
    config = EngineConfig(
        model_dir=folder,
        num_threads=2,
        devices=devices,
        host_tier_gb=0,
        enable_prefix_cache=False,
        block_size=block_size,
        cuda_graphs=captured,
    )
    return Engine(config)


def greedy_rows(
    folder: Path,
    devices: str,
    prompts: list[list[int]],
    num_tokens: int,
    block_size: int | None = None,
    captured: bool = False,
) -> list[list[int]]:
    """Each prompt's greedy tokens, all requests generated together (decode steps of several rows)."""
    with engine(folder, devices, block_size, captured) as eng:
        assert eng.config.cuda_graphs is captured
        assert [d.label for d in eng.devices] == [devices]
        results = eng.generate(prompts, SamplingParams(max_tokens=num_tokens, ignore_eos=True))
    assert all(r.error is None and len(r.token_ids) == num_tokens for r in results)
    return [r.token_ids for r in results]


def greedy(folder: Path, devices: str, ids: list[int], num_tokens: int) -> list[int]:
    (tokens,) = greedy_rows(folder, devices, [ids], num_tokens)
    return tokens


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


def test_smollm2_writes_the_cpu_eps_text(smollm2):
    """The chat model `wicore serve` uses by default (a Llama), its portable fp32 export: the same text
    on WebGPU as on the CPU EP (issue 34 names it beside the 270M)."""
    folder = smollm2()
    with engine(folder, "cpu") as cpu:
        ids = cpu.tokenizer.encode(PROMPT)
        (reference,) = cpu.generate([ids], SamplingParams(max_tokens=NUM_TOKENS_SMOLLM2, ignore_eos=True))
        tokens = greedy(folder, "webgpu:0", ids, NUM_TOKENS_SMOLLM2)
        assert cpu.tokenizer.decode(tokens) == cpu.tokenizer.decode(reference.token_ids)
    assert tokens == reference.token_ids


# -- the webgpu op flavours (wicore/graph/fused_ops.py) ----------------------------------------
@pytest.fixture(scope="module")
def tiny_flavour(tiny_model, tmp_path_factory) -> Callable[..., Path]:
    """tiny_flavour(op_flavour, dtype, attention="portable") -> the tiny Gemma 3 exported so; a
    quantized flavour (ort-quant, webgpu-quant) in 4 bits."""
    from wicore.export.exporter import OP_FLAVOURS, ExportConfig, export_model
    from wicore.export.sources import open_source

    made: dict[tuple[str, str, str], Path] = {}

    def export(op_flavour: str, dtype: str, attention: str = "portable") -> Path:
        key = (op_flavour, dtype, attention)
        if key not in made:
            folder, _ = tiny_model()
            made[key] = tmp_path_factory.mktemp(f"{op_flavour}_{attention}") / "model"
            bits = 4 if OP_FLAVOURS[op_flavour].quantized else 8
            config = ExportConfig(dtype=dtype, op_flavour=op_flavour, attention=attention, weight_bits=bits)
            export_model(open_source(str(folder)), made[key], config, progress=lambda _: None)
        return made[key]

    return export


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_the_webgpu_flavour_decodes_the_cpu_eps_tokens(tiny_flavour, tiny_export, dtype):
    portable, _ = tiny_export(dtype=dtype)
    expected = greedy(portable, "cpu", TINY_IDS, NUM_TOKENS_TINY)
    assert greedy(tiny_flavour("webgpu", dtype), "webgpu:0", TINY_IDS, NUM_TOKENS_TINY) == expected
    assert greedy(tiny_flavour("webgpu", dtype), "cpu", TINY_IDS, NUM_TOKENS_TINY) == expected


@pytest.mark.parametrize(
    ("op_flavour", "attention", "peer"),
    [("webgpu", "paged", "portable"), ("webgpu-quant", "portable", "ort-quant"), ("webgpu-quant", "paged", "ort-quant")],
)
def test_paged_and_4_bit_webgpu_flavours_decode_three_rows_as_the_cpu_ep(tiny_flavour, op_flavour, attention, peer):
    """Three requests decoding together (rows of 10, 4 and 7 prompt tokens: padding in the prefill,
    three rows a decode step) past the sliding window of 8 and their first block of 16 (released by
    the sliding layers, listed as the sink):
    the tokens the CPU EP decodes from the portable flavour's export of the same weights (`peer`:
    ort-quant for the 4-bit ones, MatMulNBits on the same 4-bit blocks). The CPU EP has no
    PagedAttention, so a paged export is checked against its peer only; the 4-bit export with the
    portable attention runs on the CPU EP as well."""
    expected = greedy_rows(tiny_flavour(peer, "fp16"), "cpu", ROWS, NUM_TOKENS_ROWS, BLOCK_SIZE_ROWS)
    export = tiny_flavour(op_flavour, "fp16", attention)
    assert greedy_rows(export, "webgpu:0", ROWS, NUM_TOKENS_ROWS, BLOCK_SIZE_ROWS) == expected
    if attention == "portable":
        assert greedy_rows(export, "cpu", ROWS, NUM_TOKENS_ROWS, BLOCK_SIZE_ROWS) == expected


def placement(model: Path, tmp_path: Path) -> tuple[set[str], list[str]]:
    """ONNX Runtime's placement of `model` on WebGPU: the nodes it left to the CPU, and what its
    optimized graph copies to the adapter each run."""
    import onnx

    from wicore.devices.providers import session_options

    device = parse_device("webgpu")
    options = session_options(1, devices=[device])
    options.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = onnxruntime().InferenceSession(str(model), sess_options=options, providers=device.providers())
    on_cpu = {
        n.name
        for sub in session.get_provider_graph_assignment_info()
        if sub.ep_name != device.capability.provider
        for n in sub.get_nodes()
    }
    optimized = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False)
    return on_cpu, [n.input[0] for n in optimized.graph.node if n.op_type.startswith("Memcpy")]


def index_packing(prefix: str, fed: tuple[str, ...]) -> set[str]:
    """fused_ops.IndexMath.indices' nodes on the CPU: each fed int64 input flattened and sized, then
    all packed into one vector and cast to int32 (the one copy)."""
    each = {f"{prefix}/index/{name}/{step}" for name in fed for step in ("flat", "shape", "size")}
    return each | {f"{prefix}/index/{n}" for n in ("sizes", "packed", "packed/Cast_int32")}


# The portable attention's CPU nodes: the shapes of the masks and the KV scatter, and the packing
# (not the attention statistics' block shape: these exports have none, and unread nodes are dropped).
SHARED_ON_CPU = {
    *(f"/model/shared/{n}" for n in ("block_size", "num_tokens", "num_tokens/Cast_int32")),
    "/model/shared/positions_shape",
    *(f"/model/shared/{kind}/{n}" for kind in ("global", "sliding") for n in ("mask_shape", "mask_total", "num_blocks")),
    *(f"/model/shared/{kind}/{n}" for kind in ("global", "sliding") for n in ("total", "total/Cast_int32")),
    *index_packing("/model/shared", ("lens", "slots", "tables", "window_first", "window_slots", "window_tables")),
    "/model/shared/index/block_size/flat",
    "/model/shared/index/positions/flat",
    "/model/shared/index/positions/size",
}
# The paged graphs' CPU nodes: the int64 tables' Casts to the op's int32, which the EP takes only under
# graph capture (paged_attention.paged_values); cumulative_seqlens and past_seqlens are fed as int32.
PAGED_ON_CPU = {"/model/paged/global/tables", "/model/paged/sliding/tables"}


@pytest.mark.parametrize(
    ("op_flavour", "dtype", "attention"),
    [
        ("webgpu", "fp32", "portable"),
        ("webgpu-quant", "fp16", "portable"),
        ("webgpu", "fp16", "paged"),
        ("webgpu-quant", "fp16", "paged"),
    ],
)
def test_the_webgpu_flavours_leave_the_cpu_int64_shape_math_and_one_copy(tiny_flavour, tmp_path, op_flavour, dtype, attention):
    """Every node left to the CPU computes on int64 shapes or the fed int64 paging inputs (the EP takes no
    int64 op without graph capture), named here one by one, and what crosses to the adapter a run: the
    portable attention's packed int32 index values in one copy (the portable graphs copy 10), the paged
    graphs' two int32 tables. Norms, RoPE, MatMulNBits and PagedAttention all stay on WebGPU."""
    import onnx

    from wicore.devices.graph_nodes import graph_nodes

    model = tiny_flavour(op_flavour, dtype, attention) / "part-00.onnx"
    on_cpu, copies = placement(model, tmp_path)
    types = {n.name: n.dtype for n in graph_nodes(onnx.load(str(model), load_external_data=False))}
    assert {types[name] for name in on_cpu} == {"int64"}
    assert on_cpu == (PAGED_ON_CPU if attention == "paged" else SHARED_ON_CPU)
    if attention == "paged":
        assert sorted(copies) == [f"{name}/output_0" for name in sorted(PAGED_ON_CPU)]
    else:
        assert copies == ["/model/shared/index/packed/Cast_int32/output_0"]


def test_gemma_270m_in_the_webgpu_flavour_writes_the_cpu_eps_text(export_cached, gemma_270m):
    folder = export_cached("gemma3-270m-webgpu", "gemma3-270m", op_flavour="webgpu")
    with engine(gemma_270m(1), "cpu") as cpu:
        ids = cpu.tokenizer.encode(PROMPT)
        (reference,) = cpu.generate([ids], SamplingParams(max_tokens=NUM_TOKENS_270M, ignore_eos=True))
        tokens = greedy(folder, "webgpu:0", ids, NUM_TOKENS_270M)
        assert cpu.tokenizer.decode(tokens) == cpu.tokenizer.decode(reference.token_ids)
    assert tokens == reference.token_ids


# -- graph capture (Capability.graph_capture: the WebGPU EP's enableGraphCapture) ------------------
REPLAY = "Replaying the captured WebGpuExecutionProvider graph"


@pytest.fixture
def capture_log(capfd, monkeypatch) -> Callable[[], str]:
    """capture_log() -> ONNX Runtime's log (INFO: captures and replays) of the sessions made since the last call."""
    import wicore.executor.graphs as graphs_module

    options = graphs_module.session_options

    def logging_options(*args, **kwargs):
        opts = options(*args, **kwargs)
        opts.log_severity_level = 1
        return opts

    monkeypatch.setattr(graphs_module, "session_options", logging_options)
    return lambda: capfd.readouterr().err


def replays(log: str) -> dict[int, int]:
    """How many replays of each graph id (a batch-size bucket: 0 for 1 row, 1 for 2, 2 for 4) the log shows."""
    ids = re.findall(rf"{REPLAY} for this model with tag:  with graph annotation id: (\d+)", log)
    return dict(Counter(int(i) for i in ids))


@pytest.mark.parametrize("op_flavour", ["webgpu", "webgpu-quant"])
def test_paged_webgpu_graphs_are_captured_and_replay_the_uncaptured_tokens(tiny_flavour, capture_log, op_flavour):
    """The paged webgpu graphs have every node on the EP under capture (no copy node), so ONNX Runtime
    takes `enableGraphCapture`: three rows decode in the 4-row bucket, its graph captured on the first
    decode step and replayed on each later one (ONNX Runtime's log says so, once a step), and every row
    gets the tokens the same export decodes uncaptured."""
    export = tiny_flavour(op_flavour, "fp16", "paged")
    expected = greedy_rows(export, "webgpu:0", ROWS, NUM_TOKENS_ROWS, BLOCK_SIZE_ROWS)
    capture_log()
    assert greedy_rows(export, "webgpu:0", ROWS, NUM_TOKENS_ROWS, BLOCK_SIZE_ROWS, captured=True) == expected
    log = capture_log()
    assert log.count("This session will use the graph capture feature as requested by the user with WebGpuExecutionProvider") == 1
    # one prefill step gives the first token, the first decode step captures, the other 22 replay
    assert replays(log) == {2: NUM_TOKENS_ROWS - 2} and log.count(REPLAY) == NUM_TOKENS_ROWS - 2


def test_rows_that_end_apart_replay_a_graph_a_bucket(tiny_flavour, capture_log):
    """Rows of 24, 12 and 6 tokens: 5 steps of 3 rows (the 4-row bucket), 6 of 2, 12 of 1, each bucket's
    graph captured on its first step and replayed on the others, the tokens the uncaptured run's."""
    export = tiny_flavour("webgpu", "fp16", "paged")
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (24, 12, 6)]
    tokens = {}
    for captured in (False, True):
        capture_log()
        with engine(export, "webgpu:0", BLOCK_SIZE_ROWS, captured) as eng:
            tokens[captured] = [r.token_ids for r in eng.generate(ROWS, params)]
    assert [len(t) for t in tokens[True]] == [24, 12, 6] and tokens[True] == tokens[False]
    assert replays(capture_log()) == {2: 4, 1: 5, 0: 11}


def test_the_portable_attention_is_refused_graph_capture(tiny_flavour):
    """Its int64 index arithmetic leaves nodes and copies to the CPU (the test above it): capture needs the paged graphs."""
    from wicore.devices.providers import DeviceError

    with pytest.raises(DeviceError, match="--attention paged"):
        engine(tiny_flavour("webgpu", "fp16"), "webgpu:0", BLOCK_SIZE_ROWS, captured=True)


def test_captured_steps_sample_the_uncaptured_tokens(tiny_flavour):
    """Sampled rows (seeded, temperature 0.9) in captured steps: the export's sampling head runs uncaptured
    on the bucket's logits, which the replay wrote on the adapter, and draws what it draws uncaptured."""
    export = tiny_flavour("webgpu", "fp16", "paged")
    params = [SamplingParams(max_tokens=NUM_TOKENS_ROWS, ignore_eos=True, temperature=0.9, seed=seed) for seed in (1, 2, 3)]
    sampled = {}
    for captured in (False, True):
        with engine(export, "webgpu:0", BLOCK_SIZE_ROWS, captured) as eng:
            assert eng.config.cuda_graphs is captured and eng.core.runner.graphs.head is not None
            assert eng.config.async_scheduling is False  # measured only on CUDA (async_by_default)
            results = eng.generate(ROWS, params)
        assert all(r.error is None and len(r.token_ids) == NUM_TOKENS_ROWS for r in results)
        sampled[captured] = [r.token_ids for r in results]
    assert sampled[True] == sampled[False]
