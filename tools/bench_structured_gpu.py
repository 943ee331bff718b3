"""Constrained decoding on a GPU (issue 31): a batch of sampled streams, none, half or all of them
constrained to a JSON schema, at a named Gemma 3's real shapes with random weights.

    export   --layers layers of random fp16 weights at --shape (wicore.export.random_weights; the
             last layer full attention, as the engine needs one), paged attention, the sampling
             head; the tokenizer and its manifest entry copied from --tokenizer-from (a WiCore
             export with one, e.g. the packaged Gemma 3 270M: the same 262K-token vocabulary)
    runs     one engine; --batch requests at once, each mode in turn, --repeats times alternating:
               free        every row draws in the sampling head
               half        even rows constrained to SCHEMA, their masks bound into the head
               all         every row constrained
               half-host   as half, with a head built without the mask input (constrained rows
               all-host    read the batch's logits back and sample on the host: before issue 31's
                           GPU half, and what an older head still does)
             a step is timed around EngineCore.step() (schedule, graphs, head, masks' waits,
             update), only where every row decodes one token; tok/s = batch / median step

SCHEMA (tools/workloads.SERVING_SCHEMA) cannot be complete before max_tokens, so constrained
streams decode as long as free ones (which set ignore_eos).

Usage (GPU machine, onnxruntime-gpu under /tmp/site, docs/HARDWARE.md):
    PYTHONPATH=/tmp/site:.:tools python3 tools/bench_structured_gpu.py --tokenizer-from /tmp/tok \\
        --work /tmp/sg --batch 64 --json structured-gpu.json
CPU smoke test (fp32, portable attention: the head runs on the CPU EP):
    python tools/bench_structured_gpu.py --shape gemma3-1b --layers 1 --dtype fp32 --attention portable \\
        --devices cpu --batch 4 --steps 3 --tokenizer-from DIR --work /tmp/sg
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from workloads import SERVING_SCHEMA

from wicore.engine.engine import Engine, EngineConfig
from wicore.engine.scheduler import SchedulerConfig
from wicore.executor.sampling_head import SamplingHead
from wicore.export.exporter import ExportConfig, export_model
from wicore.export.random_weights import RandomFloatSource
from wicore.graph.manifest import MANIFEST as MANIFEST_FILE
from wicore.model.config import DecoderConfig
from wicore.model.shapes import hf_config
from wicore.structured.spec import StructuredKind, StructuredOutput
from wicore.types.sampling import SamplingParams

MODES = ("free", "half", "all", "half-host", "all-host")
NUM_WARMUP_STEPS = 3
STAGGER_SLACK = 16


@dataclass(frozen=True)
class Config:
    shape: str
    layers: int
    batch: int
    steps: int
    repeats: int
    context: int
    temperature: float
    dtype: str
    attention: str
    devices: str
    cuda_graphs: bool
    tokenizer_from: Path
    work: Path
    json_path: Path | None
    export_only: bool = False


def export(config: Config) -> Path:
    out = config.work / f"{config.shape}-{config.layers}l-{config.dtype}-{config.attention}"
    if (out / MANIFEST_FILE).is_file():
        return out
    hf = hf_config(config.shape, config.layers)
    types = list(hf["layer_types"])  # type: ignore[call-overload]
    types[-1] = "full_attention"
    hf["layer_types"] = types
    source = RandomFloatSource(DecoderConfig.from_hf({"model_type": "gemma3_text", **hf}))
    settings = ExportConfig(dtype=config.dtype, attention=config.attention, sampling_head="on", overwrite=True)
    start = time.perf_counter()
    export_model(source, out, settings, progress=lambda _: None)
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    donor = json.loads((config.tokenizer_from / MANIFEST_FILE).read_text())
    for name in donor["tokenizer"]["files"]:
        shutil.copy(config.tokenizer_from / name, out / name)
    manifest["tokenizer"] = donor["tokenizer"]
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
    print(f"exported {out.name} in {time.perf_counter() - start:.0f} s", flush=True)
    return out


def params_of(mode: str, config: Config, max_tokens: int) -> list[SamplingParams]:
    schema = StructuredOutput(StructuredKind.JSON, json.dumps(SERVING_SCHEMA), "guided_json")
    out = []
    for i in range(config.batch):
        constrained = mode.startswith("all") or (mode.startswith("half") and i % 2 == 0)
        out.append(
            SamplingParams(
                max_tokens=max_tokens,
                temperature=config.temperature,
                seed=i,
                ignore_eos=not constrained,
                structured=schema if constrained else None,
            )
        )
    return out


def run_mode(engine: Engine, mode: str, config: Config) -> dict[str, Any]:
    """Median step ms where every row decodes, for `mode`'s batch (the engine's head swapped for
    one without the mask input in the -host modes)."""
    graphs = engine.core.runner.graphs
    assert graphs.head is not None, "an export without the sampling head"
    masked_head = graphs.head
    if mode.endswith("-host"):
        graphs.head = SamplingHead(graphs.manifest.config.vocab_size, graphs.devices[-1], token_bitmask=False)
    try:
        rng = np.random.default_rng(0)
        # slack: constrained rows start a step or two after free ones (their grammar compiles
        # first), and only steps where every row decodes are timed
        max_tokens = 2 + NUM_WARMUP_STEPS + config.steps + STAGGER_SLACK
        vocab = graphs.manifest.config.vocab_size
        core = engine.core  # driven here, step by step (the engine's loop thread is not started)
        mask_stats = core.runner.masks.stats
        waits_before, wait_s_before = mask_stats.num_waits, mask_stats.wait_seconds
        ids = []
        for i, p in enumerate(params_of(mode, config, max_tokens)):
            ids.append(f"{mode}-{i}")
            core.add(core.make_request(rng.integers(1000, vocab, config.context).tolist(), p, ids[-1]))
        steps, num_decodes, num_tokens, num_finished = [], 0, 0, 0
        start = time.perf_counter()
        while num_finished < len(ids):
            t = time.perf_counter()
            outputs = core.step()
            seconds = time.perf_counter() - t
            errors = [o.error for o in outputs if o.finish_reason == "error"]
            if errors:
                raise RuntimeError(f"{mode}: a request failed: {errors[0]}")
            num_tokens += sum(len(o.new_token_ids) for o in outputs)
            num_finished += sum(o.finished for o in outputs)
            trace = core.last_step
            if len(trace.rows) == config.batch and all(len(r.token_ids) == 1 for r in trace.rows):
                num_decodes += 1
                if NUM_WARMUP_STEPS < num_decodes <= NUM_WARMUP_STEPS + config.steps:
                    steps.append(seconds)
        wall = time.perf_counter() - start
        if len(steps) != config.steps:
            raise RuntimeError(f"{mode}: {num_decodes} steps had every row decoding, {config.steps} timed ones needed")
    finally:
        graphs.head = masked_head
    step = statistics.median(steps)
    return {
        "mode": mode,
        "batch": config.batch,
        "step_ms_median": 1000 * step,
        "step_ms_min": 1000 * min(steps),
        "decode_tok_s": config.batch / step,
        "tokens": num_tokens,
        "wall_tok_s": num_tokens / wall,  # prefill and the grammar compiles included
        # steps whose sampling waited for the grammar masks after the graphs had run, and how long
        "mask_waits": mask_stats.num_waits - waits_before,
        "mask_wait_ms": 1000 * (mask_stats.wait_seconds - wait_s_before),
    }


def run(config: Config) -> int:
    model_dir = export(config)
    if config.export_only:
        return 0
    engine_config = EngineConfig(
        model_dir=model_dir,
        num_threads=1,
        devices=config.devices,
        num_host_blocks=0,
        num_nvme_blocks=0,
        enable_prefix_cache=False,
        verify_files=False,  # the tokenizer was copied in after the export
        cuda_graphs=config.cuda_graphs,
        scheduler=SchedulerConfig(max_num_seqs=config.batch),
        async_scheduling=False,  # each step timed alone around EngineCore.step()
    )
    records: list[dict[str, Any]] = []
    with Engine(engine_config) as engine:
        start = time.perf_counter()
        engine.grammars.compiler  # noqa: B018  (the vocabulary bridge: seconds, once, not in a run)
        print(f"vocabulary bridge in {time.perf_counter() - start:.1f} s", flush=True)
        warm = replace(config, steps=2)
        run_mode(engine, "half", warm)  # compiles the schema, captures the graphs, loads the kernels
        run_mode(engine, "half-host", warm)
        for repeat in range(config.repeats):
            for mode in MODES:
                record = run_mode(engine, mode, config) | {"repeat": repeat}
                records.append(record)
                print(json.dumps(record), flush=True)
    summary = []
    for mode in MODES:
        mine = [r for r in records if r["mode"] == mode]
        step = statistics.median(r["step_ms_median"] for r in mine)
        summary.append({"mode": mode, "step_ms": step, "decode_tok_s": config.batch / (step / 1000)})
    free = summary[0]["step_ms"]
    print(f"\n{config.shape}, {config.layers} layers, batch {config.batch}, temperature {config.temperature}")
    print("| mode | step ms (median of repeats) | decode tok/s | vs free |")
    print("|---|---:|---:|---:|")
    for s in summary:
        print(f"| {s['mode']} | {s['step_ms']:.2f} | {s['decode_tok_s']:.0f} | {free / s['step_ms']:.2f}x |")
    if config.json_path is not None:
        meta = {k: str(v) if isinstance(v, Path) else v for k, v in config.__dict__.items()}
        config.json_path.write_text(json.dumps({"config": meta, "runs": records, "summary": summary}, indent=1))
    return 0


def parse_args(argv: list[str] | None) -> Config:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="gemma3-27b")
    ap.add_argument("--layers", type=int, default=2, help="layers of random weights (the last full attention)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=24, help="decode steps timed a run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--context", type=int, default=64, help="prompt tokens a request")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--attention", default="paged")
    ap.add_argument("--devices", default="cuda:0")
    ap.add_argument("--no-cuda-graphs", action="store_true")
    ap.add_argument("--tokenizer-from", type=Path, required=True, help="a WiCore export whose tokenizer to use")
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--export-only", action="store_true", help="make the export and stop")
    a = ap.parse_args(argv)
    if a.batch < 2 or a.steps < 1 or a.repeats < 1 or a.temperature <= 0:
        ap.error("--batch >= 2, --steps >= 1, --repeats >= 1 and --temperature > 0")
    return Config(
        a.shape, a.layers, a.batch, a.steps, a.repeats, a.context, a.temperature, a.dtype, a.attention,
        a.devices, not a.no_cuda_graphs and a.devices.startswith("cuda"), a.tokenizer_from, a.work, a.json, a.export_only,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(run(parse_args(sys.argv[1:])))
