"""`quarl-edge field report LOGS --bundle B`: the deployed model against the bundle's fp32 model on the
observations the robot logged (runtimes.telemetry), with the out-of-calibration-range rate per feature and
the latency act() had in the field.

The comparison replays every logged model input through the deployed model and the fp32 reference of the
bundle, here on the host, so both answer the same inputs. By default the bundle must be the one the log was
written with (its manifest sha256 is in the log); ``replay=True`` evaluates another bundle of the same
policy on those observations (a re-export calibrated on them, before it is deployed): the report then says
so, and its latency is the logged model's.
"""

from __future__ import annotations

import datetime as _dt
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quarl_edge import __version__
from quarl_edge.runtimes.envs import bounds, split_wrappers
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.fieldlog import FLAG_NONFINITE, FLAG_OUT_OF_RANGE, FieldLog, load_field_log
from quarl_edge.runtimes.fsutil import sha256_file
from quarl_edge.runtimes.inputs import CalibrationRange
from quarl_edge.runtimes.load import load_policy
from quarl_edge.runtimes.loop import Percentiles
from quarl_edge.runtimes.manifest import MANIFEST_NAME, Manifest, ModelEntry, load_manifest
from quarl_edge.runtimes.policy import Policy
from quarl_edge.runtimes.schema import JSONObject

REPORT_FORMAT = "quarl-edge/field-report"
REPORT_VERSION = 1
BINS = 20
"""the report's time line: the records in this many consecutive groups of equal size"""
BATCH = 256
"""model inputs per inference when replaying (bounded memory for image frames)"""


def _num(v: Any, name: str, low: float = -math.inf, high: float = math.inf, none: bool = False) -> None:
    if v is None and none:
        return
    if isinstance(v, bool) or not isinstance(v, int | float) or not (low <= v <= high) or math.isnan(v):
        raise ValueError(f"{name} must be a number in [{low:g}, {high:g}] (got {str(v)[:24]!r})")


def _count(v: Any, name: str) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{name} must be a count >= 0 (got {str(v)[:24]!r})")


@dataclass(frozen=True)
class TimeBin:
    """One stretch of the log, in record order."""

    first_record: int
    records: int
    t_s: float
    """its first record, seconds after the log's first record"""
    agreement: float
    action_error: float
    """mean |deployed - fp32| (max over action dimensions); discrete: the share of differing actions"""
    out_of_range_rate: float
    act_p50_us: float
    act_p99_us: float

    def __post_init__(self) -> None:
        _count(self.first_record, "first_record")
        _count(self.records, "records")
        _num(self.agreement, "agreement", -math.inf, 1)
        _num(self.out_of_range_rate, "out_of_range_rate", 0, 1)
        for name in ("t_s", "action_error", "act_p50_us", "act_p99_us"):
            _num(getattr(self, name), name, 0)


