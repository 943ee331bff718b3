"""Plugin execution providers: EPs that ship as a library of their own, outside the `onnxruntime`
wheel (ONNX Runtime's EP ABI), offered once their library is registered with ONNX Runtime's
environment. providers.installed_providers registers every one installed, once a process.
"""

from __future__ import annotations

import importlib
import logging
import re
from functools import cache
from types import ModuleType

log = logging.getLogger(__name__)

# plugin EPs WiCore knows: (Python package, the name its library is registered under, the oldest
# ONNX Runtime that runs WiCore's graphs on it). WebGPU needs 1.32, measured on an H100 through Vulkan
# (docs/HARDWARE.md): 1.30 takes the plugin's device but places every node on the CPU, without an
# error; onnxruntime-gpu 1.31.1 refuses to bind the KV pools ("no data transfer registered").
PLUGIN_EPS = (("onnxruntime_ep_webgpu", "webgpu", (1, 32)),)

# plugin EPs installed but not registered, and why (said when such a device is asked for)
plugin_refusals: dict[str, str] = {}


@cache
def register_plugin_eps(ort: ModuleType) -> tuple[str, ...]:
    """Register the library of every plugin EP package installed with ONNX Runtime's environment
    (once a process): their EPs then count as available providers and sessions name them as the
    built-in ones. Returns the registration names; a library ONNX Runtime refuses (a plugin built
    for a newer ONNX Runtime, say), or an ONNX Runtime too old for WiCore's use of it, is left out
    with a warning."""
    registered = []
    for package, name, oldest in PLUGIN_EPS:
        try:
            plugin = importlib.import_module(package)
        except ImportError:
            continue
        if _version(ort.__version__) < oldest:
            plugin_refusals[name] = (
                f"{package} is installed, but WiCore runs it with onnxruntime >= {'.'.join(map(str, oldest))} "
                f"(this is {ort.__version__}): pip install -U 'onnxruntime>={'.'.join(map(str, oldest))}'"
            )
            log.warning("the %s plugin EP is not used: %s", name, plugin_refusals[name])
            continue
        try:
            ort.register_execution_provider_library(name, plugin.get_library_path())
        except Exception as exc:
            plugin_refusals[name] = f"ONNX Runtime refused {package}'s library: {exc}"
            log.warning("the %s plugin EP (%s) was not registered with ONNX Runtime: %s", name, package, exc)
            continue
        registered.append(name)
    return tuple(registered)


def _version(text: str) -> tuple[int, int]:
    """(1, 32) of "1.32.0" or "1.32.0.dev20261101"."""
    match = re.match(r"(\d+)\.(\d+)", text)
    if match is None:
        raise ValueError(f"not a version: {text!r}")
    return int(match[1]), int(match[2])
