"""WiCore: compile a model once into ONNX graphs, serve it through ONNX Runtime anywhere.

The public API, importable from `wicore` itself:

    from wicore import Engine, EngineConfig, SamplingParams

    with Engine(EngineConfig(model_dir="models/smollm2")) as engine:
        [done] = engine.generate(["The capital of France is"], SamplingParams(max_tokens=8))

Names load on first use (PEP 562), so `import wicore` stays cheap for the CLI and the exporter,
which do not need ONNX Runtime's sessions.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "Engine": "wicore.runtime.engine",
    "EngineCore": "wicore.runtime.engine_core",
    "StepTrace": "wicore.runtime.engine_core",
    "EngineConfig": "wicore.runtime.engine_config",
    "SchedulerConfig": "wicore.runtime.scheduler_config",
    "SpeculativeConfig": "wicore.runtime.speculative",
    "EngineStats": "wicore.runtime.engine_stats",
    "SamplingParams": "wicore.runtime.sampler",
    "Logprobs": "wicore.runtime.sampler",
    "RequestOutput": "wicore.runtime.request",
    "Completion": "wicore.runtime.request",
    "Priority": "wicore.runtime.request",
    "ImageInput": "wicore.runtime.images",
    "StructuredOutput": "wicore.structured.spec",
    "StructuredKind": "wicore.structured.spec",
    "WiCoreError": "wicore.errors",
    "RequestError": "wicore.errors",
    "ContextLengthError": "wicore.errors",
    "OverloadedError": "wicore.errors",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # the same names for type checkers and editors (`X as X`: a re-export)
    from wicore.errors import ContextLengthError as ContextLengthError
    from wicore.errors import OverloadedError as OverloadedError
    from wicore.errors import RequestError as RequestError
    from wicore.errors import WiCoreError as WiCoreError
    from wicore.runtime.engine import Engine as Engine
    from wicore.runtime.engine_config import EngineConfig as EngineConfig
    from wicore.runtime.engine_core import EngineCore as EngineCore
    from wicore.runtime.engine_core import StepTrace as StepTrace
    from wicore.runtime.engine_stats import EngineStats as EngineStats
    from wicore.runtime.images import ImageInput as ImageInput
    from wicore.runtime.request import Completion as Completion
    from wicore.runtime.request import Priority as Priority
    from wicore.runtime.request import RequestOutput as RequestOutput
    from wicore.runtime.sampler import Logprobs as Logprobs
    from wicore.runtime.sampler import SamplingParams as SamplingParams
    from wicore.runtime.scheduler_config import SchedulerConfig as SchedulerConfig
    from wicore.runtime.speculative import SpeculativeConfig as SpeculativeConfig
    from wicore.structured.spec import StructuredKind as StructuredKind
    from wicore.structured.spec import StructuredOutput as StructuredOutput


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'wicore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup skips this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
