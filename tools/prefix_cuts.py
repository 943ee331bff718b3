"""Device time of one layer's segments, from prefixes of the graph (profile_ops.py --cuts LAYER).

Where the EP gives no GPU timestamps (the WebGPU plugin), a run's wall time still holds its GPU
time, since a run ends by reading its output back. A graph cut at a value V (only V's ancestors,
V its one output) that dominates the graph so far (V's ancestors are every node before it that
the logits need: a residual add, a norm, a projection on the main chain) runs exactly the nodes
before V; prefixes cut at consecutive such values differ by the nodes between them:

    nodes (topological)   e . . n1 . q k v A . o + n2 g . d + ...       (a decode step, one layer)
    cuts                  |       |          |   | |  |     | |
    segment time          T(cut k) - T(cut k-1): the nodes after cut k-1 up to cut k, GPU included

ONNX Runtime's `only_execute_path_to_fetches` would run such prefixes in one session, but 1.32
runs every node whatever is fetched (measured: three chained MatMuls, the first fetched), so each
cut is a graph of its own, a session each (its weights loaded again: the embedding's too). The cuts
are those inside layer `LAYER` and the one before it; the first segment ("before") holds a run's fixed
cost (feeds, launch, the read-back wait) and the layers before. ONNX Runtime optimizes each prefix
on its own: a fusion across a cut is lost there (a cut value is a graph output).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from wicore.devices.providers import onnxruntime, session_options
from wicore.graph import io


@dataclass(frozen=True)
class Cut:
    value: str  # the value fetched
    nodes: tuple[tuple[str, str], ...]  # (node, op type) the cut adds to the one before it


def ancestor_masks(nodes: list[Any]) -> list[int]:
    """For each node (topologically ordered), the bitmask of the nodes it needs."""
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    masks: list[int] = []
    for node in nodes:
        mask = 0
        for name in node.input:
            p = producer.get(name)
            if p is not None:
                mask |= masks[p] | (1 << p)
        masks.append(mask)
    return masks


def demand_order(nodes: list[Any], last: int) -> list[int]:
    """The nodes `last` needs, each right after the nodes it needs (a depth-first post-order from
    `last`, inputs in order): an export's own order may interleave layers, this one runs a layer's
    main chain through before the next layer's nodes begin."""
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    order: list[int] = []
    done: set[int] = set()
    stack = [(last, False)]
    while stack:
        i, expanded = stack.pop()
        if i in done:
            continue
        if expanded:
            done.add(i)
            order.append(i)
            continue
        stack.append((i, True))
        for name in reversed(nodes[i].input):
            p = producer.get(name)
            if p is not None and p not in done:
                stack.append((p, False))
    return order


def dominator_cuts(graph: Any, final: str, layer_prefix: str) -> list[Cut]:
    """The cuts of `graph` towards `final` in the nodes named `layer_prefix`..., and the one before:
    in demand order, each a node's first output whose ancestors are every node before it."""
    nodes = list(graph.node)
    masks = ancestor_masks(nodes)
    last = next((i for i, n in enumerate(nodes) if final in n.output), None)
    if last is None:
        raise ValueError(f"no node makes {final!r}")
    cuts: list[Cut] = []
    seen = 0
    segment: list[int] = []
    for i in demand_order(nodes, last):
        seen |= 1 << i
        segment.append(i)
        if masks[i] | (1 << i) == seen:
            cuts.append(Cut(nodes[i].output[0], tuple((nodes[j].name, nodes[j].op_type) for j in segment)))
            segment = []
    inside = [k for k, cut in enumerate(cuts) if cut.nodes[-1][0].startswith(layer_prefix)]
    if not inside:
        raise ValueError(f"no cut in the nodes named {layer_prefix}...")
    return cuts[max(inside[0] - 1, 0) : inside[-1] + 1]


def prefix_model(model: Any, value: str) -> bytes:
    """`model` cut at `value`: the nodes it needs, their inputs and weights, `value` the one output."""
    nodes = list(model.graph.node)
    masks = ancestor_masks(nodes)
    last = next(i for i, n in enumerate(nodes) if value in n.output)
    keep = masks[last] | (1 << last)
    kept = [n for i, n in enumerate(nodes) if keep >> i & 1]
    used = {name for n in kept for name in n.input}
    graph = onnx.helper.make_graph(
        kept,
        model.graph.name,
        [i for i in model.graph.input if i.name in used],
        [onnx.helper.make_empty_tensor_value_info(value)],
        [t for t in model.graph.initializer if t.name in used],
    )
    cut = onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    cut.functions.extend(model.functions)
    return cut.SerializeToString()


def graph_options(graphs: Any, threads: int) -> Any:
    """The engine's session options for its device (its custom-op library too)."""
    from wicore.executor.graphs import kernel_library

    options = session_options(threads, devices=graphs.devices)
    if graphs.manifest.kernels == "wicore":
        options.register_custom_ops_library(str(kernel_library(graphs.devices)))
    return options


def session(model: bytes, weights: Path, options: Any, providers: list) -> Any:
    """A session on a serialized model whose external weights lie in folder `weights`."""
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(weights))
    return onnxruntime().InferenceSession(model, sess_options=options, providers=providers)


