"""Where a decode step's time goes, op by op, read from ONNX Runtime's profile JSON (profile_ops.py).

ONNX Runtime's profiler (session option `enable_profiling`) writes one JSON list of trace events a
session. Three kinds matter here:

    cat "Session", name "model_run"   one graph run: its wall time on the host, sync included
    cat "Node", name "<node>_kernel_time"
                                      one node's kernel as the host ran it. On the CPU EP that is the
                                      work; on a GPU EP the host's time to launch or record it (the GPU
                                      runs it later, asynchronously): labelled "host"
    cat "Kernel" (CUDA builds with CUPTI), or cat "Api" with a "cache_key" argument (the WebGPU EP's
    timestamp queries, WebGpuContext::CollectProfilingData)
                                      GPU time of one kernel or shader dispatch: labelled "gpu"

Only the timed runs count: a session's last `num_runs` model_run events, and the node events inside
them. GPU events whose timestamps share the host's clock (CUPTI's) are picked the same way; the WebGPU
EP's count from its first timestamp instead (its TODO: "apply CPU-GPU time offset"), so its last
`num_runs` runs are found by their order: the timed runs repeat the same dispatches (names "node&op&
program" and shapes), so the events' tail repeats with a period of one run.

Copies between host and device are nodes too (MemcpyFromHost, MemcpyToHost, inserted by ONNX Runtime
where a node's input lives on the other side); their bytes come from the event's input shape.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

KERNEL_SUFFIX = "_kernel_time"
COPY_OPS = ("MemcpyFromHost", "MemcpyToHost")
DTYPE_BYTES = {
    "float": 4,
    "float16": 2,
    "bfloat16": 2,
    "double": 8,
    "int64": 8,
    "uint64": 8,
    "int32": 4,
    "uint32": 4,
    "int16": 2,
    "uint16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}

Event = dict[str, Any]


@dataclass
class OpTable:
    """Per-run times of the timed runs of one or more sessions (their partitions add up).

    `source` is "gpu" (GPU kernel events) or "host" (node events: on a GPU EP, launch or record time).
    `us_by_node` is keyed by (node name, op type); `calls_by_node` counts the node's events a run.
    """

    source: str
    num_runs: int
    run_us: float = 0.0  # the model_run events' wall time a run, summed over the sessions
    us_by_node: Counter = field(default_factory=Counter)
    calls_by_node: Counter = field(default_factory=Counter)
    copy_calls: Counter = field(default_factory=Counter)  # a run, by copy op type (from the node events)
    copy_bytes: Counter = field(default_factory=Counter)
    copy_us: Counter = field(default_factory=Counter)  # host time
    copy_shapes: dict[str, list] = field(default_factory=dict)  # node -> its input_type_shape (the last run's)

    def by_op(self) -> list[tuple[str, int, float, float]]:
        """(op type, nodes, calls a run, µs a run) rows, the slowest first."""
        us: Counter = Counter()
        calls: Counter = Counter()
        nodes: Counter = Counter()
        for (name, op), t in self.us_by_node.items():
            us[op] += t
            calls[op] += self.calls_by_node[name, op]
            nodes[op] += 1
        return [(op, nodes[op], calls[op], t) for op, t in us.most_common()]

    @property
    def kernel_us(self) -> float:
        return sum(self.us_by_node.values())

    def to_json(self) -> dict[str, object]:
        """The record: every op type and every node, the slowest first, and the copies."""
        return {
            "source": self.source,
            "num_runs": self.num_runs,
            "run_us": self.run_us,
            "kernel_us": self.kernel_us,
            "ops": [{"op": op, "nodes": n, "calls": c, "us": us} for op, n, c, us in self.by_op()],
            "nodes": [
                {"node": name, "op": op, "calls": self.calls_by_node[name, op], "us": us}
                for (name, op), us in self.us_by_node.most_common()
            ],
            "copies": {
                op: {"calls": self.copy_calls[op], "bytes": self.copy_bytes[op], "host_us": self.copy_us[op]} for op in COPY_OPS
            },
            "copy_shapes": self.copy_shapes,
        }


def tensor_bytes(type_shapes: Sequence[dict[str, list[int]]]) -> int:
    """Bytes of a node event's `input_type_shape`: [{"int32": [1, 4]}, ...]."""
    return sum(DTYPE_BYTES.get(dtype, 0) * math.prod(shape) for item in type_shapes for dtype, shape in item.items())


def is_webgpu_event(event: Event) -> bool:
    """A WebGPU dispatch's GPU time: its arguments hold the program's cache_key."""
    return event.get("cat") in ("Api", "Kernel") and "cache_key" in (event.get("args") or {})


def is_gpu_event(event: Event) -> bool:
    return event.get("cat") == "Kernel" or is_webgpu_event(event)


def gpu_node_and_op(event: Event) -> tuple[str, str]:
    """(node, op type) of a GPU event: the WebGPU EP names it "node&op&program", CUPTI's carry
    the launching node in their arguments (else the kernel's name stands for both)."""
    parts = event["name"].split("&")
    if len(parts) >= 3:
        return parts[0], f"{parts[1]} ({parts[2]})" if parts[2] != parts[1] else parts[1]
    args = event.get("args") or {}
    return args.get("parent_name", event["name"]), args.get("op_name", event["name"][:60])


