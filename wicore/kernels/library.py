"""Build WiCore's kernel library (csrc/) once per source and compiler, cached, and say where it is.

    library(cuda=True)  ──► cache hit? ──► ~/.cache/wicore/kernels/<key>/libwicore_kernels.so
                              └─ no ──► nvcc (CUDA + CPU kernels) or c++ (CPU kernels only) ──► cached

The key is a hash of the sources, the vendored ONNX Runtime headers, the compiler's version and the
flags, so an edit or another compiler builds anew and nothing stale is loaded. Where no compiler
is (or the build fails), KernelBuildError says what to install; graphs exported without
`kernels="wicore"` never need the library.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from wicore.errors import WiCoreError

CSRC = Path(__file__).parent / "csrc"
INCLUDE = Path(__file__).parent / "include"
LIBRARY = "libwicore_kernels.so"
DOMAIN = "wicore"  # the ops' ONNX domain (csrc/ops.cc)
# Turing to Hopper as machine code, and Hopper's PTX for newer cards to compile at load.
CUDA_ARCHS = ("75", "80", "86", "89", "90")
CUDA_ENV = "WICORE_NVCC"  # a path to nvcc, where it is not on PATH, in CUDA_HOME or in a pip package
CUBLASLT_ENV = "WICORE_CUBLASLT_INCLUDE"  # a folder with cublasLt.h, where neither the toolkit nor pip's nvidia-cublas has it


class KernelBuildError(WiCoreError):
    """WiCore's own kernels cannot be built or loaded here."""


@dataclass(frozen=True)
class Compiler:
    path: Path
    cuda: bool

    def version(self) -> str:
        out = subprocess.run([str(self.path), "--version"], capture_output=True, text=True, timeout=60)
        return out.stdout.strip()

    def command(self, out: Path) -> list[str]:
        common = ["-std=c++17", "-shared", f"-I{INCLUDE}", f"-I{CSRC}", "-o", str(out)]
        sources = [
            str(CSRC / name)
            for name in (
                "ops.cc", "ops_attention.cc", "ops_greedy.cc", "kernels_cpu.cc", "matmul_q_cpu.cc", "matmul_q_float.cc", "matmul_q_int8.cc",
                "matmul_q_packed.cc", "attention_cpu.cc", "attention_qkv_cpu.cc", "ops_matmul_q16.cc", "ops_matmul_i8.cc",
            )
        ]  # fmt: skip
        if not self.cuda:
            return [str(self.path), "-O2", "-fPIC", "-fvisibility=hidden", *common, *sources]
        toolkit = self.path.parent.parent  # bin/nvcc's toolkit: its include and lib (a pip install: lib)
        gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in CUDA_ARCHS]
        gencode.append(f"-gencode=arch=compute_{CUDA_ARCHS[-1]},code=compute_{CUDA_ARCHS[-1]}")
        libs = [f"-L{toolkit / d}" for d in ("lib64", "lib") if (toolkit / d).is_dir()]
        # MatMulI8's cuBLASLt: its header at build, the library opened at run time (csrc/cublaslt_i8.h); without
        # the header the other ops build all the same and MatMulI8 on CUDA says what is missing
        header = find_cublaslt_include(toolkit)
        cublaslt = [] if header is None else ["-DWICORE_CUBLASLT", *([] if header in _searched(toolkit) else [f"-I{header}"])]
        # --threads 0: the architectures compile side by side, one thread a core (the build at first use)
        return [
            str(self.path), "-O3", "--threads", "0", "-DWICORE_CUDA", "-Xcompiler", "-fPIC,-fvisibility=hidden", *gencode,
            *cublaslt, *common, *sources, str(CSRC / "cublaslt_i8.cc"),
            *(str(CSRC / name) for name in ("kernels.cu", "attention.cu", "attention_prefill.cu", "attention_tiles.cu", "matmul_q16.cu", "matmul_i8.cu")),
            *libs, "-ldl",
        ]  # fmt: skip


