"""Models named by their Hugging Face Hub id, fetched through `huggingface_hub` into its own cache.

    <org>/<name>            a safetensors repository: config.json, *.safetensors, the tokenizer files
    <org>/<name>:<QUANT>    a GGUF repository's one file of that quantization (`:Q4_K_M`, any case)
    hf.co/<org>/<name>...   the same (the form `ollama run` takes)

The files land in the Hub cache (`HF_HUB_CACHE`, else `HF_HOME/hub`, else ~/.cache/huggingface/hub)
with the Hub's progress bars; `HF_TOKEN` authenticates (gated and private repositories) and
`HF_HUB_OFFLINE=1` reads the cache alone. A name that is also a local file or folder is that path.
A repository that does not exist, is gated, lacks the quantization or is not cached offline is a
ModelSourceError saying which (exit code 2 in the CLI).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from wicore.errors import ModelSourceError

_HUB_ID = re.compile(r"(?:(?:https://)?(?:hf\.co|huggingface\.co)/)?([A-Za-z0-9][\w.-]*)/([\w.-]+?)(?::([\w.-]+))?")
# Weights and the tokenizer of a safetensors repository; not the duplicate consolidated / original copies.
_ALLOW = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja"]
_IGNORE = ["consolidated*", "*/*"]


@dataclass(frozen=True)
class HubId:
    repo_id: str  # "<org>/<name>"
    quant: str | None = None  # a GGUF repository's quantization tag

    @property
    def cache_name(self) -> str:
        """A folder name for its export: `org--name` or `org--name--Q4_K_M`."""
        return self.repo_id.replace("/", "--") + (f"--{self.quant}" if self.quant else "")


def parse_hub_id(spec: str) -> HubId | None:
    """The Hub id `spec` names; None where it is not one or names an existing local path."""
    if Path(spec).exists() or spec.endswith((".gguf", ".json")):
        return None
    found = _HUB_ID.fullmatch(spec)
    if found is None or found[2] in (".", ".."):
        return None
    return HubId(f"{found[1]}/{found[2]}", found[3])


def hub_cache() -> Path:
    """Where huggingface_hub keeps repositories, read from the environment as it reads it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "huggingface")
    return Path(home) / "hub"


def is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def hub_path(hub: HubId, progress: Callable[[str], None] | None = None) -> Path:
    """The local copy of a Hub model: a snapshot folder (safetensors) or the .gguf file (quant tag),
    downloaded first where the cache lacks it."""
    offline = is_offline()
    if progress is not None:
        where = "the Hugging Face cache (HF_HUB_OFFLINE)" if offline else "the Hugging Face Hub"
        progress(f"fetching {hub.repo_id}{':' + hub.quant if hub.quant else ''} from {where} into {hub_cache()}")
    try:
        return _gguf(hub, offline) if hub.quant else _snapshot(hub, offline)
    except ModelSourceError:
        raise
    except Exception as exc:  # huggingface_hub's errors, named for the user
        raise ModelSourceError(_explain(hub, exc, offline)) from exc


def hub_config(hub: HubId, progress: Callable[[str], None] | None = None) -> Path:
    """The repository's config.json alone (what `wicore plan` needs of a model too large to fetch)."""
    from huggingface_hub import hf_hub_download

    offline = is_offline()
    if progress is not None:
        progress(f"fetching {hub.repo_id}'s config.json into {hub_cache()}")
    try:
        return Path(hf_hub_download(hub.repo_id, "config.json", cache_dir=hub_cache(), local_files_only=offline))
    except Exception as exc:
        raise ModelSourceError(_explain(hub, exc, offline)) from exc


def _snapshot(hub: HubId, offline: bool) -> Path:
    from huggingface_hub import snapshot_download

    folder = Path(
        snapshot_download(
            hub.repo_id, allow_patterns=_ALLOW, ignore_patterns=_IGNORE, cache_dir=hub_cache(), local_files_only=offline
        )
    )
    if (folder / "config.json").is_file():
        return folder
    quants = sorted(
        {m[1] for f in _files(hub, offline) if (m := re.search(r"[-.]((?:I?Q\d|F16|BF16|F32)[\w]*)\.gguf$", f, re.I))}
    )
    if quants:
        raise ModelSourceError(
            f"{hub.repo_id} is a GGUF repository: name a quantization, e.g. {hub.repo_id}:{quants[0]} (it has {', '.join(quants)})"
        )
    raise ModelSourceError(f"{hub.repo_id} has no config.json: not a model repository WiCore can export")


def _files(hub: HubId, offline: bool) -> list[str]:
    """The repository's file names (the cached snapshot's, offline)."""
    if offline:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(hub.repo_id, cache_dir=hub_cache(), local_files_only=True))
        return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    from huggingface_hub import HfApi

    return HfApi().list_repo_files(hub.repo_id)


def _gguf(hub: HubId, offline: bool) -> Path:
    from huggingface_hub import hf_hub_download

    assert hub.quant is not None
    tag = hub.quant.lower()
    ggufs = [f for f in _files(hub, offline) if f.lower().endswith(".gguf")]
    matches = [f for f in ggufs if re.search(rf"(^|[-._/]){re.escape(tag)}([-._]|$)", f.lower()[: -len(".gguf")])]
    if not matches:
        have = ", ".join(ggufs) or "no .gguf files"
        raise ModelSourceError(f"{hub.repo_id} has no GGUF file of quantization {hub.quant} (it has {have})")
    if len(matches) > 1:
        raise ModelSourceError(
            f"{hub.repo_id}:{hub.quant} matches {len(matches)} files ({', '.join(matches)}); split GGUFs are not supported"
        )
    return Path(hf_hub_download(hub.repo_id, matches[0], cache_dir=hub_cache(), local_files_only=offline))


def _explain(hub: HubId, exc: Exception, offline: bool) -> str:
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    if isinstance(exc, GatedRepoError):
        return f"{hub.repo_id} is a gated repository: accept its terms on https://huggingface.co/{hub.repo_id} and set HF_TOKEN"
    if isinstance(exc, RepositoryNotFoundError):
        return (
            f"no repository {hub.repo_id} on the Hugging Face Hub (misspelled? a private one needs HF_TOKEN), "
            "and no such local file or folder"
        )
    if offline:
        return (
            f"{hub.repo_id} is not in the Hugging Face cache {hub_cache()} and HF_HUB_OFFLINE is set "
            f"(nor is it a local file or folder): run `wicore pull {hub.repo_id}` online first"
        )
    if isinstance(exc, LocalEntryNotFoundError):
        return f"cannot reach the Hugging Face Hub and {hub.repo_id} is not in its cache {hub_cache()}"
    return f"cannot fetch {hub.repo_id} from the Hugging Face Hub: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
