"""quarl-edge's device side: numpy and one runtime, never torch or TensorFlow.

The runtime API is ``load_policy`` (runtimes/policy.py; docs/runtime.md). It is imported on first use,
so ``python -m quarl_edge.runtimes info`` still runs on a board that has no numpy yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .policy import Policy, PolicyInfo, load_policy

__all__ = ["Policy", "PolicyInfo", "load_policy"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import policy

        return getattr(policy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
