"""The records of tune's result (tune/result.py): a latency, a closed loop, a candidate's row, the choice,
the per-layer search's evidence, the settings, the device, the inputs and the shipped bundle. Each is a
frozen dataclass that checks its own numbers when made and when read back (``from_dict``): an agreement
outside [0, 1], a latency that is not positive, a p99 below its p50, a model without a sha256 is one
InputError wherever it is read. Dicts only at the JSON edge."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from quarl_edge.runtimes import schema
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.schema import JSONObject
from quarl_edge.tune.candidates import Candidate

VERDICTS = ("pass", "rejected", "not judged", "not needed")
FIX = "re-run `quarl-edge tune`"
_SHA256 = re.compile("[0-9a-f]{64}")


def sha256(v: Any, where: str) -> str:
    if not isinstance(v, str) or not _SHA256.fullmatch(v):
        raise InputError(f"{where} is not a sha256 (64 hex digits)", FIX)
    return v


def positive(v: Any, where: str) -> float:
    x = schema.number(v, where, FIX)
    if x <= 0:
        raise InputError(f"{where} is not positive ({x!r})", FIX)
    return x


def share(v: Any, where: str) -> float:
    x = schema.number(v, where, FIX)
    if not 0.0 <= x <= 1.0:
        raise InputError(f"{where} is not between 0 and 1 ({x!r})", FIX)
    return x


def nonnegative(v: Any, where: str) -> float:
    x = schema.number(v, where, FIX)
    if x < 0:
        raise InputError(f"{where} is negative ({x!r})", FIX)
    return x


def _opt(check: Any, v: Any, where: str, *args: Any) -> Any:
    return None if v is None else check(v, where, *args)


def _interval(v: Any, where: str) -> tuple[float, float]:
    if not isinstance(v, list | tuple) or len(v) != 2:
        raise InputError(f"{where} is not a [low, high] pair", FIX)
    lo, hi = (schema.number(x, where, FIX) for x in v)
    if lo > hi:
        raise InputError(f"{where} has its low end above its high end ({lo!r} > {hi!r})", FIX)
    return lo, hi


@dataclass(frozen=True)
class Timing:
    """One model's latency at one thread count on the device."""

    p50_us: float
    p99_us: float

    def __post_init__(self) -> None:
        positive(self.p50_us, "p50_us")
        if positive(self.p99_us, "p99_us") < self.p50_us:
            raise InputError(f"p99_us {self.p99_us!r} is below p50_us {self.p50_us!r}", FIX)

    def to_dict(self) -> JSONObject:
        return {"p50_us": self.p50_us, "p99_us": self.p99_us}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Timing:
        d = schema.obj(d, where, FIX)
        return cls(positive(d.get("p50_us"), f"{where} p50_us"), positive(d.get("p99_us"), f"{where} p99_us"))


@dataclass(frozen=True)
class Drift:
    """One closed loop: a candidate's paired-seed reward against the reference. ``drop_pct`` and its
    interval are None when they are undefined (an fp32 mean reward of 0 gives no relative drop)."""

    drop_pct: float | None
    drop_ci95_pct: tuple[float, float] | None
    episodes: int
    mean: float
    ref_mean: float

    def __post_init__(self) -> None:
        _opt(schema.number, self.drop_pct, "drop_pct", FIX)
        _opt(_interval, self.drop_ci95_pct, "drop_ci95_pct")
        schema.integer(self.episodes, "episodes", FIX, 1)
        schema.number(self.mean, "mean", FIX)
        schema.number(self.ref_mean, "ref_mean", FIX)

    def to_dict(self) -> JSONObject:
        return {"drop_pct": self.drop_pct, "drop_ci95_pct": list(self.drop_ci95_pct) if self.drop_ci95_pct else None,
                "episodes": self.episodes, "mean": self.mean, "ref_mean": self.ref_mean}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Drift:
        d = schema.obj(d, where, FIX)
        return cls(_opt(schema.number, d["drop_pct"], f"{where} drop_pct", FIX),
                   _opt(_interval, d["drop_ci95_pct"], f"{where} drop_ci95_pct"),
                   schema.integer(d["episodes"], f"{where} episodes", FIX, 1), schema.number(d["mean"], f"{where} mean", FIX),
                   schema.number(d["ref_mean"], f"{where} ref_mean", FIX))  # fmt: skip


