"""Which nodes of an export each execution provider would not take (`wicore doctor`), from one of two
sources, and each report says which:

    EP installed here   ONNX Runtime's own placement: a session on the EP with the CPU EP behind it,
                        created with session.record_ep_graph_assignment_info (ORT >= 1.24) and read
                        back with get_provider_graph_assignment_info(): the EP each node was given
                        after ORT's basic graph optimizations. A node the EP took but that ORT then
                        moved to the CPU as cheaper there (its "Force fallback to CPU execution"
                        warning, read from the log) is told apart from one the EP has no kernel for.
    EP not installed    its published operator list (op_tables): per node, taken, not taken or unknown.

    export ──► graphs (partitions, vision, sampling head) ──► per EP: GraphReport ──► verdict + rows
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from wicore.devices.graph_nodes import GraphNode, graph_nodes
from wicore.devices.op_tables import Support, op_table
from wicore.devices.providers import CAPABILITIES, installed_providers, onnxruntime, session_options

CPU = "CPUExecutionProvider"
# EPs WiCore has no device row for, which doctor still answers for (from their lists, or a session)
OTHER_PROVIDERS = {"coreml": "CoreMLExecutionProvider", "qnn": "QNNExecutionProvider", "rocm": "ROCMExecutionProvider"}
NAMES_SHOWN = 3  # node names a row shows
_FORCED = re.compile(r"Force fallback to CPU execution for node (.+?) because")

SHAPE_MATH = "taken, then moved to the CPU by ORT (cheaper there)"
NO_KERNEL = "not taken by the EP"
NOT_LISTED = "not in its list (this op, or this type)"
UNLISTED = "not covered by its list"


def known_providers() -> dict[str, str]:
    """Doctor's EP names -> ONNX Runtime's: WiCore's devices (capability table) and a few more."""
    return {**{name: cap.provider for name, cap in CAPABILITIES.items()}, **OTHER_PROVIDERS}


@dataclass(frozen=True)
class NodeGroup:
    """Nodes of one op (and domain, and type) that one EP does not take, and why."""

    domain: str
    op_type: str
    dtype: str | None
    reason: str
    names: tuple[str, ...]

    @property
    def label(self) -> str:
        op = self.op_type if self.domain == "ai.onnx" else f"{self.domain}.{self.op_type}"
        return op + (f" ({self.dtype})" if self.dtype else "")


@dataclass(frozen=True)
class GraphReport:
    graph: str
    provider: str
    source: str  # "ORT placement" or "published list"
    num_nodes: int
    fallbacks: tuple[NodeGroup, ...]  # nodes left to the CPU EP
    unknown: tuple[NodeGroup, ...] = ()  # (published lists) nodes of ops the list does not cover
    error: str | None = None  # the session could not be made
    has_list: bool = True  # (published lists) False: the repository keeps none for this EP

    @property
    def num_fallbacks(self) -> int:
        return sum(len(g.names) for g in self.fallbacks)

    def verdict(self) -> str:
        if self.error is not None:
            return f"no placement: {self.error}"
        if not self.has_list:
            return f"unknown for all {self.num_nodes} nodes: no published operator list of {self.provider} is kept in WiCore"
        if not self.fallbacks and not self.unknown:
            by_list = "" if self.source.startswith("ORT placement") else ", by its list"
            return f"all {self.num_nodes} nodes on {self.provider}{by_list}"
        parts = []
        if self.fallbacks:
            ops = ", ".join(f"{g.label} x{len(g.names)}" for g in self.fallbacks)
            parts.append(f"{self.num_fallbacks} of {self.num_nodes} nodes fall back to the CPU: {ops}")
        if self.unknown:
            count = sum(len(g.names) for g in self.unknown)
            ops = ", ".join(f"{g.label} x{len(g.names)}" for g in self.unknown)
            parts.append(f"{count} of {self.num_nodes} nodes unknown (not in its list): {ops}")
        return "; ".join(parts)


