"""One device's bench report as typed data: every model's latency, size, reward, drift and agreement against
the fp32 reference, the device and the harness. Frozen dataclasses that check their numbers when made (by
bench.run.bench, from what the device sent) and when read back (from_dict), and become the report JSON
only at the edge (to_dict). Gate, tune, the writers and the plots read these, never the JSON's keys.

A fleet (`bench --device a,b`) is a report per device: bench/fleet_result.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from quarl_edge.runtimes.inloop import InLoopStats
from quarl_edge.runtimes.parity import SourceParity
from quarl_edge.runtimes.schema import JSONObject
from quarl_edge.runtimes.sustained import SustainedStats, Window
from quarl_edge.runtimes.thermal import ThermalReading
from quarl_edge.stats import Drift
from quarl_edge.typed import (
    OMIT_NONE,
    build,
    fields_json,
    first_twice,
    flag,
    integer,
    items,
    number,
    obj,
    opt_number,
    opt_text,
    optional,
    text,
)

REPORT_FORMAT = "quarl-edge/report"
REPORT_VERSION = 1
FIX = "re-run `quarl-edge bench`"
EXACT_MATCH = "exact_match_rate"
"""agreement of discrete actions: the share of recorded states where the action equals fp32's"""
RANGE_MATCH = "1 - mean_abs_diff/action_range"
"""agreement of continuous actions: 1 - the mean |a - a_fp32| in units of each dimension's range"""
NAME_MAX = 256


@dataclass(frozen=True)
class Latency:
    """Single-observation latency over ``count`` calls after a warm-up (runtimes.runner.LatencyStats)."""

    count: int
    p50_us: float
    p90_us: float
    p99_us: float
    mean_us: float
    std_us: float
    min_us: float
    max_us: float
    throughput_per_s: float | None
    """1e6 / mean_us; None when the mean was 0 (a clock too coarse to see the call)"""

    def __post_init__(self) -> None:
        integer(self.count, "count")
        for k in ("p50_us", "p90_us", "p99_us", "mean_us", "std_us", "min_us", "max_us"):
            number(getattr(self, k), k, lo=0)
        opt_number(self.throughput_per_s, "throughput_per_s", lo=0)


@dataclass(frozen=True)
class Reward:
    """Closed-loop returns on the bench's seeds (in seed order)."""

    mean: float | None
    """over the episodes that finished with a finite return; None when none did"""
    std: float | None
    episodes: int
    """how many finished with a finite return"""
    per_episode: tuple[float | None, ...]
    """every episode's return (a failed episode's up to its failure; None: not a finite number)"""
    seeds: tuple[int, ...]

    def __post_init__(self) -> None:
        integer(self.episodes, "episodes", hi=len(self.per_episode))
        for i, r in enumerate(self.per_episode):
            opt_number(r, f"per_episode[{i}]")
        for i, s in enumerate(self.seeds):
            integer(s, f"seeds[{i}]")
        if len(self.seeds) != len(self.per_episode):
            raise ValueError(f"{len(self.seeds)} seeds for {len(self.per_episode)} episodes")
        if (self.mean is None) != (self.episodes == 0) or (self.std is None) != (self.episodes == 0):
            raise ValueError("mean and std are null exactly when no episode finished")
        opt_number(self.mean, "mean")
        opt_number(self.std, "std", lo=0)


