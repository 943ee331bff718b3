"""The Ray Serve application: ingress replicas (one by default) in front of N engine replicas.

    HTTP ─► Ray Serve proxy ─► Ingress (WiCore's Starlette app, wicore.api) ─► engine replicas
                               auth, limits, errors, SSE   RemoteEngine + PrefixAwareRouter   (EngineReplica)

The ingress serves the very app `wicore serve` serves (wicore.api.app.create_app), given a
RemoteEngine instead of an Engine: same routes, auth, limits, error shapes and streaming. It
takes no CPU of its own (num_cpus 0), so the CPUs Ray has go to the engines. Hypercorn's
connection limits (--max-connections, --header-timeout) do not apply: Ray's proxy holds the
connections.

An ingress detokenizes and streams every request it takes, so at a few thousand tokens a second one
ingress process is the limit (docs/PERFORMANCE.md, "Ray Serve on two GPUs"): `--ingress-replicas`
runs several, Ray's proxy spreading requests over them. Their prefix routers then share what they
learn (wicore.serve_ray.prefix_share), and the replicas' paced streams get each ingress's share.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle

from wicore.api.app import create_app
from wicore.api.settings import ServerSettings
from wicore.engine.engine import EngineConfig
from wicore.graph.manifest import Manifest
from wicore.inputs.tokenizer import Tokenizer
from wicore.kv.layout import choose_block_size
from wicore.model.tokenizer_info import TokenizerInfo
from wicore.serve_ray.board import stats_board
from wicore.serve_ray.client import RemoteEngine
from wicore.serve_ray.replica import STREAM_MESSAGES_PER_S, EngineReplica
from wicore.serve_ray.router import ROUTERS

ENGINE_START_TIMEOUT_S = 600.0  # the ingress waits this long for a first engine replica to answer


@dataclass(frozen=True)
class ClusterConfig:
    """How many engine replicas, what each gets from Ray, and how requests are spread."""

    engine: EngineConfig
    settings: ServerSettings
    num_replicas: int = 1  # the count, or with autoscaling the count to start with
    num_ingress_replicas: int = 1  # HTTP ingress processes (the app, detokenizing, SSE)
    min_replicas: int | None = None  # autoscaling bounds: both or neither
    max_replicas: int | None = None
    max_ongoing_requests: int = 64  # requests one replica runs or queues; more wait in the router
    num_cpus_per_replica: float = 1.0
    num_gpus_per_replica: float = 0.0
    routing: str = "prefix"  # or "round-robin" (wicore.serve_ray.router)
    max_imbalance: int = 2  # prefix routing yields to the least loaded past this many more requests
    app_name: str = "wicore"

    def __post_init__(self) -> None:
        if self.num_replicas < 1 or self.max_ongoing_requests < 1 or self.num_ingress_replicas < 1:
            raise ValueError("--replicas, --ingress-replicas and --max-ongoing-requests must be at least 1")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ValueError("give both --min-replicas and --max-replicas (autoscaling bounds), or neither")
        bounds = (self.min_replicas, self.max_replicas)
        if bounds[0] is not None and bounds[1] is not None and not (0 <= bounds[0] <= self.num_replicas <= bounds[1]):
            raise ValueError("autoscaling needs 0 <= --min-replicas <= --replicas <= --max-replicas")
        if self.routing not in ROUTERS:
            raise ValueError(f"--routing {self.routing!r}: choose {' or '.join(ROUTERS)}")
        if self.num_cpus_per_replica < 0 or self.num_gpus_per_replica < 0 or self.max_imbalance < 0:
            raise ValueError("CPUs and GPUs per replica, and the imbalance, must be >= 0")

    @property
    def largest_count(self) -> int:
        """Replicas there may be at once: what a cluster must have room for."""
        return self.max_replicas if self.max_replicas is not None else self.num_replicas

    def replica_options(self) -> dict[str, Any]:
        """The engine deployment's options (Ray Serve's names)."""
        scaling: dict[str, Any]
        if self.max_replicas is None:
            scaling = {"num_replicas": self.num_replicas}
        else:
            scaling = {
                "autoscaling_config": {
                    "min_replicas": self.min_replicas,
                    "initial_replicas": self.num_replicas,
                    "max_replicas": self.max_replicas,
                    "target_ongoing_requests": max(1, self.max_ongoing_requests // 2),
                }
            }
        block_size = choose_block_size(Manifest.read(Path(self.engine.model_dir)), self.engine.block_size)
        router_class = ROUTERS[self.routing]
        router = RequestRouterConfig(
            request_router_class=f"{router_class.__module__}.{router_class.__qualname__}",  # type: ignore[arg-type]  # str | Callable in Ray
            request_router_kwargs={
                "block_size": block_size,
                "max_imbalance": self.max_imbalance,
                "share_with": self.app_name if self.num_ingress_replicas > 1 else None,
            },
        )
        return {
            **scaling,
            "max_ongoing_requests": self.max_ongoing_requests,
            "ray_actor_options": {"num_cpus": self.num_cpus_per_replica, "num_gpus": self.num_gpus_per_replica},
            "request_router_config": router,
            "graceful_shutdown_timeout_s": 30.0,
        }


@serve.ingress()
class Ingress:
    """WiCore's app over the engine replicas (the class Ray Serve runs as the HTTP ingress)."""

    async def __init__(self, engines: DeploymentHandle, model_dir: str, settings: ServerSettings, app_name: str) -> None:  # type: ignore[misc]  # Ray Serve awaits an async constructor
        try:
            info = await asyncio.wait_for(engines.info.remote(), ENGINE_START_TIMEOUT_S)
        except asyncio.TimeoutError:
            raise RuntimeError(f"no engine replica answered within {ENGINE_START_TIMEOUT_S:g} s") from None
        stats_board(app_name)  # made here, so that it lives as long as the ingress
        self.engine = await RemoteEngine(engines, info, load_tokenizer(Path(model_dir)), app_name).start()
        self.settings = settings

    def __serve_build_asgi_app__(self) -> Any:
        return create_app(self.engine, self.settings)

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)  # None when the constructor failed
        if engine is not None:
            engine.stop()


def load_tokenizer(model_dir: Path) -> Tokenizer | None:
    manifest = Manifest.read(model_dir)
    if manifest.tokenizer is None:
        return None
    return Tokenizer(model_dir, TokenizerInfo.from_dict(manifest.tokenizer))


def application(config: ClusterConfig) -> Application:
    """The application to `serve.run` (or to return from a `serve run` config's import path)."""
    engines = serve.deployment(name="WiCoreEngine")(EngineReplica).options(**config.replica_options())
    ingress = serve.deployment(
        name="WiCoreIngress",
        num_replicas=config.num_ingress_replicas,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=1000,
    )(Ingress)
    messages_per_s = STREAM_MESSAGES_PER_S * config.num_ingress_replicas / config.largest_count
    return ingress.bind(
        engines.bind(config.engine, config.app_name, messages_per_s),
        str(config.engine.model_dir),
        config.settings,
        config.app_name,
    )