@dataclass(frozen=True)
class FieldReport:
    """What a field log says about the deployed model. ``action_error`` and ``out_of_range_rate`` are the
    figures ``quarl-edge gate`` checks (--max-action-error, --max-out-of-range)."""

    created: str
    tool_version: str
    logs: str
    chunks: int
    sessions: int
    records: int
    compared: int
    """records replayed (those with NaN/inf are not)"""
    dropped: int
    """records the device's logger could not keep"""
    bundle: str
    manifest_sha256: str
    """of the bundle evaluated"""
    logged_manifest_sha256: str
    """of the bundle the log was written with (the same unless ``replay``)"""
    replay: bool
    policy: str
    env_id: str
    model: str
    precision: str
    reference: str
    """the fp32 model compared against"""
    logged_model: str
    discrete: bool
    agreement: float
    """discrete: the share of actions equal to fp32's; continuous: 1 - mean |deployed - fp32| / action range
    (bench's agreement metric)"""
    agreement_in_range: float | None
    """over the records inside the evaluated bundle's calibration range (None: none were)"""
    agreement_out_of_range: float | None
    action_error: float
    """the gated figure: discrete, the share of actions differing from fp32's; continuous, the p99 of
    |deployed - fp32| (max over action dimensions, in action units)"""
    action_error_mean: float
    action_error_max: float
    logged_vs_replayed: float | None
    """the logged actions against this host's replay of the same model: discrete, the share that differ;
    continuous, the max |difference| (None for a replay of another bundle)"""
    out_of_range_rate: float | None
    """records with a feature outside the evaluated bundle's calibration range (None: it records none)"""
    out_of_range_features: tuple[float, ...]
    """per feature of the observation (one entry for a range over all pixels): the share outside"""
    logged_out_of_range_rate: float
    """what the device flagged, against the deployed bundle's range"""
    latency: Percentiles | None
    """act() in the field, as logged (of the logged model)"""
    over_time: tuple[TimeBin, ...]
    plots: tuple[str, ...] = ()
    format: str = REPORT_FORMAT
    version: int = REPORT_VERSION

    def __post_init__(self) -> None:
        if self.format != REPORT_FORMAT or self.version != REPORT_VERSION:
            raise ValueError(f"not a {REPORT_FORMAT} v{REPORT_VERSION}")
        for name in ("chunks", "sessions", "records", "compared", "dropped"):
            _count(getattr(self, name), name)
        if self.compared > self.records:
            raise ValueError("compared must be at most records")
        for name in ("agreement", "agreement_in_range", "agreement_out_of_range"):
            _num(getattr(self, name), name, -math.inf, 1, none=name != "agreement")
        for name in ("action_error", "action_error_mean", "action_error_max", "logged_vs_replayed"):
            _num(getattr(self, name), name, 0, none=name == "logged_vs_replayed")
        for name in ("out_of_range_rate", "logged_out_of_range_rate"):
            _num(getattr(self, name), name, 0, 1, none=name == "out_of_range_rate")
        for i, r in enumerate(self.out_of_range_features):
            _num(r, f"out_of_range_features[{i}]", 0, 1)
        for name in ("bundle", "logs", "policy", "env_id", "model", "precision", "reference", "logged_model",
                     "manifest_sha256", "logged_manifest_sha256", "created", "tool_version"):  # fmt: skip
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"{name} must be text")
        if not all(isinstance(p, str) and "/" not in p and p.endswith(".png") for p in self.plots):
            raise ValueError("plots must be .png file names")
        if not isinstance(self.replay, bool) or not isinstance(self.discrete, bool):
            raise ValueError("replay and discrete must be true or false")

    def to_dict(self) -> JSONObject:
        d = asdict(self)
        d = {"format": d.pop("format"), "version": d.pop("version"), **d}
        d["latency"] = None if self.latency is None else self.latency.to_dict()
        d["over_time"] = [asdict(b) for b in self.over_time]
        d["out_of_range_features"], d["plots"] = list(self.out_of_range_features), list(self.plots)
        return d

    @classmethod
    def from_dict(cls, d: Any) -> FieldReport:
        """A report read from JSON, every field checked (ValueError names the first that is wrong)."""
        if not isinstance(d, dict) or d.get("format") != REPORT_FORMAT:
            raise ValueError(f"not a {REPORT_FORMAT}")
        names = set(cls.__dataclass_fields__)
        if set(d) - names or names - set(d) - {"plots"}:
            raise ValueError(f"fields differ from a v{REPORT_VERSION} report's: {sorted(set(d) ^ names)[:4]}")
        fields = dict(d)
        bins = d.get("over_time")
        if not isinstance(bins, list) or not all(isinstance(b, dict) for b in bins):
            raise ValueError("over_time must be a list of objects")
        fields["over_time"] = tuple(TimeBin(**b) for b in bins)
        fields["latency"] = None if d.get("latency") is None else Percentiles.from_dict(d["latency"])
        for name in ("out_of_range_features", "plots"):
            if not isinstance(d.get(name, []), list):
                raise ValueError(f"{name} must be a list")
            fields[name] = tuple(d.get(name, []))
        return cls(**fields)


# ---- building one ------------------------------------------------------------------------------------------


