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

    PYTHONPATH=. python3 tools/check_determinism_gpu.py --model M [--devices cuda:0] [--cuda-graphs on]
    PYTHONPATH=. python3 tools/check_determinism_gpu.py --model M --runs 1 --dump a.json   (twice)
    PYTHONPATH=. python3 tools/check_determinism_gpu.py --compare a.json b.json
    PYTHONPATH=. python3 tools/check_determinism_gpu.py --model M --head-only [--rows 24]

Exit 0: no divergence (or the head's outputs equal), 1: a divergence, named.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wicore.engine.config import EngineConfig
from wicore.engine.core import EngineCore
from wicore.graph import io
from wicore.graph.manifest import Manifest
from wicore.types.sampling import SamplingParams


@dataclass
class Record:
    """One request's row at one step that ran the sampling head."""

    step: int  # the engine's step (counted from 0 in each run)
    request: str
    uniform: float  # float32 as the head took it (0 for a greedy row)
    logits: str  # digest of the row's float32 logits
    hidden: list[str]  # digest of the row's hidden states after each partition but the last
    token: int  # the head's draw (a sampled row) or the graph's argmax (a greedy one)
    head_again: int | None = None  # --rerun-head: the head's draw, run again on the same logits


@dataclass
class Run:
    records: list[Record] = field(default_factory=list)
    tokens: dict[str, list[int]] = field(default_factory=dict)  # what the engine returned


def digest(array: Any) -> str:
    """The first 16 hex digits of the sha1 of an array's bytes (float32 rows: bitwise equality)."""
    return hashlib.sha1(np.ascontiguousarray(array).tobytes()).hexdigest()[:16]


def workload(vocab: int, num_sampled: int, num_greedy: int, new_tokens: int) -> list[tuple[list[int], SamplingParams]]:
    """Seeded whole-distribution rows (the head draws them) and greedy ones, prompts of 9 to 120 tokens."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(num_sampled + num_greedy):
        prompt = rng.integers(3, vocab, 9 + (37 * i) % 112).tolist()
        if i < num_sampled:
            params = SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=i, ignore_eos=True)
        else:
            params = SamplingParams(max_tokens=new_tokens, ignore_eos=True)
        out.append((prompt, params))
    return out


class Recorder:
    """Records what each step's batches drew. The tool's only hooks into the engine: the runner's
    `run_device` and the graphs' `run_partition`, replaced on those instances (the engine's code and
    its other users are untouched): each batch's rows, sampling inputs and outputs are read after the
    device ran it, the logits copied from where the graph left them."""

    def __init__(self, core: EngineCore, rerun_head: bool) -> None:
        self.run = Run()
        self.step = 0
        self.rerun_head = rerun_head
        runner, graphs = core.runner, core.runner.graphs
        self.graphs = graphs
        self._hidden: list[np.ndarray] = []  # this batch's hidden states, uncaptured partitions
        run_device, run_partition = runner.run_device, graphs.run_partition

        def recorded_partition(*args: Any, **kwargs: Any) -> dict[str, Any]:
            out = run_partition(*args, **kwargs)
            if io.HIDDEN_STATES_OUT in out:
                self._hidden.append(out[io.HIDDEN_STATES_OUT].numpy().copy())
            return out

        def recorded_device(step: Any, previous: Any = None) -> Any:
            self._hidden = []
            device = run_device(step, previous)
            for prepared, out in zip(step.batches, device.outputs):
                self.note(prepared, out)
            return device

        runner.run_device = recorded_device  # type: ignore[method-assign]
        graphs.run_partition = recorded_partition  # type: ignore[method-assign]

    def note(self, prepared: Any, out: Any) -> None:
        """The batch's rows that sample, if the head ran for it (a greedy-only batch reads no logits)."""
        if out.draws is None:
            return
        logits = out.read_logits()
        replay = prepared.replay
        if replay is not None:  # a replayed bucket: each partition's hidden states in its buffers
            hidden = [w.numpy()[: replay.rows] for w in replay.bucket.written]
            device_logits = replay.bucket.outputs[io.LOGITS]
        else:
            hidden = self._hidden[: len(self.graphs.sessions) - 1]
            device_logits = out.unread_logits
        again = None
        if self.rerun_head and self.graphs.head is not None and hasattr(device_logits, "shape"):
            again = self.graphs.head.run(device_logits, prepared.sampling)[io.SAMPLED_TOKENS].numpy()
        offset = 0
        for i, row in enumerate(prepared.rows):
            offset += row.num_logits
            if not row.needs_sample or row.draft_ids:
                continue
            at = offset - 1
            drawn = row.request_id in prepared.drawn
            token = int(out.draws.tokens[at]) if drawn else int(out.greedy_tokens[at])
            record = Record(
                self.step,
                row.request_id,
                float(prepared.sampling.uniform[at]) if drawn else 0.0,
                digest(np.asarray(logits[at], np.float32)),
                [digest(h[i]) for h in hidden],
                token,
                int(again[at]) if again is not None and drawn else None,
            )
            self.run.records.append(record)


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
        async_scheduling=False,
        num_threads=args.threads,
    )
    core = EngineCore(config)
    recorder = Recorder(core, args.rerun_head)
    try:
        for i, (prompt, params) in enumerate(workload(manifest.config.vocab_size, args.sampled, args.greedy, args.new_tokens)):
            core.add(core.make_request(prompt, params, f"{'s' if params.seed is not None else 'g'}{i}"))
        while core.has_work:
            for out in core.step():
                recorder.run.tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            recorder.step += 1
    finally:
        core.close()
    run = recorder.run
    print(f"{label}: {len(run.records)} rows recorded over {recorder.step} steps", flush=True)
    return run


