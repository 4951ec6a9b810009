"""The PTQ and QAT studies' results as typed data: a row per (policy, variant) and the findings per
policy, checked when made and when read back (the committed docs/results/*.json load through these), and
written as the studies' JSON at the edge (to_dict)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from quarl_edge.runtimes.artifact import read_artifact
from quarl_edge.runtimes.schema import JSONObject
from quarl_edge.stats import Drift, mean_std
from quarl_edge.typed import (
    OMIT_NONE,
    build,
    fields_json,
    flag,
    integer,
    items,
    load,
    number,
    obj,
    opt_number,
    opt_text,
    optional,
    text,
    tuple_of,
)

PTQ_FORMAT, QAT_FORMAT, STUDY_VERSION = "quarl-edge/study-ptq", "quarl-edge/study-qat", 1
FIX = "run the study again"


def _bounds(v: object, name: str) -> tuple[float | None, float | None]:
    pair = items(v, name)
    if len(pair) != 2:
        raise ValueError(f"{name} is not a pair of bounds")
    lo, hi = (opt_number(x, name) for x in pair)
    if lo is not None and hi is not None and lo > hi:
        raise ValueError(f"{name} is [{lo:g}, {hi:g}], its low end above its high end")
    return lo, hi


@dataclass(frozen=True)
class VariantResult:
    """One (policy, variant) on the study's paired seeds: its returns and, against fp32 on the same seeds,
    its drop (stats.paired_drift) and fidelity; ``normalized`` = (R - R_random) / (R_fp32 - R_random)."""

    policy: str
    env: str
    algo: str
    variant: str
    """fp32, random, w<bits> (weight-only), onnx-fp16, onnx-int8, tflite-int8, ptq<bits>, qat<bits>; all: the
    whole policy was skipped"""
    bits: int | None
    skipped: str | None
    """why it was not evaluated (its numbers are then absent)"""
    note: str | None = field(default=None, metadata=OMIT_NONE)
    mean: float | None = field(default=None, metadata=OMIT_NONE)
    std: float | None = field(default=None, metadata=OMIT_NONE)
    episodes: int | None = field(default=None, metadata=OMIT_NONE)
    returns: tuple[float, ...] | None = field(default=None, metadata=OMIT_NONE)
    agreement_pct: float | None = field(default=None, metadata=OMIT_NONE)
    """discrete actions: share of recorded states where the greedy action equals fp32's, %"""
    action_err_pct: float | None = field(default=None, metadata=OMIT_NONE)
    """continuous actions: mean |action - fp32 action| in % of the action range"""
    drop_pct: float | None = field(default=None, metadata=OMIT_NONE)
    drop_ci95_pct: tuple[float | None, float | None] | None = field(default=None, metadata=OMIT_NONE)
    normalized: float | None = field(default=None, metadata=OMIT_NONE)

    def __post_init__(self) -> None:
        for k in ("policy", "env", "algo", "variant"):
            text(getattr(self, k), k)
        if self.bits is not None:
            integer(self.bits, "bits", lo=1, hi=32)
        opt_text(self.skipped, "skipped")
        opt_text(self.note, "note")
        opt_number(self.mean, "mean")
        opt_number(self.std, "std", lo=0)
        if self.episodes is not None:
            integer(self.episodes, "episodes", lo=1)
        for i, r in enumerate(self.returns or ()):
            number(r, f"returns[{i}]")
        if self.returns is not None and self.episodes != len(self.returns):
            raise ValueError(f"{self.episodes} episodes for {len(self.returns)} returns")
        opt_number(self.agreement_pct, "agreement_pct", lo=0, hi=100)
        opt_number(self.action_err_pct, "action_err_pct", lo=0)
        opt_number(self.drop_pct, "drop_pct")
        if self.drop_ci95_pct is not None:
            _bounds(self.drop_ci95_pct, "drop_ci95_pct")
        opt_number(self.normalized, "normalized")

    @property
    def measured(self) -> bool:
        return self.skipped is None and self.mean is not None

    @classmethod
    def from_dict(cls, v: object, name: str) -> VariantResult:
        return build(cls, v, name, {"drop_ci95_pct": optional(_bounds)})


