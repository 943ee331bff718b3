"""What the suite builds once and keeps: the export cache's key and lock, files shared between exports, and
HF references loaded once (tests/conftest.py's fixtures use these).

With WICORE_TEST_CACHE set, exports and HF references are kept there between runs, in a folder keyed by the
source of wicore/export, wicore/graph and wicore/model (`code_key`), so that a change to the exporter
invalidates them. Under pytest-xdist the workers share that folder: `build_lock` makes one build a thing
while the others wait for it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import wicore

ROOT = Path(wicore.__file__).parent


def code_key() -> str:
    h = hashlib.sha256()
    for path in sorted([*ROOT.glob("export/*.py"), *ROOT.glob("graph/*.py"), *ROOT.glob("model/*.py")]):
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


@contextmanager
def build_lock(target: Path) -> Iterator[None]:
    """Hold an exclusive lock named after `target` (a sibling `.lock` file): under pytest-xdist the
    workers share WICORE_TEST_CACHE, so one builds a cached thing while the others wait for it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


SHARE_MIN_BYTES = 1 << 20


def share_identical_files(folder: Path, blobs: Path) -> None:
    """Hard-link each large file of `folder` to the one copy in `blobs` with the same bytes.

    The suite exports one model in several flavours whose weights and tokenizers are byte-identical
    (the 270M's fp32 weights are 1 GiB in each of four exports); linked, the cache is ~3 GiB smaller,
    which is what a CI machine with little free disk needs (a run ran out of it writing the cache).
    Cached files are only ever read or replaced, never written in place, so sharing them is safe."""
    blobs.mkdir(parents=True, exist_ok=True)
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path.stat().st_size < SHARE_MIN_BYTES:
            continue
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
        blob = blobs / digest.hexdigest()
        if not blob.exists():
            os.link(path, blob)
        elif not blob.samefile(path):
            staged = path.with_name(path.name + ".link")
            os.link(blob, staged)
            staged.replace(path)


@contextmanager
def gguf_read_once() -> Iterator[None]:
    """While transformers loads a GGUF: each GGUF file parsed once, each gguf-py tensor-name map built
    once. transformers parses the file for the config and again for the weights (gguf-py reads every
    string of the vocabulary one by one), and builds the same name map anew for each of the model's
    submodules: most of the minutes a cold load took. Both are read-only, so the weights are the same
    bit for bit (checked against a load without this: tests/test_smollm2.py's reference)."""
    import functools

    import gguf

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", functools.lru_cache(maxsize=None)(gguf.GGUFReader))
        patch.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
        yield


def hf_reference(name: str, source: str, cache_dir: Path) -> object:
    """wicore.cli.verify.load_hf_model(source): transformers' model on a GGUF's weights (fp32, eager).

    transformers dequantizes a GGUF in Python: 1 to 6 minutes for the 270M on 2 busy cores. The first
    load keeps the model's config and fp32 state dict in the cache (under a lock, so xdist workers
    load it once); later sessions and workers build the same model from them in seconds: the same
    config and the same fp32 tensors, bit for bit."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    from wicore.cli.verify import load_hf_model

    saved = cache_dir / f"hf-{name}-transformers-{transformers.__version__}"
    with build_lock(saved):
        if not (saved / "state_dict.pt").is_file():
            with gguf_read_once():
                model = load_hf_model(source)
            saved.mkdir(parents=True, exist_ok=True)
            model.config.save_pretrained(saved)
            torch.save(model.state_dict(), saved / "state_dict.pt.partial")
            (saved / "state_dict.pt.partial").rename(saved / "state_dict.pt")
            return model
    config = AutoConfig.from_pretrained(saved)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    model.load_state_dict(torch.load(saved / "state_dict.pt", weights_only=True), strict=True)
    return model.eval()
