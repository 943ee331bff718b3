"""ONNX Runtime import and execution-provider choice.

Every ONNX Runtime build installs the same `onnxruntime` module, so which one
is present decides the hardware; WiCore depends on none of them directly.
"""

from __future__ import annotations

from types import ModuleType

from wicore.errors import RuntimeMissingError

EXTRAS = "pip install 'wicore[cpu]' (or wicore[cuda] for NVIDIA, wicore[openvino] for Intel)"


def onnxruntime() -> ModuleType:
    """The installed ONNX Runtime module, or a RuntimeMissingError naming the extras."""
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise RuntimeMissingError(f"no ONNX Runtime is installed: {EXTRAS}") from exc
    return ort


def session_options(num_threads: int | None) -> object:
    ort = onnxruntime()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if num_threads:
        opts.intra_op_num_threads = num_threads
        opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return opts