def grouped(nodes: Sequence[tuple[GraphNode, str]]) -> tuple[NodeGroup, ...]:
    """(node, reason) pairs as groups, largest first, then by op."""
    groups: dict[tuple[str, str, str | None, str], list[str]] = {}
    for node, reason in nodes:
        groups.setdefault((node.domain, node.op_type, node.dtype, reason), []).append(node.name)
    return tuple(
        NodeGroup(domain, op, dtype, reason, tuple(names))
        for (domain, op, dtype, reason), names in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0][1], kv[0][3]))
    )


# -- from a published list ----------------------------------------------------------------
def listed_placement(graph: str, model: onnx.ModelProto, provider: str) -> GraphReport:
    """What `provider`'s published list says of each node of `model` (every node, when there is no list)."""
    nodes = graph_nodes(model)
    table = op_table(provider)
    if table is None:
        return GraphReport(graph, provider, "published list: none", len(nodes), (), has_list=False)
    answers = [(n, table.support(n.domain, n.op_type, n.dtype)) for n in nodes]
    not_taken = [(n, NOT_LISTED) for n, s in answers if s is Support.NOT_TAKEN]
    unknown = [(n, UNLISTED) for n, s in answers if s is Support.UNKNOWN]
    return GraphReport(graph, provider, f"published list: {table.citation}", len(nodes), grouped(not_taken), grouped(unknown))


# -- from ONNX Runtime's placement ---------------------------------------------------------
def session_placement(graph: str, model: onnx.ModelProto, path: Path | None, provider: str, library: Path | None) -> GraphReport:
    """ONNX Runtime's placement of `model` (read from `path` where it has weights beside it) on
    `provider` with the CPU EP behind it; `library`: a custom-op library the graph needs."""
    ort = onnxruntime()
    name = next((n for n, p in known_providers().items() if p == provider), None)
    cap = CAPABILITIES.get(name or "")
    device = None
    if cap is not None:
        from wicore.devices.providers import Device

        device = Device(cap, cap.default_index)
    opts = session_options(1, devices=[device] if device else [])
    opts.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    if library is not None:
        opts.register_custom_ops_library(str(library))
    providers: list[Any] = device.providers() if device else [provider, CPU]
    source = f"ORT placement (onnxruntime {ort.__version__})"
    try:
        with stderr_lines() as log:
            session = ort.InferenceSession(
                str(path) if path else model.SerializeToString(), sess_options=opts, providers=providers
            )
            assigned = [(sub.ep_name, node) for sub in session.get_provider_graph_assignment_info() for node in sub.get_nodes()]
    except Exception as exc:
        return GraphReport(graph, provider, source, 0, (), error=str(exc).strip().splitlines()[0])
    forced = {m.group(1) for line in log for m in [_FORCED.search(line)] if m}
    typed = {n.name: n.dtype for n in graph_nodes(model)}
    # The assignment is recorded before ORT's later pass that moves small nodes the EP took back to
    # the CPU (its "Force fallback" warnings): those land on the CPU too.
    left = [
        (
            GraphNode(node.name, node.domain or "ai.onnx", node.op_type, typed.get(node.name)),
            NO_KERNEL if ep != provider else SHAPE_MATH,
        )
        for ep, node in assigned
        if ep != provider or node.name in forced
    ]
    return GraphReport(graph, provider, source, len(assigned), grouped(left))


@contextmanager
def stderr_lines() -> Iterator[list[str]]:
    """The lines written to file descriptor 2 inside the block (ONNX Runtime logs there, below Python),
    given once the block ends; they are not shown."""
    lines: list[str] = []
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode(errors="replace").splitlines())


def placement(graph: str, model: onnx.ModelProto, path: Path | None, provider: str, library: Path | None) -> GraphReport:
    """ORT's placement where `provider` is installed here, else its published list's answer."""
    if provider in installed_providers():
        return session_placement(graph, model, path, provider, library)
    return listed_placement(graph, model, provider)