@dataclass(frozen=True)
class CandidateRow:
    """One candidate: its settings, the sha256 of the model file its numbers were measured on, and what
    each stage found (None: not measured / not judged)."""

    candidate: Candidate
    sha256: str
    agreement: float | None = None
    latency: tuple[tuple[int, Timing | None], ...] = ()
    """per thread count tried (None: not measured there, e.g. the budget ran out)"""
    threads: int | None = None
    p50_us: float | None = None
    p99_us: float | None = None
    verdict: str | None = None
    why: str | None = None
    drop_pct: float | None = None
    drop_ci95_pct: tuple[float, float] | None = None
    episodes_judged: int | None = None
    confirm_drop_pct: float | None = None
    confirm_episodes: int | None = None
    action_error: float | None = None
    """where the environment cannot run here: its action error against fp32 on the recorded observations,
    measured on the device at its threads (Agreement.action_error); its verdict rests on it"""

    def __post_init__(self) -> None:
        where = f"candidate {self.name}"
        sha256(self.sha256, f"{where} sha256")
        _opt(share, self.agreement, f"{where} agreement")
        if (self.threads is None) != (self.p50_us is None) or (self.p50_us is None) != (self.p99_us is None):
            raise InputError(f"{where} has threads, p50_us and p99_us only in part", FIX)
        if self.threads is not None:
            schema.integer(self.threads, f"{where} threads", FIX, 1)
            best = Timing(positive(self.p50_us, f"{where} p50_us"), positive(self.p99_us, f"{where} p99_us"))
            if dict(self.latency).get(self.threads) != best:
                raise InputError(
                    f"{where}'s p50/p99 are not those it measured at {self.threads} thread(s)", FIX
                )
        if self.verdict is not None and self.verdict not in VERDICTS:
            raise InputError(
                f"{where} verdict {self.verdict[:40]!r} is not one of {', '.join(VERDICTS)}", FIX
            )
        _opt(schema.number, self.drop_pct, f"{where} drop_pct", FIX)
        _opt(_interval, self.drop_ci95_pct, f"{where} drop_ci95_pct")
        _opt(schema.integer, self.episodes_judged, f"{where} episodes_judged", FIX, 1)
        _opt(schema.number, self.confirm_drop_pct, f"{where} confirm_drop_pct", FIX)
        _opt(schema.integer, self.confirm_episodes, f"{where} confirm_episodes", FIX, 1)
        _opt(nonnegative, self.action_error, f"{where} action_error")

    @property
    def name(self) -> str:
        return self.candidate.name

    @property
    def judged_drop(self) -> float | None:
        """The drop the verdict rests on (all episodes of a close call)."""
        return self.confirm_drop_pct if self.confirm_drop_pct is not None else self.drop_pct

    def to_dict(self) -> JSONObject:
        optional = {"verdict": self.verdict, "why": self.why, "drop_pct": self.drop_pct,
                    "drop_ci95_pct": list(self.drop_ci95_pct) if self.drop_ci95_pct else None,
                    "episodes_judged": self.episodes_judged, "confirm_drop_pct": self.confirm_drop_pct,
                    "confirm_episodes": self.confirm_episodes, "action_error": self.action_error}  # fmt: skip
        return {**self.candidate.to_dict(), "sha256": self.sha256, "agreement": self.agreement,
                "latency": {str(t): v.to_dict() if v else None for t, v in self.latency},
                "threads": self.threads, "p50_us": self.p50_us, "p99_us": self.p99_us,
                **{k: v for k, v in optional.items() if v is not None}}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Any, where: str) -> CandidateRow:
        d = schema.obj(d, where, FIX)
        lat = schema.obj(d.get("latency") or {}, f"{where} latency", FIX)
        if len(lat) > 1024:
            raise InputError(f"{where} latency has too many thread counts", FIX)
        try:
            latency = tuple(
                (int(t), _opt(Timing.from_dict, v, f"{where} latency[{t}]")) for t, v in lat.items()
            )
        except ValueError:
            raise InputError(f"{where} latency is not keyed by thread counts", FIX) from None
        return cls(Candidate.from_dict(d, where), d.get("sha256"), d.get("agreement"), latency, d.get("threads"),
                   d.get("p50_us"), d.get("p99_us"), d.get("verdict"), _opt(schema.text, d.get("why"), f"{where} why", FIX),
                   d.get("drop_pct"), _opt(_interval, d.get("drop_ci95_pct"), f"{where} drop_ci95_pct"),
                   d.get("episodes_judged"), d.get("confirm_drop_pct"), d.get("confirm_episodes"),
                   d.get("action_error"))  # fmt: skip


