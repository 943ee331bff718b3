"""The scheduler alone at 256 decoding requests, async-style: plan_ahead, schedule(busy), update; CPU us a step."""
import sys, time, statistics
from wicore.blocks.block_groups import BlockGroups
from wicore.blocks.block_pool import BlockPool
from wicore.blocks.policy import A2CRPolicy, A2CRConfig
from wicore.engine.request import Request
from wicore.engine.scheduler import Scheduler, SchedulerConfig
from wicore.types.outputs import Priority
from wicore.types.sampling import Sample, SamplingParams
from wicore.types.step import RunResult
import numpy as np

N, BS = 256, 128
kv = BlockGroups(BlockPool(1 + N * 8, 0, 0, BS, A2CRPolicy(A2CRConfig()), group=0), BlockPool(1 + N * 9, 0, 0, BS, A2CRPolicy(A2CRConfig()), group=1), 1024)
sched = Scheduler(SchedulerConfig(max_num_seqs=N, max_num_batched_tokens=N * 512, prefill_chunk=512, eos_token_ids=(1,)), kv)
rng = np.random.default_rng(0)
for i in range(N):
    sched.add(Request(f"r{i}", rng.integers(2, 500, 512).tolist(), SamplingParams(max_tokens=400, ignore_eos=True), 400, Priority.NORMAL, float(i)))
out = sched.schedule()
def result(rows): return RunResult(sampled={r.request_id: Sample(7) for r in rows if r.needs_sample})
sched.update(out.rows, result(out.rows))
inflight = sched.schedule().rows
times = {"plan_ahead": [], "schedule": [], "update": []}
import gc
if "nogc" in sys.argv: gc.disable()
t = time.thread_time
STEPS = int(next((a[6:] for a in sys.argv if a.startswith("steps=")), "300"))
for step in range(STEPS):
    busy = {r.request_id for r in inflight}
    a = t(); assert sched.plan_ahead(inflight, busy); b = t()
    nxt = sched.schedule(busy=busy, ahead=True).rows; c = t()
    res = result(inflight)
    d = t(); sched.update(inflight, res); e = t()
    assert len(nxt) == N
    times["plan_ahead"].append(b - a); times["schedule"].append(c - b); times["update"].append(e - d)
    inflight = nxt
label = (sys.argv[1] if len(sys.argv) > 1 else "") + (" nogc" if "nogc" in sys.argv else "")
if STEPS: print(label, " ".join(f"{k} {1e6*statistics.median(v):.0f}" for k, v in times.items()), "us (median CPU, 300 steps at 256 rows)")
