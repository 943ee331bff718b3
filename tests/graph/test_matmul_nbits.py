"""The ort-quant flavour: MatMulNBits nodes against NumPy, and a tiny model against its fp32 export."""

from __future__ import annotations

import ctypes

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from wicore.devices.providers import CAPABILITIES, Device, DeviceError, onnxruntime
from wicore.engine.engine import Engine, EngineConfig
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.sources import open_source
from wicore.graph.manifest import Manifest
from wicore.graph.ops import DataFile, Graph
from wicore.graph.quant import FLOAT, HEAD_CANDIDATES, INT8, QuantLinear, matmul_nbits, pack_codes, split_nibbles
from wicore.model.quant import BlockQuant, QuantizedTensor, quantize_symmetric
from wicore.types.sampling import SamplingParams

PROMPT = np.random.default_rng(0).integers(0, 512, 40).tolist()


def with_offsets(w: BlockQuant, seed: int = 0) -> BlockQuant:
    offsets = np.random.default_rng(seed).uniform(-0.1, 0.1, w.scales.shape).astype(np.float32)
    return BlockQuant(w.codes, w.scales, offsets, w.bits, w.block_size)


def run_matmul(tmp_path, w: BlockQuant, x: np.ndarray, accuracy_level: int) -> np.ndarray:
    ort = onnxruntime()
    data = DataFile(tmp_path / "w.data")
    g = Graph("mm", data)
    g.input("x", TensorProto.FLOAT, ["b", "s", w.shape[1]])
    matmul_nbits(g, "x", w, "/mm", np.float32, accuracy_level, out="y")
    g.output("y", TensorProto.FLOAT, ["b", "s", w.shape[0]])
    data.close()
    onnx.save_model(g.to_model(17), tmp_path / "mm.onnx")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(tmp_path / "mm.onnx"), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("bits,block_size", [(4, 32), (8, 32), (8, 16), (4, 16)])
@pytest.mark.parametrize("offsets", [False, True], ids=["symmetric", "offsets"])
def test_matmul_nbits_computes_x_times_the_dequantized_weight(tmp_path, bits, block_size, offsets):
    rng = np.random.default_rng(bits + block_size)
    w = quantize_symmetric(rng.standard_normal((48, 96)).astype(np.float32), bits, block_size)
    w = with_offsets(w) if offsets else w
    x = rng.standard_normal((2, 3, 96)).astype(np.float32)
    reference = x @ w.dequantize().T
    exact = run_matmul(tmp_path, w, x, accuracy_level=0)  # float activations
    np.testing.assert_allclose(exact, reference, rtol=1e-5, atol=1e-4)
    fast = run_matmul(tmp_path, w, x, accuracy_level=4)  # int8 activations, as on CPU in the graphs
    assert np.abs(fast - reference).max() < 2e-2 * np.abs(reference).max()


