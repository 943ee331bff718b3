"""Where do two runs of seeded sampling first differ: the logits, the sampling head, or the host?

Issue 32: on an H200 (CUDA EP, fp16 paged export, CUDA graphs) 19 of 24 seeded requests drew other
tokens in two plain runs, greedy ones never moved. With random weights the tempered distribution
over 262K tokens is near flat, so one ulp anywhere before the draw moves a token. This tool runs one
fixed workload (seeded rows at temperature 1, a few greedy ones, prompts of varied length, every
request added before the first step, so every run steps the same rows) through the real engine,
`--runs` engines one after the other in this process, and records for each request at each step
that drew: the uniform its seeded generator gave (the host), a digest of its logits row and of its
rows of each partition's hidden states (the device's model), the head's token (the head) and, with
`--rerun-head`, the token of the head run again on the same device logits. `--dump` writes a run's
records, `--compare A B` compares two dumps (two processes). The first divergence is named by kind:

    uniforms differ                     -> the host (the seeded generators, the order of draws)
    logits (or hidden states) differ    -> the model's kernels; the first partition that differs
                                           (export with one layer a partition to name the layer)
    logits equal, tokens differ         -> the sampling head

`--head-only`: the head alone (wicore.graph.sampling.head_model) on the device, the same near-flat
logits [rows, vocab] and uniforms `--repeats` times, in two sessions: are its outputs bitwise equal?
`--relaunch` launches each captured decode step twice on the same inputs: the model's repeatability
in place. `--runs 3` compares run 0 with 1 and 1 with 2 (a first engine that alone differs: memory it
found fresh where later engines find their predecessor's). `--make-export 26` first exports the
random 1B of tools/gpu_async_bench.sh in one layer a partition, so that hidden states name the
layer. Switches worth an A/B: `--cuda-graphs off`, WICORE_CUDA_SHARED_ARENA=0 (each session its own
arena: the head and prefills then never reuse a graph's scratch), CUBLAS_WORKSPACE_CONFIG=:4096:8.

What ONNX Runtime's CUDA sources say about the head's kernels (microsoft/onnxruntime, read 2026-11-29,
recent main; not run): ReduceSum over the last axis takes reduce_matrix_columns (fast_reduction_),
a fixed-order tree whose last block sums the per-block partials (an atomic counter picks which
block, not the order): run-to-run exact. Only reduce_matrix_rows (leading axes, not ours) adds with
atomics. An int64 ReduceSum (the head's counts) goes through float32 cudnnReduceTensor: exact below
2^24. CumSum sums each prefix serially (exact, repeatable); TopK (radix, hybrid or small-K paths)
counts with integer atomics and writes by prefix sums: repeatable values and order. GEMMs: cuBLAS
promises bitwise-equal results run to run on one GPU model when one stream is active (its docs,
"Results reproducibility"; concurrent streams may pick other workspaces: CUBLAS_WORKSPACE_CONFIG
or a handle per stream); ORT's GEMM auto-tuner (timing cuBLAS against a small-N GEMV per shape,
which could pick differently per process) is off unless ep.cuda.enable_gemm_auto_tune or
ORT_CUDA_GEMM_AUTO_TUNE is set. So nothing in the head is expected to vary; the tool checks.

    PYTHONPATH=. python3 tools/check_determinism_gpu.py --model M [--devices cuda:0] [--cuda-graphs on]
    PYTHONPATH=. python3 tools/check_determinism_gpu.py --model M --runs 1 --dump a.json   (twice)
    PYTHONPATH=. python3 tools/check_determinism_gpu.py --compare a.json b.json
    PYTHONPATH=. python3 tools/check_determinism_gpu.py --model M --head-only [--rows 24]

Exit 0: no divergence (or the head's outputs equal), 1: a divergence, named.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from determinism_records import Record, Run, digest, dump, head_disagreements, load, relaunch_disagreements, report

from wicore.engine.config import EngineConfig
from wicore.engine.core import EngineCore
from wicore.graph import io
from wicore.graph.manifest import Manifest
from wicore.types.sampling import SamplingParams


def workload(args: argparse.Namespace, vocab: int) -> list[tuple[list[int], SamplingParams]]:
    """Seeded whole-distribution rows (the head draws them) and greedy ones, prompts of 9 to 120 tokens."""
    num_sampled, num_greedy, new_tokens = args.sampled, args.greedy, args.new_tokens
    rng = np.random.default_rng(0)
    out = []
    for i in range(num_sampled + num_greedy):
        prompt = rng.integers(3, vocab, 9 + (37 * i) % 112).tolist()
        if i < num_sampled:
            params = SamplingParams(max_tokens=new_tokens, temperature=args.temperature, seed=i, ignore_eos=True)
        else:
            params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
        out.append((prompt, params))
    return out


class Recorder:
    """Records what each step's batches drew. The tool's only hooks into the engine: the runner's
    `run_device`, the graphs' `run` and `run_partition`, replaced on those instances (the engine's
    code and its other users are untouched): each batch's rows, sampling inputs and outputs are read
    after the device ran it, the logits copied from where the graph left them."""

    def __init__(self, core: EngineCore, rerun_head: bool, relaunch: bool) -> None:
        self.run = Run()
        self.step = 0  # the device steps run so far (with async scheduling they run on a worker thread)
        self.rerun_head = rerun_head
        self.relaunch = relaunch
        runner, graphs = core.runner, core.runner.graphs
        self.graphs = graphs
        self._hidden: list[list[np.ndarray]] = []  # per batch of the step: each uncaptured partition's hidden states
        run_device, run_graphs, run_partition = runner.run_device, graphs.run, graphs.run_partition

        def recorded_partition(*args: Any, **kwargs: Any) -> dict[str, Any]:
            out = run_partition(*args, **kwargs)
            if io.HIDDEN_STATES_OUT in out:
                self._hidden[-1].append(out[io.HIDDEN_STATES_OUT].numpy().copy())
            return out

        def recorded_graphs(*args: Any, **kwargs: Any) -> Any:
            self._hidden.append([])
            return run_graphs(*args, **kwargs)

        def recorded_device(step: Any, previous: Any = None, **kwargs: Any) -> Any:
            self._hidden = []
            device = run_device(step, previous, **kwargs)
            for prepared, out, hidden in zip(step.batches, device.outputs, self._hidden):
                self.note(prepared, out, hidden)
            self.step += 1
            return device

        runner.run_device = recorded_device  # type: ignore[method-assign]
        graphs.run = recorded_graphs  # type: ignore[method-assign]
        graphs.run_partition = recorded_partition  # type: ignore[method-assign]

    def note(self, prepared: Any, out: Any, hidden: list[np.ndarray]) -> None:
        """The batch's rows that sample, if the head ran for it (a greedy-only batch reads no logits)."""
        if out.draws is None:
            return
        logits = out.read_logits()
        replay = prepared.replay
        if replay is not None:  # a replayed bucket: each partition's hidden states in its buffers (copied)
            hidden = [np.array(w.numpy()[: replay.rows]) for w in replay.bucket.written]
            device_logits = replay.bucket.outputs[io.LOGITS]
        else:
            device_logits = out.unread_logits
        again = None
        if self.rerun_head and self.graphs.head is not None and hasattr(device_logits, "shape"):
            again = self.graphs.head.run(device_logits, prepared.sampling)[io.SAMPLED_TOKENS].numpy()
        relaunched = None
        if self.relaunch and replay is not None and self.graphs.decode_graphs is not None:
            # the same inputs (its host side is unchanged), the new tokens' KV written again where they were
            relaunched = [self.graphs.decode_graphs.launch(replay, True).read_logits()]
            relaunched += [np.array(w.numpy()[: replay.rows]) for w in replay.bucket.written]
        offset = 0
        for i, row in enumerate(prepared.rows):
            offset += row.num_logits
            if not row.needs_sample or row.draft_ids:
                continue
            at = offset - 1
            drawn = row.request_id in prepared.drawn
            token = int(out.draws.tokens[at]) if drawn else int(out.greedy_tokens[at])
            rows = [np.asarray(logits[at], np.float32), *(np.asarray(h[i]) for h in hidden)]
            record = Record(
                self.step,
                row.request_id,
                float(prepared.sampling.uniform[at]) if drawn else 0.0,
                digest(rows[0]),
                [digest(h) for h in rows[1:]],
                token,
                int(again[at]) if again is not None and drawn else None,
                None if relaunched is None else [digest(relaunched[0][at]), *(digest(h[i]) for h in relaunched[1:])],
            )
            self.run.records.append(record)
            self.run.rows[(record.step, record.request)] = rows