def first_divergence(a: Run, b: Run) -> str | None:
    """The first record (by step, then request) where two runs differ, named by kind; None: none."""
    keyed = {(r.step, r.request): r for r in b.records}
    for x in a.records:
        y = keyed.get((x.step, x.request))
        where = f"step {x.step}, request {x.request}"
        if y is None:
            return f"schedule: {where} ran in the first run only"
        if x.uniform != y.uniform:
            return f"host: {where}: uniforms differ ({x.uniform!r} against {y.uniform!r})"
        if x.hidden != y.hidden:
            part = next(k for k, (h, g) in enumerate(zip(x.hidden, y.hidden)) if h != g)
            return f"logits: {where}: hidden states after partition {part} differ (the model's kernels)"
        if x.logits != y.logits:
            return f"logits: {where}: logits differ, hidden states equal (the last partition's kernels)"
        if x.token != y.token:
            return f"head: {where}: logits equal, tokens differ ({x.token} against {y.token})"
    if len(b.records) != len(a.records):
        return f"schedule: {len(a.records)} rows recorded against {len(b.records)}"
    if a.tokens != b.tokens:
        return "tokens: the engine returned other tokens, every recorded row equal (a row drawn on the host)"
    return None


def head_disagreements(run: Run) -> list[str]:
    """--rerun-head: rows whose head gave another token when run again on the same logits."""
    return [f"step {r.step}, {r.request}" for r in run.records if r.head_again is not None and r.head_again != r.token]


def report(a: Run, b: Run, label: str) -> int:
    differ = sorted(k for k in a.tokens if a.tokens[k] != b.tokens.get(k))
    print(f"{label}: requests whose tokens differ: {len(differ)} of {len(a.tokens)} {differ[:12]}")
    found = first_divergence(a, b)
    print(f"{label}: first divergence: {found or 'no divergence'}")
    return 0 if found is None else 1


def dump(run: Run, path: Path) -> None:
    path.write_text(json.dumps({"records": [asdict(r) for r in run.records], "tokens": run.tokens}))


def load(path: Path) -> Run:
    data = json.loads(path.read_text())
    return Run([Record(**r) for r in data["records"]], data["tokens"])


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
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--devices", default="cuda:0")
    parser.add_argument("--cuda-graphs", choices=("on", "off", "auto"), default="on")
    parser.add_argument("--runs", type=int, default=2, help="engines one after the other in this process")
    parser.add_argument("--sampled", type=int, default=24)
    parser.add_argument("--greedy", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=40)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--kv-pool-gb", type=float, default=4.0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rerun-head", action="store_true", help="run the head twice a step, on the same logits")
    parser.add_argument("--dump", type=Path, help="write the first run's records (json)")
    parser.add_argument("--compare", type=Path, nargs=2, metavar=("A", "B"), help="compare two dumps, run nothing")
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
    if args.cuda_graphs == "on" and not args.devices.startswith("cuda"):
        args.cuda_graphs = "off"  # captured steps are the CUDA EP's
    runs = [run_engine(args, f"run {k}") for k in range(args.runs)]
    if args.dump:
        dump(runs[0], args.dump)
    failed = 0
    for k, run in enumerate(runs):
        if again := head_disagreements(run):
            print(f"run {k}: the head run again on the same logits gave other tokens at {len(again)} rows: {again[:6]}")
            failed = 1
    for k in range(1, len(runs)):
        failed |= report(runs[0], runs[k], f"run 0 against run {k}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
