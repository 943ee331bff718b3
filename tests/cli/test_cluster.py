"""`wicore serve --replicas / --ray-address` (wicore.cli.cluster): flags to a ClusterConfig, the
`serve run` builder on deploy/ray-serve.yaml, and a clear error without Ray. No cluster is started
here (tests/serve_ray/test_ray_serve_270m.py runs one)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from wicore.cli.cluster import cluster_config
from wicore.cli.main import main, parse_command_line, prepare_serve
from wicore.errors import UsageError

pytest.importorskip("ray.serve", reason="needs the wicore[ray] extra")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(gemma_270m) -> Path:
    return gemma_270m(1)


def config(model_dir: Path, *flags: str, local: bool = True):
    args = parse_command_line(["serve", "--model", str(model_dir), *flags])
    _, settings = prepare_serve(args)
    return cluster_config(args, model_dir, settings, local)


def test_replicas_share_the_machine_cores_and_their_threads_follow(model_dir):
    cores = os.cpu_count() or 1
    c = config(model_dir, "--replicas", "2")
    assert c.num_replicas == 2 and c.max_replicas is None
    assert c.num_cpus_per_replica == max(1, cores // 2) and c.engine.num_threads == max(1, cores // 2)
    options = c.replica_options()
    assert options["num_replicas"] == 2 and options["ray_actor_options"] == {"num_cpus": c.num_cpus_per_replica, "num_gpus": 0.0}
    assert options["request_router_config"].request_router_kwargs == {"block_size": 16, "max_imbalance": 2, "share_with": None}
    # On a running cluster a replica takes 1 CPU unless told; --threads wins over the CPUs.
    c = config(model_dir, "--replicas", "3", "--threads", "2", "--max-ongoing-requests", "8", local=False)
    assert (c.num_cpus_per_replica, c.engine.num_threads, c.replica_options()["max_ongoing_requests"]) == (1, 2, 8)


def test_autoscaling_bounds_become_rays_autoscaling_config(model_dir):
    c = config(model_dir, "--min-replicas", "1", "--max-replicas", "4", "--cpus-per-replica", "1", local=False)
    assert c.replica_options()["autoscaling_config"] == {
        "min_replicas": 1,
        "initial_replicas": 1,
        "max_replicas": 4,
        "target_ongoing_requests": 32,
    }
    with pytest.raises(UsageError, match="both --min-replicas and --max-replicas"):
        config(model_dir, "--max-replicas", "4", "--cpus-per-replica", "1", local=False)
    with pytest.raises(UsageError, match="--replicas <= --max-replicas"):
        config(model_dir, "--replicas", "5", "--min-replicas", "1", "--max-replicas", "4", "--cpus-per-replica", "1", local=False)
    with pytest.raises(UsageError, match="do not fit the"):
        config(model_dir, "--replicas", str((os.cpu_count() or 1) + 1), "--cpus-per-replica", "1")


def test_several_ingress_replicas_share_their_prefix_routing(model_dir):
    c = config(model_dir, "--replicas", "2", "--ingress-replicas", "3", local=False)
    assert c.num_ingress_replicas == 3
    assert c.replica_options()["request_router_config"].request_router_kwargs["share_with"] == c.app_name == "wicore"
    assert config(model_dir, "--replicas", "2", local=False).num_ingress_replicas == 1
    with pytest.raises(UsageError, match="--ingress-replicas and --max-ongoing-requests must be at least 1"):
        config(model_dir, "--replicas", "2", "--ingress-replicas", "0", local=False)


def test_ingress_replicas_without_a_cluster_is_refused_in_one_line(capsys):
    assert main(["serve", "--ingress-replicas", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "wicore: error: --ingress-replicas runs on Ray Serve: give --replicas N (or --ray-address) too"


def test_an_engine_process_on_a_cluster_is_refused_in_one_line(capsys):
    assert main(["serve", "--replicas", "2", "--engine-process", "on"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "wicore: error: --engine-process is for one server: on Ray Serve each engine replica is a process of its own already"
    )


def test_the_serve_run_config_file_builds_the_application(model_dir):
    import yaml
    from ray.serve import Application

    from wicore.cli.cluster import build

    spec = yaml.safe_load((REPO / "deploy" / "ray-serve.yaml").read_text())
    [app] = spec["applications"]
    module, _, name = app["import_path"].partition(":")
    assert (module, name) == ("wicore.cli.cluster", "build")
    assert isinstance(build({**app["args"], "model": str(model_dir)}), Application)


def test_without_ray_the_flags_say_which_extra_to_install(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)
    monkeypatch.setitem(sys.modules, "ray.serve", None)
    assert main(["serve", "--replicas", "2"]) == 2
    assert "pip install 'wicore[ray]'" in capsys.readouterr().err


def test_plain_serve_never_imports_ray():
    code = (
        "import sys, wicore.cli.main as m; m.parse_command_line(['serve']); import wicore.api.server; print('ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
