"""Device time of one layer's segments, from the layer's graph cut short (profile_ops.py --cuts LAYER).

Where the EP gives no GPU timestamps (the WebGPU plugin), a run's wall time still holds its GPU
time, since a run ends by reading its output back. A value V whose ancestors are every node before
it that the logits need (it dominates the graph so far: a residual add, a norm, a projection on the
main chain) cuts the graph: the nodes up to V run without any after it. Graphs cut at consecutive
such values differ by exactly the nodes between them:

    nodes (demand order)  ... + | n1 | q k v A | o | + | n2 | g | . | d | + ...   (one decode layer)
    cuts                       c0   c1         c2  c3  c4   c5   c6  c7  c8  c9
    segment time          T(c k) - T(c k-1): the nodes after cut k-1 up to cut k, GPU included

Each cut of layer LAYER is a graph of its own, a session each (ONNX Runtime 1.32's
`only_execute_path_to_fetches` runs every node whatever is fetched: three chained MatMuls, the first
fetched). It holds only the layer's nodes up to the cut: what they read from before the layer (the
cut c0 before it: the hidden states, the block tables' int32 copies, RoPE's rows) is computed once,
by the graph up to c0, and fed from the host to every cut, so each loads only the layer's weights.
T(c0) is an Identity of the hidden states: the fixed cost of a run (feeds, launch, read-back). ONNX
Runtime optimizes each cut graph on its own: a fusion across a cut is lost there.
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


def node_masks(nodes: list[Any]) -> tuple[dict[str, int], list[int]]:
    """(value -> the node making it, each node's ancestors as a bitmask)."""
    return {out: i for i, node in enumerate(nodes) for out in node.output if out}, ancestor_masks(nodes)


def sub_model(model: Any, mask: int, inputs: dict[str, Any], outputs: list[str]) -> bytes:
    """The nodes of `model` in bitmask `mask` as a model: the graph inputs and weights they read,
    `inputs` (value -> a NumPy array of its type and shape) fed in place of the values they read
    from outside `mask`, `outputs` its outputs."""
    kept = [n for i, n in enumerate(model.graph.node) if mask >> i & 1]
    used = {name for n in kept for name in n.input}
    fed = [
        onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for name, a in inputs.items()
        if name in used
    ]
    graph = onnx.helper.make_graph(
        kept,
        model.graph.name,
        [*[i for i in model.graph.input if i.name in used], *fed],
        [onnx.helper.make_empty_tensor_value_info(v) for v in outputs],
        [t for t in model.graph.initializer if t.name in used],
    )
    cut = onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=model.ir_version)
    cut.functions.extend(model.functions)
    return cut.SerializeToString()


def identity_model(name: str, array: Any) -> bytes:
    """`name` in, the same out (as "identity"): a run's fixed cost with one dispatch."""
    value = onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)
    out = onnx.helper.make_empty_tensor_value_info("identity")
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", [name], ["identity"])], "identity", [value], [out])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


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
    samples_us: list[list[float]]  # each cut's timed runs (the first: the Identity, a run's fixed cost)
    fed: list[str]  # the values from before the layer that its cut graphs are fed

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
        for cut, us in self.segments()[1:]:  # the first is the run's fixed cost
            groups["+".join(sorted({op for _, op in cut.nodes}))] += us
        return groups

    def to_json(self) -> dict[str, object]:
        return {
            "layer": self.layer,
            "fed": self.fed,
            "spread_us": self.spread_us(),
            "segments": [{"value": c.value, "nodes": [list(n) for n in c.nodes], "us": us} for c, us in self.segments()],
            "groups": dict(self.by_group()),
        }


def time_graph(model: bytes, graphs: Any, weights: Path, feeds: dict, output: str, threads: int, num_reps: int) -> list[float]:
    """µs of `num_reps` runs (after one warm-up) of `model` with its one output read back to the host;
    `feeds` bound from the host where it takes them, the engine's KV buffers as its cache inputs."""
    cut = session(model, weights, graph_options(graphs, threads), graphs.devices[0].providers())
    binding = bind_inputs(cut, graphs, feeds)
    binding.bind_output(output, "cpu")
    times = []
    for _ in range(num_reps + 1):
        start = time.perf_counter()
        cut.run_with_iobinding(binding)
        times.append(1e6 * (time.perf_counter() - start))
    return times[1:]


