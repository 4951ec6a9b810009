"""The one report every bench makes and gate reads: a bench report per device of a fleet (one device is a
fleet of one), the devices that did not finish, and the comparison across them.

A fleet of one that finished is written as that device's own bench report (bench/result.py, format
``quarl-edge/report``), as a single-device bench always was; a fleet of two or more as
``quarl-edge/fleet-report`` (each device's report a section). ``FleetReport.from_dict`` reads both.

The comparison has one row per model and device: latency p50/p99 there, reward, the drift and speed-up
against that device's own fp32 run, and per model the fastest device. An emulated device's latency is
qemu's, not a board's: its rows say so, and it is the fastest only when no real device ran the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from quarl_edge.bench.result import NAME_MAX, REPORT_FORMAT, BenchReport, BundleInfo
from quarl_edge.runtimes.schema import JSONObject
from quarl_edge.typed import (
    build,
    fields_json,
    first_twice,
    flag,
    integer,
    items,
    obj,
    opt_number,
    opt_text,
    text,
    to_json,
)

FLEET_FORMAT = "quarl-edge/fleet-report"
FLEET_VERSION = 1
FLEET_FIX = "re-run `quarl-edge bench --device ...`"


@dataclass(frozen=True)
class Failure:
    """A device whose bench did not finish: why, and the partial file keeping its finished work."""

    error: str
    fix: str | None = None
    partial: str | None = None

    def __post_init__(self) -> None:
        text(self.error, "error")
        opt_text(self.fix, "fix")
        opt_text(self.partial, "partial")


@dataclass(frozen=True)
class FleetSettings:
    """What every device of the fleet shared, and each device's thread count."""

    episodes: int
    seeds: tuple[int, ...]
    models: tuple[str, ...]
    threads: Mapping[str, int]
    """per device"""
    latency_samples: int
    warmup: int
    max_steps: int | None = None
    hz: float | None = None
    duration_s: float | None = None
    env_on_host: bool = False
    trace: str | None = None

    def __post_init__(self) -> None:
        integer(self.episodes, "episodes")
        for i, s in enumerate(self.seeds):
            integer(s, f"seeds[{i}]")
        if len(self.seeds) != self.episodes:
            raise ValueError(f"{len(self.seeds)} seeds for {self.episodes} episodes")
        for m in self.models:
            text(m, "models", NAME_MAX)
        for dev, t in self.threads.items():
            integer(t, f"threads {dev}", lo=1)
        integer(self.latency_samples, "latency_samples")
        integer(self.warmup, "warmup")
        if self.max_steps is not None:
            integer(self.max_steps, "max_steps", lo=1)
        opt_number(self.hz, "hz", lo=0)
        opt_number(self.duration_s, "duration_s", lo=0)
        flag(self.env_on_host, "env_on_host")
        opt_text(self.trace, "trace")

    @classmethod
    def of_one(cls, report: BenchReport) -> FleetSettings:
        s = report.settings
        return cls(episodes=s.episodes, seeds=s.seeds, models=tuple(m.name for m in report.models),
                   threads={report.device.name: s.threads}, latency_samples=s.latency_samples, warmup=s.warmup,
                   hz=s.hz, duration_s=s.duration_s)  # fmt: skip


@dataclass(frozen=True)
class ComparisonRow:
    """One model on one device, against that device's own fp32 reference."""

    model: str
    device: str
    emulated: bool
    threads: int | None
    runtime: str | None
    p50_us: float | None
    p99_us: float | None
    speedup_vs_fp32: float | None
    """the device's fp32 p50 / this model's p50 there"""
    reward_mean: float | None
    reward_drop_pct: float | None
    """mean paired reward drop vs the device's fp32, in % of its mean return (None: the reference)"""
    drift_abs: float | None
    agreement: float | None
    fastest: bool
    """the lowest p50 for this model across the fleet (emulated devices only when no real one ran it;
    never when only one device has the model)"""


