"""`wicore serve --replicas N` / `--ray-address ADDR`: the same server on Ray Serve (wicore.serve_ray),
and `build`, the application builder that a `serve run` config file names (deploy/ray-serve.yaml).

Ray is imported only here and in wicore.serve_ray, and only when one of these flags is given:
plain `wicore serve` never imports it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

from wicore.cli.engine_args import engine_config
from wicore.errors import UsageError

INSTALL = "pip install 'wicore[ray]'"


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(f"several engine replicas on Ray Serve ({INSTALL}; see docs/DEPLOY.md)")
    g.add_argument("--replicas", type=int, default=None, help="engine replicas (a local Ray cluster unless --ray-address)")
    g.add_argument("--ray-address", default=None, help="deploy onto this running Ray cluster ('auto', or ray://HEAD:10001)")
    g.add_argument("--min-replicas", type=int, default=None, help="autoscaling: fewest replicas (with --max-replicas)")
    g.add_argument("--max-replicas", type=int, default=None, help="autoscaling: most replicas (with --min-replicas)")
    g.add_argument(
        "--max-ongoing-requests", type=int, default=64, help="requests one replica runs or queues; more wait in the router"
    )
    g.add_argument(
        "--cpus-per-replica",
        type=float,
        default=None,
        help="CPUs Ray reserves for each replica, also its --threads by default (default: on a local cluster the "
        "machine's cores shared among the replicas, else 1)",
    )
    g.add_argument("--gpus-per-replica", type=float, default=0.0, help="GPUs each replica gets (its --devices cuda:0)")
    g.add_argument(
        "--ingress-replicas",
        type=int,
        default=None,
        help="HTTP ingress processes (the API app: detokenizing and streaming); more when one is the limit, "
        "as with many streams over several GPU replicas (default 1)",
    )
    g.add_argument(
        "--routing",
        choices=("prefix", "round-robin"),
        default="prefix",
        help="prefix: a prompt goes to the replica that ran its prefix unless it is much busier (default)",
    )
    g.add_argument(
        "--max-imbalance",
        type=int,
        default=2,
        help="prefix routing: requests a prefix's replica may run beyond the least loaded one before that one gets it",
    )


def wants_cluster(args: argparse.Namespace) -> bool:
    cluster = any(getattr(args, name) is not None for name in ("replicas", "ray_address", "min_replicas", "max_replicas"))
    if not cluster and args.ingress_replicas is not None:
        raise UsageError("--ingress-replicas runs on Ray Serve: give --replicas N (or --ray-address) too")
    return cluster


def require_ray() -> None:
    try:
        import ray.serve  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"--replicas and --ray-address run on Ray Serve, which is not installed: {INSTALL}") from exc


def cluster_config(args: argparse.Namespace, model_dir: Path, settings: Any, local: bool):  # -> ClusterConfig
    """The flags' ClusterConfig; `local`: Ray runs on this machine only (CPUs are shared out by default)."""
    from wicore.serve_ray.app import ClusterConfig

    autoscaling = args.max_replicas is not None
    num_replicas = args.replicas if args.replicas is not None else max(1, args.min_replicas or 0) if autoscaling else 1
    largest = args.max_replicas if autoscaling else num_replicas
    cores = os.cpu_count() or 1
    cpus = args.cpus_per_replica if args.cpus_per_replica is not None else (max(1, cores // largest) if local else 1)
    if local and largest * cpus > cores:
        raise UsageError(
            f"{largest} replicas x {cpus:g} CPUs do not fit the {cores} cores of this machine's Ray cluster: "
            "lower --replicas / --max-replicas or --cpus-per-replica"
        )
    engine = replace(engine_config(args, model_dir), num_threads=args.threads or max(1, int(cpus)))
    try:
        return ClusterConfig(
            engine=engine,
            settings=settings,
            num_replicas=num_replicas,
            num_ingress_replicas=1 if args.ingress_replicas is None else args.ingress_replicas,
            min_replicas=args.min_replicas,
            max_replicas=args.max_replicas,
            max_ongoing_requests=args.max_ongoing_requests,
            num_cpus_per_replica=cpus,
            num_gpus_per_replica=args.gpus_per_replica,
            routing=args.routing,
            max_imbalance=args.max_imbalance,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def run_cluster(args: argparse.Namespace, model_dir: Path, settings: Any) -> int:
    """Deploy; on a local cluster serve until SIGTERM / SIGINT, then shut it down. On a running
    cluster (--ray-address) the application stays after this returns (`serve shutdown` stops it)."""
    import ray
    from ray import serve

    from wicore.serve_ray.app import application

    local = args.ray_address is None
    config = cluster_config(args, model_dir, settings, local)
    if local:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False)
    else:
        ray.init(address=args.ray_address)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(application(config), name=config.app_name, route_prefix="/")
        print(
            f"wicore: serving {settings.model_name} on http://{args.host}:{args.port} with {config.num_replicas} engine "
            f"replica(s) on Ray Serve ({config.routing} routing)",
            file=sys.stderr,
        )
        if not local:
            print(f"wicore: deployed as Ray Serve application {config.app_name!r}; `serve shutdown` stops it", file=sys.stderr)
            return 0
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.wait(1.0):
            pass
        return 0
    finally:
        if local:
            serve.shutdown()
            ray.shutdown()


def build(args: dict[str, Any]):  # -> ray.serve.Application
    """The application of a `serve run` config file: `args` holds `wicore serve`'s settings by flag
    name (model, replicas, api_key, ...), as a --config file does (deploy/ray-serve.yaml)."""
    from wicore.cli.main import parse_command_line, prepare_serve
    from wicore.serve_ray.app import application

    argv = ["serve"]
    for name, value in args.items():
        flag = "--" + name.replace("_", "-")
        values = value if isinstance(value, list) else [value]
        for v in values:
            if v is True:
                argv.append(flag)
            elif v is not False and v is not None:
                argv += [flag, str(v)]
    parsed = parse_command_line(argv)
    model_dir, settings = prepare_serve(parsed)
    return application(cluster_config(parsed, model_dir, settings, local=False))
