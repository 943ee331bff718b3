"""The small graphs tools/probe_kernels.py and tools/check_attention_gpu.py time: paged attention
nodes and linear layers at a model's shapes, weights written straight to an external data file;
and `cuda_kernels`, the GPU time of each kernel a run launches (CUPTI, through torch's profiler), with
`measure` a layer's of a bound attention session (check_attention_gpu.py, check_attention_qkv_gpu.py); `timed`
one op's outputs and us a CUDA graph replay (check_kernels_gpu.py, check_matmul_q16_gpu.py)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

SHAPE_27B = dict(hidden=5376, inter=21504, heads=32, kv_heads=16, head_dim=128, vocab=262208)
# (name, N, K) of a Gemma 3 27B layer's linear ops: q|k|v (32 + 2 x 16 heads of 128), o, gate|up, down
LINEAR_27B = [("qkv", 8192, 5376), ("o", 5376, 4096), ("gate_up", 43008, 5376), ("down", 5376, 21504)]
BLOCK = 128  # the paged op's FlashAttention tile at head size 128
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
IR_VERSION = 10  # what ONNX Runtime 1.31 reads (a newer onnx writes a newer IR by default)
REPEAT = 4  # layers a timed attention model (each its own pools, so the L2 cache holds none of them)


def attention_model(batch: int, ctx: int, window: int, num_bounds: int, repeat: int) -> onnx.ModelProto:
    s = SHAPE_27B
    hd, heads, kvh = s["head_dim"], s["heads"], s["kv_heads"]
    num_blocks = batch * -(-ctx // BLOCK) + 1
    f16, i32 = TensorProto.FLOAT16, TensorProto.INT32
    inputs = [
        helper.make_tensor_value_info("qkv", f16, [batch, (heads + 2 * kvh) * hd]),
        helper.make_tensor_value_info("cumulative", i32, [batch + 1]),
        helper.make_tensor_value_info("past", i32, [batch]),
        helper.make_tensor_value_info("tables", i32, [batch, -(-ctx // BLOCK)]),
        helper.make_tensor_value_info("slots", i32, [batch]),
        helper.make_tensor_value_info("bounds", i32, [num_bounds]),
    ]
    rng = np.random.default_rng(0)
    angles = np.arange(ctx + 1, dtype=np.float32)[:, None] * (1e6 ** (-np.arange(0, hd, 2, dtype=np.float32) / hd))
    inits = [
        onnx.numpy_helper.from_array(np.cos(angles).astype(np.float16), "cos"),
        onnx.numpy_helper.from_array(np.sin(angles).astype(np.float16), "sin"),
        onnx.numpy_helper.from_array((1 + 0.1 * rng.standard_normal(hd)).astype(np.float16), "q_norm"),
        onnx.numpy_helper.from_array((1 + 0.1 * rng.standard_normal(hd)).astype(np.float16), "k_norm"),
    ]
    nodes, outputs = [], []
    pool = [num_blocks, BLOCK, kvh, hd]
    for r in range(repeat):
        inputs += [helper.make_tensor_value_info(f"k{r}", f16, pool), helper.make_tensor_value_info(f"v{r}", f16, pool)]
        outs = [f"out{r}", f"k{r}_out", f"v{r}_out"]
        ins = [
            "qkv",
            "",
            "",
            f"k{r}",
            f"v{r}",
            "cumulative",
            "past",
            "tables",
            "cos",
            "sin",
            "slots",
            "",
            "q_norm",
            "k_norm",
            "",
            "",
            "bounds",
        ]
        nodes.append(
            helper.make_node(
                "PagedAttention", ins, outs, f"attn{r}", domain="com.microsoft", num_heads=heads, kv_num_heads=kvh,
                do_rotary=1, local_window_size=window or -1, scale=hd**-0.5, qk_norm_epsilon=1e-6,
            )
        )  # fmt: skip
        outputs += [
            helper.make_tensor_value_info(f"out{r}", f16, [batch, heads * hd]),
            helper.make_tensor_value_info(f"k{r}_out", f16, pool),
            helper.make_tensor_value_info(f"v{r}_out", f16, pool),
        ]
    graph = helper.make_graph(nodes, "attention", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=OPSETS, ir_version=IR_VERSION)


def random_f16(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Random float16 of magnitude 1/16 .. 1/8 and either sign, from random bits (fast at GBs)."""
    bits = np.frombuffer(rng.bytes(int(np.prod(shape)) * 2), np.uint16)
    return ((bits & 0x83FF) | 0x2C00).view(np.float16).reshape(shape)