@dataclass(frozen=True)
class Choice:
    """The model tune chose: its numbers are its row's, its sha256 the bytes that were measured."""

    name: str
    sha256: str
    threads: int
    p50_us: float
    p99_us: float
    speedup_vs_fp32: float
    drop_pct: float | None
    """None: the reward was not measured (the environment cannot run here), never estimated"""
    episodes: int | None
    """paired episodes its verdict rests on (None: the reference, which passes by definition, or no
    environment here)"""
    why: str
    action_error: float | None = None
    """where the environment cannot run here: the action error its verdict rests on"""

    def __post_init__(self) -> None:
        sha256(self.sha256, "choice sha256")
        schema.integer(self.threads, "choice threads", FIX, 1)
        Timing(positive(self.p50_us, "choice p50_us"), positive(self.p99_us, "choice p99_us"))
        positive(self.speedup_vs_fp32, "choice speedup_vs_fp32")
        _opt(schema.number, self.drop_pct, "choice drop_pct", FIX)
        _opt(schema.integer, self.episodes, "choice episodes", FIX, 1)
        _opt(nonnegative, self.action_error, "choice action_error")

    def to_dict(self) -> JSONObject:
        return {"name": self.name, "sha256": self.sha256, "threads": self.threads, "p50_us": self.p50_us,
                "p99_us": self.p99_us, "speedup_vs_fp32": self.speedup_vs_fp32, "drop_pct": self.drop_pct,
                "episodes": self.episodes, "why": self.why,
                **({} if self.action_error is None else {"action_error": self.action_error})}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Any, where: str = "choice") -> Choice:
        d = schema.obj(d, where, FIX)
        return cls(schema.text(d["name"], f"{where} name", FIX, 256), d.get("sha256"), d["threads"], d["p50_us"],
                   d["p99_us"], d["speedup_vs_fp32"], d["drop_pct"], d.get("episodes"),
                   schema.text(d.get("why") or "", f"{where} why", FIX), d.get("action_error"))  # fmt: skip


@dataclass(frozen=True)
class LayerEvidence:
    """The per-layer search for one format: agreement with every layer int8, each layer's sensitivity,
    the greedy steps and what came of them."""

    format: str
    proxy: float
    all_int8: float
    alone: tuple[tuple[str, float], ...] = ()
    steps: tuple[tuple[tuple[str, ...], float], ...] = ()
    result: str = ""

    def __post_init__(self) -> None:
        for v, w in ((self.proxy, "proxy"), (self.all_int8, "all_int8"), *((a, f"alone {k}") for k, a in self.alone),
                     *((a, "a greedy step") for _, a in self.steps)):  # fmt: skip
            share(v, f"layer search {w}")

    def to_dict(self) -> JSONObject:
        return {"format": self.format, "proxy": self.proxy, "all_int8": self.all_int8, "alone": dict(self.alone),
                "steps": [{"float_layers": list(fl), "agreement": a} for fl, a in self.steps], "result": self.result}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Any, where: str = "layer search") -> LayerEvidence:
        d = schema.obj(d, where, FIX)
        steps = d.get("steps") or []
        if not isinstance(steps, list) or len(steps) > 1024:
            raise InputError(f"{where} steps is not a list", FIX)
        return cls(schema.text(d["format"], f"{where} format", FIX, 16), d["proxy"], d["all_int8"],
                   tuple((str(k), v) for k, v in schema.obj(d.get("alone") or {}, f"{where} alone", FIX).items()),
                   tuple((schema.strings(schema.obj(s, f"{where} step", FIX)["float_layers"], f"{where} step", FIX),
                          s["agreement"]) for s in steps),
                   schema.text(d.get("result") or "", f"{where} result", FIX))  # fmt: skip


