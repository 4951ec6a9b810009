"""Exporter registry and the typed export configuration (each default defined once, here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from quarl_edge.policies import Policy
from quarl_edge.runtimes.errors import InputError

CALIBRATION_METHODS = ("minmax", "percentile", "entropy")


@dataclass(frozen=True)
class ExportConfig:
    calibration_method: str = "minmax"
    """activation range estimator for int8: minmax, percentile or entropy"""
    percentile: float = 99.999
    """percentile used by the percentile method"""
    per_channel: bool | None = None
    """per-channel weight scales; None: on for convolutional models, off for MLPs"""
    max_calibration_samples: int = 2000
    """calibration observations used at most (evenly subsampled)"""
    opset: int = 18
    float_io_layers: bool = True
    """keep the output layer (and, for vector observations, the input layer) in float; see exporters/onnx.py"""

    def __post_init__(self) -> None:
        if self.calibration_method not in CALIBRATION_METHODS:
            raise InputError(
                f"unknown calibration method {self.calibration_method!r}",
                f"choose one of: {', '.join(CALIBRATION_METHODS)}",
            )
        if not 50.0 < self.percentile <= 100.0:
            raise InputError(f"--percentile must be in (50, 100] (got {self.percentile})", "e.g. 99.999")
        if self.max_calibration_samples < 1:
            raise InputError("--max-calibration-samples must be at least 1", "e.g. 2000")


@dataclass
class ExportedModel:
    """What an exporter produced; the bundle writer adds name, sha256 and size."""

    file: Path
    format: str
    precision: str
    quantization: dict[str, Any] = field(default_factory=dict)
    io: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExportContext:
    policy: Policy
    calibration: np.ndarray | None  # observations, already subsampled
    config: ExportConfig
    workdir: Path


Exporter = Callable[[ExportContext, Path], ExportedModel]
EXPORTERS: dict[str, Exporter] = {}
NEEDS_CALIBRATION: set[str] = set()


def register(name: str, *, calibrated: bool = False) -> Callable[[Exporter], Exporter]:
    def deco(fn: Exporter) -> Exporter:
        EXPORTERS[name] = fn
        if calibrated:
            NEEDS_CALIBRATION.add(name)
        return fn

    return deco


def load_builtin() -> None:
    from quarl_edge.exporters import onnx  # noqa: F401


def resolve_targets(spec: str | list[str]) -> list[str]:
    load_builtin()
    names = [t.strip() for t in (spec.split(",") if isinstance(spec, str) else spec) if t.strip()]
    if not names:
        raise InputError("no export targets given", f"pass --to with some of: {', '.join(EXPORTERS)}")
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        hint = ""
        if any(n.startswith("tflite") for n in unknown):
            hint = " (TFLite export is not available in this build)"
        raise InputError(
            f"unknown export target {unknown[0]!r}{hint}", f"known targets: {', '.join(EXPORTERS)}"
        )
    return list(dict.fromkeys(names))