@dataclass(frozen=True)
class FleetReport:
    """Every device's bench of one bundle on the same seeds; ``reports`` and ``failed`` together hold every
    device of ``devices`` exactly once, in that order."""

    devices: tuple[str, ...]
    reports: Mapping[str, BenchReport]
    """the finished devices' own reports"""
    failed: Mapping[str, Failure]
    bundle: BundleInfo
    settings: FleetSettings
    reference: str
    created: str
    tool_version: str

    def __post_init__(self) -> None:
        if not self.devices:
            raise ValueError("the report has no devices")
        twice = first_twice(self.devices)
        if twice is not None:
            raise ValueError(f"the report lists the device {twice!r} twice: one of them would go unchecked")
        for dev in self.devices:
            text(dev, "a device name", NAME_MAX)
            if (dev in self.reports) == (dev in self.failed):
                raise ValueError(f"device {dev!r} is neither finished nor failed (or both)")
        extra = sorted((set(self.reports) | set(self.failed)) - set(self.devices))
        if extra:
            raise ValueError(f"it has a section for {extra[0]!r}, which is not one of its devices")
        if set(self.settings.threads) != set(self.devices):
            raise ValueError(f"its settings name the devices {sorted(self.settings.threads)}, its sections "
                             f"{list(self.devices)}")  # fmt: skip
        for dev, r in self.reports.items():
            if r.device.name != dev or r.reference != self.reference:
                raise ValueError(f"device {dev!r}'s section is a report of {r.device.name!r} against "
                                 f"{r.reference!r}, not of {dev!r} against {self.reference!r}")  # fmt: skip
            if r.bundle.manifest_sha256 != self.bundle.manifest_sha256:
                raise ValueError(f"device {dev!r}'s section benched another bundle than the report names")

    @property
    def complete(self) -> bool:
        return not self.failed

    @property
    def single(self) -> BenchReport | None:
        """The one device's report, when this is a finished fleet of one (its JSON is that report's)."""
        return self.reports[self.devices[0]] if len(self.devices) == 1 and self.complete else None

    @property
    def sections(self) -> list[tuple[str, BenchReport]]:
        """The finished devices' reports, in the fleet's order."""
        return [(d, self.reports[d]) for d in self.devices if d in self.reports]

    @property
    def emulated(self) -> bool:
        return any(r.device.emulated for r in self.reports.values())

    @classmethod
    def of_one(cls, report: BenchReport) -> FleetReport:
        dev = report.device.name
        return cls(devices=(dev,), reports={dev: report}, failed={}, bundle=report.bundle,
                   settings=FleetSettings.of_one(report), reference=report.reference, created=report.created,
                   tool_version=report.tool_version)  # fmt: skip

    def comparison(self) -> list[ComparisonRow]:
        """The rows, by model (in the order the devices first name them) then device (the fleet's order)."""
        order = list(dict.fromkeys(m.name for _, r in self.sections for m in r.models))
        rows: list[ComparisonRow] = []
        for name in order:
            group = []
            for dev, r in self.sections:
                m = next((x for x in r.models if x.name == name), None)
                if m is None:
                    continue
                group.append(ComparisonRow(
                    model=name, device=dev, emulated=r.device.emulated, threads=m.threads, runtime=m.runtime,
                    p50_us=m.latency.p50_us if m.latency else None, p99_us=m.latency.p99_us if m.latency else None,
                    speedup_vs_fp32=m.speedup_p50_vs_ref, reward_mean=m.reward.mean,
                    reward_drop_pct=m.drift.reward_drop_pct if m.drift else None,
                    drift_abs=m.drift.abs if m.drift else None,
                    agreement=m.agreement.value if m.agreement else None, fastest=False,
                ))  # fmt: skip
            timed = [r for r in group if r.p50_us is not None]
            real = [r for r in timed if not r.emulated]
            # one device alone (the others failed) is no comparison: nothing is marked
            best = min(real or timed, key=lambda r: r.p50_us or 0.0) if len(timed) > 1 else None
            rows += [replace(r, fastest=r is best) for r in group]
        return rows

    def fastest(self) -> dict[str, str]:
        """Per model, the device with the lowest p50 (see ComparisonRow.fastest)."""
        return {r.model: r.device for r in self.comparison() if r.fastest}

    def to_dict(self) -> JSONObject:
        """The report JSON: a finished fleet of one as that device's own report, a fleet as sections."""
        one = self.single
        if one is not None:
            return one.to_dict()
        rows = self.comparison()
        return {"format": FLEET_FORMAT, "schema_version": FLEET_VERSION, "created": self.created,
                "tool_version": self.tool_version, "bundle": to_json(self.bundle), "settings": to_json(self.settings),
                "reference": self.reference, "devices": list(self.devices), "complete": self.complete,
                "reports": {d: r.to_dict() for d, r in self.sections},
                "failed": {d: to_json(self.failed[d]) for d in self.devices if d in self.failed},
                "comparison": {"rows": [fields_json(r) for r in rows], "fastest": self.fastest()}}  # fmt: skip

    @classmethod
    def from_dict(cls, v: object, name: str) -> FleetReport:
        """Either shape (the format tag says which: the file reader checked it and its version). The
        stored comparison is derived data: it is made again from the sections, never trusted."""
        d = obj(v, name)
        if d.get("format") == REPORT_FORMAT:
            return cls.of_one(BenchReport.from_dict(d, name))
        devices = tuple(
            text(x, f"{name} devices", NAME_MAX) for x in items(d.get("devices"), f"{name} devices")
        )
        reports = {str(k): BenchReport.from_dict(r, f"{name} device {k!r}")
                   for k, r in obj(d.get("reports"), f"{name} reports").items()}  # fmt: skip
        failed = {
            str(k): build(Failure, f, f"{name} failed {k!r}") for k, f in obj(d.get("failed"), name).items()
        }
        fleet = build(cls, {**d, "devices": devices, "reports": reports, "failed": failed}, name, {
            "bundle": lambda x, n: build(BundleInfo, x, n),
            "settings": lambda x, n: build(FleetSettings, x, n, {
                "threads": lambda t, tn: dict(obj(t, tn)),
                "models": lambda ms, mn: tuple(items(ms, mn))}),
            "reference": lambda x, n: text(x, n, NAME_MAX),
            "created": lambda x, n: x if isinstance(x, str) and x else "unknown",
            "tool_version": lambda x, n: x if isinstance(x, str) and x else "unknown",
        })  # fmt: skip
        if flag(d.get("complete"), f"{name} complete") != fleet.complete:
            why = f"{', '.join(fleet.failed)} did not finish" if fleet.failed else "no device failed"
            raise ValueError(f"{name} says complete: {str(d.get('complete')).lower()}, but {why}")
        return fleet
