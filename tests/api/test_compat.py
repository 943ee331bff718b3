"""The original WiCore API: /v1/inference and --config FILE."""

from __future__ import annotations

import json

import httpx
import pytest

from wicore.api.compat import load_config_file
from wicore.errors import RequestError


def test_original_config_keys_map_to_flags(tmp_path):
    path = tmp_path / "wicore.json"
    path.write_text(
        json.dumps(
            {
                "model_path": "m",
                "server_port": 9000,
                "max_batch_size": 8,
                "max_context_length": 4096,
                "gpu_memory_gb": 2,
                "cpu_memory_gb": 4,
                "enable_hmt": False,
                "api-key": "k",
            }
        )
    )
    assert load_config_file(path) == {
        "model": "m",
        "port": 9000,
        "max_num_seqs": 8,
        "max_context": 4096,
        "kv_pool_gb": 2,
        "host_tier_gb": 0.0,
        "nvme_tier_gb": 0.0,
        "api_key": "k",
    }


def test_toml_config(tmp_path):
    path = tmp_path / "wicore.toml"
    path.write_text("server_port = 9001\nmax_batched_tokens = 128\n")
    assert load_config_file(path) == {"port": 9001, "max_batched_tokens": 128}


def test_bad_config_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{nope")
    with pytest.raises(RequestError, match="does not parse"):
        load_config_file(path)


def test_config_file_with_flags_winning(tiny_export, tmp_path, launch):
    folder, _ = tiny_export()
    config = tmp_path / "serve.json"
    config.write_text(json.dumps({"api_key": "cfg-key", "served_model_name": "from-config", "server_port": 1, "rate_limit": 0}))
    proc, url = launch(folder, "--config", str(config))  # launch's --port overrides server_port
    try:
        r = httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer cfg-key"})
        assert r.json()["data"][0]["id"] == "from-config"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_inference_refuses_images_to_a_text_only_model(tiny_server):
    served = tiny_server()
    r = httpx.post(f"{served.url}/v1/inference", json={"prompt": "hi", "images": ["AAAA"]})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "images[0]" and "no vision partition" in error["message"]


@pytest.mark.slow
def test_inference_on_the_real_model(gemma_server):
    r = httpx.post(f"{gemma_server.url}/v1/inference", json={"prompt": "The capital of France is", "max_tokens": 6}, timeout=120)
    body = r.json()
    assert r.status_code == 200 and set(body) == {"id", "content", "token_count", "latency_ms"}
    completion = httpx.post(
        f"{gemma_server.url}/v1/completions",
        timeout=120,
        json={"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0},
    ).json()
    assert body["content"] == completion["choices"][0]["text"] and body["token_count"] == 6