@dataclass(frozen=True)
class Agreement:
    """Action agreement with the fp32 reference on the recorded trace, in [0, 1]."""

    metric: str
    """EXACT_MATCH (discrete actions) or RANGE_MATCH (continuous)"""
    value: float
    mean_abs_diff_rel: float | None = field(default=None, metadata=OMIT_NONE)
    """continuous actions: the mean |a - a_fp32| / range, so value = 1 - this"""
    samples: int = 0
    mean_abs_diff: float | None = field(default=None, metadata=OMIT_NONE)
    """continuous actions: the action error in action units, mean |a - a_fp32| (gate --max-action-error
    judges max_abs_diff)"""
    p99_abs_diff: float | None = field(default=None, metadata=OMIT_NONE)
    max_abs_diff: float | None = field(default=None, metadata=OMIT_NONE)

    def __post_init__(self) -> None:
        if self.metric not in (EXACT_MATCH, RANGE_MATCH):
            raise ValueError(f"metric is {str(self.metric)[:40]!r}, not {EXACT_MATCH} or {RANGE_MATCH}")
        number(self.value, "value", lo=0, hi=1)
        integer(self.samples, "samples", lo=1)
        if (self.mean_abs_diff_rel is None) != (self.metric == EXACT_MATCH):
            raise ValueError("mean_abs_diff_rel is given exactly for continuous actions")
        opt_number(self.mean_abs_diff_rel, "mean_abs_diff_rel", lo=0, hi=1)
        for k in ("mean_abs_diff", "p99_abs_diff", "max_abs_diff"):
            opt_number(getattr(self, k), k, lo=0)

    def action_error(self) -> tuple[float, str]:
        """The action error `gate --max-action-error` judges and tune chooses by where the environment
        cannot run here, and what it is: max |a - a_fp32| in action units; for discrete actions (or when
        no finite bound exists: a model answered NaN) the share of steps whose action differs."""
        if self.max_abs_diff is not None:
            return self.max_abs_diff, "max |Δa|"
        return 1.0 - self.value, "differing actions"


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p99: float

    def __post_init__(self) -> None:
        number(self.p50, "p50", lo=0)
        number(self.p99, "p99", lo=0)


@dataclass(frozen=True)
class LinkTiming:
    """`bench --env-on-host`: the env here, the policy on the device, one step at a time over the link."""

    where: str
    steps: int
    policy_us: Percentiles | None = field(default=None, metadata=OMIT_NONE)
    """the device's own inference time per step"""
    round_trip_us: Percentiles | None = field(default=None, metadata=OMIT_NONE)
    """one step over the link, as the host saw it"""
    link_us_p50: float | None = field(default=None, metadata=OMIT_NONE)
    """round trip minus inference, p50"""

    def __post_init__(self) -> None:
        text(self.where, "where")
        integer(self.steps, "steps")
        opt_number(self.link_us_p50, "link_us_p50", lo=0)

    @classmethod
    def from_dict(cls, v: object, name: str) -> LinkTiming:
        pct = optional(lambda x, n: build(Percentiles, x, n))
        return build(cls, v, name, {"policy_us": pct, "round_trip_us": pct})


def in_loop_from_dict(v: object, name: str) -> InLoopStats:
    """The runner's in-loop block (runtimes.loop.InLoopStats), checked."""
    s = build(InLoopStats, v, name)
    try:
        check_in_loop(s)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    return s


def check_in_loop(s: InLoopStats) -> None:
    """The in-loop figures as a share of steps and latencies (`gate --max-miss-rate` reads them)."""
    number(s.hz, "hz", lo=0)
    number(s.budget_us, "budget_us", lo=0)
    integer(s.steps, "steps", lo=1)
    integer(s.over_budget, "over_budget", hi=s.steps)
    number(s.miss_rate, "miss_rate", lo=0, hi=1)
    for k in ("p50_us", "p99_us", "p999_us", "max_us", "mean_us"):
        number(getattr(s, k), k, lo=0)
    opt_number(s.first_call_ms, "first_call_ms", lo=0)
    flag(s.paced, "paced")
    integer(s.overruns, "overruns")
    integer(s.no_warmup_steps, "no_warmup_steps")
    for k in ("no_warmup_p50_us", "no_warmup_p99_us"):
        opt_number(getattr(s, k), k, lo=0)
    opt_number(s.no_warmup_miss_rate, "no_warmup_miss_rate", lo=0, hi=1)
    if not isinstance(s.os_settings, tuple) or not all(
        isinstance(x, str) and len(x) <= 40 for x in s.os_settings
    ):
        raise ValueError("os_settings must be a list of setting names")


def _reading(v: object, name: str) -> ThermalReading:
    d = obj(v, name)
    temps, freqs, throttled = d.get("temp_c"), d.get("freq_mhz"), d.get("throttled")
    return ThermalReading(
        t_s=number(d.get("t_s"), f"{name} t_s", lo=0),
        temp_c=None if temps is None else {str(k): number(t, f"{name} temp_c") for k, t in obj(temps, name).items()},
        freq_mhz=None if freqs is None else [number(f, f"{name} freq_mhz", lo=0) for f in items(freqs, name)],
        throttled=None if throttled is None else integer(throttled, f"{name} throttled"),
    )  # fmt: skip


