"""wicore.BlockAttentionQKV on the CUDA EP (float16, wicore/kernels/csrc/attention.cu and
attention_prefill.cu): the output and the written pools against the CPU op (float32, the reference)
on random inputs, pools bound in place as the runtime binds them (and once copied); then a decode
step's kernel time a layer against ONNX Runtime's com.microsoft.PagedAttention at the 27B shape (both
with their prologue: q/k norms, RoPE, the K/V write), in CUDA graphs, per context, window (0: a full
layer) and batch, with the GB/s of K and V read.

    PYTHONPATH=/tmp/site:.:tools python3 tools/check_attention_qkv_gpu.py [--library LIB.so] [--json OUT]

Prints the worst error per case (relative to the output's or the pool's scale; fails past 1e-2).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import numpy as np
from benchlib import int_list
from kernel_graphs import BLOCK, REPEAT, SHAPE_27B, attention_model, bind_cuda, measure, random_block_tables, timing_session
from onnx import TensorProto, helper

from wicore.devices.providers import onnxruntime
from wicore.kernels.library import DOMAIN, library

F16, F32, I64, I32 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32
INPUTS = ["qkv", "k", "v", "tables", "positions", "slots", "past", "cos", "sin", "q_norm", "k_norm"]


def qkv_model(
    dtype: int, heads: int, kv_heads: int, window: int, softcap: float, scale: float, norms: bool, repeat: int = 1
) -> bytes:
    types = {"tables": I64, "positions": I64, "slots": I64, "past": I32}
    shared = [n for n in INPUTS if n not in ("k", "v") and (norms or n not in ("q_norm", "k_norm"))]
    ins = [helper.make_tensor_value_info(n, types.get(n, dtype), None) for n in shared]
    nodes, outs = [], []
    for r in range(repeat):
        k, v = (f"k{r}", f"v{r}") if repeat > 1 else ("k", "v")
        ins += [helper.make_tensor_value_info(k, dtype, None), helper.make_tensor_value_info(v, dtype, None)]
        names = ["qkv", k, v, "tables", "positions", "slots", "past", "cos", "sin"] + (["q_norm", "k_norm"] if norms else [])
        outs_r = [f"out{r}" if repeat > 1 else "out", f"{k}_out", f"{v}_out"]
        nodes.append(
            helper.make_node(
                "BlockAttentionQKV", names, outs_r, domain=DOMAIN, num_heads=heads, num_kv_heads=kv_heads, window=window,
                softcap=softcap, scale=scale, epsilon=1e-6,
            )
        )  # fmt: skip
        outs += [helper.make_tensor_value_info(n, dtype, None) for n in outs_r]
    graph = helper.make_graph(nodes, "a", ins, outs)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def random_case(rng: np.random.Generator, batch: int, seq: int, groups: int, kvh: int, hd: int, bs: int,
                max_ctx: int) -> dict[str, np.ndarray]:  # fmt: skip
    """Ragged rows (each its own length, its last `seq` tokens new), tables of random distinct blocks
    from logical block 0, RoPE caches of theta 1e4, norm weights around 1."""
    lens = rng.integers(seq, max_ctx + 1, batch)
    width = int(max(-(-lens // bs)))
    num_blocks = batch * width + 3
    tables = rng.permutation(num_blocks)[: batch * width].reshape(batch, width).astype(np.int64)
    positions = (lens[:, None] - seq + np.arange(seq)[None, :]).astype(np.int64)
    slots = np.take_along_axis(tables, positions // bs, axis=1) * bs + positions % bs
    angles = np.arange(max_ctx + 1, dtype=np.float32)[:, None] * (1e4 ** (-np.arange(0, hd, 2, dtype=np.float32) / hd))
    width_qkv = (groups * kvh + 2 * kvh) * hd
    return {
        "qkv": rng.standard_normal((batch, seq, width_qkv), dtype=np.float32).astype(np.float16),
        "k": rng.standard_normal((num_blocks, bs, kvh, hd), dtype=np.float32).astype(np.float16),
        "v": rng.standard_normal((num_blocks, bs, kvh, hd), dtype=np.float32).astype(np.float16),
        "tables": tables, "positions": positions, "slots": slots, "past": (lens - seq).astype(np.int32),
        "cos": np.cos(angles).astype(np.float16), "sin": np.sin(angles).astype(np.float16),
        "q_norm": (1 + 0.3 * rng.standard_normal(hd)).astype(np.float16) * np.float16(hd**-0.5),
        "k_norm": (1 + 0.3 * rng.standard_normal(hd)).astype(np.float16),
    }  # fmt: skip


def rel(got: np.ndarray, want: np.ndarray) -> float:
    err = float(np.abs(got.astype(np.float32) - want).max() / max(float(np.abs(want).max()), 1e-6))
    return err if np.isfinite(err) else float("inf")


def check(ort, lib: str) -> float:
    rng = np.random.default_rng(0)
    # (batch, seq, groups, kv_heads, head_dim, block_size, window, softcap, max context, norms)
    cases = [
        (1, 1, 2, 16, 128, 128, 1024, 0.0, 600, True),
        (64, 1, 2, 16, 128, 128, 1024, 0.0, 1500, True),
        (7, 1, 2, 2, 256, 64, 0, 50.0, 2500, True),
        (9, 1, 8, 2, 128, 32, 100, 0.0, 900, False),
        (4, 1, 6, 2, 64, 16, 0, 0.0, 500, True),
        (200, 1, 2, 4, 128, 16, 0, 0.0, 300, True),
        (3, 5, 2, 4, 128, 16, 0, 0.0, 300, True),  # prefill chunks
        (2, 7, 4, 2, 256, 64, 50, 20.0, 2600, False),
        # prefill chunks on tensor-core tiles (attention_tiles.cu), as tools/check_attention_gpu.py's
        (2, 300, 2, 16, 128, 16, 1024, 0.0, 800, True),
        (3, 130, 7, 2, 128, 16, 100, 0.0, 600, True),
        (1, 1500, 2, 2, 256, 64, 0, 50.0, 2600, True),
        (2, 70, 4, 2, 64, 32, 0, 0.0, 300, False),
    ]
    opts = ort.SessionOptions()
    opts.register_custom_ops_library(lib)
    worst = 0.0
    for i, (batch, seq, groups, kvh, hd, bs, window, softcap, max_ctx, norms) in enumerate(cases):
        feeds = random_case(rng, batch, seq, groups, kvh, hd, bs, max_ctx)
        scale = 1.0 if norms else hd**-0.5
        if not norms:
            feeds = {k: v for k, v in feeds.items() if k not in ("q_norm", "k_norm")}
        heads = groups * kvh
        gpu = ort.InferenceSession(
            qkv_model(F16, heads, kvh, window, softcap, scale, norms), opts, providers=["CUDAExecutionProvider"]
        )
        cpu = ort.InferenceSession(
            qkv_model(F32, heads, kvh, window, softcap, scale, norms), opts, providers=["CPUExecutionProvider"]
        )
        want = cpu.run(None, {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in feeds.items()})
        # in place, as the runtime binds the pools
        binding = gpu.io_binding()
        binding.bind_output("out", "cpu")  # the first output bound: copy_outputs_to_cpu()[0]
        pools = {n: ort.OrtValue.ortvalue_from_numpy(feeds[n], "cuda", 0) for n in ("k", "v")}
        for name, x in feeds.items():
            if name in pools:
                binding.bind_ortvalue_input(name, pools[name])
                binding.bind_ortvalue_output(f"{name}_out", pools[name])
            else:
                binding.bind_cpu_input(name, x)
        gpu.run_with_iobinding(binding)
        got = [binding.copy_outputs_to_cpu()[0], pools["k"].numpy(), pools["v"].numpy()]
        errs = [rel(g, w) for g, w in zip(got, want, strict=True)]
        if i == 0:  # the pools copied into outputs of their own
            errs += [rel(g, w) for g, w in zip(gpu.run(None, feeds), want, strict=True)]
        worst = max(worst, *errs)
        print(f"batch {batch:3d} seq {seq} groups {groups} kv_heads {kvh:2d} head_dim {hd} block {bs:3d} window {window:4d} "
              f"softcap {softcap:4.0f} ctx<={max_ctx} norms {norms:d}: rel err out / k / v " + " / ".join(f"{e:.1e}" for e in errs))  # fmt: skip
    return worst


def time_fused(ort, lib: str, batch: int, ctx: int, window: int) -> dict:
    """ORT's PagedAttention and BlockAttentionQKV (both: q/k norms, RoPE, the K/V write, the attention)
    on pools of the 27B shape, REPEAT layers a graph, GPU kernel time a layer (CUPTI)."""
    import torch

    s = SHAPE_27B
    heads, kvh, hd = s["heads"], s["kv_heads"], s["head_dim"]
    opts, providers = timing_session(ort, lib)
    dev = torch.device("cuda")
    pool, tables = random_block_tables(batch, ctx, BLOCK, kvh, hd)
    pos = ctx - 1
    slots = tables[:, pos // BLOCK] * BLOCK + pos % BLOCK
    angles = torch.arange(ctx + 1, device=dev, dtype=torch.float32)[:, None] * (
        1e4 ** (-torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd)
    )
    qkv = torch.randn(batch, (heads + 2 * kvh) * hd, device=dev, dtype=torch.float16)
    t: dict[str, torch.Tensor] = {
        "cumulative": torch.arange(batch + 1, dtype=torch.int32, device=dev),
        "past": torch.full((batch,), pos, dtype=torch.int32, device=dev),
    }
    for r in range(REPEAT):
        for kv in "kv":
            t[f"{kv}{r}"] = torch.randn(pool, device=dev, dtype=torch.float16)
        t[f"out{r}"] = torch.empty(batch, heads * hd, device=dev, dtype=torch.float16)

    pools = {f"{kv}{r}": t[f"{kv}{r}"] for r in range(REPEAT) for kv in "kv"}
    in_place = {f"{n}_out": x for n, x in pools.items()}
    outs = {f"out{r}" for r in range(REPEAT)} | set(in_place)
    results = {}
    ort_names = {"qkv": qkv, "tables": tables.to(torch.int32), "slots": slots.to(torch.int32), **t, **in_place}
    sess = ort.InferenceSession(attention_model(batch, ctx, window, 2, REPEAT).SerializeToString(), opts, providers=providers)
    b = bind_cuda(sess, {k: v for k, v in ort_names.items() if k in {i.name for i in sess.get_inputs()} | outs}, outs)
    b.bind_ortvalue_input("bounds", ort.OrtValue.ortvalue_from_numpy(np.asarray([1, ctx], np.int32)))
    results["ort"] = measure(sess, b)
    del sess, b
    ours = {
        "qkv": qkv.view(batch, 1, -1), "tables": tables.to(torch.int64), "positions": torch.full((batch, 1), pos, dtype=torch.int64, device=dev),
        "slots": slots.to(torch.int64).view(batch, 1), "past": t["past"], "cos": torch.cos(angles).half(), "sin": torch.sin(angles).half(),
        "q_norm": torch.ones(hd, device=dev, dtype=torch.float16), "k_norm": torch.ones(hd, device=dev, dtype=torch.float16),
        **pools, **in_place, **{f"out{r}": t[f"out{r}"].view(batch, 1, -1) for r in range(REPEAT)},
    }  # fmt: skip
    sess = ort.InferenceSession(qkv_model(F16, heads, kvh, window, 0.0, 1.0, True, REPEAT), opts, providers=providers)
    b = bind_cuda(sess, ours, outs)
    results["wicore"] = measure(sess, b)
    gb = batch * (min(ctx, window) if window else ctx) * kvh * hd * 2 * 2 / 1e9  # K and V of every visible key
    for r in results.values():
        r["gb_per_s"] = gb / (r["us_per_layer"] * 1e-6)
    return dict(batch=batch, context=ctx, window=window, kv_gb=gb, **results)


def time_prefill(ort, lib: str, tokens: int, window: int) -> dict:
    """BlockAttentionQKV on one prompt of `tokens` tokens at once (a prefill chunk from position 0) at the 27B
    shape, REPEAT layers a graph, GPU kernel time a layer and a token (no ORT peer: its op takes prompts
    through cumulative lengths, which kernel_graphs' decode models do not bind)."""
    import torch

    s = SHAPE_27B
    heads, kvh, hd = s["heads"], s["kv_heads"], s["head_dim"]
    opts, providers = timing_session(ort, lib)
    dev = torch.device("cuda")
    pool, tables = random_block_tables(1, tokens, BLOCK, kvh, hd)
    pos = torch.arange(tokens, device=dev)
    angles = torch.arange(tokens + 1, device=dev, dtype=torch.float32)[:, None] * (
        1e4 ** (-torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd)
    )
    names: dict[str, torch.Tensor] = {
        "qkv": torch.randn(1, tokens, (heads + 2 * kvh) * hd, device=dev, dtype=torch.float16),
        "tables": tables.to(torch.int64), "positions": pos.view(1, tokens),
        "slots": (tables[0, pos // BLOCK] * BLOCK + pos % BLOCK).view(1, tokens), "past": torch.zeros(1, dtype=torch.int32, device=dev),
        "cos": torch.cos(angles).half(), "sin": torch.sin(angles).half(),
        "q_norm": torch.ones(hd, device=dev, dtype=torch.float16), "k_norm": torch.ones(hd, device=dev, dtype=torch.float16),
    }  # fmt: skip
    for r in range(REPEAT):
        for kv in "kv":
            names[f"{kv}{r}"] = names[f"{kv}{r}_out"] = torch.randn(pool, device=dev, dtype=torch.float16)
        names[f"out{r}"] = torch.empty(1, tokens, heads * hd, device=dev, dtype=torch.float16)
    outs = {f"out{r}" for r in range(REPEAT)} | {f"{kv}{r}_out" for r in range(REPEAT) for kv in "kv"}
    sess = ort.InferenceSession(qkv_model(F16, heads, kvh, window, 0.0, 1.0, True, REPEAT), opts, providers=providers)
    result = measure(sess, bind_cuda(sess, names, outs))
    return dict(tokens=tokens, window=window, us_per_token=result["us_per_layer"] / tokens, wicore=result)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--library", help="a built libwicore_kernels.so (default: build or take the cached one)")
    p.add_argument("--batches", default="1,64,256")
    p.add_argument("--contexts", default="512", help="tokens of each row (the timed step's position + 1)")
    p.add_argument("--windows", default="1024", help="0: a full-attention layer; else a sliding one of this window")
    p.add_argument("--prefill", default="", help="also time one prompt of each of these token counts at once (per --windows)")
    p.add_argument("--json", help="write the errors and timings here")
    args = p.parse_args(argv)
    ort = onnxruntime()
    lib = args.library or str(library(cuda=True))
    worst = check(ort, lib)
    print(f"worst rel err {worst:.1e}", flush=True)
    rows = []
    for ctx, window, batch in itertools.product(*(int_list(x) for x in (args.contexts, args.windows, args.batches))):
        r = time_fused(ort, lib, batch, ctx, window)
        rows.append(r)
        o, w = r["ort"]["us_per_layer"], r["wicore"]["us_per_layer"]
        print(f"ctx {ctx:5d} window {window:4d} batch {batch:3d}: BlockAttentionQKV {w:7.1f} us ({r['wicore']['gb_per_s']:5.0f} GB/s), "
              f"ORT PagedAttention {o:7.1f} us a layer ({w / o:.2f}x)", flush=True)  # fmt: skip
    prefill = []
    for tokens, window in itertools.product(int_list(args.prefill), int_list(args.windows)):
        prefill.append(time_prefill(ort, lib, tokens, window))
        r = prefill[-1]
        print(f"prefill {tokens:5d} tokens window {window:4d}: BlockAttentionQKV {r['wicore']['us_per_layer']:8.1f} us a layer, "
              f"{r['us_per_token']:.3f} us a token", flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps({"worst_rel_err": worst, "timings": rows, "prefill": prefill}, indent=1))
    return 1 if worst > 1e-2 else 0


if __name__ == "__main__":
    sys.exit(main())
