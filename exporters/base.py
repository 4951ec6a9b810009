"""Exporter registry and the typed export configuration (each default defined once, here)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from quarl_edge.policy.net import Policy
from quarl_edge.quant.config import QATConfig
from quarl_edge.runtimes.errors import InputError, MissingDependencyError

CALIBRATION_METHODS = ("minmax", "percentile", "entropy")


@dataclass(frozen=True)
class ExportConfig:
    calibration_method: str = "minmax"
    """activation range estimator for int8: minmax, percentile or entropy"""
    percentile: float = 99.999
    """percentile used by the percentile method"""
    per_channel: bool | None = None
    """per-channel weight scales; None: ONNX on for convolutional models, off for MLPs; TFLite on"""
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
    toolchain: dict[str, str] = field(default_factory=dict)
    """converter, quantizer and the runtime that read the parameters back, with versions"""


@dataclass(frozen=True)
class ExportContext:
    policy: Policy
    """the policy as trained (a QAT policy keeps its fake quantization in float exports)"""
    calibration: np.ndarray | None  # observations, already subsampled
    config: ExportConfig
    workdir: Path
    qat: QATConfig | None = None
    """set for a QAT policy: how it was trained to be quantized"""
    plain: Policy | None = None
    """a QAT policy without fake quantization, its weights on the n-bit grid (quarl_edge.quant.deployable)"""
    learned_ranges: tuple[tuple[float, float] | None, ...] = ()
    """a QAT policy's learned input range of each quantized layer, in layer order"""

    @property
    def quantizable(self) -> Policy:
        """What integer exports quantize: the plain copy of a QAT policy, else the policy itself."""
        return self.plain if self.plain is not None else self.policy


Exporter = Callable[[ExportContext, Path], ExportedModel]
EXPORTERS: dict[str, Exporter] = {}
NEEDS_CALIBRATION: set[str] = set()


@dataclass(frozen=True)
class Requirement:
    """Modules an exporter imports when it runs, and the pip extra that installs them."""

    modules: tuple[str, ...]
    extra: str

    def install_command(self) -> str:
        return f"pip install 'quarl-edge[{self.extra}]'"


REQUIREMENTS: dict[str, Requirement] = {}


def register(
    name: str, *, calibrated: bool = False, requires: Requirement | None = None
) -> Callable[[Exporter], Exporter]:
    def deco(fn: Exporter) -> Exporter:
        EXPORTERS[name] = fn
        if calibrated:
            NEEDS_CALIBRATION.add(name)
        if requires is not None:
            REQUIREMENTS[name] = requires
        return fn

    return deco


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails to import, or a blocked import
        return False


def missing_dependency(name: str, module: str, requirement: Requirement) -> MissingDependencyError:
    return MissingDependencyError(
        f"export target {name!r} needs the {requirement.extra} extra ({module!r} is not installed)",
        f"install it with: {requirement.install_command()}",
    )
