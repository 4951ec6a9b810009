"""Runtime adapters by model format. Each adapter loads one model file and maps obs -> actions.

Adapters register by format name; bench and gate never need format-specific code.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .errors import InputError
from .spec import SpaceSpec


class ModelSession(Protocol):
    format: str
    runtime: str  # e.g. "onnxruntime 1.32.0"
    input_shape: tuple[int | None, ...]
    input_dtype: np.dtype

    def run(self, obs: np.ndarray) -> np.ndarray:
        """Actions for a batch of observations (leading batch dimension)."""
        ...

    def run_io(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Every output for every input, both in graph order (observation first, then an action mask,
        recurrent state...; action first, then the state after the step), one batch."""
        ...


AdapterFactory = Callable[[Path, int, Any], ModelSession]
"""(model file, threads, the runtime's session options or None) -> session"""
ADAPTERS: dict[str, AdapterFactory] = {}

MAX_THREADS = 256
"""the most threads a model is opened with, oversubscribed or not: ONNX Runtime segfaults creating a
million threads and raises a traceback at 2**31"""


def register(fmt: str) -> Callable[[AdapterFactory], AdapterFactory]:
    def deco(factory: AdapterFactory) -> AdapterFactory:
        ADAPTERS[fmt] = factory
        return factory

    return deco


def open_model(path: str | Path, fmt: str, threads: int = 1, options: Any = None) -> ModelSession:
    _load_builtin_adapters()
    factory = ADAPTERS.get(fmt)
    if factory is None:
        raise InputError(
            f"no runtime adapter for format {fmt!r}", f"known formats: {', '.join(sorted(ADAPTERS))}"
        )
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= MAX_THREADS:
        raise InputError(f"threads must be an integer from 1 to {MAX_THREADS} (got {str(threads)[:24]})",
                         "pass threads=1 or more, up to the device's cores",
                         cli_fix="pass --threads 1 or more, up to the device's cores")  # fmt: skip
    return factory(Path(path), threads, options)


def check_input(session: ModelSession, obs_space: SpaceSpec, path: Path) -> None:
    """Refuse a model whose input does not fit the policy's observation space."""
    want = tuple(obs_space.shape)
    got = tuple(session.input_shape[1:])
    if len(got) != len(want) or any(g is not None and g != w for g, w in zip(got, want, strict=True)):
        raise InputError(
            f"model {path.name!r} expects observations of shape {list(got)}, the policy's space is {list(want)}",
            "the model belongs to another policy or environment; re-export the bundle",
        )


def _load_builtin_adapters() -> None:
    # Each adapter module imports its runtime only when a model is opened, so all register on a
    # device that has one runtime; opening a model of the other format then names the install command.
    # An adapter module that fails to import at all (a broken install) must not take the other down.
    import contextlib
    import importlib

    for name in ("onnx", "litert", "c"):
        with contextlib.suppress(ImportError):
            importlib.import_module(f"{__package__}.{name}")
