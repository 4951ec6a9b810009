"""ActorQ's results as typed data: a run's log (``log.json``) and the study's runs and rows (``actorq.json``),
checked when made and when read back (a finished run's log is read again to reuse it; the committed
docs/results/actorq files load through these), written as JSON at the edge (to_dict). A field a log or a
study of an earlier version lacks is None."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quarl_edge.runtimes.artifact import MAX_JSON_BYTES
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.schema import JSONObject
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

LOG_VERSION = 1
STUDY_FORMAT, STUDY_VERSION = "quarl-edge/study-actorq", 2
LOG_FIX = "delete the run's folder and run it again"
STUDY_FIX = "run the study again"


def _numbers(v: object, name: str, lo: float | None = 0) -> dict[str, float]:
    return {str(k): number(x, f"{name} {k}", lo=lo) for k, x in obj(v, name).items()}


@dataclass(frozen=True)
class CurvePoint:
    """One finished episode: when (wall seconds, env steps so far, joules so far), its return and length."""

    wall_s: float
    env_steps: int
    ret: float
    """the episode's return (``return`` in the JSON)"""
    length: int
    actor: int
    energy_j: float | None = None
    """None: a log from before energy accounting"""

    def __post_init__(self) -> None:
        number(self.wall_s, "wall_s", lo=0)
        integer(self.env_steps, "env_steps")
        number(self.ret, "return")
        integer(self.length, "length")
        integer(self.actor, "actor")
        opt_number(self.energy_j, "energy_j", lo=0)

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"wall_s": self.wall_s, "env_steps": self.env_steps, "return": self.ret,
                                "length": self.length, "actor": self.actor}  # fmt: skip
        return d if self.energy_j is None else {**d, "energy_j": self.energy_j}

    @classmethod
    def from_dict(cls, v: object, name: str) -> CurvePoint:
        d = obj(v, name)
        return build(cls, {**d, "ret": d.get("return")}, name)


@dataclass(frozen=True)
class RoleTime:
    """Where a role's (the learner's, an actor's) wall time went, and its CPU seconds."""

    wall_s: float | None = field(default=None, metadata=OMIT_NONE)
    seconds: Mapping[str, float] | None = field(default=None, metadata=OMIT_NONE)
    """seconds per field (LEARNER_FIELDS / ACTOR_FIELDS); None: an actor that died before it reported"""
    sum_s: float | None = field(default=None, metadata=OMIT_NONE)
    cpu_s: float | None = field(default=None, metadata=OMIT_NONE)
    version: int | None = field(default=None, metadata=OMIT_NONE)
    """an actor: the newest broadcast it pulled"""
    died: bool | None = field(default=None, metadata=OMIT_NONE)

    def __post_init__(self) -> None:
        for k in ("wall_s", "sum_s", "cpu_s"):
            opt_number(getattr(self, k), k, lo=0)
        for k, s in (self.seconds or {}).items():
            number(s, f"seconds {k}", lo=0)
        if self.version is not None:
            integer(self.version, "version", lo=-1)
        if self.died is not None:
            flag(self.died, "died")

    @classmethod
    def from_dict(cls, v: object, name: str) -> RoleTime:
        return build(cls, v, name, {"seconds": optional(_numbers)})


@dataclass(frozen=True)
class Energy:
    """Joules of the run, measured (RAPL) or estimated from CPU seconds (actorq/energy.py)."""

    source: str
    joules: float
    wall_s: float
    cpu_s: Mapping[str, float]
    cpu_s_total: float
    assumption: str | None
    """the estimate's assumption (None: measured)"""
    scope: str
    since_resume: bool | None = field(default=None, metadata=OMIT_NONE)
    """a resumed run: these figures cover the part since the resume"""
    joules_before_resume: float | None = field(default=None, metadata=OMIT_NONE)

    def __post_init__(self) -> None:
        if self.source not in ("rapl", "estimate"):
            raise ValueError(f"source is {str(self.source)[:40]!r}, not rapl or estimate")
        for k in ("joules", "wall_s", "cpu_s_total"):
            number(getattr(self, k), k, lo=0)
        for k, s in self.cpu_s.items():
            number(s, f"cpu_s {k}", lo=0)
        opt_text(self.assumption, "assumption")
        text(self.scope, "scope")
        opt_number(self.joules_before_resume, "joules_before_resume", lo=0)

    @classmethod
    def from_dict(cls, v: object, name: str) -> Energy:
        return build(cls, v, name, {"cpu_s": _numbers})


