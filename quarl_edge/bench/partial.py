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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quarl_edge.runtimes import schema
from quarl_edge.runtimes.artifact import read_artifact
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.fsutil import atomic_write_json

PARTIAL_FORMAT = "quarl-edge/bench-partial"
PARTIAL_VERSION = 1


def partial_path(report: str | os.PathLike[str]) -> Path:
    """``reports/x.json`` -> ``reports/x.partial.json``."""
    report = Path(report)
    return report.with_name(f"{report.stem}.partial.json")


class BenchInterrupted(QuarlError):
    """The bench stopped part-way; what finished is kept in the partial file."""


@dataclass
class ModelProgress:
    measured: dict[str, Any] | None = None
    """the runner's measured event (a ModelRun without episodes), kept from the first run"""
    episodes: list[dict[str, Any]] = field(default_factory=list)
    run: dict[str, Any] | None = None
    """the complete, merged run once the model is done"""

    def to_dict(self) -> dict[str, Any]:
        return {"measured": self.measured, "episodes": self.episodes, "run": self.run}

    @classmethod
    def from_dict(cls, d: Any, where: str = "partial bench file") -> ModelProgress:
        """Validated: a tampered file is refused here (one line), not half-used later."""
        fix = "delete it and run the bench without --resume"
        d = schema.obj(d, f"{where} model", fix)
        episodes = d.get("episodes") or []
        if not isinstance(episodes, list) or len(episodes) > 1_000_000:
            raise InputError(f"{where}: a model's episodes are not a list", fix)
        for e in episodes:
            e = schema.obj(e, f"{where} episode", fix)
            schema.integer(e.get("seed"), f"{where} episode seed", fix, 0)
            if e.get("ret") is not None:
                schema.number(e["ret"], f"{where} episode return", fix, finite=False)
            _check_act_ns(e.get("act_ns"), f"{where} episode act_ns", fix)
        measured, run = (_check_run(d.get(k), f"{where} {k}", fix) for k in ("measured", "run"))
        return cls(measured=measured, episodes=list(episodes), run=run)


# the fields of a runner's measured event / merged run that the report is built from
_RUN_TEXT = ("format", "precision", "runtime")
_RUN_NUMBERS = ("threads", "size_bytes", "load_ms", "first_inference_ms", "peak_rss_mb")


def _check_run(v: Any, where: str, fix: str) -> dict[str, Any] | None:
    if v is None:
        return None
    run = schema.obj(v, where, fix)
    for k in _RUN_TEXT:
        schema.text(run.get(k), f"{where} {k}", fix, 256)
    for k in _RUN_NUMBERS:
        schema.number(run.get(k), f"{where} {k}", fix)
    for k in ("latency", "in_loop", "sustained"):
        if run.get(k) is not None:
            schema.obj(run[k], f"{where} {k}", fix)
    for k in ("episodes", "replay_actions"):
        if run.get(k) is not None and not isinstance(run[k], list):
            raise InputError(f"{where} {k} is not a list", fix)
    for e in run.get("episodes") or []:
        _check_act_ns(schema.obj(e, f"{where} episode", fix).get("act_ns"), f"{where} episode act_ns", fix)
    return run


def _check_act_ns(v: Any, where: str, fix: str) -> None:
    """An episode's act() times (bench --hz): null, or a list of nanosecond counts."""
    if v is None:
        return
    if not isinstance(v, list) or len(v) > 10_000_000:
        raise InputError(f"{where} is not a list", fix)
    if not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**62 for t in v):
        raise InputError(f"{where} holds something other than nanosecond counts", fix)


@dataclass
class PartialBench:
    """Progress of one bench: what each model has finished, saved to ``path`` (None: kept in memory)."""

    path: Path | None
    key: dict[str, Any]
    """what must match for a resume: bundle, device and settings"""
    seeds: list[int]
    models: dict[str, ModelProgress]
    resumed_episodes: int = 0
    error: str | None = None

    @classmethod
    def start(
        cls, path: Path | None, key: dict[str, Any], names: Sequence[str], seeds: Sequence[int]
    ) -> PartialBench:
        state = cls(path, key, list(seeds), {n: ModelProgress() for n in names})
        return state

    @classmethod
    def resume(
        cls, path: Path, key: dict[str, Any], names: Sequence[str], seeds: Sequence[int]
    ) -> PartialBench:
        if not path.is_file():
            raise InputError(
                f"nothing to resume: {str(path)!r} does not exist", "run the bench without --resume"
            )
        data = read_artifact(path, PARTIAL_FORMAT, PARTIAL_VERSION, "partial bench file",
                             "delete it and run the bench without --resume")  # fmt: skip
        old = schema.obj(data.get("key") or {}, "partial bench file key", "run the bench without --resume")
        diff = sorted(k for k in set(old) | set(key) if old.get(k) != key.get(k))
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
        done = {e["seed"] for e in self.models[name].episodes}
        return [s for s in self.seeds if s not in done]

    def on_event(self, name: str, ev: dict[str, Any]) -> None:
        m = self.models[name]
        kind = ev.get("event")
        if kind == "measured" and m.measured is None:  # a resumed run re-sends one without latency
            m.measured = ev["run"]
        elif kind == "episode" and ev.get("seed") in self.seeds:
            m.episodes = [e for e in m.episodes if e["seed"] != ev["seed"]]
            m.episodes.append({k: v for k, v in ev.items() if k not in ("event", "model")})
        else:
            return
        self.save()

    def finish(self, name: str, result: dict[str, Any] | None) -> dict[str, Any]:
        """Merge what was kept with the runner's ``result`` (None: nothing was left to run)."""
        m = self.models[name]
        base = m.measured or result
        if base is None:
            raise QuarlError(f"no measurements for {name!r} to finish", "run the bench without --resume")
        by_seed = {e["seed"]: e for e in m.episodes}
        for e in (result or {}).get("episodes", []):
            by_seed[e["seed"]] = e
        run = dict(base)
        run["episodes"] = [by_seed[s] for s in self.seeds if s in by_seed]
        runs = [r for r in (m.measured, result) if r]
        run["peak_rss_mb"] = max(float(r.get("peak_rss_mb") or 0.0) for r in runs)
        run["torch_imported"] = any(bool(r.get("torch_imported")) for r in runs)
        m.run, m.episodes = run, run["episodes"]
        self.save()
        return run

    # -- reporting ----------------------------------------------------------------------------------

    def missing(self) -> dict[str, Any]:
        """Per unfinished model: what is still to be measured."""
        out: dict[str, Any] = {}
        for name, m in self.models.items():
            if m.run is not None:
                continue
            if m.measured is None:
                out[name] = {"status": "not measured", "seeds": self.seeds_left(name), "latency": True}
            else:
                out[name] = {"status": "partly measured", "seeds": self.seeds_left(name), "latency": False}
        return out

    def summary(self) -> str:
        parts = []
        for name, miss in self.missing().items():
            left = len(miss["seeds"])
            if miss["status"] == "not measured":
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
                "key": self.key,
                "missing": self.missing(),
                "error": self.error,
                "models": {n: m.to_dict() for n, m in self.models.items()},
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
