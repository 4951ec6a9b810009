"""Partial bench results: saved as they arrive, so a dropped link or a crash loses nothing finished.

``<report>.partial.json`` (beside ``--out``) holds, per model, the runner's ``measured`` event (load,
first inference, latency, trace replay: everything but the episodes) and each finished episode, and
says what is still missing. ``bench --resume`` reads it back and asks the runner only for the missing
seeds, without measuring latency or replaying the trace again. The file is rewritten atomically after
every event and removed once the full report exists.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from quarl_edge.bench.device_run import MAX_EPISODES, DeviceRun, Episode
from quarl_edge.bench.result import LinkTiming
from quarl_edge.bench.transport import Event
from quarl_edge.runtimes import schema
from quarl_edge.runtimes.artifact import read_artifact
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.fsutil import atomic_write_json
from quarl_edge.typed import items, load, obj, optional, to_json

PARTIAL_FORMAT = "quarl-edge/bench-partial"
PARTIAL_VERSION = 1
RESUME_FIX = "delete it and run the bench without --resume"
DEVICE_FIX = "run the bench again; if it repeats, the device's runner is not quarl-edge's"


def partial_path(report: str | os.PathLike[str]) -> Path:
    """``reports/x.json`` -> ``reports/x.partial.json``."""
    report = Path(report)
    return report.with_name(f"{report.stem}.partial.json")


@dataclass(frozen=True)
class PartialKey:
    """What a resumed bench must share with the interrupted one: the bundle, the device, the settings
    (compared as they are written, JSON)."""

    bundle_manifest_sha256: str
    device: str
    models: tuple[str, ...]
    seeds: tuple[int, ...]
    threads: int
    latency_samples: int
    warmup: int
    max_steps: int | None
    trace_sha256: str | None
    env_on_host: bool
    hz: float | None
    duration_s: float | None


class BenchInterrupted(QuarlError):
    """The bench stopped part-way; what finished is kept in the partial file."""


@dataclass
class ModelProgress:
    measured: DeviceRun | None = None
    """the runner's measured event (a run without episodes), kept from the first run"""
    episodes: list[Episode] = field(default_factory=list)
    run: DeviceRun | None = None
    """the complete, merged run once the model is done"""

    @classmethod
    def from_dict(cls, d: Any, where: str = "partial bench file") -> ModelProgress:
        """Validated: a tampered file is refused here (one line), not half-used later."""

        def read() -> ModelProgress:
            m = obj(d, f"{where} model")
            episodes = items(m.get("episodes") or [], f"{where} episodes", MAX_EPISODES)
            return cls(measured=optional(DeviceRun.from_dict)(m.get("measured"), f"{where} measured"),
                       episodes=[Episode.from_dict(e, f"{where} episode") for e in episodes],
                       run=optional(DeviceRun.from_dict)(m.get("run"), f"{where} run"))  # fmt: skip

        return load(read, where, RESUME_FIX)


@dataclass(frozen=True)
class Missing:
    """What an unfinished model still lacks."""

    status: str
    """not measured (latency too) or partly measured (episodes only)"""
    seeds: list[int]
    latency: bool