def sustained_from_dict(v: object, name: str) -> SustainedStats:
    """The runner's sustained-loop block (runtimes.sustained.SustainedStats), checked."""
    d = obj(v, name)
    windows = [build(Window, w, f"{name} windows[{i}]") for i, w in enumerate(items(d.get("windows"), name))]
    for w in windows:
        integer(w.calls, f"{name} windows calls")
        number(w.p50_us, f"{name} windows p50_us", lo=0)
        number(w.p99_us, f"{name} windows p99_us", lo=0)
    strings = [
        text(x, f"{name} {k}") for k in ("throttle_flags", "not_exposed") for x in items(d.get(k) or [], name)
    ]
    return SustainedStats(
        duration_s=number(d.get("duration_s"), f"{name} duration_s", lo=0),
        calls=integer(d.get("calls"), f"{name} calls"),
        windows=windows,
        readings=[_reading(r, f"{name} readings[{i}]") for i, r in enumerate(items(d.get("readings"), name))],
        first_p50_us=number(d.get("first_p50_us"), f"{name} first_p50_us", lo=0),
        last_p50_us=number(d.get("last_p50_us"), f"{name} last_p50_us", lo=0),
        slowdown=number(d.get("slowdown"), f"{name} slowdown", lo=0),
        clock_drop_pct=opt_number(d.get("clock_drop_pct"), f"{name} clock_drop_pct", lo=0, hi=100),
        max_temp_c=opt_number(d.get("max_temp_c"), f"{name} max_temp_c"),
        throttle_flags=strings[: len(d.get("throttle_flags") or [])],
        not_exposed=strings[len(d.get("throttle_flags") or []) :],
        emulated=flag(d.get("emulated", False), f"{name} emulated"),
    )


@dataclass(frozen=True)
class ModelResult:
    """One model of the bundle on the device, against the device's fp32 reference (the reference itself has
    no drift and no agreement)."""

    name: str
    format: str
    precision: str
    runtime: str
    toolchain: Mapping[str, str]
    """the converter, quantizer and runtime the bundle was checked with"""
    threads: int
    size_bytes: int
    size_ratio_vs_ref: float | None
    load_ms: float
    first_inference_ms: float
    peak_rss_mb: float
    latency: Latency | None
    """None: not measured (latency_samples 0)"""
    speedup_p50_vs_ref: float | None
    reward: Reward
    drift: Drift | None
    """None for the reference, or when no episode pair finished"""
    agreement: Agreement | None
    """None for the reference, or without a trace"""
    warnings: tuple[str, ...] = ()
    env_on_host: LinkTiming | None = None
    in_loop: InLoopStats | None = None
    """with `bench --hz`: act() inside the episodes against the period's budget"""
    sustained: SustainedStats | None = None
    """with `bench --duration`: the sustained loop and the board's thermal readings"""

    def __post_init__(self) -> None:
        text(self.name, "its name", NAME_MAX)
        for k in ("format", "precision", "runtime"):
            text(getattr(self, k), k, NAME_MAX)
        for k, v in self.toolchain.items():
            text(v, f"toolchain {k}")
        integer(self.threads, "threads", lo=1)
        integer(self.size_bytes, "size_bytes")
        for k in ("load_ms", "first_inference_ms", "peak_rss_mb"):
            number(getattr(self, k), k, lo=0)
        for k in ("size_ratio_vs_ref", "speedup_p50_vs_ref"):
            opt_number(getattr(self, k), k, lo=0)
        for w in self.warnings:
            text(w, "a warning")
        if self.in_loop is not None:
            try:
                check_in_loop(self.in_loop)
            except ValueError as e:
                raise ValueError(f"in_loop: {e}") from None

    @classmethod
    def from_dict(cls, v: object, name: str) -> ModelResult:
        """``name``: the report's name and the model's place (``#0``), replaced by its name once read."""
        d = obj(v, name)
        label = d.get("name")
        if not isinstance(label, str) or not label.strip():
            raise ValueError(f"{name}: the report has a model without a name ({str(label)[:40]!r})")
        where = f"{name.rsplit(' #', 1)[0]} {label[:NAME_MAX]}"
        return build(cls, d, where, {
            "toolchain": lambda x, n: {str(k): text(t, n) for k, t in obj(x or {}, n).items()},
            "latency": optional(lambda x, n: build(Latency, x, n)),
            "reward": lambda x, n: build(Reward, x, n),
            "drift": optional(lambda x, n: build(Drift, x, n)),
            "agreement": optional(lambda x, n: build(Agreement, x, n)),
            "warnings": lambda x, n: tuple(text(w, n) for w in items([] if x is None else x, n)),
            "env_on_host": optional(LinkTiming.from_dict),
            "in_loop": optional(in_loop_from_dict),
            "sustained": optional(sustained_from_dict),
        })  # fmt: skip