def variant_result(
    policy: str, env: str, algo: str, variant: str, bits: int | None, returns: list[float], *,
    skipped: str | None = None, note: str | None = None, drift: Drift | None = None,
    fidelity: tuple[str, float] | None = None, normalized: float | None = None,
) -> VariantResult:  # fmt: skip
    """A row from what was measured (returns, the drift against fp32, fidelity as (field, value))."""
    if skipped or not returns:
        return VariantResult(policy, env, algo, variant, bits, skipped, note)
    mean, std = mean_std(returns)
    return VariantResult(
        policy, env, algo, variant, bits, None, note, mean=mean, std=std, episodes=len(returns),
        returns=tuple(returns),
        agreement_pct=fidelity[1] if fidelity and fidelity[0] == "agreement_pct" else None,
        action_err_pct=fidelity[1] if fidelity and fidelity[0] == "action_err_pct" else None,
        drop_pct=drift.reward_drop_pct if drift else None, drop_ci95_pct=drift.drop_ci95_pct if drift else None,
        normalized=normalized,
    )  # fmt: skip


# ---- PTQ -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Confirmation:
    """A runtime variant's gate failure re-checked on more paired episodes (fresh seeds): the verdict on all
    of them together."""

    policy: str
    variant: str
    episodes: int
    fp32_mean: float
    mean: float
    drop_pct: float
    drop_ci95_pct: tuple[float | None, float | None]
    keeps_reward: bool

    def __post_init__(self) -> None:
        text(self.policy, "policy")
        text(self.variant, "variant")
        integer(self.episodes, "episodes", lo=1)
        for k in ("fp32_mean", "mean", "drop_pct"):
            number(getattr(self, k), k)
        _bounds(self.drop_ci95_pct, "drop_ci95_pct")
        flag(self.keeps_reward, "keeps_reward")

    @classmethod
    def from_dict(cls, v: object, name: str) -> Confirmation:
        return build(cls, v, name, {"drop_ci95_pct": _bounds})


def _bools(v: object, name: str) -> dict[str, bool]:
    return {str(k): flag(b, f"{name} {k}") for k, b in obj(v, name).items()}


@dataclass(frozen=True)
class PTQFinding:
    """Per policy: the fewest weight bits that keep reward, each runtime variant's drop and verdict."""

    policy: str
    sweet_spot_bits: int | None
    weight_bits_ok: Mapping[str, bool]
    """per weight bit width (as text, a JSON key): within the drift limit of fp32"""
    drop_pct: Mapping[str, float | None]
    keeps_reward: Mapping[str, bool]
    fp32_ci95: tuple[float | None, float | None]
    confirmed: Mapping[str, Confirmation] = field(default_factory=dict)

    def __post_init__(self) -> None:
        text(self.policy, "policy")
        if self.sweet_spot_bits is not None:
            integer(self.sweet_spot_bits, "sweet_spot_bits", lo=1, hi=32)
        for k, d in self.drop_pct.items():
            opt_number(d, f"drop_pct {k}")
        _bounds(self.fp32_ci95, "fp32_ci95")

    @classmethod
    def from_dict(cls, v: object, name: str) -> PTQFinding:
        return build(cls, v, name, {
            "weight_bits_ok": _bools, "keeps_reward": _bools, "fp32_ci95": _bounds,
            "drop_pct": lambda x, n: {str(k): opt_number(d, f"{n} {k}") for k, d in obj(x, n).items()},
            "confirmed": lambda x, n: {str(k): Confirmation.from_dict(c, f"{n} {k}") for k, c in obj(x, n).items()},
        })  # fmt: skip


def _seeds(v: object, name: str) -> tuple[int, ...]:
    return tuple(integer(s, name) for s in items(v, name))


