"""quarl-edge's device side: numpy and one runtime, never torch or TensorFlow.

The runtime API is ``load_policy`` (runtimes/load.py, its Policy runtimes/policy.py; docs/runtime.md). It is imported on first use,
so ``python -m quarl_edge.runtimes info`` still runs on a board that has no numpy yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .inputs import PolicyStats
    from .load import load_policy
    from .onnx import OrtOptions
    from .policy import Policy, PolicyInfo
    from .selection import DeviceMismatchWarning

__all__ = ["DeviceMismatchWarning", "OrtOptions", "Policy", "PolicyInfo", "PolicyStats", "load_policy"]
_HOMES = {
    "load_policy": "load",
    "PolicyStats": "inputs",
    "OrtOptions": "onnx",
    "DeviceMismatchWarning": "selection",
}


def __getattr__(name: str) -> Any:
    if name in __all__:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_HOMES.get(name, 'policy')}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