@dataclass(frozen=True)
class BundleInfo:
    """The bundle benched: where it was, its manifest's sha256, the policy it holds."""

    path: str
    manifest_sha256: str
    policy: str
    env: str
    algo: str

    def __post_init__(self) -> None:
        for k in ("path", "manifest_sha256", "policy", "env", "algo"):
            text(getattr(self, k), k)


@dataclass(frozen=True)
class Device:
    """Where the bench ran: its profile name, transport, whether it is emulated (qemu's latency, not the
    board's), and the facts the device reported about itself (runtimes.facts: data from the device, shown
    by facts_text, never trusted as anything else)."""

    name: str
    emulated: bool = False
    transport: str | None = None
    facts: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        text(self.name, "name", NAME_MAX)
        flag(self.emulated, "emulated")
        opt_text(self.transport, "transport", NAME_MAX)

    @property
    def remote(self) -> bool:
        return (self.transport or "local") != "local"

    def to_dict(self) -> dict[str, object]:
        head: dict[str, object] = {"name": self.name}
        if self.transport is not None:
            head["transport"] = self.transport
        return {**head, "emulated": self.emulated, **self.facts}

    @classmethod
    def from_dict(cls, v: object, name: str) -> Device:
        d = obj(v, name)
        facts = {k: x for k, x in d.items() if k not in ("name", "emulated", "transport")}
        return cls(name=d.get("name"), emulated=d.get("emulated", False), transport=d.get("transport"),  # type: ignore[arg-type]
                   facts=facts)  # fmt: skip


@dataclass(frozen=True)
class Harness:
    """The harness's own overhead: the transport, connect, cache check, upload, device info, and each
    model's runner start-up (seconds)."""

    transport: str = "local"
    connect_s: float | None = field(default=None, metadata=OMIT_NONE)
    cache_check_s: float | None = field(default=None, metadata=OMIT_NONE)
    upload_s: float | None = field(default=None, metadata=OMIT_NONE)
    uploaded_files: tuple[str, ...] | None = field(default=None, metadata=OMIT_NONE)
    uploaded_bytes: int | None = field(default=None, metadata=OMIT_NONE)
    info_s: float | None = field(default=None, metadata=OMIT_NONE)
    runner_startup_s: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        text(self.transport, "transport", NAME_MAX)
        for k in ("connect_s", "cache_check_s", "upload_s", "info_s"):
            opt_number(getattr(self, k), k, lo=0)
        if self.uploaded_bytes is not None:
            integer(self.uploaded_bytes, "uploaded_bytes")
        for f in self.uploaded_files or ():
            text(f, "uploaded_files")
        for k, s in self.runner_startup_s.items():
            number(s, f"runner_startup_s {k}", lo=0)

    @classmethod
    def from_dict(cls, v: object, name: str) -> Harness:
        return build(cls, v, name, {"runner_startup_s": lambda x, n: dict(obj(x or {}, n))})


@dataclass(frozen=True)
class Settings:
    """What every model of the bench shared."""

    episodes: int
    seeds: tuple[int, ...]
    threads: int
    latency_samples: int
    warmup: int
    hz: float | None = None
    duration_s: float | None = None

    def __post_init__(self) -> None:
        integer(self.episodes, "episodes")
        for i, s in enumerate(self.seeds):
            integer(s, f"seeds[{i}]")
        if len(self.seeds) != self.episodes:
            raise ValueError(f"{len(self.seeds)} seeds for {self.episodes} episodes")
        integer(self.threads, "threads", lo=1)
        integer(self.latency_samples, "latency_samples")
        integer(self.warmup, "warmup")
        opt_number(self.hz, "hz", lo=0)
        opt_number(self.duration_s, "duration_s", lo=0)