def timed_runs(events: list[Event], num_runs: int) -> list[tuple[int, int]]:
    """(start, end) µs of the session's last `num_runs` model_run events."""
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "model_run")
    if len(runs) < num_runs:
        raise ValueError(f"the profile holds {len(runs)} runs, fewer than the {num_runs} timed ones")
    return runs[-num_runs:]


def periodic_tail(events: list[Event], num_runs: int) -> list[Event] | None:
    """The last `num_runs` repeats of the events' tail, or None when it does not repeat so: the
    shortest period p whose last `num_runs` blocks of p events name the same dispatches in order."""
    keys = [(e["name"], (e.get("args") or {}).get("shapes")) for e in events]
    for period in range(1, len(keys) // num_runs + 1):
        tail = keys[len(keys) - period :]
        if all(keys[len(keys) - (k + 1) * period : len(keys) - k * period] == tail for k in range(1, num_runs)):
            return events[len(events) - num_runs * period :]
    return None


def read_session(table: OpTable, events: list[Event], partition: str = "") -> None:
    """Add one session's timed runs to `table` (its source decides which events count); its node
    names prefixed with `partition` (the same name in two partitions is two nodes)."""
    runs = timed_runs(events, table.num_runs)
    table.run_us += sum(end - start for start, end in runs) / table.num_runs

    def in_runs(event: Event) -> bool:
        return any(start <= event["ts"] <= end for start, end in runs)

    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith(KERNEL_SUFFIX) and in_runs(e)]
    for e in nodes:  # copies are counted from the node events whichever the source
        op = e["args"]["op_name"]
        if op in COPY_OPS:
            table.copy_calls[op] += 1 / table.num_runs
            table.copy_bytes[op] += tensor_bytes(e["args"].get("input_type_shape", [])) / table.num_runs
            table.copy_us[op] += e["dur"] / table.num_runs
            table.copy_shapes[partition + e["name"][: -len(KERNEL_SUFFIX)]] = e["args"].get("input_type_shape", [])
    if table.source == "host":
        for e in nodes:
            key = (partition + e["name"][: -len(KERNEL_SUFFIX)], e["args"]["op_name"])
            table.us_by_node[key] += e["dur"] / table.num_runs
            table.calls_by_node[key] += 1 / table.num_runs
        return
    gpu = [e for e in events if is_gpu_event(e)]
    if not any(is_webgpu_event(e) for e in gpu):  # CUPTI's: on the host's clock
        timed = [e for e in gpu if in_runs(e)]
    elif (tail := periodic_tail(gpu, table.num_runs)) is not None:
        timed = tail
    else:
        raise ValueError(f"{partition or 'the session'}: its last {table.num_runs} runs' GPU events do not repeat run by run")
    for e in timed:
        node, op = gpu_node_and_op(e)
        key = (partition + node, op)
        table.us_by_node[key] += e["dur"] / table.num_runs
        table.calls_by_node[key] += 1 / table.num_runs


def op_table(profiles: Sequence[list[Event]], num_runs: int) -> OpTable:
    """The timed runs' table over all the sessions' profiles: GPU events where any session has
    them, else the host's node events."""
    source = "gpu" if any(is_gpu_event(e) for events in profiles for e in events) else "host"
    table = OpTable(source, num_runs)
    for i, events in enumerate(profiles):
        read_session(table, events, f"part-{i:02d}:" if len(profiles) > 1 else "")
    return table


SOURCE_LABELS = {
    "gpu": "GPU time of each kernel (GPU timestamps)",
    "host": "HOST time of each node's kernel call (on a GPU EP: its launch or recording, not GPU time)",
}


def format_table(title: str, table: OpTable, top: int) -> str:
    """Markdown: the ops, the slowest nodes, and the copies, a graph run each."""
    run = table.run_us or 1.0
    lines = [
        f"### {title}",
        "",
        f"Timed by: {SOURCE_LABELS[table.source]}; {table.num_runs} graph runs, µs a run; "
        f"share: of the run's wall time ({table.run_us:.0f} µs, model_run).",
        "",
        "| op type | nodes | calls a run | µs a run | share |",
        "|---|---:|---:|---:|---:|",
    ]
    for op, nodes, calls, us in table.by_op():
        lines.append(f"| {op} | {nodes} | {calls:.0f} | {us:.1f} | {100 * us / run:.1f}% |")
    total_calls = sum(table.calls_by_node.values())
    lines.append(
        f"| **all kernels** | {len(table.us_by_node)} | {total_calls:.0f} | {table.kernel_us:.1f} | {100 * table.kernel_us / run:.1f}% |"
    )
    outside = table.run_us - table.kernel_us
    lines.append(f"| (run, outside kernels) | | | {outside:.1f} | {100 * outside / run:.1f}% |")
    lines += ["", f"Top {top} nodes:", "", "| node | op type | µs a run | share |", "|---|---|---:|---:|"]
    for (name, op), us in table.us_by_node.most_common(top):
        lines.append(f"| {name} | {op} | {us:.1f} | {100 * us / run:.1f}% |")
    copies = [
        f"{op} {table.copy_calls[op]:.0f} a run, {table.copy_bytes[op]:.0f} bytes, {table.copy_us[op]:.1f} µs" for op in COPY_OPS
    ]
    shapes = ", ".join(f"{name} {shape}" for name, shape in sorted(table.copy_shapes.items()))
    lines += ["", "Copies (Memcpy nodes, host time): " + "; ".join(copies) + (f" ({shapes})" if shapes else ""), ""]
    return "\n".join(lines)