def bind_inputs(cut: Any, graphs: Any, feeds: dict) -> Any:
    """A binding of `cut`'s inputs: host arrays from `feeds`, KV caches from the engine's buffers."""
    inputs = {i.name for i in cut.get_inputs()}
    binding = cut.io_binding()
    for name, array in feeds.items():
        if name in inputs:
            binding.bind_cpu_input(name, array)
    record = graphs.manifest.partitions[0]
    for layer in range(record.start, record.stop):
        for name, buffer in zip((io.key_cache(layer), io.value_cache(layer)), graphs.buffers.values(layer)):
            if name in inputs:
                binding.bind_ortvalue_input(name, buffer)
    return binding


def boundary_values(original: Any, graphs: Any, weights: Path, feeds: dict, names: list[str], threads: int) -> dict[str, Any]:
    """The values `names` as the graph computes them on these feeds (NumPy): one run of its nodes
    up to them."""
    producer, masks = node_masks(list(original.graph.node))
    mask = 0
    for name in names:
        mask |= masks[producer[name]] | (1 << producer[name])
    source = session(sub_model(original, mask, {}, names), weights, graph_options(graphs, threads), graphs.devices[0].providers())
    binding = bind_inputs(source, graphs, feeds)
    for name in names:
        binding.bind_output(name, "cpu")
    source.run_with_iobinding(binding)
    return {name: value.numpy() for name, value in zip(names, binding.get_outputs())}


def time_cuts(graphs: Any, model: Path, batch: Any, layer: int, threads: int, num_reps: int) -> CutTimes:
    """Time the engine's single partition `model` cut inside `layer` on `batch` (a decode step's
    BatchInputs, its KV in the engine's buffers): each cut a graph of the layer's nodes up to it."""
    if len(graphs.sessions) != 1:
        raise ValueError("--cuts takes a single-partition export")
    original = onnx.load(str(model), load_external_data=False)
    final = io.GREEDY_TOKENS if any(o.name == io.GREEDY_TOKENS for o in original.graph.output) else io.LOGITS
    cuts = dominator_cuts(original.graph, final, f"/model/layers.{layer}/")
    nodes = list(original.graph.node)
    producer, masks = node_masks(nodes)
    before = producer[cuts[0].value]
    outside = masks[before] | (1 << before)
    layer_mask = (masks[producer[cuts[-1].value]] | (1 << producer[cuts[-1].value])) & ~outside
    reads = sorted(
        {
            name
            for i, n in enumerate(nodes)
            if layer_mask >> i & 1
            for name in n.input
            if name in producer and outside >> producer[name] & 1
        }
    )
    feeds = {io.INPUT_IDS: batch.input_ids, io.LOGITS_INDICES: batch.logits_indices, **batch.paging_inputs()}
    fed = boundary_values(original, graphs, model.parent, feeds, reads, threads)
    samples = [
        time_graph(identity_model(cuts[0].value, fed[cuts[0].value]), graphs, model.parent, fed, "identity", threads, num_reps)
    ]
    for cut in cuts[1:]:
        end = producer[cut.value]
        mask = (masks[end] | (1 << end)) & ~outside
        samples.append(
            time_graph(
                sub_model(original, mask, fed, [cut.value]), graphs, model.parent, {**feeds, **fed}, cut.value, threads, num_reps
            )
        )
    return CutTimes(layer, cuts, samples, reads)


def format_cuts(title: str, result: CutTimes, top: int) -> str:
    """Markdown: µs a run by what the layer's segments hold, then its slowest segments."""
    medians = result.median_us
    layer_us = medians[-1] - medians[0]
    lines = [
        f"### {title}: layer {result.layer} between cuts",
        "",
        f"Timed by: WALL time of layer {result.layer}'s graph cut short at {len(result.cuts) - 1} values (GPU included; "
        f"prefix_cuts.py), medians of runs: the layer {layer_us:.0f} µs a run beyond a run's fixed cost of {medians[0]:.0f} "
        f"(an Identity of the hidden states; the cut graphs are fed {len(result.fed)} values from before the layer); "
        f"noise about ±{result.spread_us():.0f} µs a segment.",
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