def linear_model(case: dict, repeat: int, folder: Path) -> Path:
    """`repeat` linear ops of one shape, each its own weights, on one input [M, K]. The weights go
    straight to an external data file (the LM head's 2.8 GB is past protobuf's 2 GB)."""
    k, n = case["k"], case["n"]
    rng = np.random.default_rng(1)
    f16 = TensorProto.FLOAT16
    data = folder / "linear.data"
    nodes, inits, outputs = [], [], []
    with data.open("wb") as f:

        def weight(name: str, array: np.ndarray) -> None:
            tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape)
            offset = f.tell()
            f.write(array.tobytes())
            tensor.data_location = TensorProto.EXTERNAL
            for key, value in (("location", data.name), ("offset", offset), ("length", array.nbytes)):
                tensor.external_data.add(key=key, value=str(value))
            inits.append(tensor)

        for r in range(repeat):
            if case["kind"] == "nbits":
                bits, block = case["bits"], 32
                blob = block * bits // 8
                weight(f"w{r}", np.frombuffer(rng.bytes(n * (k // block) * blob), np.uint8).reshape(n, k // block, blob))
                weight(f"s{r}", random_f16(rng, (n * (k // block),)))
                nodes.append(
                    helper.make_node(
                        "MatMulNBits",
                        ["x", f"w{r}", f"s{r}"],
                        [f"y{r}"],
                        domain="com.microsoft",
                        K=k,
                        N=n,
                        bits=bits,
                        block_size=block,
                        accuracy_level=0,
                    )
                )
            elif case["shape"] == "lm_head":  # the tied head: the embedding table [vocab, hidden], transB
                weight(f"w{r}", random_f16(rng, (n, k)))
                nodes.append(helper.make_node("Gemm", ["x", f"w{r}"], [f"y{r}"], transB=1))
            else:
                weight(f"w{r}", random_f16(rng, (k, n)))
                nodes.append(helper.make_node("MatMul", ["x", f"w{r}"], [f"y{r}"]))
            outputs.append(helper.make_tensor_value_info(f"y{r}", f16, ["m", n]))
    graph = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("x", f16, ["m", k])], outputs, inits)
    path = folder / "linear.onnx"
    onnx.save(helper.make_model(graph, opset_imports=OPSETS, ir_version=IR_VERSION), path)
    return path


def cuda_kernels(run: Callable[[], object], num_runs: int) -> tuple[float, Counter]:
    """(wall ms a run, {kernel: GPU us a run}) of `num_runs` calls of `run`, from CUPTI."""
    import torch

    per_kernel: Counter = Counter()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for _ in range(num_runs):
            run()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / num_runs
    for event in prof.key_averages():
        if event.self_device_time_total > 0:
            per_kernel[event.key[:60]] += event.self_device_time_total / num_runs
    return 1000 * wall, per_kernel


def measure(sess, binding, runs: int = 20) -> dict:
    """A session of REPEAT attention layers, bound and replayed: GPU kernel time a layer (and by kernel)."""
    for _ in range(4):  # warm-up; the CUDA EP captures its graph on one of these
        sess.run_with_iobinding(binding)
    wall_ms, kernels = cuda_kernels(lambda: sess.run_with_iobinding(binding), runs)
    return dict(us_per_layer=sum(kernels.values()) / REPEAT, wall_ms=wall_ms, kernels={k: v / REPEAT for k, v in kernels.items()})


def timing_session(ort, lib: str) -> tuple[object, list]:
    """Session options with WiCore's kernel library and the CUDA EP's graphs on, as the timings run them."""
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    opts.register_custom_ops_library(lib)
    return opts, [("CUDAExecutionProvider", {"enable_cuda_graph": "1"}), "CPUExecutionProvider"]


def random_block_tables(batch: int, ctx: int, block: int, kv_heads: int, head_dim: int):
    """Seeded on cuda: a pool's shape for `batch` sequences of `ctx` tokens in blocks of `block` (one
    spare block) and their block tables, a random permutation of the blocks past the first."""
    import torch

    torch.manual_seed(0)
    nb = -(-ctx // block)
    tables = (1 + torch.randperm(batch * nb, device="cuda")).reshape(batch, nb)
    return (batch * nb + 1, block, kv_heads, head_dim), tables


def bind_cuda(sess, tensors: dict, outputs: set[str] | list[str]):
    """An IO binding of torch cuda tensors by name, those in `outputs` as outputs, the rest as inputs."""
    import torch

    types = {torch.float16: np.float16, torch.int32: np.int32, torch.int64: np.int64}
    b = sess.io_binding()
    for name, x in tensors.items():
        (b.bind_output if name in outputs else b.bind_input)(name, "cuda", 0, types[x.dtype], list(x.shape), x.data_ptr())
    return b


def timed(
    ort, path: str, onnx_model: bytes, feeds: dict[str, np.ndarray], repeats: int, config: dict[str, str] | None = None
) -> tuple[list[np.ndarray], float]:
    """Outputs and median us a replay of the model's CUDA graph, its inputs and outputs on the device; `config`:
    session config entries (e.g. ep.cuda.fpa_intb_gemm, which WiCore's sessions set: wicore/devices/providers.py)."""
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(path)
    for key, value in (config or {}).items():
        opts.add_session_config_entry(key, value)
    s = ort.InferenceSession(onnx_model, opts, providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])
    binding = s.io_binding()
    values = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in feeds.items()}
    for k, v in values.items():
        binding.bind_ortvalue_input(k, v)
    for o in s.get_outputs():
        binding.bind_output(o.name, "cuda", 0)
    s.run_with_iobinding(binding)  # the capture
    outs = [o.numpy() for o in binding.get_outputs()]
    import torch  # its events time the replays

    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        s.run_with_iobinding(binding)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    return outs, float(np.median(times))
