"""The HTTP surface on a real Hypercorn server and a tiny random model (no tokenizer):
auth, rate limit, body limit, errors in OpenAI's shape, metrics, stats, CORS, OpenAPI."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from starlette.requests import Request
from starlette.responses import Response

from wicore.api.app import ServerSettings, create_app
from wicore.api.server import ServerThread
from wicore.engine.engine import Engine, EngineConfig
from wicore.errors import OverloadedError, RequestError


@pytest.fixture(scope="module")
def open_server(tiny_server):
    return tiny_server(max_body_bytes=4096, cors_origins=("https://app.example",))


@pytest.fixture(scope="module")
def locked_server(tiny_server):
    return tiny_server(api_keys=("secret-1", "secret-2"), rate_limit_rpm=60, rate_limit_burst=3)


async def raise_by_name(request: Request) -> Response:
    """A route that raises the exception its path names, with the message "boom"."""
    kinds = {"RuntimeError": RuntimeError, "RequestError": RequestError, "OverloadedError": OverloadedError}
    raise kinds[request.path_params["name"]]("boom")


@pytest.fixture(scope="module")
def raising_url(open_server):
    """The real app over the open server's engine, with one more route, /raise/{name}, that raises:
    what a bug in any handler looks like to the app's exception handlers (Starlette's test style)."""
    app = create_app(open_server.engine, ServerSettings(model_name="tiny"))
    app.add_route("/raise/{name}", raise_by_name, methods=["GET"])
    server = ServerThread(app).start()
    yield server.url
    server.stop()


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    return error


def test_health_and_models(open_server):
    assert httpx.get(f"{open_server.url}/health").json() == {"status": "ok"}
    client = openai.OpenAI(base_url=f"{open_server.url}/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_bad_parameter_is_400_naming_it(open_server):
    client = openai.OpenAI(base_url=f"{open_server.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], temperature=5)
    assert info.value.param == "temperature" and "temperature" in info.value.message
    r = httpx.post(f"{open_server.url}/v1/completions", json={"prompt": "a", "top_p": "high"})
    assert_openai_error(r, 400, "top_p")


def test_unknown_model_is_404(open_server):
    r = httpx.post(f"{open_server.url}/v1/completions", json={"model": "gpt-9", "prompt": [1, 2]})
    assert assert_openai_error(r, 404, "model")["code"] == "model_not_found"


def test_text_endpoints_without_a_tokenizer_say_so(open_server):
    r = httpx.post(f"{open_server.url}/v1/completions", json={"prompt": "hello"})
    assert "without a tokenizer" in assert_openai_error(r, 400)["message"]
    # Token ids too: the answer's text could not be decoded.
    r = httpx.post(f"{open_server.url}/v1/completions", json={"prompt": [1, 2, 3]})
    assert "without a tokenizer" in assert_openai_error(r, 400)["message"]


def test_malformed_json_and_body_limit(open_server):
    r = httpx.post(f"{open_server.url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert_openai_error(r, 400)
    r = httpx.post(f"{open_server.url}/v1/completions", json={"prompt": "x" * 5000})
    assert "4096" in assert_openai_error(r, 413)["message"]


def test_the_default_body_limit_holds_the_longest_prompt():
    """16 bytes a token, at least 1 MiB: a 32K model keeps 1 MiB, a 128K one takes 2 MiB."""
    settings = ServerSettings()
    assert (settings.body_limit(False, 32768), settings.body_limit(False, 131072)) == (1 << 20, 2 << 20)
    assert settings.body_limit(True, 131072) == 32 << 20
    assert ServerSettings(max_body_bytes=4096).body_limit(False, 131072) == 4096


def test_a_128k_model_reads_a_body_of_over_1_mib(tiny_export):
    """A tiny model with 131,072 positions and a pool that holds them takes 2 MiB bodies: 240,000
    token ids (1.2 MB) are read and parsed (this model has no tokenizer to answer with: a 400,
    where 1 MiB gave a 413); 440,000 (2.2 MB) are not."""
    full, sliding = {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}, {"rope_type": "default", "rope_theta": 1e4}
    folder, _ = tiny_export(
        1, max_position_embeddings=131072, rope_parameters={"full_attention": full, "sliding_attention": sliding}
    )
    pool = dict(num_device_blocks=8194, num_window_device_blocks=8, num_host_blocks=0)
    engine = Engine(EngineConfig(folder, num_threads=1, verify_files=False, **pool)).start()
    app = create_app(engine, ServerSettings(model_name="long"))
    server = ServerThread(app).start()
    try:
        assert (engine.max_sequence_tokens, app.state.api.body_limit) == (131072, 2 << 20)
        url, headers = f"{server.url}/v1/completions", {"content-type": "application/json"}
        body = lambda n: json.dumps({"prompt": [511] * n, "max_tokens": 1}).encode()  # 5 bytes a token: "511, "
        assert (len(body(240_000)), len(body(440_000))) == (1_200_029, 2_200_029)
        read = httpx.post(url, content=body(240_000), headers=headers, timeout=60)
        assert assert_openai_error(read, 400)["message"] == "this model was exported without a tokenizer: send token ids"
        too_large = httpx.post(url, content=body(440_000), headers=headers, timeout=60)
        assert "2097152" in assert_openai_error(too_large, 413)["message"]
    finally:
        server.stop()
        engine.stop()


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions", "/v1/inference"])
def test_json_too_deep_or_with_a_lone_surrogate_is_a_400(open_server, route):
    headers = {"content-type": "application/json"}
    deep = httpx.post(f"{open_server.url}{route}", content=b"[" * 3000, headers=headers)
    assert "nested too deeply" in assert_openai_error(deep, 400)["message"]
    body = b'{"prompt": "a\\ud800b", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    surrogate = httpx.post(f"{open_server.url}{route}", content=body, headers=headers)
    assert "lone surrogate" in assert_openai_error(surrogate, 400)["message"]
    assert httpx.get(f"{open_server.url}/health").status_code == 200


def test_unknown_route_and_method_are_openai_shaped(open_server):
    assert_openai_error(httpx.get(f"{open_server.url}/v1/nothing"), 404)
    assert_openai_error(httpx.get(f"{open_server.url}/v1/completions"), 405)


def test_exception_in_one_request_is_500_and_the_server_goes_on(raising_url):
    error = assert_openai_error(httpx.get(f"{raising_url}/raise/RuntimeError"), 500)
    assert error["type"] == "server_error" and error["code"] == "internal_error"
    assert "boom" not in error["message"] and "see the server log" in error["message"]
    assert httpx.get(f"{raising_url}/v1/models").json()["data"][0]["id"] == "tiny"


def test_cors(open_server):
    r = httpx.options(
        f"{open_server.url}/v1/models", headers={"Origin": "https://app.example", "Access-Control-Request-Method": "GET"}
    )
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
    r = httpx.get(f"{open_server.url}/health", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in r.headers


def test_a_refused_cors_preflight_is_an_openai_error(open_server):
    headers = {"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    r = httpx.options(f"{open_server.url}/v1/completions", headers=headers)
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    assert r.json() == {
        "error": {
            "message": "CORS preflight from 'https://evil.example' refused: its origin is not allowed (see wicore serve --cors-origin)",
            "type": "invalid_request_error",
            "param": None,
            "code": "cors_not_allowed",
        }
    }
    assert "access-control-allow-origin" not in r.headers and r.headers["vary"].startswith("Origin")


def test_401_without_or_with_a_wrong_key(locked_server):
    client = openai.OpenAI(base_url=f"{locked_server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        client.models.list()
    assert_openai_error(httpx.get(f"{locked_server.url}/v1/models"), 401)
    assert httpx.get(f"{locked_server.url}/health").status_code == 200  # health needs no key


def test_429_with_retry_after_per_key(locked_server):
    client = openai.OpenAI(base_url=f"{locked_server.url}/v1", api_key="secret-1", max_retries=0)
    statuses = []
    for _ in range(6):
        try:
            client.models.list()
            statuses.append(200)
        except openai.RateLimitError as exc:
            statuses.append(429)
            assert int(exc.response.headers["retry-after"]) >= 1
    assert statuses[:3] == [200, 200, 200] and 429 in statuses[3:]
    other = openai.OpenAI(base_url=f"{locked_server.url}/v1", api_key="secret-2", max_retries=0)
    assert [m.id for m in other.models.list()] == ["tiny"]


def test_stats_and_metrics(open_server):
    stats = httpx.get(f"{open_server.url}/v1/stats").json()
    assert stats["running"] == 0 and stats["blocks_referenced"]["device"] == 0
    text = httpx.get(f"{open_server.url}/metrics").text
    for name in (
        "wicore_requests_total",
        "wicore_prompt_tokens_total",
        "wicore_generated_tokens_total",
        "wicore_time_to_first_token_seconds_bucket",
        "wicore_inter_token_seconds_bucket",
        "wicore_e2e_request_seconds_bucket",
        "wicore_requests_running",
        "wicore_requests_waiting",
        'wicore_kv_blocks_used{tier="device"}',
        'wicore_kv_blocks_free{tier="host"}',
        "wicore_prefix_cache_hit_rate",
    ):
        assert name in text
    assert 'wicore_requests_total{route="/health",status="200"}' in text


@pytest.mark.slow  # 4 s on the 2-core VM, loaded
def test_unknown_paths_share_one_metrics_series(open_server):
    """Random paths (no key needed to send them) must not add a series each to /metrics."""
    for i in range(50):
        assert httpx.get(f"{open_server.url}/no/such/path/{i}").status_code == 404
    text = httpx.get(f"{open_server.url}/metrics").text
    series = [line for line in text.splitlines() if line.startswith("wicore_requests_total{")]
    assert not [line for line in series if "no/such" in line]
    other = [line for line in series if 'route="other",status="404"' in line]
    assert len(other) == 1 and float(other[0].split()[-1]) >= 50


def test_openapi_lists_the_endpoints(open_server):
    schema = httpx.get(f"{open_server.url}/openapi.json").json()
    assert {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/v1/stats"} <= set(schema["paths"])


def test_openapi_lists_415_and_token_id_prompts(open_server):
    """Issue 35: both were missing (a keyless server answers 415 to non-JSON bodies)."""
    import jsonschema

    schema = httpx.get(f"{open_server.url}/openapi.json").json()
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/inference"):
        assert {"408", "415", "431"} <= set(schema["paths"][path]["post"]["responses"]), path
    prompt = schema["paths"]["/v1/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    prompt = prompt["properties"]["prompt"]
    for good in ("text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]):
        jsonschema.validate(good, prompt)
    for bad in ([], [[]], [1, "a"], [-1]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, prompt)


def test_a_405_says_which_methods_the_route_takes(open_server):
    """Issue 35: 405s came without Allow."""
    r = httpx.get(f"{open_server.url}/v1/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    r = httpx.delete(f"{open_server.url}/v1/models")
    assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == {"GET", "HEAD"}


def test_headers_past_16_kib_in_one_write_are_a_431(open_server):
    """Issue 35: Hypercorn refuses headers still incomplete past 16 KiB, but took 20 KB sent at once."""
    import socket

    big = "x" * 20_000
    with socket.create_connection(("127.0.0.1", open_server.server.port)) as sock:
        sock.sendall(f"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: {big}\r\n\r\n".encode())
        reply = b""
        while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 ")
    error = json.loads(body)["error"]
    assert error["code"] == "headers_too_large" and error["message"].endswith("bytes; the limit is 16384")
    fits = httpx.get(f"{open_server.url}/v1/models", headers={"x-big": "x" * 15_000})
    assert fits.status_code == 200


def test_a_500_is_logged_once_with_its_traceback(raising_url, caplog):
    """Issue 35: Starlette's last-resort handler re-raises after answering, so Hypercorn logged
    every 500 a second time."""
    import logging
    import time

    with caplog.at_level(logging.INFO):
        error = assert_openai_error(httpx.get(f"{raising_url}/raise/RuntimeError"), 500)
        time.sleep(0.2)  # the server's own log lines, if any, come from its thread
    request_id = error["message"].split("(request ")[1].split(")")[0]
    tracebacks = [r for r in caplog.records if r.exc_info is not None]
    assert [r.getMessage() for r in tracebacks] == [f"request {request_id} (GET /raise/RuntimeError) failed"]


def test_docs_is_a_self_contained_page_over_the_openapi_schema(open_server):
    """/docs renders /openapi.json in the browser (checked in headless chromium when written);
    here: it is served, loads nothing from another host, and the schema has what it reads."""
    r = httpx.get(f"{open_server.url}/docs")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert 'fetch("/openapi.json")' in r.text
    assert "http://" not in r.text and "https://" not in r.text and "<script src" not in r.text
    schema = httpx.get(f"{open_server.url}/openapi.json").json()
    chat = schema["paths"]["/v1/chat/completions"]["post"]
    assert schema["info"]["title"] and chat["summary"] == "Chat completion"
    assert "messages" in chat["requestBody"]["content"]["application/json"]["schema"]["properties"]


def test_engine_errors_raised_in_a_route_map_to_their_status(raising_url):
    error = assert_openai_error(httpx.get(f"{raising_url}/raise/RequestError"), 400)
    assert error["message"] == "boom" and error["type"] == "invalid_request_error"
    r = httpx.get(f"{raising_url}/raise/OverloadedError")
    assert assert_openai_error(r, 503)["code"] == "overloaded" and r.headers["retry-after"] == "1"