@dataclass(frozen=True)
class Throughput:
    """Batch-1 inference calls per second of each precision, timed side by side in a live actor."""

    calls_per_s: Mapping[str, float]
    calls: int
    ratio_vs_fp32: Mapping[str, float] = field(default_factory=dict)
    """``"int8/fp32"``: a precision's calls per second over fp32's"""
    runtime: str | None = None
    actor: int | None = None

    def __post_init__(self) -> None:
        for k, c in self.calls_per_s.items():
            number(c, f"calls_per_s {k}", lo=0)
        integer(self.calls, "calls")
        for k, r in self.ratio_vs_fp32.items():
            number(r, f"ratio_vs_fp32 {k}", lo=0)
        opt_text(self.runtime, "runtime")

    def to_dict(self) -> dict[str, object]:
        head = {k: v for k, v in (("runtime", self.runtime), ("actor", self.actor)) if v is not None}
        tail = {"ratio_vs_fp32": dict(self.ratio_vs_fp32)} if "fp32" in self.calls_per_s else {}
        return {**head, "calls_per_s": dict(self.calls_per_s), "calls": self.calls, **tail}

    @classmethod
    def from_dict(cls, v: object, name: str) -> Throughput:
        return build(cls, v, name, {"calls_per_s": _numbers, "ratio_vs_fp32": _numbers})


@dataclass(frozen=True)
class RuntimeChoice:
    """What the actors ran on (``--actor-runtime``, or auto's choice with what it measured)."""

    chosen: str
    calls_per_s: Mapping[str, float] | None = field(default=None, metadata=OMIT_NONE)
    why: str = "--actor-runtime"

    def __post_init__(self) -> None:
        text(self.chosen, "chosen")
        text(self.why, "why")
        for k, c in (self.calls_per_s or {}).items():
            number(c, f"calls_per_s {k}", lo=0)

    @classmethod
    def from_dict(cls, v: object, name: str) -> RuntimeChoice:
        return build(cls, v, name, {"calls_per_s": optional(_numbers)})


_LOG_FIELDS = ("version", "args", "env_steps", "learner_updates", "actor_runtime", "broadcasts", "payload_bytes",
               "startup_s", "inference_throughput", "energy", "breakdown", "curve", "events")  # fmt: skip


@dataclass(frozen=True)
class ActorQLog:
    """One ActorQ run (``OUT/log.json``): its settings, counts, where the time went, energy, the curve."""

    args: Mapping[str, Any]
    """the learner's settings as JSON (each learner's Args has its own fields)"""
    env_steps: int
    learner_updates: int
    broadcasts: int
    payload_bytes: Mapping[str, int]
    """one broadcast's bytes at the actors' precision, and at fp32"""
    startup_s: Mapping[str, float]
    inference_throughput: Throughput
    breakdown: Mapping[str, RoleTime]
    """``learner`` and ``actor<i>``"""
    curve: tuple[CurvePoint, ...]
    events: tuple[Mapping[str, Any], ...] = ()
    learner: Mapping[str, Any] = field(default_factory=dict)
    """the learner's own entries (D4PG: losses, value support), placed after learner_updates"""
    actor_runtime: RuntimeChoice | None = None
    energy: Energy | None = None
    version: int = LOG_VERSION

    def __post_init__(self) -> None:
        integer(self.version, "version", lo=1, hi=LOG_VERSION)
        for k in ("env_steps", "learner_updates", "broadcasts"):
            integer(getattr(self, k), k)
        for k, b in self.payload_bytes.items():
            integer(b, f"payload_bytes {k}")
        for k, s in self.startup_s.items():
            number(s, f"startup_s {k}", lo=0)
        if "learner" not in self.breakdown:
            raise ValueError("breakdown has no learner")

    @property
    def actors(self) -> list[RoleTime]:
        """The actors that reported where their time went."""
        return [v for k, v in self.breakdown.items() if k.startswith("actor") and v.seconds is not None]

    def to_dict(self) -> JSONObject:
        body = fields_json(self)
        out = {k: body[k] for k in ("version", "args", "env_steps", "learner_updates")}
        out.update(body["learner"])
        out.update({k: body[k] for k in _LOG_FIELDS[4:] if k in body and body[k] is not None})
        return out

    @classmethod
    def from_dict(cls, v: object, name: str) -> ActorQLog:
        d = obj(v, name)
        learner = {k: x for k, x in d.items() if k not in _LOG_FIELDS}
        return build(cls, {**d, "learner": learner}, name, {
            "args": lambda x, n: dict(obj(x, n)),
            "payload_bytes": lambda x, n: {str(k): integer(b, f"{n} {k}") for k, b in obj(x, n).items()},
            "startup_s": _numbers,
            "inference_throughput": Throughput.from_dict,
            "breakdown": lambda x, n: {str(k): RoleTime.from_dict(r, f"{n} {k}") for k, r in obj(x, n).items()},
            "curve": tuple_of(CurvePoint.from_dict),
            "events": lambda x, n: tuple(dict(obj(e, n)) for e in items(x, n)),
            "actor_runtime": optional(RuntimeChoice.from_dict),
            "energy": optional(Energy.from_dict),
        })  # fmt: skip


