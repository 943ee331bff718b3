"""`wicore doctor MODEL`: for each execution provider installed here (or named with --ep), which nodes
of each of the export's graphs it would not take, so that a user with an Ascend, AMD or Intel card
learns it before serving. Loads each graph into a session for an installed EP (ONNX Runtime's own
placement), and reads the EP's published operator list for one that is not (wicore.devices.doctor).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

from wicore.errors import UsageError


def add_doctor(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "doctor",
        help="list the nodes of an export each execution provider would leave to the CPU (ORT's placement where "
        "the EP is installed, its published operator list where not)",
    )
    p.add_argument(
        "model",
        help="an exported model folder, or what serve takes (a packaged name, a .gguf file, a Hugging Face folder or "
        "Hub id: exported on first use, as serve does)",
    )
    p.add_argument(
        "--ep",
        action="append",
        default=[],
        metavar="NAME",
        help="an execution provider to ask about, installed or not: cpu, cuda, tensorrt, migraphx, rocm, openvino, cann, "
        "dml, webgpu, coreml, qnn (or ONNX Runtime's name); repeat or separate by commas; 'all' for every one "
        "(default: those installed here)",
    )
    p.add_argument(
        "--devices",
        default="cpu",
        help="the devices a model that is not yet exported is exported for, as serve's --devices, installed here or not "
        "(default: cpu)",
    )
    p.set_defaults(func=run_doctor)


def chosen_providers(names: list[str]) -> list[str]:
    """ONNX Runtime's names of the EPs `--ep` names (every installed one WiCore knows, when none)."""
    from wicore.devices.doctor import known_providers
    from wicore.devices.providers import installed_providers

    known = known_providers()
    if not names:
        installed = set(installed_providers())
        return [p for p in known.values() if p in installed]
    wanted = [w.strip() for name in names for w in name.split(",") if w.strip()]
    if "all" in (w.lower() for w in wanted):
        return list(known.values())
    by_provider = {p.lower(): p for p in known.values()}
    chosen = []
    for word in wanted:
        provider = known.get(word.lower()) or by_provider.get(word.lower())
        if provider is None:
            raise UsageError(f"--ep {word}: unknown execution provider; known: {', '.join(known)} (or 'all')")
        chosen.append(provider)
    return list(dict.fromkeys(chosen))


def export_graphs(model_dir: Path) -> Iterator[tuple[str, object, Path | None]]:
    """(label, graph without weights, its file) of each graph an engine on this export runs."""
    from wicore.devices.graph_nodes import load_graph
    from wicore.graph.manifest import Manifest
    from wicore.graph.sampling import head_model

    manifest = Manifest.read(model_dir)
    for record in manifest.partitions:
        yield record.file, load_graph(model_dir / record.file), model_dir / record.file
    if manifest.vision is not None:
        yield manifest.vision.file, load_graph(model_dir / manifest.vision.file), model_dir / manifest.vision.file
    if manifest.sampling_head:
        yield "sampling head (built at load)", head_model(manifest.config.vocab_size), None


def kernels_for(model_dir: Path, provider: str) -> Path | None:
    """WiCore's kernel library, where the export's graphs use its ops (built once; None otherwise)."""
    from wicore.graph.manifest import Manifest

    if Manifest.read(model_dir).kernels != "wicore":
        return None
    from wicore.kernels.library import library

    return library(provider == "CUDAExecutionProvider")


def run_doctor(args: argparse.Namespace) -> int:
    from wicore.cli.models import resolve_model
    from wicore.cli.plan import is_model_name_or_path
    from wicore.devices.doctor import placement

    providers = chosen_providers(args.ep)
    if not is_model_name_or_path(args.model):
        raise UsageError(f"{args.model}: no such model folder; give an exported model's folder or a packaged name")
    # the flavour serve would export for --devices, whether or not they are installed here
    model_dir = resolve_model(args.model, args.devices, is_installed=False)
    graphs = list(export_graphs(model_dir))
    print(f"{model_dir}: {len(graphs)} graph{'s' if len(graphs) > 1 else ''} ({', '.join(label for label, _, _ in graphs)})")
    for provider in providers:
        library = kernels_for(model_dir, provider)
        reports = [placement(label, graph, file, provider, library) for label, graph, file in graphs]  # type: ignore[arg-type]
        print(f"\n{provider} [{reports[0].source}]")
        for report in reports:
            print(f"  {report.graph}: {report.verdict()}")
            for group in (*report.fallbacks, *report.unknown):
                shown = ", ".join(group.names[:3]) + (", ..." if len(group.names) > 3 else "")
                print(f"    {group.label:<32} x{len(group.names):<5} {group.reason}: {shown}")
    return 0