@dataclass(frozen=True)
class Resumed:
    episodes_kept: int

    def __post_init__(self) -> None:
        integer(self.episodes_kept, "episodes_kept")


@dataclass(frozen=True)
class BenchReport:
    """A bench of one bundle on one device: every model on the same seeds, against the fp32 reference."""

    created: str
    tool_version: str
    bundle: BundleInfo
    device: Device
    settings: Settings
    reference: str
    """the fp32 model every drift, agreement and speed-up is measured against"""
    models: tuple[ModelResult, ...]
    harness: Harness | None = None
    resumed: Resumed | None = None
    tune: Mapping[str, object] | None = field(default=None, metadata=OMIT_NONE)
    """tune.json only: tune's own evidence, carried as read (quarl_edge.tune checks it)"""
    reward_not_measured: str | None = field(default=None, metadata=OMIT_NONE)
    """why no episodes ran (the policy's environment cannot run here): reward is not measured, never
    estimated; gate judges the action error instead"""
    source_parity: SourceParity | None = field(default=None, metadata=OMIT_NONE)
    """the bundle manifest's fp32-vs-source parity, carried (quarl_edge/parity.py)"""

    def __post_init__(self) -> None:
        text(self.created, "created")
        text(self.tool_version, "tool_version")
        if not self.models:
            raise ValueError("the report has no models")
        twice = first_twice(m.name for m in self.models)
        if twice is not None:
            raise ValueError(f"the report names the model {twice!r} twice: one of them would go unchecked")
        ref = next((m for m in self.models if m.name == self.reference), None)
        if ref is None:
            raise ValueError(
                f"the report's reference {str(self.reference)[:NAME_MAX]!r} is not one of its models"
            )
        if ref.precision != "fp32":
            raise ValueError(f"the report's reference {ref.name!r} is {ref.precision!r}, not fp32: drops "
                             "measured against it say nothing about the fp32 policy")  # fmt: skip

    def model(self, name: str) -> ModelResult:
        m = next((m for m in self.models if m.name == name), None)
        if m is None:
            raise KeyError(name)
        return m

    @property
    def ref(self) -> ModelResult:
        return self.model(self.reference)

    @property
    def has_in_loop(self) -> bool:
        return self.settings.hz is not None

    def to_dict(self) -> JSONObject:
        """The report JSON (the format tune.json and `gate` read; NaN and inf as null)."""
        return {"format": REPORT_FORMAT, "schema_version": REPORT_VERSION, **fields_json(self)}

    @classmethod
    def from_dict(cls, v: object, name: str = "the report") -> BenchReport:
        """Read back (the format tag and version are the file reader's: runtimes.artifact.read_artifact).
        The models are read first: a defect there is the most telling one."""
        d = obj(v, name)
        for key in ("reference", "models", "bundle", "device", "settings"):
            if key not in d:
                raise ValueError(f"{name} lacks the field {key!r}")
        models = items(d["models"], f"{name} models")
        if not models:
            raise ValueError(f"{name} has no models")
        parsed = tuple(ModelResult.from_dict(m, f"{name}: model #{i}") for i, m in enumerate(models))
        return build(cls, {**d, "models": parsed}, name, {
            "bundle": lambda x, n: build(BundleInfo, x, n),
            "device": Device.from_dict,
            "settings": lambda x, n: build(Settings, x, n),
            "reference": lambda x, n: text(x, n, NAME_MAX),
            "harness": optional(Harness.from_dict),
            "resumed": optional(lambda x, n: build(Resumed, x, n)),
            "tune": optional(lambda x, n: dict(obj(x, n))),
            "reward_not_measured": optional(lambda x, n: text(x, n, 400)),
            "source_parity": optional(lambda x, n: SourceParity.from_dict(x, n, FIX)),
            "created": lambda x, n: x if isinstance(x, str) and x else "unknown",
            "tool_version": lambda x, n: x if isinstance(x, str) and x else "unknown",
        })  # fmt: skip