@dataclass(frozen=True)
class TuneSettings:
    max_reward_drop_pct: float
    min_agreement: float | None
    max_p99_ms: float | None
    episodes: int
    seed: int
    confirm_episodes: int
    budget_min: float
    threads: tuple[int, ...]
    proxy_agreement: float
    max_action_error: float | None = None
    """the verdict where the environment cannot run here (TuneConfig.max_action_error)"""

    def __post_init__(self) -> None:
        w = "settings"
        if schema.number(self.max_reward_drop_pct, f"{w} max_reward_drop_pct", FIX) < 0:
            raise InputError(f"{w} max_reward_drop_pct is negative", FIX)
        _opt(share, self.min_agreement, f"{w} min_agreement")
        _opt(positive, self.max_p99_ms, f"{w} max_p99_ms")
        schema.integer(self.episodes, f"{w} episodes", FIX, 1)
        schema.integer(self.seed, f"{w} seed", FIX, 0)
        schema.integer(self.confirm_episodes, f"{w} confirm_episodes", FIX, 0)
        positive(self.budget_min, f"{w} budget_min")
        if not self.threads or len(self.threads) > 1024:
            raise InputError(f"{w} threads is not a list of thread counts", FIX)
        for t in self.threads:
            schema.integer(t, f"{w} threads", FIX, 1)
        share(self.proxy_agreement, f"{w} proxy_agreement")
        _opt(nonnegative, self.max_action_error, f"{w} max_action_error")

    def to_dict(self) -> JSONObject:
        return {"max_reward_drop_pct": self.max_reward_drop_pct, "min_agreement": self.min_agreement,
                "max_p99_ms": self.max_p99_ms, "episodes": self.episodes, "seed": self.seed,
                "confirm_episodes": self.confirm_episodes, "budget_min": self.budget_min,
                "threads": list(self.threads), "proxy_agreement": self.proxy_agreement,
                **({} if self.max_action_error is None else {"max_action_error": self.max_action_error})}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Any) -> TuneSettings:
        d = schema.obj(d, "settings", FIX)
        threads = d["threads"]
        if not isinstance(threads, list):
            raise InputError("settings threads is not a list", FIX)
        return cls(d["max_reward_drop_pct"], d.get("min_agreement"), d.get("max_p99_ms"), d["episodes"], d["seed"],
                   d["confirm_episodes"], d["budget_min"], tuple(threads), d["proxy_agreement"],
                   d.get("max_action_error"))  # fmt: skip


@dataclass(frozen=True)
class TuneDevice:
    name: str
    transport: str
    emulated: bool
    cores: int
    cpu_model: str | None = None
    machine: str | None = None

    def __post_init__(self) -> None:
        schema.text(self.name, "device name", FIX, 256)
        schema.text(self.transport, "device transport", FIX, 32)
        if not isinstance(self.emulated, bool):
            raise InputError("device emulated is not true or false", FIX)
        schema.integer(self.cores, "device cores", FIX, 1, 4096)
        _opt(schema.text, self.cpu_model, "device cpu_model", FIX, 256)
        _opt(schema.text, self.machine, "device machine", FIX, 64)

    def to_dict(self) -> JSONObject:
        return {"name": self.name, "transport": self.transport, "emulated": self.emulated, "cores": self.cores,
                "cpu_model": self.cpu_model, "machine": self.machine}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Any) -> TuneDevice:
        d = schema.obj(d, "device", FIX)
        return cls(d["name"], d["transport"], d["emulated"], d["cores"], d.get("cpu_model"), d.get("machine"))


@dataclass(frozen=True)
class Inputs:
    """What the measurements depend on, by content: tune's cache is keyed by these."""

    policy_sha256: str
    """the policy's files (checkpoint, SB3 zip, VecNormalize statistics) and its weights and spec as loaded"""
    calibration_sha256: str
    device_sha256: str
    """the device's identity: profile, host, port, user, and its facts (CPU, cores, runtimes, ...)"""
    tools: tuple[tuple[str, str], ...] = ()
    """versions of the tools that exported and measured the models"""

    def __post_init__(self) -> None:
        for v, w in ((self.policy_sha256, "policy"), (self.calibration_sha256, "calibration"),
                     (self.device_sha256, "device")):  # fmt: skip
            sha256(v, f"inputs {w}_sha256")

    def to_dict(self) -> JSONObject:
        return {"policy_sha256": self.policy_sha256, "calibration_sha256": self.calibration_sha256,
                "device_sha256": self.device_sha256, "tools": dict(self.tools)}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Any) -> Inputs:
        d = schema.obj(d, "inputs", FIX)
        tools = schema.obj(d.get("tools") or {}, "inputs tools", FIX)
        return cls(d.get("policy_sha256"), d.get("calibration_sha256"), d.get("device_sha256"),
                   tuple((str(k), schema.text(v, f"inputs tools {k}", FIX, 128)) for k, v in tools.items()))  # fmt: skip


@dataclass(frozen=True)
class Shipped:
    """The bundle tune wrote (``DIR/bundle``): its manifest's sha256 and the sha256 of each model in it."""

    path: str
    manifest_sha256: str
    models: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        schema.text(self.path, "shipped path", FIX)
        sha256(self.manifest_sha256, "shipped manifest_sha256")
        for n, s in self.models:
            sha256(s, f"shipped model {n[:80]} sha256")

    def to_dict(self) -> JSONObject:
        return {"path": self.path, "manifest_sha256": self.manifest_sha256, "models": dict(self.models)}

    @classmethod
    def from_dict(cls, d: Any) -> Shipped:
        d = schema.obj(d, "shipped", FIX)
        models = schema.obj(d["models"], "shipped models", FIX)
        return cls(d["path"], d["manifest_sha256"], tuple((str(k), v) for k, v in models.items()))