def find_compiler(cuda: bool) -> Compiler | None:
    """nvcc for a CUDA build ($WICORE_NVCC, PATH, $CUDA_HOME, /usr/local/cuda, pip's nvidia-cuda-nvcc);
    the host's C++ compiler for a CPU one."""
    if not cuda:
        found = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
        return Compiler(Path(found), False) if found else None
    candidates = [os.environ.get(CUDA_ENV), shutil.which("nvcc")]
    candidates += [str(Path(base) / "bin" / "nvcc") for base in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if base]
    candidates += [str(p) for p in _pip_nvcc()]
    for path in candidates:
        if path and Path(path).is_file() and os.access(path, os.X_OK):
            return Compiler(Path(path), True)
    return None


def _toolkit_includes(toolkit: Path) -> list[Path]:
    return [toolkit / "include", toolkit / "targets" / "x86_64-linux" / "include", toolkit / "targets" / "sbsa-linux" / "include"]


def _searched(toolkit: Path) -> list[Path]:
    """Folders nvcc searches already (an -I/usr/include would break libstdc++'s #include_next)."""
    return [*_toolkit_includes(toolkit), Path("/usr/include")]


def find_cublaslt_include(toolkit: Path) -> Path | None:
    """The folder holding cublasLt.h: $WICORE_CUBLASLT_INCLUDE, nvcc's toolkit, $CUDA_HOME's or /usr/local/cuda's (nvcc
    may be a wrapper script elsewhere), or pip's nvidia-cublas (nvidia/cu13/include, nvidia/cublas/include); None
    where none has it."""
    candidates = [Path(p) for p in (os.environ.get(CUBLASLT_ENV),) if p] + _toolkit_includes(toolkit)
    candidates += [p for base in (os.environ.get("CUDA_HOME"), "/usr/local/cuda") if base for p in _toolkit_includes(Path(base))]
    candidates.append(Path("/usr/include"))  # a distribution's libcublas-dev
    try:
        import nvidia  # NVIDIA's pip wheels' namespace package

        candidates += [Path(base) / sub / "include" for base in nvidia.__path__ for sub in ("cu13", "cublas", "cu12")]
    except ImportError:
        pass
    return next((p for p in candidates if (p / "cublasLt.h").is_file()), None)


def _pip_nvcc() -> list[Path]:
    try:
        import nvidia  # the namespace package of NVIDIA's pip wheels (nvidia-cuda-nvcc)
    except ImportError:
        return []
    return sorted(p for base in nvidia.__path__ for p in Path(base).glob("cu*/bin/nvcc"))


def cache_root() -> Path:
    base = os.environ.get("WICORE_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache", "wicore")
    return Path(base) / "kernels"


def library(cuda: bool) -> Path:
    """The built library (CUDA and CPU kernels with `cuda`, else CPU only), from the cache or built now."""
    compiler = find_compiler(cuda)
    if compiler is None:
        what = (
            "CUDA's compiler nvcc (a CUDA toolkit, or pip install nvidia-cuda-nvcc nvidia-cuda-cccl)"
            if cuda
            else "a C++ compiler"
        )
        raise KernelBuildError(f"WiCore's kernels need {what} to build, and none was found; or export without kernels=wicore")
    digest = hashlib.sha256()
    for path in sorted([*CSRC.iterdir(), *INCLUDE.rglob("*.h")]):
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(compiler.version().encode() + " ".join(compiler.command(Path("out"))).encode())
    target = cache_root() / digest.hexdigest()[:20] / LIBRARY
    if not target.is_file():
        _build(compiler, target)
    return target


def _build(compiler: Compiler, target: Path) -> None:
    """Compile into a temporary file beside `target`, then rename: a reader sees a whole library or none."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / LIBRARY
        res = subprocess.run(compiler.command(out), capture_output=True, text=True, timeout=1800)
        if res.returncode != 0:
            tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
            raise KernelBuildError(f"building WiCore's kernels with {compiler.path} failed: {' | '.join(tail)}")
        os.replace(out, target)


def has_cuda_kernels(path: Path) -> bool:
    """Whether a built library holds the CUDA kernels (csrc/ops.cc WicoreHasCuda)."""
    return bool(ctypes.CDLL(str(path)).WicoreHasCuda())
