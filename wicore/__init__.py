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
    "Engine": "wicore.engine.engine",
    "EngineCore": "wicore.engine.core",
    "StepTrace": "wicore.engine.core",
    "EngineConfig": "wicore.engine.config",
    "SchedulerConfig": "wicore.engine.scheduler_config",
    "SpeculativeConfig": "wicore.engine.speculative",
    "EngineStats": "wicore.engine.stats",
    "SamplingParams": "wicore.executor.sampler",
    "Logprobs": "wicore.executor.sampler",
    "RequestOutput": "wicore.engine.request",
    "Completion": "wicore.engine.request",
    "Priority": "wicore.engine.request",
    "ImageInput": "wicore.types.images",
    "StructuredOutput": "wicore.structured.spec",
    "StructuredKind": "wicore.structured.spec",
    "WiCoreError": "wicore.errors",
    "RequestError": "wicore.errors",
    "ContextLengthError": "wicore.errors",
    "OverloadedError": "wicore.errors",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:  # the same names for type checkers and editors (`X as X`: a re-export)
    from wicore.engine.config import EngineConfig as EngineConfig
    from wicore.engine.core import EngineCore as EngineCore
    from wicore.engine.engine import Engine as Engine
    from wicore.engine.scheduler_config import SchedulerConfig as SchedulerConfig
    from wicore.engine.speculative import SpeculativeConfig as SpeculativeConfig
    from wicore.engine.stats import EngineStats as EngineStats
    from wicore.engine.trace import StepTrace as StepTrace
    from wicore.errors import ContextLengthError as ContextLengthError
    from wicore.errors import OverloadedError as OverloadedError
    from wicore.errors import RequestError as RequestError
    from wicore.errors import WiCoreError as WiCoreError
    from wicore.structured.spec import StructuredKind as StructuredKind
    from wicore.structured.spec import StructuredOutput as StructuredOutput
    from wicore.types.images import ImageInput as ImageInput
    from wicore.types.outputs import Completion as Completion
    from wicore.types.outputs import Priority as Priority
    from wicore.types.outputs import RequestOutput as RequestOutput
    from wicore.types.sampling import Logprobs as Logprobs
    from wicore.types.sampling import SamplingParams as SamplingParams


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'wicore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup skips this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
