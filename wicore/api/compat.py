"""The original WiCore API, kept for clients written against it.

    POST /v1/inference  {prompt, images?, max_tokens?, temperature?, an output constraint?}
                     -> {id, content, token_count, latency_ms}

The output constraint is any of the chat endpoint's (response_format, structured_outputs,
guided_*: wicore.api.structured).

`images` is a list of base64 images (or data: URLs). They go where the prompt writes
`<start_of_image>`, one each, in order; a prompt without any gets them all in front of its text.

`--config FILE` (JSON or TOML) takes the flags' names (`port`, `kv_pool_gb`, ...) and the
original keys below; flags given on the command line win over the file.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Hashable
from pathlib import Path
from typing import Any

from wicore.api.errors import APIError
from wicore.api.generation import ChoiceStats, run_choice
from wicore.api.images import ImagePart
from wicore.api.schemas import Options, _bad, _int, _number, _object
from wicore.api.streaming import merge
from wicore.api.structured import parse_structured
from wicore.errors import ImageTokenError, RequestError
from wicore.inputs.tokenizer import Tokenizer
from wicore.model.vision import VisionConfig
from wicore.types.images import image_token_texts
from wicore.types.limits import TEMPERATURE

# Original config key -> flag destination.
ORIGINAL_KEYS: dict[str, str] = {
    "model_path": "model",
    "server_port": "port",
    "server_host": "host",
    "max_batch_size": "max_num_seqs",
    "max_context_length": "max_context",
    "gpu_memory_gb": "kv_pool_gb",
    "cpu_memory_gb": "host_tier_gb",
    "kv_stream_tokens": "kv_offload_tokens",  # its name until issue 30 (also `--kv-stream-tokens`, hidden)
}


def load_config_file(path: Path) -> dict[str, Any]:
    """The file's settings under the flags' destination names (`max-num-seqs` -> `max_num_seqs`)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise RequestError(f"cannot read the config file {path}: {exc.strerror}") from exc
    try:
        if Path(path).suffix.lower() == ".toml":
            try:
                import tomllib
            except ImportError:  # Python 3.10
                raise RequestError("TOML config files need Python 3.11 or later; use JSON") from None

            raw = tomllib.loads(text)
        else:
            raw = json.loads(text)
    except ValueError as exc:
        raise RequestError(f"the config file {path} does not parse: {exc}") from exc
    if not isinstance(raw, dict):
        raise RequestError(f"the config file {path} must hold a table/object of settings")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name == "enable_hmt":
            if not value:  # HMT off: no tiers below the device pool
                values.update(host_tier_gb=0.0, nvme_tier_gb=0.0)
            continue
        values[ORIGINAL_KEYS.get(name, name)] = value
    return values


async def inference(api: Any, body: Any, connection: Hashable | None = None) -> dict[str, Any]:
    """Run one /v1/inference request on `api` (a wicore.api.app.API); cancelling it aborts the
    request. It counts toward `connection`'s share of the queue while it runs."""
    body = _object(body)
    prompt = body.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise _bad("prompt", "expected a non-empty string")
    opts = Options(
        max_tokens=_int(body, "max_tokens", 1),
        temperature=_number(body, "temperature", TEMPERATURE, default=0.0),
        structured=parse_structured(body),
    )
    await api.compile_constraint(opts)
    images = await api.images(_image_parts(body.get("images")))
    tok = api._tokenizer()
    if images:
        boi = image_marker(tok, api.engine.vision.config)
        prompt = await asyncio.to_thread(api.engine.expand_images, prompt if boi in prompt else boi * len(images) + prompt)
    ids = await asyncio.to_thread(tok.encode, prompt)  # off the event loop: a long prompt takes a while
    started = time.monotonic()
    request_id = f"inf-{uuid.uuid4().hex[:24]}"
    release = api.in_flight.claim(connection, 1)
    try:
        [engine_id] = api.add_requests(request_id, [ids], opts, "prompt", images)
    except BaseException:
        release()
        raise
    stats = ChoiceStats(num_prompt_tokens=len(ids))
    text = ""
    try:
        async for _, piece in merge([run_choice(api.engine, engine_id, ids, (), stats)], api.streams):
            text += piece.text  # a shutdown cuts it with a 503, as the chat and completion answers
    finally:  # cancelled (the client went away: wicore.api.connections.until_disconnect) before it read, or while
        api.engine.cancel(engine_id)
        release()
    api.metrics.observe_choice(stats, time.monotonic())
    return {
        "id": request_id,
        "content": text,
        "token_count": stats.num_completion_tokens,
        "latency_ms": round((time.monotonic() - started) * 1000.0, 3),
    }


def image_marker(tok: Tokenizer, vision: VisionConfig) -> str:
    """The text of the image-start token (`<start_of_image>`) that places a prompt's images; a 400
    where the tokenizer lacks the vision config's image tokens (wicore.types.images.image_token_texts)."""
    try:
        return image_token_texts(tok.id_to_token, vision)[0]
    except ImageTokenError as exc:
        raise APIError(400, str(exc), param="images", code="images_not_supported") from exc


def _image_parts(images: Any) -> tuple[ImagePart, ...]:
    """`images`: base64 strings (or data: URLs) -> image parts named images[i]."""
    if images is None:
        return ()
    if not isinstance(images, list) or not all(isinstance(i, str) and i for i in images):
        raise _bad("images", "expected a list of base64-encoded images")
    return tuple(ImagePart(i if i.startswith("data:") else f"data:;base64,{i}", f"images[{n}]") for n, i in enumerate(images))