def read_log(path: Path) -> ActorQLog | None:
    """A finished run's ``log.json``, every number checked; None when there is none (or it is not JSON: a
    run cut while writing it is run again)."""
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            return None
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    where = f"ActorQ log {str(path)!r}"
    return load(lambda: ActorQLog.from_dict(data, where), where, LOG_FIX)


# ---- the study -------------------------------------------------------------------------------------


def _ordered(x: Any, order: Sequence[str]) -> JSONObject:
    """A dataclass's JSON with its keys in ``order`` (the committed files' order)."""
    body = fields_json(x)
    return {k: body[k] for k in order if k in body}


@dataclass(frozen=True)
class RunSummary:
    """One run of the study (task, seed, precision, update period), from its log."""

    task: str
    env: str
    algo: str
    hidden: tuple[int, ...]
    seed: int
    update_period: int
    precision: str
    final_return: float | None
    """mean of the last WINDOW episodes"""
    time_to_target_s: float | None
    target: float
    run_s: float
    env_steps: int
    payload_bytes: Mapping[str, int]
    inference_throughput: Throughput
    actor_s_per_1k_steps: Mapping[str, float]
    learner_share: Mapping[str, float]
    curve: tuple[tuple[float, float, float], ...]
    """(env steps, wall seconds, return) per finished episode"""
    energy_to_target_j: float | None = None
    energy: Energy | None = None
    steps_per_s: float | None = None

    ORDER = ("task", "env", "algo", "hidden", "seed", "update_period", "precision", "final_return", "time_to_target_s",
             "energy_to_target_j", "energy", "target", "run_s", "env_steps", "steps_per_s", "payload_bytes",
             "inference_throughput", "actor_s_per_1k_steps", "learner_share", "curve")  # fmt: skip

    def __post_init__(self) -> None:
        for k in ("task", "env", "algo", "precision"):
            text(getattr(self, k), k)
        for h in self.hidden:
            integer(h, "hidden", lo=1)
        integer(self.seed, "seed")
        integer(self.update_period, "update_period", lo=1)
        opt_number(self.final_return, "final_return")
        for k in ("time_to_target_s", "energy_to_target_j", "steps_per_s"):
            opt_number(getattr(self, k), k, lo=0)
        number(self.target, "target")
        number(self.run_s, "run_s", lo=0)
        integer(self.env_steps, "env_steps")
        for point in self.curve:
            if len(point) != 3:
                raise ValueError("a curve point is not (env steps, wall seconds, return)")
            number(point[0], "curve env steps", lo=0)
            number(point[1], "curve wall seconds", lo=0)
            number(point[2], "curve return")

    def to_dict(self) -> JSONObject:
        return _ordered(self, self.ORDER)

    @classmethod
    def from_dict(cls, v: object, name: str) -> RunSummary:
        return build(cls, v, name, {
            "energy": optional(Energy.from_dict),
            "payload_bytes": lambda x, n: {str(k): integer(b, f"{n} {k}") for k, b in obj(x, n).items()},
            "inference_throughput": Throughput.from_dict,
            "actor_s_per_1k_steps": _numbers, "learner_share": _numbers,
            "curve": lambda x, n: tuple(tuple(items(p, n)) for p in items(x, n)),
        })  # fmt: skip