def _fp32(manifest: Manifest, entry: ModelEntry) -> ModelEntry:
    if entry.precision == "fp32":
        return entry
    same = [m for m in manifest.models if m.precision == "fp32" and m.format == entry.format]
    ref = same[0] if same else manifest.reference()
    if ref is None:
        raise InputError("the field report compares the deployed model with the bundle's fp32 model, and this "
                         "bundle has none", "re-export it with an fp32 model, e.g. --to onnx-fp32,onnx-int8")  # fmt: skip
    return ref


def _check_bundle(log: FieldLog, bundle: Path, manifest: Manifest, replay: bool) -> None:
    h, sha = log.header, sha256_file(bundle / MANIFEST_NAME)
    if not replay and h.manifest_sha256 != sha:
        raise InputError(f"field log {str(log.dir)!r} is of {h.describe()}, not of the bundle {str(bundle)!r} "
                         f"(manifest sha256 {sha[:12]})", "pass the bundle that was deployed, or --replay to "
                         "evaluate this bundle on the logged observations")  # fmt: skip
    spec = manifest.policy
    if (h.policy, h.env_id, h.obs_shape, h.obs_dtype) != (spec.name, spec.env.id, tuple(spec.observation_space.shape),
                                                        spec.observation_space.dtype):  # fmt: skip
        raise InputError(f"field log {str(log.dir)!r} is of policy {h.policy} on {h.env_id} (inputs {list(h.obs_shape)} "
                         f"{h.obs_dtype}), the bundle's is {spec.name} on {spec.env.id}", "pass a bundle of that policy")  # fmt: skip


def _actions(policy: Policy, obs: np.ndarray) -> np.ndarray:
    out = [policy.act_batch(obs[i : i + BATCH]) for i in range(0, len(obs), BATCH)]
    return np.concatenate(out) if out else np.zeros((0,), np.float32)


