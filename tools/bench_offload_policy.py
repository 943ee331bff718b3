"""Questions over long documents that do not all fit the device tier: A2CR against LRU, offloaded.

--documents documents of --document-tokens each; the full-attention layers' device tier holds
--device-documents of them (the sliding layers keep their window), the host tier all of them,
and sequences are offloaded (EngineConfig.kv_offload_tokens: a request whose blocks lie partly in host
memory runs with them staged to the device each step, every token attended). --questions
questions, one after another, each over a document drawn by a seeded Zipf law (document 0 the
most asked), each prompt the document then its question:

    question  | BOS  document d ....................................... | question |
               \\__ reused from the prefix cache where its blocks lie: ___/
                   on the device (read in place), or in host memory (copied in each step)

Which cached blocks stay on the device when a new document needs room is the policy's choice:
A2CR (frequency and recency with a decay, plus attention mass on an export with
`--attention-stats`) or LRU. Each policy runs the same questions in a fresh engine, driven step
by step here, and every full-attention block a step reads is counted where it came from:

    device hit rate   blocks read on the device / all blocks read (steps of every question)
    host blocks       blocks copied in from host memory (per full-attention layer)

with time to first token and answer tokens a second. Both policies must give the same tokens.

    PYTHONPATH=. python tools/bench_offload_policy.py --model-dir models/gemma3-270m --json out.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from benchlib import CpuWatch, add_model_args, ensure_model, load_tokenizer, others_cell, run_tool, write_record
from workloads import build_prompts

QUESTIONS = (
    "Which of these sentences is about the weather?",
    "Summarise the text in one sentence.",
    "What does the text say about bees?",
    "Name two places the text mentions.",
)


@dataclass(frozen=True)
class Config:
    wicore_model: Path
    op_flavour: str
    threads: int
    num_documents: int
    num_document_tokens: int
    device_documents: float
    num_questions: int
    zipf: float
    num_new_tokens: int
    policies: tuple[str, ...]
    json_path: Path | None

    def __post_init__(self) -> None:
        if min(self.threads, self.num_documents, self.num_document_tokens, self.num_questions, self.num_new_tokens) < 1:
            raise ValueError("--threads, --documents, --document-tokens, --questions and --new-tokens must be positive")
        if not 0 < self.device_documents < self.num_documents:
            raise ValueError("--device-documents must be between 0 and --documents (else nothing is offloaded)")
        if not set(self.policies) <= {"a2cr", "lru"}:
            raise ValueError("--policies: a2cr, lru")


@dataclass
class PolicyRun:
    policy: str
    device_blocks_read: int = 0  # full-attention blocks steps read in place on the device
    host_blocks_read: int = 0  # ... copied in from host memory
    num_offloaded_questions: int = 0  # questions with at least one staged step
    ttft_seconds: list[float] = field(default_factory=list)
    seconds: float = 0.0  # all questions, end to end
    num_cached_tokens: int = 0
    token_ids: list[list[int]] = field(default_factory=list)

    @property
    def device_hit_rate(self) -> float:
        return self.device_blocks_read / max(1, self.device_blocks_read + self.host_blocks_read)


def ask(config: Config, policy: str, prompts: list[list[int]]) -> tuple[PolicyRun, float | None]:
    from wicore.blocks.tier import Tier
    from wicore.engine.engine import Engine, EngineConfig
    from wicore.engine.scheduler import SchedulerConfig
    from wicore.graph.manifest import Manifest
    from wicore.kv.layout import KVLayout, choose_block_size
    from wicore.types.sampling import SamplingParams

    manifest = Manifest.read(config.wicore_model)
    bs = choose_block_size(manifest, None)
    layout = KVLayout.of(manifest, bs)
    doc_blocks = -(-config.num_document_tokens // bs)
    longest = max(len(p) for p in prompts) + config.num_new_tokens
    sched = SchedulerConfig(max_num_seqs=1)
    engine_config = EngineConfig(
        model_dir=config.wicore_model,
        num_threads=config.threads,
        block_size=bs,
        num_device_blocks=int(config.device_documents * doc_blocks) + 1,
        num_window_device_blocks=layout.window_blocks_per_sequence(sched.prefill_chunk) + 2,
        num_host_blocks=(config.num_documents + 1) * -(-longest // bs),
        num_nvme_blocks=0,
        kv_offload_tokens=longest,
        policy=policy,
        scheduler=sched,
    )
    run = PolicyRun(policy)
    params = SamplingParams(max_tokens=config.num_new_tokens, ignore_eos=True)
    with Engine(engine_config) as engine, CpuWatch() as watch:
        start_all = time.perf_counter()
        for prompt in prompts:
            core = engine.core
            request_id = f"q{len(run.token_ids)}"
            core.add(core.make_request(prompt, params, request_id))
            start, first, offloaded, tokens = time.perf_counter(), None, False, []
            while core.has_work:
                outputs = core.step()
                for row in core.last_step.rows:
                    tiers = [t for t, _ in row.full_locations] or [Tier.DEVICE] * len(row.block_table)
                    on_device = sum(t is Tier.DEVICE for t in tiers)
                    run.device_blocks_read += on_device
                    run.host_blocks_read += len(tiers) - on_device
                    offloaded = offloaded or bool(row.full_locations)
                for o in outputs:
                    if o.request_id == request_id and o.new_token_ids:
                        first = first or time.perf_counter()
                        tokens += o.new_token_ids
                        run.num_cached_tokens += o.num_cached_tokens if len(tokens) == len(o.new_token_ids) else 0
            assert first is not None and len(tokens) == config.num_new_tokens
            run.ttft_seconds.append(first - start)
            run.num_offloaded_questions += offloaded
            run.token_ids.append(tokens)
        run.seconds = time.perf_counter() - start_all
    return run, watch.num_other_busy_cores


def parse_args(argv: Sequence[str] | None) -> Config:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_args(p)
    p.add_argument("--threads", type=int, default=2, help="compute threads (default 2)")
    p.add_argument("--documents", type=int, default=4)
    p.add_argument("--document-tokens", type=int, default=2000, help="each document's tokens, BOS included")
    p.add_argument("--device-documents", type=float, default=1.5, help="documents the full layers' device tier holds")
    p.add_argument("--questions", type=int, default=24)
    p.add_argument("--zipf", type=float, default=1.2, help="exponent of the documents' popularity (0: uniform)")
    p.add_argument("--new-tokens", type=int, default=8, help="greedy tokens of each answer")
    p.add_argument("--policies", default="a2cr,lru")
    p.add_argument("--json", type=Path)
    a = p.parse_args(argv)
    return Config(
        a.model_dir, a.op_flavour, a.threads, a.documents, a.document_tokens, a.device_documents, a.questions, a.zipf,
        a.new_tokens, tuple(a.policies.split(",")), a.json,
    )  # fmt: skip


def run(config: Config, num_busy_before: float | None) -> int:
    ensure_model(config.wicore_model, config.op_flavour)
    tokenizer, manifest = load_tokenizer(config.wicore_model)
    documents = build_prompts(tokenizer.encode, config.num_documents, config.num_document_tokens, seed=9)
    weights = 1.0 / np.arange(1, config.num_documents + 1) ** config.zipf
    rng = np.random.default_rng(3)
    asked = rng.choice(config.num_documents, config.num_questions, p=weights / weights.sum()).tolist()
    suffixes = [tokenizer.encode(f"\n\nQuestion: {q}\nAnswer:", add_bos=False) for q in QUESTIONS]
    prompts = [documents[d] + suffixes[i % len(suffixes)] for i, d in enumerate(asked)]
    runs, others = [], []
    for policy in config.policies:
        result, busy = ask(config, policy, prompts)
        runs.append(result)
        others.append(busy)
    print(
        f"Gemma 3 270M ({manifest.dtype} {manifest.op_flavour}), {config.num_documents} documents of "
        f"{config.num_document_tokens} tokens, the device tier holding {config.device_documents}; "
        f"{config.num_questions} questions (documents asked: {[asked.count(d) for d in range(config.num_documents)]})\n"
    )
    print(
        "| policy | device hit rate | blocks from host | offloaded questions | mean TTFT s | answer tok/s | cached prompt tokens |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in runs:
        print(
            f"| {r.policy} | {100 * r.device_hit_rate:.1f}% | {r.host_blocks_read:,} | {r.num_offloaded_questions} | "
            f"{statistics.mean(r.ttft_seconds):.2f} | {config.num_questions * config.num_new_tokens / r.seconds:.1f} | "
            f"{r.num_cached_tokens:,} |"
        )
    print("other processes kept " + " / ".join(others_cell(o, 1) for o in others) + " cores busy")
    same = all(r.token_ids == runs[0].token_ids for r in runs)
    print("same tokens for every policy: " + ("yes" if same else "NO"))
    if config.json_path is not None:
        write_record(
            config.json_path,
            config,
            num_busy_cores_before=num_busy_before,
            documents_asked=asked,
            runs=[{**asdict(r), "device_hit_rate": r.device_hit_rate} for r in runs],
            num_other_busy_cores=others,
        )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(run_tool(None, parse_args, run))
