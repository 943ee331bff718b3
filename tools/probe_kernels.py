"""What ONNX Runtime's CUDA kernels cost at a model's shapes: GPU µs an op, read from CUPTI.

The decode step of a paged export is a chain of a few ONNX Runtime kernels a layer, so what a
step costs is what those kernels cost at its shapes, and ONNX Runtime has switches that change
which kernels run (environment variables read when a session is created, session config keys,
the paged attention's host-side bounds). This tool times each choice on small graphs of the
real shapes, each case a session of its own, every case of one environment in one process:

    attention   com.microsoft.PagedAttention (fused q/k norm and RoPE prologue, blocks of the
                op's FlashAttention tile) at batch x context, global or sliding window, with
                the bounds a captured step passes: [1, max_context] (what the runtime passes
                today), [1, L], [1, L, L] (a lower bound: lets FlashAttention split the KV);
                and with cuDNN's paged SDPA (ORT_ENABLE_CUDNN_FLASH_ATTENTION=1)
    matmul      fp16 MatMul x [M, K] @ w [K, N] (the LM head: Gemm with transB): cuBLAS, the
                auto-tuner (ep.cuda.enable_gemm_auto_tune), the small-N GEMV forced
    nbits       MatMulNBits with 4- and 8-bit weights: default kernels, the CUTLASS fpA_intB
                ones (WiCore's default), and their GEMV options

GPU time comes from CUPTI through torch's profiler (kernels only: no launch gaps, no host), per
op: all kernels of the profiled runs / (runs x ops in the graph). Attention outputs of each case
are kept, and every variant of a case is compared with the first (max |diff|).

    PYTHONPATH=/tmp/site:. python3 tools/probe_kernels.py --json probe.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from benchlib import write_record
from kernel_graphs import BLOCK, SHAPE_27B, attention_model, cuda_kernels, linear_model

MAX_CONTEXT = 131072
RUNS = 20  # profiled runs a case
ENVS = {  # process environments: name -> variables
    "default": {},
    "cudnn": {"ORT_ENABLE_CUDNN_FLASH_ATTENTION": "1"},
    "small-n": {"ORT_ENABLE_SMALL_N_GEMV": "1"},
}


@dataclass(frozen=True)
class ProbeConfig:
    kinds: str
    budget_s: float
    runs: int  # profiled runs a case


# --------------------------------------------------------------------------- cases
def attention_cases() -> list[dict]:
    cases = []
    points = [(1, 512), (1, 2048), (1, 8192), (1, 32768), (1, 131072), (8, 512), (8, 8192), (32, 512), (32, 4096)]
    for batch, ctx in points:
        bounds = {"cap": [1, MAX_CONTEXT], "exact": [1, ctx], "lower": [1, ctx, ctx]}
        for name, b in bounds.items():
            cases.append(dict(kind="attention", env="default", batch=batch, context=ctx, window=0, bounds=b, variant=name))
        for name in ("exact", "lower"):
            cases.append(
                dict(
                    kind="attention",
                    env="cudnn",
                    batch=batch,
                    context=ctx,
                    window=0,
                    bounds=bounds[name],
                    variant=f"cudnn-{name}",
                )
            )
    for batch, ctx in [(1, 512), (1, 2048), (1, 8192), (32, 2048)]:
        for env, name in (("default", "cap"), ("cudnn", "cudnn-exact")):
            b = [1, MAX_CONTEXT] if name == "cap" else [1, ctx]
            cases.append(dict(kind="attention", env=env, batch=batch, context=ctx, window=1024, bounds=b, variant=name))
    return cases


def matmul_cases() -> list[dict]:
    s = SHAPE_27B
    shapes = {
        "qkv": (s["hidden"], (s["heads"] + 2 * s["kv_heads"]) * s["head_dim"]),
        "o": (s["heads"] * s["head_dim"], s["hidden"]),
        "gate_up": (s["hidden"], 2 * s["inter"]),
        "down": (s["inter"], s["hidden"]),
        "lm_head": (s["hidden"], s["vocab"]),
    }
    cases = []
    for name, (k, n) in shapes.items():
        for variant, env, tune in (("cublas", "default", "0"), ("auto-tune", "default", "1"), ("small-n", "small-n", "0")):
            cases.append(dict(kind="matmul", env=env, shape=name, k=k, n=n, rows=[1, 8, 32, 64], tune=tune, variant=variant))
        if name == "lm_head":
            continue
        for bits in (4, 8):
            for variant, config in (
                ("default", {"ep.cuda.fpa_intb_gemm": "0"}),
                ("fpa_intb", {"ep.cuda.fpa_intb_gemm": "1"}),
                ("fpa_intb+paired_k", {"ep.cuda.fpa_intb_gemm": "1", "ep.cuda.fpa_intb_gemv_paired_k": "1"}),
                ("fpa_intb+wave_aware", {"ep.cuda.fpa_intb_gemm": "1", "ep.cuda.fpa_intb_gemv_wave_aware": "1"}),
            ):
                if bits == 8 and "+" in variant:
                    continue
                cases.append(
                    dict(
                        kind="nbits",
                        env="default",
                        shape=name,
                        k=k,
                        n=n,
                        rows=[1, 8, 32, 64],
                        bits=bits,
                        config=config,
                        variant=variant,
                    )
                )
    return cases


# --------------------------------------------------------------------------- timing
def probe_attention(case: dict, out_dir: Path, repeat: int = 4) -> dict:
    import onnxruntime as ort
    import torch

    batch, ctx = case["batch"], case["context"]
    model = attention_model(batch, ctx, case["window"], len(case["bounds"]), repeat)
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(
        model.SerializeToString(), opts, providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"}), "CPUExecutionProvider"]
    )
    torch.manual_seed(0)
    dev = torch.device("cuda")
    s = SHAPE_27B
    nb = -(-ctx // BLOCK)
    num_blocks = batch * nb + 1
    tables = (1 + torch.randperm(batch * nb, device=dev)).to(torch.int32).reshape(batch, nb)
    past = torch.full((batch,), ctx - 1, dtype=torch.int32, device=dev)
    pos = ctx - 1
    slots = (tables[:, pos // BLOCK] * BLOCK + pos % BLOCK).to(torch.int32)
    tensors = {
        "qkv": torch.randn(batch, (s["heads"] + 2 * s["kv_heads"]) * s["head_dim"], device=dev, dtype=torch.float16),
        "cumulative": torch.arange(batch + 1, dtype=torch.int32, device=dev),
        "past": past,
        "tables": tables,
        "slots": slots,
    }
    pool = (num_blocks, BLOCK, s["kv_heads"], s["head_dim"])
    for r in range(repeat):
        tensors[f"k{r}"] = torch.randn(pool, device=dev, dtype=torch.float16)
        tensors[f"v{r}"] = torch.randn(pool, device=dev, dtype=torch.float16)
        tensors[f"out{r}"] = torch.empty(batch, s["heads"] * s["head_dim"], device=dev, dtype=torch.float16)
    binding = sess.io_binding()
    for name, t in tensors.items():
        if name.startswith("out"):
            binding.bind_output(name, "cuda", 0, np.float16, list(t.shape), t.data_ptr())
        else:
            binding.bind_input(name, "cuda", 0, _np_type(t.dtype), list(t.shape), t.data_ptr())
    for r in range(repeat):
        for kv in "kv":
            t = tensors[f"{kv}{r}"]
            binding.bind_output(f"{kv}{r}_out", "cuda", 0, np.float16, list(t.shape), t.data_ptr())
    bounds = ort.OrtValue.ortvalue_from_numpy(np.asarray(case["bounds"], np.int32))
    binding.bind_ortvalue_input("bounds", bounds)

    def run() -> None:
        sess.run_with_iobinding(binding)

    for _ in range(4):  # warm-up; the CUDA EP captures the graph on one of these
        run()
    wall_ms, kernels = cuda_kernels(run, RUNS)
    out = tensors["out0"].float().cpu().numpy()
    np.save(out_dir / f"{case['id']}.npy", out)
    return dict(wall_ms=wall_ms, us_per_op=sum(kernels.values()) / repeat, kernels={k: v / repeat for k, v in kernels.items()})


def probe_linear(case: dict, out_dir: Path, repeat: int = 2) -> dict:
    import onnxruntime as ort
    import torch

    with tempfile.TemporaryDirectory() as tmp:
        path = linear_model(case, 1 if case["shape"] == "lm_head" else repeat, Path(tmp))
        repeat = 1 if case["shape"] == "lm_head" else repeat
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        if case["kind"] == "matmul":
            opts.add_session_config_entry("ep.cuda.enable_gemm_auto_tune", case["tune"])
        for key, value in case.get("config", {}).items():
            opts.add_session_config_entry(key, value)
        sess = ort.InferenceSession(str(path), opts, providers=["CUDAExecutionProvider"])
    results = {}
    bytes_per = (
        case["bits"] / 8 * (1 + 2 * 8 / (32 * case["bits"])) if case["kind"] == "nbits" else 2
    )  # scales: fp16 a block of 32
    weight_bytes = case["k"] * case["n"] * bytes_per
    for m in case["rows"]:
        x = torch.randn(m, case["k"], device="cuda", dtype=torch.float16)
        ys = [torch.empty(m, case["n"], device="cuda", dtype=torch.float16) for _ in range(repeat)]
        binding = sess.io_binding()
        binding.bind_input("x", "cuda", 0, np.float16, [m, case["k"]], x.data_ptr())
        for r, y in enumerate(ys):
            binding.bind_output(f"y{r}", "cuda", 0, np.float16, [m, case["n"]], y.data_ptr())
        for _ in range(3):
            sess.run_with_iobinding(binding)
        _, kernels = cuda_kernels(lambda b=binding: sess.run_with_iobinding(b), RUNS)
        us = sum(kernels.values()) / repeat
        results[m] = dict(us=us, tb_per_s=weight_bytes / (us * 1e-6) / 1e12, kernels={k: v / repeat for k, v in kernels.items()})
    return dict(rows=results)


def _np_type(dtype) -> type:
    import torch

    return {torch.float16: np.float16, torch.int32: np.int32, torch.int64: np.int64}[dtype]


# --------------------------------------------------------------------------- driver
def child(env_name: str, cases: list[dict], out_dir: Path, deadline: float) -> None:
    """Run `cases` in this process, one JSON line each on stdout."""
    for case in cases:
        if time.time() > deadline:
            print(json.dumps(dict(case, error="skipped: out of time")), flush=True)
            continue
        try:
            probe = probe_attention if case["kind"] == "attention" else probe_linear
            print(json.dumps(dict(case, **probe(case, out_dir))), flush=True)
        except Exception as exc:  # one case's failure is its result
            print(json.dumps(dict(case, error=f"{type(exc).__name__}: {str(exc)[:400]}")), flush=True)
        import torch

        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kinds", default="attention,matmul,nbits")
    p.add_argument("--budget-s", type=float, default=480, help="stop starting cases after this long")
    p.add_argument("--json", type=Path)
    p.add_argument("--child", help=argparse.SUPPRESS)  # env name: run the cases in --cases-file here
    p.add_argument("--cases-file", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--out-dir", type=Path, default=Path(tempfile.gettempdir()) / "probe-kernels")
    p.add_argument("--deadline", type=float, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    if a.child:
        child(a.child, json.loads(a.cases_file.read_text()), a.out_dir, a.deadline)
        return 0
    kinds = set(a.kinds.split(","))
    cases = [c for c in attention_cases() + matmul_cases() if c["kind"] in kinds]
    for i, c in enumerate(cases):
        c["id"] = f"case{i:03d}"
    deadline = time.time() + a.budget_s
    results = []
    for env_name, variables in ENVS.items():
        mine = [c for c in cases if c["env"] == env_name]
        if not mine:
            continue
        cases_file = a.out_dir / f"cases-{env_name}.json"
        cases_file.write_text(json.dumps(mine))
        cmd = [
            sys.executable,
            __file__,
            "--child",
            env_name,
            "--cases-file",
            str(cases_file),
            "--out-dir",
            str(a.out_dir),
            "--deadline",
            str(deadline),
        ]
        proc = subprocess.run(cmd, env={**os.environ, **variables}, capture_output=True, text=True)
        got = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        results += got
        if proc.returncode != 0 or len(got) < len(mine):
            print(f"{env_name}: exit {proc.returncode}; stderr tail:\n{proc.stderr[-2000:]}", flush=True)
    compare_attention(results, a.out_dir)
    print_tables(results)
    if a.json:
        write_record(a.json, ProbeConfig(a.kinds, a.budget_s, RUNS), shape=SHAPE_27B, results=results)
    return 0


def compare_attention(results: list[dict], out_dir: Path) -> None:
    """Each attention case's output against the first variant of the same point (max |diff|)."""
    first: dict[tuple, np.ndarray] = {}
    for r in results:
        if r["kind"] != "attention" or "error" in r:
            continue
        out = np.load(out_dir / f"{r['id']}.npy")
        key = (r["batch"], r["context"], r["window"])
        if key not in first:
            first[key] = out
        r["max_abs_diff_vs_first"] = float(np.abs(out - first[key]).max())


