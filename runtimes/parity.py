"""fp32 parity against the source, as the bundle manifest records it (``source_parity``): the exported fp32
models against the policy they came from, on the bundle's trace. Measured at export by
quarl_edge/parity.py; typed here, on the device side, so the manifest reads it checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import schema
from .errors import InputError

FIX = "re-export the bundle with `quarl-edge export`"
MAX_MODELS = 256


def _share(v: Any, where: str, fix: str) -> float:
    x = schema.number(v, where, fix)
    if not 0.0 <= x <= 1.0:
        raise InputError(f"{where} {x!r} is not a share in [0, 1]", fix)
    return x


def _diff(v: Any, where: str, fix: str) -> float | None:
    if v is None:
        return None
    x = schema.number(v, where, fix)
    if x < 0.0:
        raise InputError(f"{where} {x!r} is negative, not an action difference", fix)
    return x


@dataclass(frozen=True)
class ModelParity:
    """One fp32 model against the source."""

    model: str
    samples: int
    """the trace's states it was compared on (those with finite observations)"""
    agreement: float
    """discrete: the share of equal actions; continuous: 1 - mean |Δa| / action range (as bench's)"""
    max_abs_diff: float | None
    """continuous: the largest |Δa| over every sample and action dimension, in action units"""
    mean_abs_diff: float | None

    def __post_init__(self) -> None:
        where = f"source parity of {str(self.model)[:64]!r}"
        schema.text(self.model, f"{where}: model", FIX, 256)
        schema.integer(self.samples, f"{where}: samples", FIX, 1)
        _share(self.agreement, f"{where}: agreement", FIX)
        _diff(self.max_abs_diff, f"{where}: max_abs_diff", FIX)
        _diff(self.mean_abs_diff, f"{where}: mean_abs_diff", FIX)

    def to_dict(self) -> schema.JSONObject:
        return {"model": self.model, "samples": self.samples, "agreement": self.agreement,
                "max_abs_diff": self.max_abs_diff, "mean_abs_diff": self.mean_abs_diff}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Any, where: str, fix: str = FIX) -> ModelParity:
        d = schema.obj(d, where, fix)
        for key in ("model", "samples", "agreement"):
            if key not in d:
                raise InputError(f"{where} lacks the field {key!r}", fix)
        return cls(
            model=schema.text(d["model"], f"{where}.model", fix, 256),
            samples=schema.integer(d["samples"], f"{where}.samples", fix, 1),
            agreement=_share(d["agreement"], f"{where}.agreement", fix),
            max_abs_diff=_diff(d.get("max_abs_diff"), f"{where}.max_abs_diff", fix),
            mean_abs_diff=_diff(d.get("mean_abs_diff"), f"{where}.mean_abs_diff", fix),
        )


@dataclass(frozen=True)
class SourceParity:
    """The bundle's fp32 models against the source policy, or why that was not measured."""

    reference: str
    """what the fp32 models were compared with, e.g. ``TQC.predict (sb3-contrib 2.9.2)``"""
    models: tuple[ModelParity, ...] = ()
    error: str | None = None
    """why it was not measured (then ``models`` is empty)"""

    def __post_init__(self) -> None:
        schema.text(self.reference, "source parity reference", FIX)
        if self.error is not None:
            schema.text(self.error, "source parity error", FIX)
        if not isinstance(self.models, tuple) or len(self.models) > MAX_MODELS:
            raise InputError(f"source parity models is not a tuple of at most {MAX_MODELS}", FIX)
        if self.error is not None and self.models:
            raise InputError("source parity has both an error and measured models", FIX)

    def to_dict(self) -> schema.JSONObject:
        return {
            "reference": self.reference,
            "models": [m.to_dict() for m in self.models],
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, d: Any, where: str, fix: str = FIX) -> SourceParity:
        """The block as read (a manifest's or a bench report's ``source_parity``), every field checked: a bad
        one is one InputError naming ``where`` and the field."""
        d = schema.obj(d, where, fix)
        if "reference" not in d:
            raise InputError(f"{where} lacks the field 'reference'", fix)
        models = d.get("models") or []
        if not isinstance(models, list) or len(models) > MAX_MODELS:
            raise InputError(f"{where}.models is not a list of at most {MAX_MODELS}", fix)
        error = d.get("error")
        parsed = tuple(ModelParity.from_dict(m, f"{where}.models[{i}]", fix) for i, m in enumerate(models))
        if error is not None and parsed:
            raise InputError(f"{where} has both an error and measured models", fix)
        return cls(
            reference=schema.text(d["reference"], f"{where}.reference", fix),
            models=parsed,
            error=None if error is None else schema.text(error, f"{where}.error", fix),
        )

    def line(self) -> str:
        """One line for the terminal and the bench report."""
        if self.error:
            return f"fp32 vs source ({self.reference}): not measured ({self.error})"
        parts = [
            f"{m.model} agreement {m.agreement:.4f}"
            + ("" if m.max_abs_diff is None else f", max |Δa| {m.max_abs_diff:.3g}")
            + f" on {m.samples} states"
            for m in self.models
        ]
        return f"fp32 vs source ({self.reference}): " + "; ".join(parts)