def run_engine(args: argparse.Namespace, label: str) -> Run:
    """The workload through one engine, stepped by hand (every request added before the first step)."""
    manifest = Manifest.read(args.model)
    graphs = {"on": True, "off": False, "auto": None}[args.cuda_graphs]
    config = EngineConfig(
        model_dir=args.model,
        devices=args.devices,
        cuda_graphs=graphs,
        block_size=args.block_size,
        kv_pool_gb=args.kv_pool_gb,
        verify_files=False,
        async_scheduling=args.async_scheduling == "on",
        num_threads=args.threads,
    )
    started = time.perf_counter()
    core = EngineCore(config)
    if args.buckets:  # on the CPU EP (graph ids ignored): the replayed path's recording, testable here
        bs, context = core.layout.block_size, core.max_sequence_tokens
        window = -(-core.manifest.config.sliding_window // bs) + 2 if core.layout.has_window else 1
        core.runner.graphs.enable_decode_graphs(bs, core.scheduler.config.max_num_seqs, -(-context // bs), window, context)
    recorder = Recorder(core, args.rerun_head, args.relaunch)
    try:
        for i, (prompt, params) in enumerate(workload(args, manifest.config.vocab_size)):
            core.add(core.make_request(prompt, params, f"{'s' if params.seed is not None else 'g'}{i}"))
        while core.has_work:
            for out in core.step():
                recorder.run.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
    finally:
        core.close()
    run = recorder.run
    seconds = time.perf_counter() - started
    print(f"{label}: {len(run.records)} rows recorded over {recorder.step} steps ({seconds:.0f} s)", flush=True)
    return run


def make_export(model: Path, partitions: int) -> None:
    """The random Gemma 3 1B of tools/gpu_async_bench.sh (fp16, paged, sampling head) in `partitions`
    partitions: one layer a partition names the first layer whose output differs."""
    from wicore.export.exporter import ExportConfig, export_model
    from wicore.export.random_weights import RandomFloatSource
    from wicore.model.config import DecoderConfig
    from wicore.model.shapes import hf_config

    source = RandomFloatSource(DecoderConfig.from_hf({"model_type": "gemma3_text", **hf_config("gemma3-1b")}))
    config = ExportConfig(dtype="fp16", attention="paged", sampling_head="on", num_partitions=partitions, overwrite=True)
    export_model(source, model, config, progress=lambda _: None)
    print(f"exported the random Gemma 3 1B in {partitions} partitions to {model}", flush=True)


def cuda_waits(devices: str) -> None:
    """Say which CUDA runtime the engine waits for a replay with: none, and the sampling head could read
    logits a replayed graph is still writing (wicore.executor.device_wait)."""
    if devices.startswith("cuda"):
        from wicore.executor.device_wait import cuda_runtime

        runtime = cuda_runtime()
        print(f"CUDA runtime for the waits after a replay: {runtime._name if runtime is not None else 'NONE FOUND'}")


def head_only(args: argparse.Namespace) -> int:
    """The head alone on the device, the same inputs `--repeats` times in each of two sessions."""
    from wicore.devices.providers import onnxruntime, parse_device
    from wicore.executor.graph_io import SamplingInputs
    from wicore.executor.sampling_head import HEAD_OUTPUTS, SamplingHead

    ort = onnxruntime()
    device = parse_device(args.devices)
    vocab = Manifest.read(args.model).config.vocab_size if args.model else args.vocab
    rng = np.random.default_rng(1)
    logits = (rng.standard_normal((args.rows, vocab)) * 0.05).astype(np.float32)  # near flat, as random weights give
    sampling = SamplingInputs(np.ones(args.rows, np.float32), rng.random(args.rows).astype(np.float32))
    value = ort.OrtValue.ortvalue_from_numpy(logits, *device.ort_device)
    first = None
    failed = 0
    for session in (1, 2):
        head = SamplingHead(vocab, device)
        for repeat in range(args.repeats):
            out = {k: v.numpy() for k, v in head.run(value, sampling).items()}
            if first is None:
                first = out
            moved = [k for k in HEAD_OUTPUTS if not np.array_equal(out[k], first[k])]
            if moved:
                failed += 1
                rows = np.flatnonzero(out[io.SAMPLED_TOKENS] != first[io.SAMPLED_TOKENS]).tolist()
                print(f"session {session}, repeat {repeat}: {', '.join(moved)} differ from the first run (token rows {rows})")
    print(f"head alone on {args.devices}, {args.rows} x {vocab}: {failed} of {2 * args.repeats} runs differ from the first")
    # a larger batch (a CUDA graph's larger bucket): each row's outputs should not depend on the others
    wider = np.concatenate([logits, (rng.standard_normal((8, vocab)) * 0.05).astype(np.float32)])
    out = {
        k: v.numpy()[: args.rows]
        for k, v in head.run(ort.OrtValue.ortvalue_from_numpy(wider, *device.ort_device), sampling).items()
    }
    moved = [k for k in HEAD_OUTPUTS if not np.array_equal(out[k], first[k])]
    print(f"the same rows with 8 more beside them: {', '.join(moved) + ' differ' if moved else 'the same outputs'}")
    return 1 if failed or moved else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--devices", default="cuda:0")
    parser.add_argument("--cuda-graphs", choices=("on", "off", "auto"), default="on")
    parser.add_argument("--buckets", action="store_true", help="CPU: decode steps through the CUDA graphs' buckets")
    parser.add_argument("--async-scheduling", choices=("on", "off"), default="off")
    parser.add_argument("--runs", type=int, default=2, help="engines one after the other in this process")
    parser.add_argument("--sampled", type=int, default=24)
    parser.add_argument("--greedy", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=40)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--make-export", type=int, metavar="PARTITIONS", help="export the random 1B to --model first")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--kv-pool-gb", type=float, default=4.0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rerun-head", action="store_true", help="run the head twice a step, on the same logits")
    parser.add_argument("--relaunch", action="store_true", help="launch each captured step twice, on the same inputs")
    parser.add_argument("--dump", type=Path, help="write the first run's records (json)")
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("A", "B"), help="compare two dumps, run nothing")
    parser.add_argument("--rows-out", type=Path, help="FILE.npz: the first divergent row of both runs (FILE.0-1.npz, ...)")
    parser.add_argument("--head-only", action="store_true")
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--vocab", type=int, default=262144, help="--head-only without --model")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    if args.compare:
        return report(load(args.compare[0]), load(args.compare[1]), "dumps")
    if args.head_only:
        return head_only(args)
    if args.model is None:
        parser.error("--model is required (but with --compare, or --head-only with --vocab)")
    if args.make_export:
        make_export(args.model, args.make_export)
    if args.cuda_graphs == "on" and not args.devices.startswith("cuda"):
        args.cuda_graphs = "off"  # captured steps are the CUDA EP's
    runs = []
    for k in range(args.runs):
        runs.append(run_engine(args, f"run {k}"))
        if k == 0:
            cuda_waits(args.devices)
    if args.dump:
        dump(runs[0], args.dump)
    failed = 0
    for k, run in enumerate(runs):
        if again := head_disagreements(run):
            print(f"run {k}: the head run again on the same logits gave other tokens at {len(again)} rows: {again[:6]}")
            failed = 1
        if again := relaunch_disagreements(run):
            print(
                f"run {k}: the captured step launched again gave other logits or hidden states at {len(again)} rows: {again[:6]}"
            )
            failed = 1
    for k in range(1, len(runs)):
        rows_out = args.rows_out.with_suffix(f".{k - 1}-{k}.npz") if args.rows_out else None  # one file a comparison
        failed |= report(runs[k - 1], runs[k], f"run {k - 1} against run {k}", rows_out)
    return failed


if __name__ == "__main__":
    sys.exit(main())
