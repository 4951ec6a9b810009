"""The deployable variants tune searches: format x precision x int8 calibration x layers kept in float
(and, measured on the device, x thread count). Each is one model of the candidates bundle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quarl_edge.bundle import Variant
from quarl_edge.exporters.base import CALIBRATION_METHODS, ExportConfig

PRECISIONS = ("fp32", "fp16", "int8")


@dataclass(frozen=True)
class Candidate:
    """An export variant; ``float_layers`` None is the exporter's default split (first/last layer float)."""

    format: str
    precision: str
    method: str = "minmax"
    float_layers: tuple[str, ...] | None = None
    origin: str = ""
    """how the variant came about (the per-layer search says which layers it kept in float and why)"""

    @property
    def target(self) -> str:
        return f"{self.format}-{self.precision}"

    @property
    def name(self) -> str:
        if self.precision != "int8":
            return self.target
        layers = "" if self.float_layers is None else "-float[" + ",".join(self.float_layers) + "]"
        return f"{self.target}-{self.method}{layers}"

    def variant(self) -> Variant:
        cfg = ExportConfig(calibration_method=self.method, float_layers=self.float_layers)
        return Variant(self.name, self.target, cfg)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "format": self.format, "precision": self.precision,
                "calibration": self.method if self.precision == "int8" else None,
                "float_layers": list(self.float_layers) if self.float_layers is not None else "default",
                "origin": self.origin}  # fmt: skip


def grid(formats: tuple[str, ...]) -> list[Candidate]:
    """fp32 and fp16 of each format, int8 of each with every calibration method (default float layers).
    The first is the reference every other is compared with (fp32 of the first format)."""
    out = []
    for fmt in formats:
        out += [Candidate(fmt, "fp32"), Candidate(fmt, "fp16")]
        out += [Candidate(fmt, "int8", m) for m in CALIBRATION_METHODS]
    return out
