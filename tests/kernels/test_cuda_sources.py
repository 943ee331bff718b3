"""WiCore's CUDA sources (wicore/kernels/csrc: kernels.cu, the attention .cu files and the CUDA ops of ops*.cc) compile
with nvcc where one is found; no GPU needed. Their results are checked on a GPU by
tools/check_kernels_gpu.py and tools/check_attention_gpu.py, not here."""

from __future__ import annotations

import subprocess

import pytest

from wicore.kernels.library import CSRC, CUDA_ARCHS, INCLUDE, find_compiler, find_cublaslt_include


@pytest.mark.slow  # ~100 s of nvcc (CPU time), the fourteen in parallel
def test_the_cuda_kernels_and_their_ops_compile_with_nvcc(tmp_path):
    nvcc = find_compiler(cuda=True)
    if nvcc is None:
        pytest.skip("no nvcc here (a CUDA toolkit, or pip install nvidia-cuda-nvcc nvidia-cuda-cccl)")
    arch = CUDA_ARCHS[-1]  # one architecture: what compiles for one compiles for the others (but #if __CUDA_ARCH__)
    names = (
        "kernels.cu",
        "attention.cu",
        "attention_prefill.cu",
        "attention_tiles.cu",
        "matmul_q16.cu",
        "ops.cc",
        "ops_attention.cc",
        "ops_matmul_q16.cc",
        "matmul_i8.cu",
        "ops_matmul_i8.cc",
        "cublaslt_i8.cc",
    )
    run = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def compile_job(name: str, arch: str, out: str, extra: tuple | list = ()) -> subprocess.Popen:
        flags = [
            "-std=c++17",
            "-O1",
            "-DWICORE_CUDA",
            f"-arch=sm_{arch}",
            f"-I{INCLUDE}",
            f"-I{CSRC}",
            "-Xcompiler",
            "-fPIC",
            *extra,
        ]
        return subprocess.Popen([str(nvcc.path), *flags, "-c", str(CSRC / name), "-o", str(tmp_path / out)], **run)

    jobs = [compile_job(n, arch, f"{n}.o") for n in names]  # cublaslt_i8.cc: its fallback without the header
    # MatMulQ16's GEMV has a Turing branch (no m16n8k16 MMA before sm_80), and the attention tiles' WMMA must
    # build for Turing too (where the shared memory they take decides at run time): the oldest architecture too
    names += ("matmul_q16.cu (oldest)", "attention_tiles.cu (oldest)")
    jobs.append(compile_job("matmul_q16.cu", CUDA_ARCHS[0], f"{names[-2]}.o"))
    jobs.append(compile_job("attention_tiles.cu", CUDA_ARCHS[0], f"{names[-1]}.o"))
    for name, job in zip(names, jobs):
        out, _ = job.communicate(timeout=900)
        assert job.returncode == 0, f"{name}: {out[-2000:]}"
        assert (tmp_path / f"{name}.o").stat().st_size > 0


def test_the_cublaslt_glue_compiles_against_its_header(tmp_path):
    """cublaslt_i8.cc as library.py builds it where cuBLASLt's header is found (MatMulI8's int8 GEMM)."""
    nvcc = find_compiler(cuda=True)
    if nvcc is None:
        pytest.skip("no nvcc here (a CUDA toolkit, or pip install nvidia-cuda-nvcc nvidia-cuda-cccl)")
    header = find_cublaslt_include(nvcc.path.parent.parent)
    if header is None:
        pytest.skip(
            "no cublasLt.h beside nvcc (a CUDA toolkit has it; pip: nvidia-cublas): MatMulI8's cuBLASLt path is not compiled here"
        )
    flags = [
        "-std=c++17",
        "-O1",
        "-DWICORE_CUDA",
        "-DWICORE_CUBLASLT",
        f"-I{header}",
        f"-I{INCLUDE}",
        f"-I{CSRC}",
        "-Xcompiler",
        "-fPIC",
    ]
    out = tmp_path / "cublaslt_i8.o"
    done = subprocess.run(
        [str(nvcc.path), *flags, "-c", str(CSRC / "cublaslt_i8.cc"), "-o", str(out)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert out.stat().st_size > 0