def print_tables(results: list[dict]) -> None:
    print("\n## attention (GPU µs an op; max |diff| against the first variant)")
    for r in results:
        if r["kind"] == "attention":
            head = f"b{r['batch']:<3} ctx {r['context']:<7} {'window ' + str(r['window']) if r['window'] else 'global':<12} {r['variant']:<12}"
            if "error" in r:
                print(f"{head} ERROR {r['error'][:200]}")
                continue
            top = ", ".join(f"{k[:40]} {v:.1f}" for k, v in Counter(r["kernels"]).most_common(3))
            print(
                f"{head} {r['us_per_op']:8.1f} us  wall {r['wall_ms']:.3f} ms  diff {r.get('max_abs_diff_vs_first', 0):.2e}  [{top}]"
            )
    print("\n## linear layers (GPU µs an op, TB/s of weights read)")
    for r in results:
        if r["kind"] in ("matmul", "nbits"):
            name = f"{r['kind']}{r.get('bits', '')} {r['shape']:<8} {r['variant']:<20}"
            if "error" in r:
                print(f"{name} ERROR {r['error'][:200]}")
                continue
            cells = "  ".join(f"M={m}: {v['us']:7.1f} us {v['tb_per_s']:.2f}" for m, v in r["rows"].items())
            print(f"{name} {cells}")


if __name__ == "__main__":
    sys.exit(main())
