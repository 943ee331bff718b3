"""wicore.BlockAttention on the CUDA EP (float16, wicore/kernels/csrc/attention.cu): results against
the CPU op (float32, the reference) on random pools, then a decode step's time against ONNX
Runtime's com.microsoft.PagedAttention on the same pools at the 27B shape, both in CUDA graphs.

    PYTHONPATH=/tmp/site:.:tools python3 tools/check_attention_gpu.py [--library LIB.so] [--json OUT]

Prints the worst error per case (relative to the output's scale; fails past 1e-2), then per batch,
context and window: us a layer (GPU kernel time from CUPTI, layers of their own pools) and the GB/s
of K/V read (batch x visible keys x kv_heads x head_dim x 2 x 2 bytes over that time).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from kernel_graphs import BLOCK, REPEAT, SHAPE_27B, attention_model, bind_cuda, measure, random_block_tables, timing_session
from onnx import TensorProto, helper

from wicore.devices.providers import onnxruntime
from wicore.kernels.library import DOMAIN, library

F16, F32, I64 = TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.INT64


def block_attention_model(dtype: int, heads: int, kv_heads: int, window: int, softcap: float, repeat: int = 1) -> bytes:
    ins = [
        helper.make_tensor_value_info("q", dtype, ["b", "s", "w"]),
        helper.make_tensor_value_info("tables", I64, ["b", "m"]),
        helper.make_tensor_value_info("positions", I64, ["b", "s"]),
        helper.make_tensor_value_info("lens", I64, ["b"]),
        helper.make_tensor_value_info("first", I64, ["b"]),
    ]
    nodes, outs = [], []
    for r in range(repeat):
        ins += [helper.make_tensor_value_info(f"k{r}", dtype, None), helper.make_tensor_value_info(f"v{r}", dtype, None)]
        nodes.append(
            helper.make_node(
                "BlockAttention", ["q", f"k{r}", f"v{r}", "tables", "positions", "lens", "first"], [f"out{r}"],
                domain=DOMAIN, num_heads=heads, num_kv_heads=kv_heads, window=window, softcap=softcap,
            )
        )  # fmt: skip
        outs.append(helper.make_tensor_value_info(f"out{r}", dtype, None))
    graph = helper.make_graph(nodes, "a", ins, outs)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


def random_case(rng: np.random.Generator, batch: int, seq: int, groups: int, kvh: int, hd: int, bs: int, window: int,
                max_ctx: int, sliding_tables: bool) -> dict[str, np.ndarray]:  # fmt: skip
    """Ragged rows: each its own context length, its last `seq` tokens the queries; tables of random
    distinct blocks (width the longest row's, padded with block 0); with `sliding_tables` the tables
    start at the window's first block (first_block), as the runtime lists a sliding layer's."""
    lens = rng.integers(seq, max_ctx + 1, batch)
    firsts = np.zeros(batch, np.int64)
    if sliding_tables and window > 0:
        firsts = np.maximum(0, (lens - seq - window + 1) // bs)
    width = int(max(-(-(lens[r]) // bs) - firsts[r] for r in range(batch)))
    num_blocks = batch * width + 3
    perm = rng.permutation(num_blocks)
    tables = np.zeros((batch, width), np.int64)
    for r in range(batch):
        n = -(-int(lens[r]) // bs) - int(firsts[r])
        tables[r, :n] = perm[r * width : r * width + n]
    positions = lens[:, None] - seq + np.arange(seq)[None, :]
    heads = groups * kvh
    return {
        "q": (rng.standard_normal((batch, seq, heads * hd)) * hd**-0.5 * 3).astype(np.float16),
        "k0": rng.standard_normal((num_blocks, bs, kvh, hd), dtype=np.float32).astype(np.float16),
        "v0": rng.standard_normal((num_blocks, bs, kvh, hd), dtype=np.float32).astype(np.float16),
        "tables": tables,
        "positions": positions.astype(np.int64),
        "lens": lens.astype(np.int64),
        "first": firsts,
    }


def poison_unseen(feeds: dict[str, np.ndarray], window: int, pad: int) -> None:
    """Row 0's last `pad` query tokens padding (position 0, as the runtime pads a chunk), then NaN in every pool
    row that no query token sees (window and causal span as the op's; a table starting at first_block)."""
    feeds["positions"][0, -pad:] = 0
    tables, bs = feeds["tables"], feeds["k0"].shape[1]
    seen = np.zeros(feeds["k0"].shape[0] * bs, bool)
    for r, (row, length, first) in enumerate(zip(feeds["positions"], feeds["lens"], feeds["first"] * bs, strict=True)):
        for p in row:
            for key in range(max(first, p - window + 1 if window else 0), min(p + 1, length)):
                seen[tables[r, (key - first) // bs] * bs + (key - first) % bs] = True
    for name in ("k0", "v0"):
        flat = feeds[name].reshape(seen.size, -1)
        flat[~seen] = np.nan


def check(ort, lib: str, only: slice | None = None) -> float:
    rng = np.random.default_rng(0)
    # (batch, seq, groups, kv_heads, head_dim, block_size, window, softcap, max context, sliding tables)
    cases = [
        (1, 1, 2, 16, 128, 128, 0, 0.0, 600, False),
        (5, 1, 1, 4, 128, 16, 0, 0.0, 3000, False),
        (7, 1, 2, 2, 256, 64, 0, 50.0, 2500, False),
        (9, 1, 8, 2, 128, 32, 100, 0.0, 900, True),
        (3, 1, 8, 1, 256, 64, 300, 30.0, 1500, False),
        (64, 1, 2, 16, 128, 128, 1024, 0.0, 4096, True),
        (200, 1, 2, 4, 128, 16, 0, 0.0, 300, False),  # a grid full without splits
        (4, 1, 6, 2, 64, 16, 0, 0.0, 500, False),  # 6 query heads a KV head: chunks of 2
        (3, 5, 2, 4, 128, 16, 0, 0.0, 300, False),  # prefill chunks
        (2, 7, 4, 2, 256, 64, 50, 20.0, 2600, True),
        # prefill chunks on tensor-core tiles (attention_tiles.cu): tiles past the chunk's end, 7 query heads a KV
        # head, windows shorter than the chunk, spans past 1,024 keys, every head dim
        (2, 300, 2, 16, 128, 16, 1024, 0.0, 800, True),
        (3, 130, 7, 2, 128, 16, 100, 0.0, 600, True),
        (1, 1500, 2, 2, 256, 64, 0, 50.0, 2600, False),
        (2, 70, 4, 2, 64, 32, 0, 0.0, 300, False),
        (2, 33, 1, 3, 64, 16, 40, 0.0, 200, True),
    ]
    # (case, padded tokens): the last tokens of row 0 padding at position 0 beside real ones in a tile, every pool
    # row no query sees NaN (a tile that read them into p·v with p = 0 would still give NaN: 0 x NaN); the third's
    # sliding tables start past key 0, so its padding sees no key and a whole tile of it has none
    poisoned = [
        ((2, 100, 2, 4, 128, 16, 50, 0.0, 400, False), 10),
        ((1, 70, 1, 2, 256, 64, 20, 0.0, 300, False), 5),
        ((2, 100, 2, 4, 64, 16, 30, 0.0, 400, True), 40),
    ]
    cpu_opts = ort.SessionOptions()
    cpu_opts.register_custom_ops_library(lib)
    worst = 0.0
    runs = [(c, 0) for c in cases] + poisoned
    runs = runs[only] if only is not None else runs
    for (batch, seq, groups, kvh, hd, bs, window, softcap, max_ctx, sliding), pad in runs:
        feeds = random_case(rng, batch, seq, groups, kvh, hd, bs, window, max_ctx, sliding)
        if pad:
            poison_unseen(feeds, window, pad)
        model16 = block_attention_model(F16, groups * kvh, kvh, window, softcap)
        model32 = block_attention_model(F32, groups * kvh, kvh, window, softcap)
        gpu = ort.InferenceSession(model16, cpu_opts, providers=["CUDAExecutionProvider"])
        cpu = ort.InferenceSession(model32, cpu_opts, providers=["CPUExecutionProvider"])
        (got,) = gpu.run(None, feeds)
        f32 = {k: v.astype(np.float32) if v.dtype == np.float16 else v for k, v in feeds.items()}
        (want,) = cpu.run(None, f32)
        err = float(np.abs(got.astype(np.float32) - want).max() / max(np.abs(want).max(), 1e-6))
        worst = max(worst, err if np.isfinite(err) else np.inf)
        print(f"{'padded, unseen rows NaN: ' if pad else ''}batch {batch:3d} seq {seq} groups {groups} kv_heads {kvh:2d} head_dim {hd} block {bs:3d} window {window:4d} "
              f"softcap {softcap:4.0f} ctx<={max_ctx}: rel err {err:.1e}")  # fmt: skip
    return worst


def time_pair(ort, lib: str, batch: int, ctx: int, window: int) -> dict:
    """ORT's PagedAttention (its production attributes: q/k norm + RoPE prologue, K/V write) and
    BlockAttention on the same pools, REPEAT layers a graph, GPU kernel time a layer."""
    import torch

    s = SHAPE_27B
    heads, kvh, hd = s["heads"], s["kv_heads"], s["head_dim"]
    opts, providers = timing_session(ort, lib)
    dev = torch.device("cuda")
    pool, tables = random_block_tables(batch, ctx, BLOCK, kvh, hd)
    pos = ctx - 1
    t: dict[str, torch.Tensor] = {
        "qkv": torch.randn(batch, (heads + 2 * kvh) * hd, device=dev, dtype=torch.float16),
        "cumulative": torch.arange(batch + 1, dtype=torch.int32, device=dev),
        "past": torch.full((batch,), pos, dtype=torch.int32, device=dev),
        "tables": tables.to(torch.int32),
        "slots": (tables[:, pos // BLOCK] * BLOCK + pos % BLOCK).to(torch.int32),
    }
    for r in range(REPEAT):
        t[f"k{r}"] = torch.randn(pool, device=dev, dtype=torch.float16)
        t[f"v{r}"] = torch.randn(pool, device=dev, dtype=torch.float16)
        t[f"out{r}"] = torch.empty(batch, heads * hd, device=dev, dtype=torch.float16)
    ours = {
        "q": (t["qkv"][:, : heads * hd] * hd**-0.5).reshape(batch, 1, heads * hd).contiguous(),
        "tables": tables.to(torch.int64),
        "positions": torch.full((batch, 1), pos, dtype=torch.int64, device=dev),
        "lens": torch.full((batch,), ctx, dtype=torch.int64, device=dev),
        "first": torch.zeros(batch, dtype=torch.int64, device=dev),
    }

    results = {}
    # ORT's op
    sess = ort.InferenceSession(attention_model(batch, ctx, window, 2, REPEAT).SerializeToString(), opts, providers=providers)
    b = bind_cuda(sess, {k: v for k, v in t.items()}, [f"out{r}" for r in range(REPEAT)])
    for r in range(REPEAT):
        for kv in "kv":
            x = t[f"{kv}{r}"]
            b.bind_output(f"{kv}{r}_out", "cuda", 0, np.float16, list(x.shape), x.data_ptr())
    b.bind_ortvalue_input("bounds", ort.OrtValue.ortvalue_from_numpy(np.asarray([1, ctx], np.int32)))
    results["ort"] = measure(sess, b)
    del sess, b
    # ours
    sess = ort.InferenceSession(block_attention_model(F16, heads, kvh, window, 0.0, REPEAT), opts, providers=providers)
    names = {**ours, **{f"{kv}{r}": t[f"{kv}{r}"] for r in range(REPEAT) for kv in "kv"}}
    names.update({f"out{r}": t[f"out{r}"].view(batch, 1, heads * hd) for r in range(REPEAT)})
    b = bind_cuda(sess, names, [f"out{r}" for r in range(REPEAT)])
    results["wicore"] = measure(sess, b)
    keys = min(ctx, window) if window else ctx
    gb = batch * keys * kvh * hd * 2 * 2 / 1e9
    for r in results.values():
        r["gb_per_s"] = gb / (r["us_per_layer"] * 1e-6)
    return dict(batch=batch, context=ctx, window=window, kv_gb=gb, **results)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--library", help="a built libwicore_kernels.so (default: build or take the cached one)")
    p.add_argument("--batches", default="1,64,256")
    p.add_argument("--contexts", default="512,4096")
    p.add_argument("--windows", default="0,1024")
    p.add_argument("--json", help="write the timings here")
    p.add_argument("--cases", help="check only these cases: N (the first N) or A:B (Python's slice; the padded ones last)")
    p.add_argument("--no-timing", action="store_true")
    args = p.parse_args(argv)
    ort = onnxruntime()
    start = time.perf_counter()
    lib = args.library or str(library(cuda=True))
    print(f"library {lib} ({time.perf_counter() - start:.1f} s)")
    only = None
    if args.cases:
        a, _, b = args.cases.rpartition(":") if ":" in args.cases else ("", "", args.cases)
        only = slice(int(a) if a else None, int(b) if b else None)
    worst = check(ort, lib, only)
    print(f"worst rel err {worst:.1e}")
    rows = []
    if args.no_timing:
        args.contexts = ""
    for ctx in (int(c) for c in args.contexts.split(",") if c):
        for window in (int(w) for w in args.windows.split(",")):
            for batch in (int(b) for b in args.batches.split(",")):
                r = time_pair(ort, lib, batch, ctx, window)
                rows.append(r)
                o, w = r["ort"], r["wicore"]
                print(
                    f"ctx {ctx:5d} window {window:4d} batch {batch:3d}: wicore {w['us_per_layer']:7.1f} us "
                    f"({w['gb_per_s']:6.0f} GB/s), ORT PagedAttention {o['us_per_layer']:7.1f} us ({o['gb_per_s']:6.0f} GB/s)",
                    flush=True,
                )
    if args.json:
        Path(args.json).write_text(json.dumps({"worst_rel_err": worst, "timings": rows}, indent=1))
    return 1 if worst > 1e-2 or not np.isfinite(worst) else 0


if __name__ == "__main__":
    sys.exit(main())
