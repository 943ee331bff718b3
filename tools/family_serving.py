"""`wicore serve` on a tiny random checkpoint against HF transformers' greedy text: the serving half
of check_families_gpu.py (`--serve`).

A random checkpoint has no tokenizer, and a server without one answers no text, so the checkpoint
gets an id tokenizer: token i is the text "<i>", a text is its tokens joined (tokenizers' Fuse
decoder). Any id sequence, however random, then decodes to one text both sides agree on, and the
text compares the ids one for one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from wicore.api.server import free_port

STARTUP_S = 180.0  # a fresh process imports ONNX Runtime's CUDA EP and captures its decode graphs


def write_id_tokenizer(folder: Path, vocab_size: int) -> Any:
    """Save the id tokenizer (tokenizer.json, tokenizer_config.json) into the HF folder; returns it
    (a transformers PreTrainedTokenizerFast). No special tokens: no text is dropped when decoded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"<{i}>": i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<0>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(">", behavior="merged_with_previous")
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer)
    fast.save_pretrained(folder)
    return fast


def hf_greedy_text(model: Any, tokenizer: Any, prompts: list[list[int]], num_tokens: int) -> list[str]:
    """HF `generate`'s greedy continuation of each prompt (EOS not stopping it), decoded.

    Without a KV cache: each token is the argmax of HF's forward over the whole sequence so far,
    which is what a cached `generate` computes where transformers gets the cache right, and all
    that the reference may depend on. Phi-3's LongRoPE is where it does not: its generate drops the
    cache at the switch (original_max_position_embeddings) to run the whole sequence with the long
    factors, but transformers 5.17 (the GPU machine's image) still feeds only the newest token
    there, with no cache, at every step past the switch, so each of those tokens came from the one
    before it alone (5.24 feeds the whole sequence). That broken text was taken for HF's in the
    H200 records of 2026-11-28 (docs/FAMILIES.md)."""
    import torch

    texts = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=num_tokens,
                do_sample=False,
                eos_token_id=None,
                use_cache=False,
            )
        texts.append(tokenizer.decode(out[0, len(prompt) :].tolist()))
    return texts


@contextmanager
def serving(model_dir: Path, devices: str, flags: Sequence[str] = ()) -> Iterator[str]:
    """`wicore serve MODEL_DIR --devices DEVICES [FLAGS]` on a free port, once /health answers: its
    URL. Stopped (and its log printed where it failed to start) on leaving."""
    port = free_port()
    command = [sys.executable, "-m", "wicore.cli", "serve", str(model_dir), "--port", str(port), "--devices", devices, *flags]
    log_path = model_dir.with_name(model_dir.name + "-serve.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_S
        while not _answers(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"wicore serve did not come up; its log:\n{log_path.read_text()[-4000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def served_greedy_text(url: str, prompts: list[list[int]], num_tokens: int) -> list[str]:
    """/v1/completions' greedy text of each prompt (token ids, EOS ignored), the requests sent at
    once so the server batches them."""

    def complete(prompt: list[int]) -> str:
        body = {"prompt": prompt, "max_tokens": num_tokens, "temperature": 0, "ignore_eos": True}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        r.raise_for_status()
        return str(r.json()["choices"][0]["text"])

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(complete, prompts))