@dataclass
class CutTimes:
    layer: int
    cuts: list[Cut]
    samples_us: list[list[float]]  # each cut's timed runs
    full_us: float  # the median run of the whole graph, timed the same way

    @property
    def median_us(self) -> list[float]:
        return [statistics.median(t) for t in self.samples_us]

    def segments(self) -> list[tuple[Cut, float]]:
        """(cut, its segment's µs): the median run to it less the median run to the cut before."""
        medians = self.median_us
        return [(cut, us - prev) for cut, us, prev in zip(self.cuts, medians, [0.0, *medians[:-1]])]

    def spread_us(self) -> float:
        """The largest median absolute deviation of a cut's runs: the noise on a segment's time."""
        return max(statistics.median(abs(t - statistics.median(ts)) for t in ts) for ts in self.samples_us)

    def by_group(self) -> Counter:
        """µs by what a segment holds: its op type, or its op types joined by '+' (several nodes)."""
        groups: Counter = Counter()
        for cut, us in self.segments()[1:]:  # the first holds the run's fixed cost and the layers before
            groups["+".join(sorted({op for _, op in cut.nodes}))] += us
        return groups

    def to_json(self) -> dict[str, object]:
        return {
            "layer": self.layer,
            "full_us": self.full_us,
            "spread_us": self.spread_us(),
            "segments": [{"value": c.value, "nodes": [list(n) for n in c.nodes], "us": us} for c, us in self.segments()],
            "groups": dict(self.by_group()),
        }


def time_prefix(model: bytes, graphs: Any, weights: Path, feeds: dict, output: str, threads: int, num_reps: int) -> list[float]:
    """µs of `num_reps` runs (after one warm-up) of a prefix whose one output is `output`, read back
    to the host; the engine's KV buffers bound as the cache inputs it has."""
    prefix = session(model, weights, graph_options(graphs, threads), graphs.devices[0].providers())
    inputs = {i.name for i in prefix.get_inputs()}
    binding = prefix.io_binding()
    for name, array in feeds.items():
        if name in inputs:
            binding.bind_cpu_input(name, array)
    for layer in range(graphs.manifest.partitions[0].start, graphs.manifest.partitions[0].stop):
        for name, buffer in zip((io.key_cache(layer), io.value_cache(layer)), graphs.buffers.values(layer)):
            if name in inputs:
                binding.bind_ortvalue_input(name, buffer)
    binding.bind_output(output, "cpu")
    times = []
    for _ in range(num_reps + 1):
        start = time.perf_counter()
        prefix.run_with_iobinding(binding)
        times.append(1e6 * (time.perf_counter() - start))
    return times[1:]


def time_cuts(graphs: Any, model: Path, batch: Any, layer: int, threads: int, num_reps: int) -> CutTimes:
    """Time the prefixes of the engine's single partition `model` cut inside `layer` on `batch` (a
    decode step's BatchInputs, its KV in the engine's buffers), and the whole graph."""
    if len(graphs.sessions) != 1:
        raise ValueError("--cuts takes a single-partition export")
    original = onnx.load(str(model), load_external_data=False)
    final = io.GREEDY_TOKENS if any(o.name == io.GREEDY_TOKENS for o in original.graph.output) else io.LOGITS
    cuts = dominator_cuts(original.graph, final, f"/model/layers.{layer}/")
    feeds = {io.INPUT_IDS: batch.input_ids, io.LOGITS_INDICES: batch.logits_indices, **batch.paging_inputs()}
    samples = [
        time_prefix(prefix_model(original, c.value), graphs, model.parent, feeds, c.value, threads, num_reps) for c in cuts
    ]
    full = time_prefix(prefix_model(original, final), graphs, model.parent, feeds, final, threads, num_reps)
    return CutTimes(layer, cuts, samples, statistics.median(full))


def format_cuts(title: str, result: CutTimes, top: int) -> str:
    """Markdown: µs a run by what the layer's segments hold, then its slowest segments."""
    medians = result.median_us
    layer_us = medians[-1] - medians[0]
    lines = [
        f"### {title}: layer {result.layer} between cuts",
        "",
        f"Timed by: WALL time of graphs cut inside layer {result.layer} (GPU included; prefix_cuts.py), medians of "
        f"runs; the whole graph {result.full_us:.0f} µs a run, the layer {layer_us:.0f}, before it {medians[0]:.0f} "
        f"(fixed cost and the layers before); noise about ±{result.spread_us():.0f} µs a segment.",
        "",
        "| segment holds | µs a run | share of the layer |",
        "|---|---:|---:|",
    ]
    share = layer_us or 1.0
    for group, us in result.by_group().most_common():
        lines.append(f"| {group} | {us:.1f} | {100 * us / share:.1f}% |")
    lines += ["", f"Slowest {top} segments:", "", "| up to | nodes | µs |", "|---|---:|---:|"]
    for cut, us in sorted(result.segments()[1:], key=lambda s: -s[1])[:top]:
        lines.append(f"| {cut.nodes[-1][0]} | {len(cut.nodes)} | {us:.1f} |")
    return "\n".join([*lines, ""])