@dataclass(frozen=True)
class PTQStudy:
    """`quarl-edge study ptq`: every zoo policy of a suite at every precision, on the same paired seeds."""

    suite: str
    zoo: str
    episodes: int
    seeds: tuple[int, ...]
    bits: tuple[int, ...]
    drift_limit_pct: float
    confirm_episodes: int
    results: tuple[VariantResult, ...]
    findings: tuple[PTQFinding, ...]

    def __post_init__(self) -> None:
        text(self.suite, "suite")
        text(self.zoo, "zoo")
        integer(self.episodes, "episodes", lo=1)
        if len(self.seeds) != self.episodes:
            raise ValueError(f"{len(self.seeds)} seeds for {self.episodes} episodes")
        number(self.drift_limit_pct, "drift_limit_pct", lo=0)
        integer(self.confirm_episodes, "confirm_episodes")

    def to_dict(self) -> JSONObject:
        return {"format": PTQ_FORMAT, "version": STUDY_VERSION, **fields_json(self)}

    @classmethod
    def from_dict(cls, v: object, name: str) -> PTQStudy:
        return build(cls, v, name, {"seeds": _seeds, "bits": _seeds,
                                    "results": tuple_of(VariantResult.from_dict),
                                    "findings": tuple_of(PTQFinding.from_dict)})  # fmt: skip


# ---- QAT -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BitsPoint:
    """Normalized return at one bit width, post-training (weight-only) and quantization-aware."""

    bits: int
    ptq: float | None
    qat: float | None

    def __post_init__(self) -> None:
        integer(self.bits, "bits", lo=1, hi=32)
        opt_number(self.ptq, "ptq")
        opt_number(self.qat, "qat")


@dataclass(frozen=True)
class QATFinding:
    task: str
    normalized: tuple[BitsPoint, ...]
    qat_keeps_where_ptq_breaks_bits: tuple[int, ...]

    def __post_init__(self) -> None:
        text(self.task, "task")
        for b in self.qat_keeps_where_ptq_breaks_bits:
            integer(b, "qat_keeps_where_ptq_breaks_bits", lo=1, hi=32)

    @classmethod
    def from_dict(cls, v: object, name: str) -> QATFinding:
        return build(cls, v, name, {"normalized": tuple_of(lambda x, n: build(BitsPoint, x, n))})


@dataclass(frozen=True)
class QATStudy:
    """`quarl-edge study qat`: PTQ vs QAT per task and bit width, on the same paired seeds."""

    suite: str
    episodes: int
    seeds: tuple[int, ...]
    bits: tuple[int, ...]
    keep_fraction: float
    results: tuple[VariantResult, ...]
    findings: tuple[QATFinding, ...]
    qat_activations: bool | None = field(default=None, metadata=OMIT_NONE)
    """None: a study from before the choice (both were fake-quantized)"""
    qat_scope: str | None = field(default=None, metadata=OMIT_NONE)
    """None: a study from before the choice (every layer)"""

    def __post_init__(self) -> None:
        text(self.suite, "suite")
        integer(self.episodes, "episodes", lo=1)
        if len(self.seeds) != self.episodes:
            raise ValueError(f"{len(self.seeds)} seeds for {self.episodes} episodes")
        number(self.keep_fraction, "keep_fraction", lo=0, hi=1)
        if self.qat_activations is not None:
            flag(self.qat_activations, "qat_activations")
        opt_text(self.qat_scope, "qat_scope")

    ORDER = ("suite", "episodes", "seeds", "bits", "qat_activations", "qat_scope", "keep_fraction", "results",
             "findings")  # fmt: skip
    """the JSON's order: the QAT settings before keep_fraction"""

    def to_dict(self) -> JSONObject:
        body = fields_json(self)
        return {
            "format": QAT_FORMAT,
            "version": STUDY_VERSION,
            **{k: body[k] for k in self.ORDER if k in body},
        }

    @classmethod
    def from_dict(cls, v: object, name: str) -> QATStudy:
        return build(cls, v, name, {"seeds": _seeds, "bits": _seeds,
                                    "results": tuple_of(VariantResult.from_dict),
                                    "findings": tuple_of(QATFinding.from_dict)})  # fmt: skip


def read_study(path: Path) -> PTQStudy | QATStudy:
    """A PTQ or QAT study's JSON (ptq.json, qat.json), every number checked."""
    from quarl_edge.outputs import json_format

    fmt = json_format(path)
    kind: type[PTQStudy] | type[QATStudy] = QATStudy if fmt == QAT_FORMAT else PTQStudy
    data = read_artifact(path, QAT_FORMAT if kind is QATStudy else PTQ_FORMAT, STUDY_VERSION, "study", FIX,
                         version_key="version")  # fmt: skip
    where = f"study {str(path)!r}"
    return load(lambda: kind.from_dict(data, where), where, FIX)