@dataclass
class PartialBench:
    """Progress of one bench: what each model has finished, saved to ``path`` (None: kept in memory)."""

    path: Path | None
    key: PartialKey
    """what must match for a resume: bundle, device and settings"""
    seeds: list[int]
    models: dict[str, ModelProgress]
    resumed_episodes: int = 0
    error: str | None = None

    @classmethod
    def start(
        cls, path: Path | None, key: PartialKey, names: Sequence[str], seeds: Sequence[int]
    ) -> PartialBench:
        state = cls(path, key, list(seeds), {n: ModelProgress() for n in names})
        return state

    @classmethod
    def resume(cls, path: Path, key: PartialKey, names: Sequence[str], seeds: Sequence[int]) -> PartialBench:
        if not path.is_file():
            raise InputError(
                f"nothing to resume: {str(path)!r} does not exist", "run the bench without --resume"
            )
        data = read_artifact(path, PARTIAL_FORMAT, PARTIAL_VERSION, "partial bench file",
                             "delete it and run the bench without --resume")  # fmt: skip
        old = schema.obj(data.get("key") or {}, "partial bench file key", "run the bench without --resume")
        now = to_json(key)
        diff = sorted(k for k in set(old) | set(now) if old.get(k) != now.get(k))
        if diff:
            raise InputError(
                f"{str(path)!r} was made with other {', '.join(diff)} than this bench",
                "resume with the same bundle, device and flags as the interrupted bench, or run without --resume",
            )
        try:  # it is rewritten as it resumes: a value JSON cannot hold (inf, nan) is refused now
            json.dumps(data, allow_nan=False)
        except ValueError:
            raise InputError(
                f"{str(path)!r} holds non-finite numbers", "delete it and run without --resume"
            ) from None
        stored = schema.obj(
            data.get("models") or {}, "partial bench file models", "run the bench without --resume"
        )
        state = cls(path, key, list(seeds), {n: ModelProgress.from_dict(stored.get(n) or {}) for n in names})
        state.resumed_episodes = sum(len(m.episodes) for m in state.models.values())
        return state

    # -- progress -----------------------------------------------------------------------------------

    def seeds_left(self, name: str) -> list[int]:
        done = {e.seed for e in self.models[name].episodes}
        return [s for s in self.seeds if s not in done]

    def on_event(self, name: str, ev: Event, where: str = "the runner") -> None:
        """Keep a runner's measured event or finished episode (checked: it comes from the device)."""
        m = self.models[name]
        kind = ev.get("event")
        if kind == "measured" and m.measured is None:  # a resumed run re-sends one without latency
            m.measured = load(
                lambda: DeviceRun.from_dict(ev.get("run"), f"{where}: {name}"), where, DEVICE_FIX
            )
        elif kind == "episode" and ev.get("seed") in self.seeds:
            episode = load(lambda: Episode.from_dict(ev, f"{where}: {name} episode"), where, DEVICE_FIX)
            m.episodes = [e for e in m.episodes if e.seed != episode.seed] + [episode]
        else:
            return
        self.save()

    def finish(self, name: str, result: DeviceRun | None, link: LinkTiming | None = None) -> DeviceRun:
        """Merge what was kept with the runner's ``result`` (None: nothing was left to run); ``link``: the
        link's timing of `bench --env-on-host`, kept beside the device's own measurements."""
        m = self.models[name]
        base = m.measured or result
        if base is None:
            raise QuarlError(f"no measurements for {name!r} to finish", "run the bench without --resume")
        by_seed = {e.seed: e for e in m.episodes}
        for e in result.episodes if result else ():
            by_seed[e.seed] = e
        runs = [r for r in (m.measured, result) if r]
        run = replace(base, episodes=tuple(by_seed[s] for s in self.seeds if s in by_seed),
                      peak_rss_mb=max(r.peak_rss_mb for r in runs), torch_imported=any(r.torch_imported for r in runs),
                      env_on_host=link or base.env_on_host,
                      # the runner's in-loop block carries the run's OS settings (its figures are made again
                      # from every episode): the latest run's, when it paced any
                      in_loop=result.in_loop if result is not None and result.in_loop is not None else base.in_loop)  # fmt: skip
        m.run, m.episodes = run, list(run.episodes)
        self.save()
        return run

    # -- reporting ----------------------------------------------------------------------------------

    def missing(self) -> dict[str, Missing]:
        """Per unfinished model: what is still to be measured."""
        out: dict[str, Missing] = {}
        for name, m in self.models.items():
            if m.run is not None:
                continue
            if m.measured is None:
                out[name] = Missing("not measured", self.seeds_left(name), latency=True)
            else:
                out[name] = Missing("partly measured", self.seeds_left(name), latency=False)
        return out

    def summary(self) -> str:
        parts = []
        for name, miss in self.missing().items():
            left = len(miss.seeds)
            if miss.status == "not measured":
                parts.append(f"{name} (everything)")
            else:
                parts.append(f"{name} ({left} of {len(self.seeds)} episodes)")
        return ", ".join(parts) or "nothing"

    def has_progress(self) -> bool:
        return any(m.measured is not None or m.episodes or m.run for m in self.models.values())

    def kept_episodes(self) -> int:
        return sum(len(m.episodes) for m in self.models.values())

    def save(self) -> None:
        if self.path is None:
            return
        atomic_write_json(
            self.path,
            {
                "format": PARTIAL_FORMAT,
                "schema_version": PARTIAL_VERSION,
                "updated": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                "key": to_json(self.key),
                "missing": to_json(self.missing()),
                "error": self.error,
                "models": {n: to_json(m) for n, m in self.models.items()},
            },
        )

    def interrupted(self, error: QuarlError) -> BenchInterrupted:
        """The one-line error for a bench that stopped: the cause, what is kept, and how to finish."""
        self.error = str(error)
        self.save()
        if self.path is None:
            return BenchInterrupted(
                f"{error.problem}; finished results are lost",
                "pass --out to keep them in a .partial.json that --resume completes",
            )
        return BenchInterrupted(
            f"{error.problem}; kept {self.kept_episodes()} finished episodes in {self.path}, "
            f"missing: {self.summary()}",
            "run the same bench command again with --resume to finish only the rest",
        )

    def discard(self) -> None:
        if self.path is not None and self.path.is_file():
            self.path.unlink()
