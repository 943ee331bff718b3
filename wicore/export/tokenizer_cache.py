"""GGUF tokenizers converted once: the files an export wrote, kept in WiCore's cache for the next export.

Converting a GGUF's vocabulary with transformers (wicore.export.tokenizer) takes most of a minute
for Gemma 3's 262k pieces on a 2-core VM (transformers rebuilds the BPE merges in Python), and
it is the same work for every export of the same file: each partition count, op flavour and
dtype. The result is kept as

    $WICORE_CACHE/tokenizers/KEY/tokenizer.json         (default ~/.cache/wicore/tokenizers/)
                                 tokenizer_config.json
                                 info.json              the TokenizerInfo the export returned

KEY is a sha256 of everything the conversion reads: the GGUF's `tokenizer.*` metadata and
`general.architecture`, the versions of transformers and tokenizers, and the source of
wicore/export/tokenizer.py. A new entry is written beside its place and renamed into it, so an
interrupted export leaves none half-written; a cache that cannot be written is skipped.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from wicore.errors import ManifestError
from wicore.export.pull import wicore_cache_dir
from wicore.model.tokenizer_info import TokenizerInfo

_INFO = "info.json"


def cache_key(metadata: dict[str, Any]) -> str:
    """The sha256 of the conversion's inputs (module docstring)."""
    import tokenizers
    import transformers

    import wicore.export.tokenizer as converter

    inputs = {key: value for key, value in metadata.items() if key.startswith("tokenizer.")}
    inputs["general.architecture"] = metadata.get("general.architecture")
    digest = hashlib.sha256(json.dumps(inputs, sort_keys=True, ensure_ascii=False).encode())
    digest.update(f"\0transformers {transformers.__version__}\0tokenizers {tokenizers.__version__}\0".encode())
    digest.update(Path(converter.__file__).read_bytes())
    return digest.hexdigest()


def entry(key: str, root: Path | None = None) -> Path:
    return (root or wicore_cache_dir() / "tokenizers") / key


def load(key: str, out_dir: Path, root: Path | None = None) -> TokenizerInfo | None:
    """Copy the cached files of `key` into out_dir and return their TokenizerInfo; None when not cached."""
    folder = entry(key, root)
    try:
        info = TokenizerInfo.from_dict(json.loads((folder / _INFO).read_text(encoding="utf-8")))
        out_dir.mkdir(parents=True, exist_ok=True)
        for name in info.files:
            shutil.copyfile(folder / name, out_dir / name)
    except (OSError, ValueError, ManifestError):  # not cached (or unreadable): convert again
        return None
    return info


def store(key: str, out_dir: Path, info: TokenizerInfo, root: Path | None = None) -> None:
    """Keep the files `info` names from out_dir under `key`; a cache that cannot be written is skipped."""
    folder = entry(key, root)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{key[:16]}-"))
    except OSError:
        return
    try:
        for name in info.files:
            shutil.copyfile(out_dir / name, tmp / name)
        (tmp / _INFO).write_text(json.dumps(info.to_dict(), ensure_ascii=False), encoding="utf-8")
        tmp.rename(folder)
    except OSError:  # unwritable, or another export has just kept the same entry
        shutil.rmtree(tmp, ignore_errors=True)