def run_head(tmp_path, w: BlockQuant, x: np.ndarray, quant: QuantLinear) -> np.ndarray:
    ort = onnxruntime()
    data = DataFile(tmp_path / "head.data")
    g = Graph("head", data)
    g.input("x", TensorProto.FLOAT, ["n", w.shape[1]])
    table = QuantizedTensor(w.dequantize(), lambda: w)
    quant.head(g, "x", table, "/lm_head", np.float32, out="logits")
    g.output("logits", TensorProto.FLOAT, ["n", w.shape[0]])
    data.close()
    onnx.save_model(g.to_model(17), tmp_path / "head.onnx")
    sess = ort.InferenceSession(str(tmp_path / "head.onnx"), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("offsets", [False, True], ids=["symmetric", "offsets"])
def test_an_8_bit_head_on_int8_activations_gives_its_top_candidates_float_logits(tmp_path, offsets):
    """The head's int8 logits move the near-ties; its top HEAD_CANDIDATES come back as float x times
    the weight's own rows, so the argmax is the float one and the other logits stay the int8 ones."""
    rng = np.random.default_rng(1)
    w = quantize_symmetric(rng.standard_normal((1000, 64)).astype(np.float32), 8, 32)
    w = with_offsets(w) if offsets else w
    x = rng.standard_normal((64, 64)).astype(np.float32)
    x[:, 5] = 40.0  # an outlier channel, as in SmolLM2's hidden states: its block's other values lose precision
    reference = x @ w.dequantize().T
    fast = run_head(tmp_path, w, x, QuantLinear(accuracy_level=INT8))
    int8 = run_matmul(tmp_path, w, x[None], accuracy_level=INT8)[0]  # the head before its refinement
    top = np.argsort(-int8, axis=-1)[:, :HEAD_CANDIDATES]
    assert (int8.argmax(-1) != reference.argmax(-1)).any()  # the outlier flips an argmax on int8 activations
    np.testing.assert_allclose(np.take_along_axis(fast, top, -1), np.take_along_axis(reference, top, -1), rtol=1e-5, atol=1e-4)
    assert (fast.argmax(-1) == reference.argmax(-1)).all()
    rest = np.ones_like(fast, dtype=bool)
    np.put_along_axis(rest, top, False, -1)
    np.testing.assert_array_equal(fast[rest], int8[rest])


@pytest.mark.parametrize("offsets", [False, True], ids=["symmetric", "offsets"])
def test_an_8_bit_head_on_matmul_q_with_the_residual_needs_no_refinement(tmp_path, cpu_library, offsets):
    """wicore.MatMulQ's default (int8 activations plus their rounding error rounded again) is one node with
    the float argmax on the outlier rows that flip int8's (the test above); on int8 alone the refinement stays."""
    rng = np.random.default_rng(1)
    w = quantize_symmetric(rng.standard_normal((1000, 64)).astype(np.float32), 8, 32)
    w = with_offsets(w) if offsets else w
    x = rng.standard_normal((64, 64)).astype(np.float32)
    x[:, 5] = 40.0
    reference = x @ w.dequantize().T
    ops = {}
    for level in (None, INT8):
        built = DataFile(tmp_path / f"{level}.data")
        g = Graph("head", built)
        QuantLinear(kernels="wicore", accuracy_level=level).head(
            g, "x", QuantizedTensor(w.dequantize(), lambda: w), "/h", np.float32
        )
        built.close()
        ops[level] = [n.op_type for n in g.nodes]
    assert ops[None] == ["MatMulQ"] and ops[INT8][:2] == ["MatMulQ", "TopK"]
    ort = onnxruntime()
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(cpu_library)
    data = DataFile(tmp_path / "w.data")
    g = Graph("head", data)
    g.input("x", TensorProto.FLOAT, ["n", w.shape[1]])
    QuantLinear(kernels="wicore").head(g, "x", QuantizedTensor(w.dequantize(), lambda: w), "/lm_head", np.float32, out="logits")
    g.output("logits", TensorProto.FLOAT, ["n", w.shape[0]])
    data.close()
    onnx.save_model(g.to_model(17), tmp_path / "head.onnx")
    logits = ort.InferenceSession(str(tmp_path / "head.onnx"), opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert (logits.argmax(-1) == reference.argmax(-1)).all()
    # 64 rows are a prompt: the float GEMM on an AVX-512 or AVX2 CPU; elsewhere the int8 tiles with the residual,
    # whose outlier block (x[:, 5] = 40) leaves ~d / 256 a column (~5e-3 here, found 2026-11-29 on an AVX2 AMD EPYC)
    if ctypes.CDLL(cpu_library).WicoreFloatPrompts():
        np.testing.assert_allclose(logits, reference, rtol=1e-4, atol=2e-3)


def test_a_head_keeps_float_prompts_where_a_layer_takes_int8(tmp_path, cpu_library):
    """MatMulQ's prompt_precision per tensor (graph/quant.py's table): the same 8-bit weight and 64 rows with an
    outlier column as an int8-prompt layer (llama.cpp's activations, no residual) move an argmax, as the head
    (float, whatever the layers take) does not; that is why the head keeps the float GEMM."""
    from tests.kernels.test_matmul_q import has_vnni

    rng = np.random.default_rng(1)
    w = quantize_symmetric(rng.standard_normal((1000, 64)).astype(np.float32), 8, 32)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    x[:, 5] = 40.0
    reference = x @ w.dequantize().T
    ort = onnxruntime()
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(cpu_library)
    logits, precisions = {}, {}
    for role in ("layer", "head"):
        data = DataFile(tmp_path / f"{role}.data")
        g = Graph(role, data)
        g.input("x", TensorProto.FLOAT, ["n", w.shape[1]])
        quant = QuantLinear(kernels="wicore", layer_prompt="int8")  # a Gemma 3's (its family's int8_prompts)
        table = QuantizedTensor(w.dequantize(), lambda: w)
        if role == "head":
            quant.head(g, "x", table, "/lm_head", np.float32, out="y")
        else:
            quant.linear(g, "x", [table], "/layer", np.float32, out="y")
        g.output("y", TensorProto.FLOAT, ["n", w.shape[0]])
        data.close()
        precisions[role] = [a.s.decode() for n in g.nodes for a in n.attribute if a.name == "prompt_precision"]
        onnx.save_model(g.to_model(17), tmp_path / f"{role}.onnx")
        sess = ort.InferenceSession(str(tmp_path / f"{role}.onnx"), opts, providers=["CPUExecutionProvider"])
        logits[role] = sess.run(None, {"x": x})[0]
    assert precisions == {"layer": ["int8"], "head": ["float"]}
    assert (logits["head"].argmax(-1) == reference.argmax(-1)).all()
    if has_vnni(cpu_library):  # on AVX2, 32+ rows take the float GEMM whatever the attribute says (portable: int8)
        assert (logits["layer"].argmax(-1) != reference.argmax(-1)).any()


def test_a_head_in_the_cache_keeps_8_bit_codes_where_6_would_do(tmp_path, monkeypatch):
    """A Q6_K head (codes in [-32, 32), blocks of 16) on MatMulQ: 8-bit codes up to WIDE_HEAD_CODES codes (the
    kernel's work bounds a cache-resident head) with float16 scales where exact (fewer bytes, read in place),
    the GGUF's 6 bits past it; a layer keeps 6 bits either way."""
    from wicore.graph import quant as quant_module

    rng = np.random.default_rng(2)
    scales = rng.uniform(1e-3, 2e-2, (64, 4)).astype(np.float16).astype(np.float32)  # float16 values: exact
    w = BlockQuant(rng.integers(-32, 32, (64, 64)).astype(np.int8), scales, None, 8, 16)
    table = QuantizedTensor(w.dequantize(), lambda: w)

    def node(build) -> tuple[int, list[str]]:
        data = DataFile(tmp_path / "w.data")
        g = Graph("t", data)
        build(g)
        data.close()
        n = next(n for n in g.nodes if n.op_type == "MatMulQ")
        return next(a.i for a in n.attribute if a.name == "bits"), list(n.input)

    quant = QuantLinear(kernels="wicore")
    bits, names = node(lambda g: quant.head(g, "x", table, "/h", np.float32))
    assert bits == 8 and names == ["x", "/h.qweight", "", "", "/h.scales_f16"]
    assert node(lambda g: quant.linear(g, "x", [table], "/l", np.float32))[0] == 6
    monkeypatch.setattr(quant_module, "WIDE_HEAD_CODES", w.codes.size - 1)
    assert node(lambda g: quant.head(g, "x", table, "/h", np.float32))[0] == 6


def test_layers_get_float_activations_and_8_bit_heads_int8_unless_configured():
    w4, w8 = (quantize_symmetric(np.ones((4, 32), np.float32), bits) for bits in (4, 8))
    assert (QuantLinear().level(w4), QuantLinear().level(w8)) == (FLOAT, FLOAT)
    assert QuantLinear(accuracy_level=INT8).level(w4) == INT8 and QuantLinear(accuracy_level=FLOAT).level(w8) == FLOAT
    with pytest.raises(ValueError, match="accuracy_level 2"):
        QuantLinear(accuracy_level=2)


@pytest.mark.parametrize("offsets", [False, True], ids=["symmetric", "offsets"])
def test_split_nibbles_is_the_8_bit_weight_exactly(offsets):
    rng = np.random.default_rng(3)
    w = quantize_symmetric(rng.standard_normal((8, 64)).astype(np.float32), 8, 16)
    w = with_offsets(w) if offsets else w
    high, low = split_nibbles(w)
    assert (high.bits, low.bits) == (4, 4) and high.codes.min() >= -8 and low.codes.max() <= 7
    np.testing.assert_allclose(high.dequantize() + low.dequantize(), w.dequantize(), rtol=1e-6, atol=1e-6)


def quantized_copy(model, bits: int):
    """The HF model with every matrix replaced by its symmetric block quantization (embedding included)."""
    import copy

    import torch

    model = copy.deepcopy(model)
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim == 2:
                param.copy_(torch.from_numpy(quantize_symmetric(param.numpy(), bits, 32).dequantize()))
    return model


@pytest.fixture(scope="module")
def tiny_exports(tiny_model, tmp_path_factory):
    """name -> exported folder: the tiny random model, and copies of it already quantized to 8 and 4 bits."""
    folder, model = tiny_model()
    sources = {"float": folder}
    for bits in (8, 4):
        sources[f"q{bits}"] = tmp_path_factory.mktemp(f"tiny_hf_q{bits}")
        quantized_copy(model, bits).save_pretrained(sources[f"q{bits}"])
    plan = {
        "fp32": ("float", ExportConfig()),
        "quant": ("float", ExportConfig(op_flavour="ort-quant")),
        "fp32-q8": ("q8", ExportConfig()),
        "quant-q8": ("q8", ExportConfig(op_flavour="ort-quant", accuracy_level=0)),
        "fp32-q4": ("q4", ExportConfig()),
        "quant-q4": ("q4", ExportConfig(op_flavour="ort-quant", weight_bits=4, accuracy_level=0)),
        "quant-q8-emb": ("q8", ExportConfig(op_flavour="ort-quant", accuracy_level=0, quantize_embedding=True)),
        "quant-q4-emb": ("q4", ExportConfig(op_flavour="ort-quant", weight_bits=4, accuracy_level=0, quantize_embedding=True)),
    }
    out = {}
    for name, (source, config) in plan.items():
        out[name] = tmp_path_factory.mktemp(f"tiny_{name}") / "model"
        export_model(open_source(str(sources[source])), out[name], config, progress=lambda _: None)
    return out


def engine(folder) -> Engine:
    """An engine on a tiny export: 64 device blocks of 4 tokens, no lower tiers."""
    config = EngineConfig(
        model_dir=folder, num_threads=1, block_size=4, num_device_blocks=64, num_host_blocks=0, num_nvme_blocks=0
    )
    return Engine(config)


def prompt_logits(eng: Engine, prompt: list[int]) -> np.ndarray:
    (completion,) = eng.generate([prompt], SamplingParams(max_tokens=1, prompt_logits=True))
    assert completion.error is None, completion.error
    return completion.prompt_logits


def greedy(eng: Engine, prompt: list[int], n: int) -> list[int]:
    (completion,) = eng.generate([prompt], SamplingParams(max_tokens=n, ignore_eos=True))
    assert completion.error is None and len(completion.token_ids) == n
    return completion.token_ids


def logits(folder, prompt=PROMPT) -> np.ndarray:
    with engine(folder) as eng:
        return prompt_logits(eng, prompt)


def test_manifest_records_the_flavour_and_graphs_use_matmul_nbits(tiny_exports):
    manifest = Manifest.read(tiny_exports["quant"])
    assert manifest.op_flavour == "ort-quant"
    graph = onnx.load(tiny_exports["quant"] / manifest.partitions[0].file, load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    # qkv, o, gate|up, down per layer, each 8-bit weight as two 4-bit halves on float activations; LM head
    assert ops.count("MatMulNBits") == 4 * 4 * 2 + 1
    # attention's two per layer, the low halves' offsets (two each), the 8-bit head's top candidates in float
    assert "Gemm" not in ops and ops.count("MatMul") == 2 * 4 + 2 * 4 * 4 + 1 and ops.count("ScatterElements") == 1
    # the flavour's fused kernels: RoPE of q and k, GELU; the portable graph keeps standard ops
    assert ops.count("RotaryEmbedding") == 2 * 4 and ops.count("FastGelu") == 4 and "Tanh" not in ops
    portable = onnx.load(tiny_exports["fp32"] / manifest.partitions[0].file, load_external_data=False).graph
    assert {n.domain for n in portable.node} == {""}


@pytest.mark.parametrize("embedding", ["", "-emb"], ids=["float-rows", "quantized-rows"])
@pytest.mark.parametrize("bits", [8, 4])
def test_ort_quant_computes_what_fp32_computes_on_the_same_quantized_weights(tiny_exports, bits, embedding):
    """Weights that are already on the 8/4-bit grid: the MatMulNBits graphs (float activations)
    equal the fp32 graphs up to float rounding, so packing, fusing and the LM head are right; with
    --quantize-embedding the rows gathered from the head's codes are the table's too."""
    ref, ours = logits(tiny_exports[f"fp32-q{bits}"]), logits(tiny_exports[f"quant-q{bits}{embedding}"])
    assert np.abs(ours - ref).max() < 1e-4 * np.abs(ref).max()
    assert (ours.argmax(-1) == ref.argmax(-1)).all()


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_embedding_rows_read_the_tied_heads_codes(tiny_exports, bits):
    """--quantize-embedding: the first partition gathers its rows from the LM head's MatMulNBits
    codes (one initializer, no float table) with GatherBlockQuantized in the head's bits."""
    folder = tiny_exports[f"quant-q{bits}-emb"]
    manifest = Manifest.read(folder)
    graph = onnx.load(folder / manifest.partitions[0].file, load_external_data=False).graph
    (gather,) = [n for n in graph.node if n.op_type == "GatherBlockQuantized"]
    head = [n for n in graph.node if n.op_type == "MatMulNBits" and n.input[1].startswith("model.embed_tokens.")]
    # float activations (accuracy_level 0): an 8-bit head is two 4-bit halves (split_nibbles)
    assert gather.input[0] == "model.embed_tokens.qweight" and len(head) == (1 if bits == 4 else 2)
    assert {a.name: a.i for a in gather.attribute if a.name in ("bits", "block_size")} == {"bits": bits, "block_size": 32}
    assert "model.embed_tokens.weight" not in {t.name for t in graph.initializer}
    float_rows = onnx.load(tiny_exports[f"quant-q{bits}"] / manifest.partitions[0].file, load_external_data=False).graph
    assert "GatherBlockQuantized" not in {n.op_type for n in float_rows.node}  # without the flag: float rows


def test_tiny_ort_quant_tracks_fp32(tiny_exports):
    """8-bit weights (float activations in the layers, an int8 head refined) against fp32 on a random model (its norms are
    drawn N(0, 0.5)). Measured: max |diff| 4.4% of the largest logit, 95% of argmaxes agree,
    the same 16 greedy tokens."""
    with engine(tiny_exports["fp32"]) as fp32, engine(tiny_exports["quant"]) as quant:
        ref, ours = prompt_logits(fp32, PROMPT), prompt_logits(quant, PROMPT)
        assert np.abs(ours - ref).max() < 0.08 * np.abs(ref).max()
        assert (ours.argmax(-1) == ref.argmax(-1)).mean() >= 0.9
        assert greedy(quant, PROMPT[:9], 16) == greedy(fp32, PROMPT[:9], 16)


def test_export_refuses_unknown_flavours_and_bits():
    from wicore.errors import WiCoreError

    with pytest.raises(WiCoreError, match="ort-quant"):
        ExportConfig(op_flavour="int3")
    with pytest.raises(WiCoreError, match="--weight-bits 3"):
        ExportConfig(op_flavour="ort-quant", weight_bits=3)


def test_providers_without_matmul_nbits_refuse_ort_quant():
    assert "ort-quant" in CAPABILITIES["cpu"].op_flavours and "ort-quant" in CAPABILITIES["cuda"].op_flavours
    device = Device(CAPABILITIES["openvino"], "CPU")
    with pytest.raises(DeviceError, match="--op-flavour portable"):
        device.check_can_run("fp32", "ort-quant")


def test_codes_pack_as_matmul_nbits_reads_them() -> None:
    """code + 2**(bits-1), two 4-bit codes a byte with the first in the low nibble, a block a row."""
    four = BlockQuant(np.array([[-8, 7, 0, -1], [1, -2, 3, -4]], np.int8), np.ones((2, 1), np.float32), None, 4, 4)
    assert pack_codes(four).tolist() == [[[0xF0, 0x78]], [[0x69, 0x4B]]]
    eight = BlockQuant(np.array([[-128, 127, 0, -1]], np.int8), np.ones((1, 2), np.float32), None, 8, 2)
    assert pack_codes(eight).tolist() == [[[0x00, 0xFF], [0x80, 0x7F]]]
    wide = BlockQuant(np.array([[-8, 7, 0, -1]], np.int32), np.ones((1, 1), np.float32), None, 4, 4)
    assert pack_codes(wide).tolist() == [[[0xF0, 0x78]]]  # codes of another integer type: the same bytes
