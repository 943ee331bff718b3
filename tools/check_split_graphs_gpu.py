"""Why the split's CUDA graphs gave other tokens than the uncaptured split (issue 34): two of ONNX
Runtime's behaviours, checked on two cards, then each partition's values in one decode step.

1. ORT: an input bound on cuda:0 to a session on cuda:1 (the hidden-state handoff session) is
   copied when it is bound: run, change the source, run again on the same binding, then bind again.
2. ORT: the CUDA EP finds a captured graph only on the thread that captured it: captured here on
   buffer A, then run with the same graph id on another thread bound to buffer B (B's values: a
   regular run there; A's: the graph replayed).
3. The model (tools/bench_pipeline_gpu.py's export, two partitions on cuda:0 and cuda:1): the same
   prompts prefilled uncaptured in two ModelGraphs, then decode steps of two groups of rows fed the
   uncaptured run's tokens: per step, the uncaptured partition 0's hidden states and logits against
   the captured bucket's hidden states on cuda:0 (written), on cuda:1 right before partition 1's
   replay (read) and its logits. Variants: "bind once" (the handoff as it was before the fix, rebuilt
   here), "device" (the handoff bound again each step), "host", and "device, groups" (two slots
   captured on the pipeline's workers, the groups' steps from two threads at once).

    PYTHONPATH=/tmp/site:.:tools python3 tools/check_split_graphs_gpu.py --work /tmp/pipe --json split-graphs.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from shape_exports import split_quant_export

from wicore.devices.providers import onnxruntime, parse_device
from wicore.executor.batch import build_batch
from wicore.executor.graphs import SPLIT_GRAPHS_ENV, ModelGraphs
from wicore.graph import io
from wicore.graph.manifest import Manifest
from wicore.kv.buffers import CacheConfig, KVBuffers

BLOCK = 128  # the 27B shape's FlashAttention page (head dim 128)
MAX_CONTEXT = 1024
PROMPTS = (300, 131, 257)  # three rows' prompt lengths: two groups, rows 0 and 1, and row 2


def bind_time_copy() -> dict[str, list[float]]:
    """Fact 1: what a one-node session on cuda:1 hands on from a cuda:0 buffer."""
    from onnx import TensorProto

    from wicore.devices.micrographs import handoff_graph

    ort = onnxruntime()
    card1 = parse_device("cuda:1")
    model = handoff_graph(TensorProto.FLOAT, ("rows", 1, 4)).SerializeToString()
    session = ort.InferenceSession(model, providers=card1.providers())
    src = ort.OrtValue.ortvalue_from_numpy(np.full((1, 1, 4), 1, np.float32), "cuda", 0)
    dst = ort.OrtValue.ortvalue_from_numpy(np.zeros((1, 1, 4), np.float32), "cuda", 1)
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", src)
    binding.bind_ortvalue_output("x_out", dst)
    out = {}
    session.run_with_iobinding(binding)
    out["bound, run"] = dst.numpy().ravel().tolist()
    src.update_inplace(np.full((1, 1, 4), 2, np.float32))
    session.run_with_iobinding(binding)
    out["source set to 2, run again"] = dst.numpy().ravel().tolist()
    binding.bind_ortvalue_input("x", src)
    session.run_with_iobinding(binding)
    out["bound again, run"] = dst.numpy().ravel().tolist()
    return out


def graphs_per_thread() -> dict[str, list[float]]:
    """Fact 2: y = x + 1 captured on this thread (graph id 1, buffer A = 1), then run with graph id 1
    on another thread bound to buffer B = 5."""
    from onnx import TensorProto, helper

    ort = onnxruntime()
    card0 = parse_device("cuda:0")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    one = helper.make_tensor("one", TensorProto.FLOAT, [4], [1.0] * 4)
    graph = helper.make_graph([helper.make_node("Add", ["x", "one"], ["y"])], "add", [x], [y], [one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    session = ort.InferenceSession(model.SerializeToString(), providers=card0.providers(cuda_graphs=True))
    options = ort.RunOptions()
    options.add_run_config_entry("gpu_graph_id", "1")

    def bound(value: float) -> tuple[object, object, object]:
        a = ort.OrtValue.ortvalue_from_numpy(np.full(4, value, np.float32), "cuda", 0)
        b = ort.OrtValue.ortvalue_from_numpy(np.zeros(4, np.float32), "cuda", 0)
        binding = session.io_binding()
        binding.bind_ortvalue_input("x", a)
        binding.bind_ortvalue_output("y", b)
        return binding, a, b

    main, _, out_a = bound(1)
    for _ in range(3):
        session.run_with_iobinding(main, options)
    other, _, out_b = bound(5)
    result: dict[str, list[float]] = {}

    def elsewhere() -> None:
        out_a.update_inplace(np.zeros(4, np.float32))
        session.run_with_iobinding(other, options)
        result["other thread: its output (B + 1 if run there)"] = out_b.numpy().tolist()
        result["other thread: this thread's output (A + 1 if A's graph replayed)"] = out_a.numpy().tolist()

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    return result


def _row(tokens: list[int], start: int, blocks: list[int]) -> SimpleNamespace:
    return SimpleNamespace(token_ids=tokens, start=start, block_table=blocks, window_table=blocks, window_first=0, num_logits=1)


def _graphs(folder: Path, manifest: Manifest, groups: int, devices: list, num_blocks: int, block: int) -> ModelGraphs:
    buffers = KVBuffers(manifest, CacheConfig(num_blocks, block), devices)
    captured = devices[0].capability.name == "cuda"  # a CPU dry run binds the buckets as on cards, uncaptured
    micro = None if groups > 1 else 0
    return ModelGraphs(folder, manifest, buffers, devices, micro_batch_tokens=micro, cuda_graphs=captured, pipeline_groups=groups)


def _bind_once(graphs: ModelGraphs) -> None:
    """The handoff as it was before the fix: the cuda:0 buffer bound to the handoff session once."""
    decode = graphs.decode_graphs
    assert decode is not None
    for slot in decode._slots:
        for bucket in slot:
            for i, handoff in enumerate(bucket.handoffs):
                if handoff is not None:
                    session = decode._handoff_sessions[i]
                    binding = session.io_binding()
                    binding.bind_ortvalue_input("x", bucket.written[i])
                    binding.bind_ortvalue_output("x_out", bucket.read[i])
                    bucket.handoffs[i] = functools.partial(session.run_with_iobinding, binding)


def model_steps(
    folder: Path,
    steps: int,
    devices: list,
    block: int = BLOCK,
    max_context: int = MAX_CONTEXT,
    lengths: tuple[int, ...] = PROMPTS,
) -> dict[str, object]:
    """Fact 3 (the module doc): per variant and step, the largest differences from the uncaptured run."""
    manifest = Manifest.read(folder)
    vocab = manifest.config.vocab_size
    rng = np.random.default_rng(3)
    prompts = [rng.integers(min(1000, vocab // 2), vocab, n).tolist() for n in lengths]
    per_row = max_context // block
    blocks = [list(range(1 + r * per_row, 1 + (r + 1) * per_row)) for r in range(3)]
    num_blocks = 1 + 3 * per_row
    graphs_of = functools.partial(_graphs, folder, manifest, devices=devices, num_blocks=num_blocks, block=block)
    groups = [[0, 1], [2]]

    def prefill(graphs: ModelGraphs) -> list[int]:
        return [int(graphs.run(build_batch([_row(p, 0, b)], block)).logits.argmax(-1)[0]) for p, b in zip(prompts, blocks)]

    def batch(rows: list[int], step: int, tokens: list[list[int]]):
        return build_batch([_row([tokens[r][step]], len(prompts[r]) + step, blocks[r]) for r in rows], block)

    # the uncaptured run, partition by partition: its tokens feed every variant
    os.environ[SPLIT_GRAPHS_ENV] = "device"  # sessions that may capture over two cards, as the variants'
    plain = graphs_of(1)
    tokens = [[t] for t in prefill(plain)]
    want: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (group, step) -> (hidden, logits)
    for step in range(steps):
        for g, rows in enumerate(groups):
            b = batch(rows, step, tokens)
            out0 = plain.run_partition(0, b, None, True, None)
            hidden = out0[io.HIDDEN_STATES_OUT]
            logits = plain.run_partition(1, b, hidden, True, None)[io.LOGITS].numpy()
            want[g, step] = (hidden.numpy().reshape(len(rows), -1).copy(), logits.copy())
            for r, t in zip(rows, logits.argmax(-1).tolist()):
                tokens[r].append(int(t))
    plain.close()
    del plain

    report: dict[str, object] = {}
    for variant, handoff, slots in (
        ("bind once", "device", 1), ("device", "device", 1), ("host", "host", 1), ("device, groups", "device", 2),
    ):  # fmt: skip
        os.environ[SPLIT_GRAPHS_ENV] = handoff
        graphs = graphs_of(slots)
        try:
            first = prefill(graphs)
            graphs.enable_decode_graphs(block, 4, per_row, per_row, max_context)
            if variant == "bind once":
                _bind_once(graphs)
            rows_out: list[dict[str, object]] = []
            lock = threading.Lock()

            def run(g: int, step: int, graphs: ModelGraphs = graphs, rows_out: list = rows_out, lock=lock) -> None:
                rows = groups[g]
                got = graphs.run(batch(rows, step, tokens), True).logits
                decode = graphs.decode_graphs
                bucket = next(b for b in decode._slot() if b.rows >= len(rows))
                written = bucket.written[0].numpy()[: len(rows)].reshape(len(rows), -1)
                read = bucket.read[0].numpy()[: len(rows)].reshape(len(rows), -1)
                hidden, logits = want[g, step]
                with lock:
                    rows_out.append({
                        "group": g, "step": step,
                        "hidden cuda:0 - uncaptured": float(np.abs(written - hidden).max()),
                        "hidden cuda:1 - cuda:0": float(np.abs(read - written).max()),
                        "logits - uncaptured": float(np.abs(got - logits).max()),
                        "argmax equal": bool((got.argmax(-1) == logits.argmax(-1)).all()),
                    })  # fmt: skip

            if slots == 1:
                for step in range(steps):
                    for g in range(len(groups)):
                        run(g, step)
            else:  # the groups' steps at once, a thread a group (each keeps its slot)
                barrier = threading.Barrier(len(groups))

                def group(g: int, barrier: threading.Barrier = barrier) -> None:
                    for step in range(steps):
                        barrier.wait()
                        run(g, step)

                threads = [threading.Thread(target=group, args=(g,)) for g in range(len(groups))]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
            rows_out.sort(key=lambda r: (r["step"], r["group"]))
            report[variant] = {"prefill tokens as uncaptured": first == [t[0] for t in tokens], "steps": rows_out}
        except Exception as exc:  # the other variants still run
            report[variant] = {"failed": repr(exc)}
        finally:
            graphs.close()
            del graphs
        print(variant, json.dumps(report[variant])[:2000], flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/wicore-pipeline"))
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    record: dict[str, object] = {}
    for name, check in (("bind-time copy", bind_time_copy), ("graphs per thread", graphs_per_thread)):
        try:
            record[name] = check()
        except Exception as exc:
            record[name] = {"failed": repr(exc)}
        print(name, json.dumps(record[name]), flush=True)
    model = split_quant_export("gemma3-27b", args.layers, 4, args.work)
    record["model"] = model_steps(model, args.steps, [parse_device("cuda:0"), parse_device("cuda:1")])
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=1))
    fixed = [v for k, v in record["model"].items() if k != "bind once"]  # type: ignore[union-attr]
    ok = all("steps" in v and all(s["argmax equal"] for s in v["steps"]) for v in fixed)
    print("fixed variants give the uncaptured tokens:", ok, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
