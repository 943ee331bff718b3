"""Images through the HTTP API, on the tiny random multimodal Gemma 3 (tests/multimodal.py).

The acceptance test drives a real `wicore serve` (a subprocess on a free port) with the `openai`
package and holds its greedy text to HF's `generate`; the limit and error tests run the same
app in-process (wicore.api.server.ServerThread).
"""

from __future__ import annotations

import base64
import http.server
import threading

import httpx
import pytest
from multimodal import png, user

from wicore.api.images import ImageSettings
from wicore.inputs.image_loader import ImageLimits

IMAGE = png(5, (64, 48))


def blank(width: int, height: int) -> bytes:
    """A PNG of one colour: many pixels, few bytes."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


def chat_body(*parts: str | dict, **extra: object) -> dict:
    """A one-turn chat: strings are text parts, dicts image_url parts."""
    content = [{"type": "text", "text": p} if isinstance(p, str) else {"type": "image_url", "image_url": p} for p in parts]
    return {"messages": [{"role": "user", "content": content}], "max_tokens": 4, "temperature": 0, **extra}


def hf_text(tiny, messages: list[dict], images: list[bytes], max_tokens: int) -> tuple[str, int]:
    """HF's greedy text for a conversation, and its number of prompt tokens."""
    import torch

    inputs = tiny.inputs(messages, images)
    num_prompt_tokens = inputs["input_ids"].shape[1]
    with torch.no_grad():
        out = tiny.model.generate(**inputs, max_new_tokens=max_tokens, do_sample=False)
    return tiny.processor.tokenizer.decode(out[0, num_prompt_tokens:], skip_special_tokens=True), num_prompt_tokens


@pytest.fixture(scope="module")
def served(multimodal_server):
    """The tiny multimodal export in-process, with small image limits."""
    return multimodal_server(images=ImageSettings(max_images=2, limits=ImageLimits(max_bytes=64_000, max_pixels=100_000)))


def test_greedy_chat_through_wicore_serve_equals_hf_generate(tiny_multimodal, launch):
    from openai import OpenAI

    proc, url = launch(tiny_multimodal.export(), "--served-model-name", "tiny-mm", "--kv-pool-gb", "0.01")
    try:
        client = OpenAI(base_url=f"{url}/v1", api_key="none")
        second = png(6, (30, 90), "JPEG")
        content = [
            {"type": "text", "text": "Compare"},
            {"type": "image_url", "image_url": {"url": data_url(IMAGE)}},
            {"type": "text", "text": "and"},
            {"type": "image_url", "image_url": {"url": data_url(second, "image/jpeg")}},
        ]
        reply = client.chat.completions.create(
            model="tiny-mm", messages=[{"role": "user", "content": content}], max_tokens=12, temperature=0
        )
        expected, num_prompt_tokens = hf_text(tiny_multimodal, user("Compare", IMAGE, "and", second), [IMAGE, second], 12)
        assert reply.choices[0].message.content == expected and expected
        assert reply.usage.prompt_tokens == num_prompt_tokens
        stream = client.chat.completions.create(
            model="tiny-mm", messages=[{"role": "user", "content": content}], max_tokens=12, temperature=0, stream=True
        )
        assert "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices) == expected
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_inference_takes_base64_images_in_front_of_the_prompt(served, tiny_multimodal):
    import torch

    r = httpx.post(
        f"{served.url}/v1/inference", json={"prompt": "Describe", "images": [base64.b64encode(IMAGE).decode()], "max_tokens": 8}
    )
    assert r.status_code == 200, r.text
    inputs = tiny_multimodal.processor(text="<start_of_image>Describe", images=[_pil(IMAGE)], return_tensors="pt")
    with torch.no_grad():
        out = tiny_multimodal.model.generate(**inputs, max_new_tokens=r.json()["token_count"], do_sample=False)
    expected = tiny_multimodal.processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert r.json()["content"] == expected


def _pil(data: bytes):
    import io

    from PIL import Image

    return Image.open(io.BytesIO(data))


@pytest.mark.parametrize(
    "url, message",
    [
        ("data:image/png;base64,@@@@", "not valid base64"),
        (data_url(b"GIF89a but not really an image"), "not a readable PNG, JPEG, WEBP, GIF image"),
        (data_url(IMAGE[: len(IMAGE) // 2]), "truncated or corrupt"),
        (data_url(png(7, (200, 200))), "bytes; the limit is 64000"),
        (data_url(blank(400, 300)), "400x300 = 120000 pixels; the limit is 100000"),
        ("data:text/plain;base64,aGk=", "send an image"),
        ("https://example.com/cat.png", "does not fetch image URLs: send the image inline as a data: URL"),
        ("file:///etc/passwd", "expected a data: URL"),
    ],
    ids=["base64", "not-an-image", "truncated", "bytes", "pixels", "text", "remote", "file"],
)
def test_a_bad_image_is_a_400_naming_its_content_part(served, url, message):
    r = httpx.post(f"{served.url}/v1/chat/completions", json=chat_body("Look", {"url": data_url(IMAGE)}, "and", {"url": url}))
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "messages[0].content[3]", r.text
    assert message in error["message"] and error["code"] == "invalid_image" and error["type"] == "invalid_request_error"


def test_too_many_images_and_the_body_limit(served):
    three = chat_body(*[{"url": data_url(IMAGE)}] * 3)
    r = httpx.post(f"{served.url}/v1/chat/completions", json=three)
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_images"
    assert r.json()["error"]["param"] == "messages[0].content[2]"
    assert served.app.state.api.body_limit == 32 << 20  # base64 images in JSON: not the text models' 1 MiB


def test_remote_urls_are_fetched_when_the_operator_allows_it(multimodal_server):
    class Images(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = IMAGE if self.path == "/cat.png" else IMAGE * 10
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    images = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Images)
    threading.Thread(target=images.serve_forever, daemon=True).start()
    settings = ImageSettings(limits=ImageLimits(max_bytes=len(IMAGE) * 2), fetch_urls=True, fetch_timeout=5)
    app = multimodal_server(images=settings)
    try:
        base = f"http://127.0.0.1:{images.server_address[1]}"
        fetched = httpx.post(f"{app.url}/v1/chat/completions", json=chat_body("Look", {"url": f"{base}/cat.png"}))
        inline = httpx.post(f"{app.url}/v1/chat/completions", json=chat_body("Look", {"url": data_url(IMAGE)}))
        assert fetched.status_code == 200 and fetched.json()["choices"] == inline.json()["choices"]
        big = httpx.post(f"{app.url}/v1/chat/completions", json=chat_body("Look", {"url": f"{base}/big.png"}))
        assert big.status_code == 400 and "more than" in big.json()["error"]["message"]
    finally:
        images.shutdown()