@dataclass(frozen=True)
class StudyRow:
    """One task, precision and update period over its seeds, against fp32 actors."""

    task: str
    precision: str
    update_period: int
    final_return_mean: float | None
    final_return_std: float | None
    final_returns: tuple[float, ...]
    within_fp32_spread: bool | None
    """None: fp32 itself, or one seed (no spread to compare against)"""
    time_to_target_s: float | None
    reached: str
    """seeds that reached the target / seeds run"""
    target: float
    speedup_vs_fp32: float | None
    inference_vs_fp32: float
    learner_update_share: float | None
    seeds: tuple[int, ...] | None = None
    steps_per_s: float | None = None
    steps_per_s_vs_fp32: float | None = None
    energy_to_target_j: float | None = None
    energy_ratio_fp32: float | None = None
    energy_source: str | None = None

    ORDER = ("task", "precision", "update_period", "seeds", "final_return_mean", "final_return_std", "final_returns",
             "within_fp32_spread", "time_to_target_s", "reached", "target", "speedup_vs_fp32", "steps_per_s",
             "steps_per_s_vs_fp32", "energy_to_target_j", "energy_ratio_fp32", "energy_source", "inference_vs_fp32",
             "learner_update_share")  # fmt: skip

    def __post_init__(self) -> None:
        text(self.task, "task")
        text(self.precision, "precision")
        integer(self.update_period, "update_period", lo=1)
        opt_number(self.final_return_mean, "final_return_mean")
        opt_number(self.final_return_std, "final_return_std", lo=0)
        for r in self.final_returns:
            number(r, "final_returns")
        if self.within_fp32_spread is not None:
            flag(self.within_fp32_spread, "within_fp32_spread")
        for k in ("time_to_target_s", "speedup_vs_fp32", "steps_per_s", "steps_per_s_vs_fp32", "energy_to_target_j",
                  "energy_ratio_fp32"):  # fmt: skip
            opt_number(getattr(self, k), k, lo=0)
        number(self.target, "target")
        number(self.inference_vs_fp32, "inference_vs_fp32", lo=0)
        opt_number(self.learner_update_share, "learner_update_share", lo=0, hi=1)
        done, _, of = str(self.reached).partition("/")
        if not (done.isdigit() and of.isdigit() and int(done) <= int(of)):
            raise ValueError(f"reached is {str(self.reached)[:20]!r}, not seeds/seeds")
        if self.energy_source is not None and not isinstance(self.energy_source, str):
            raise ValueError("energy_source is not a string")

    def to_dict(self) -> JSONObject:
        return _ordered(self, self.ORDER)


@dataclass(frozen=True)
class ActorQStudy:
    """`quarl-edge study actorq`: every run of a suite, and the table over seeds."""

    suite: str
    config: Mapping[str, Any]
    """the suite's tasks and settings as run (study.actorq.Suite as JSON)"""
    runs: tuple[RunSummary, ...]
    rows: tuple[StudyRow, ...]
    not_run: tuple[str, ...] = ()
    """runs not finished yet (``--finished-only``)"""
    version: int = STUDY_VERSION

    def __post_init__(self) -> None:
        text(self.suite, "suite")
        integer(self.version, "version", lo=1, hi=STUDY_VERSION)

    def to_dict(self) -> JSONObject:
        body = fields_json(self)
        return {"format": STUDY_FORMAT, "version": self.version, "suite": self.suite, "config": body["config"],
                "runs": body["runs"], "rows": body["rows"], "not_run": body["not_run"]}  # fmt: skip

    @classmethod
    def from_dict(cls, v: object, name: str) -> ActorQStudy:
        return build(cls, v, name, {
            "config": lambda x, n: dict(obj(x, n)),
            "runs": tuple_of(RunSummary.from_dict),
            "rows": tuple_of(lambda x, n: build(StudyRow, x, n)),
            "not_run": lambda x, n: tuple(text(r, n) for r in items(x, n)),
        })  # fmt: skip


def read_study(path: Path) -> ActorQStudy:
    """An ActorQ study's ``actorq.json`` (also of an earlier version, without a format tag)."""
    where = f"ActorQ study {str(path)!r}"
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise InputError(f"{where} cannot be read ({type(e).__name__})", STUDY_FIX) from None
    return load(lambda: ActorQStudy.from_dict(data, where), where, STUDY_FIX)