def _errors(a: np.ndarray, b: np.ndarray, discrete: bool, span: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per record: the action error (|a - b| max over dimensions; discrete: 0/1) and the agreement term
    (discrete: equal; continuous: 1 - mean |a - b| / action range)."""
    if discrete:
        same = (a == b).astype(np.float64)
        return 1.0 - same, same
    diff = np.abs(a.astype(np.float64) - b.astype(np.float64)).reshape(len(a), -1)
    return diff.max(axis=1, initial=0.0), 1.0 - (diff / span).mean(axis=1)


def _outside(log: FieldLog, rng: CalibrationRange | None, obs_shape: tuple[int, ...]) -> np.ndarray | None:
    """Per record and feature of its newest frame: outside the range (None: no range)."""
    if rng is None:
        return None
    frames = log.obs.reshape(log.records, -1, *obs_shape)[:, -1]
    with np.errstate(invalid="ignore"):
        out: np.ndarray = np.asarray((frames < rng.low) | (frames > rng.high)).reshape(log.records, -1)
    return np.asarray(out.any(axis=1, keepdims=True)) if rng.features == 1 else out


def _mean(x: np.ndarray) -> float | None:
    return float(x.mean()) if x.size else None


def field_report(logs: str | Path, bundle: str | Path, model: str | None = None, replay: bool = False,
                 bins: int = BINS) -> FieldReport:  # fmt: skip
    """Compare ``model`` (default: the logged one) of ``bundle`` with its fp32 model on the observations of
    the field log ``logs``; ``replay``: ``bundle`` may be another bundle of the logged policy."""
    log = load_field_log(logs)
    bundle = Path(bundle)
    manifest = load_manifest(bundle, verify=False)
    _check_bundle(log, bundle, manifest, replay)
    if log.records == 0:
        raise InputError(
            f"field log {str(log.dir)!r} holds no records yet", "run the policy with log_dir= first"
        )
    entry = manifest.model(model or log.header.model)
    ref = _fp32(manifest, entry)
    deployed = load_policy(bundle, entry.name, threads=1, warmup=0)  # sha256 checked
    fp32 = deployed if ref is entry else load_policy(bundle, ref.name, threads=1, warmup=0)
    finite = ~np.asarray(log.flags & FLAG_NONFINITE, bool)
    if log.obs.dtype.kind == "f":
        finite &= np.isfinite(log.obs.reshape(log.records, -1)).all(axis=1)
    x = log.obs[finite]
    ours, theirs = _actions(deployed, x), _actions(fp32, x)
    space = manifest.policy.action_space
    discrete = bool(space.is_discrete)
    span = np.ones(1)
    if not discrete:
        low, high = bounds(space)
        span = (high - low).reshape(-1).astype(np.float64)
        span = np.where(np.isfinite(span) & (span > 0), span, 1.0)
    err, agree = _errors(ours, theirs, discrete, span)
    logged_err = None
    if not replay:
        lerr, _ = _errors(log.actions[finite], ours, discrete, span)
        logged_err = float(lerr.mean() if discrete else lerr.max(initial=0.0))
    stack_dims = len(split_wrappers(manifest.policy.env)[1])
    obs_shape = tuple(manifest.policy.observation_space.shape)[stack_dims:]
    rng = CalibrationRange.from_manifest(manifest.calibration, obs_shape)
    outside = _outside(log, rng, obs_shape)
    row_out = np.asarray(outside.any(axis=1))[finite] if outside is not None else np.zeros(len(x), bool)
    latency = Percentiles.of_ns(log.act_ns)
    return FieldReport(
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), tool_version=__version__,
        logs=str(log.dir), chunks=len(log.chunks), sessions=len(log.sessions), records=log.records,
        compared=int(finite.sum()), dropped=log.dropped, bundle=str(bundle),
        manifest_sha256=sha256_file(bundle / MANIFEST_NAME), logged_manifest_sha256=log.header.manifest_sha256,
        replay=replay, policy=manifest.policy.name, env_id=manifest.policy.env.id, model=entry.name,
        precision=entry.precision, reference=ref.name, logged_model=log.header.model, discrete=discrete,
        agreement=float(agree.mean()) if agree.size else 1.0, agreement_in_range=_mean(agree[~row_out]),
        agreement_out_of_range=_mean(agree[row_out]),
        action_error=float(err.mean() if discrete else np.percentile(err, 99)) if err.size else 0.0,
        action_error_mean=_mean(err) or 0.0, action_error_max=float(err.max(initial=0.0)),
        logged_vs_replayed=logged_err,
        out_of_range_rate=None if outside is None else float(outside.any(axis=1).mean()),
        out_of_range_features=() if outside is None else tuple(float(r) for r in outside.mean(axis=0)),
        logged_out_of_range_rate=float(np.mean(log.flags & FLAG_OUT_OF_RANGE > 0)),
        latency=latency, over_time=_over_time(log, finite, err, agree, outside, bins),
    )  # fmt: skip


def _over_time(log: FieldLog, finite: np.ndarray, err: np.ndarray, agree: np.ndarray,
               outside: np.ndarray | None, bins: int) -> tuple[TimeBin, ...]:  # fmt: skip
    idx = np.flatnonzero(finite)  # record index of each compared record
    t0 = int(log.t_ns[0])
    out = []
    for part in np.array_split(np.arange(log.records), min(bins, log.records)):
        lo, hi = int(part[0]), int(part[-1]) + 1
        sel = (idx >= lo) & (idx < hi)
        act = log.act_ns[lo:hi].astype(np.float64) / 1e3
        out.append(TimeBin(
            first_record=lo, records=hi - lo, t_s=max(0.0, (int(log.t_ns[lo]) - t0) / 1e9),
            agreement=float(agree[sel].mean()) if sel.any() else 1.0,
            action_error=float(err[sel].mean()) if sel.any() else 0.0,
            out_of_range_rate=0.0 if outside is None else float(outside[lo:hi].any(axis=1).mean()),
            act_p50_us=float(np.percentile(act, 50)), act_p99_us=float(np.percentile(act, 99)),
        ))  # fmt: skip
    return tuple(out)
