"""`quarl-edge tune`: the fastest deployable variant of a policy that keeps its reward, chosen on the device.

Stages, cheapest first, each measurement cached in ``DIR/.cache/state.json`` so an interrupted tune
resumes and a second tune with the same inputs is nearly free:

1. per-layer fallback (host, tune/layers.py): from every layer int8, the most sensitive layers go back
   to float, greedily, until the agreement proxy passes; when none does, every greedy step is judged
   by reward in stage 5;
2. the candidates bundle (tune/candidates.py): fp32, fp16, int8 x calibration method x {default split,
   the search's splits} x runtime options (ONNX U8S8 activations, the other weight granularity);
3. screen (host): each candidate's agreement with fp32 on the recorded states;
4. (tune/judge.py) latency on the device, one model at a time, at every thread count up to the device's cores;
5. closed loop on the device, fastest first: paired-seed reward against fp32; a close call is
   re-checked on fresh seeds; the first that passes the gate is the choice (fp32 passes by definition,
   so the choice is never slower than the fastest fp32 measured).

A time budget stops the search with the best so far.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quarl_edge.bench.device import transport_for
from quarl_edge.bundle import BundleRequest, Variant, export_bundle
from quarl_edge.devices.check import check_device
from quarl_edge.devices.preflight import check_env
from quarl_edge.devices.profiles import load_profile
from quarl_edge.policy.load import load_policy
from quarl_edge.policy.net import Policy
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.fsutil import atomic_write_json, sha256_file
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.trace import load_trace, save_trace
from quarl_edge.tune.candidates import KINDS, Candidate, grid
from quarl_edge.tune.judge import closed_loop, latency
from quarl_edge.tune.layers import default_float_layers, fan_out, layer_search, model_agreement
from quarl_edge.tune.report import write_outputs

Log = Callable[[str], None]
Stage = Callable[[str], None]
STAGES = 7  # the stage() calls of run_tune, for a progress bar
STATE_VERSION = 2  # the candidates grew runtime options and greedy steps: older caches are not reused
TFLITE_RUNTIMES = ("ai_edge_litert", "tflite_runtime", "tensorflow")
MIN_BUDGET_S = 20.0  # below this not even the fp32 latency and one closed-loop batch fit


@dataclass(frozen=True)
class TuneConfig:
    policy: Path
    out: Path
    device: str = "local"
    overrides: dict[str, Any] = field(default_factory=dict)
    """device profile overrides (host, user, port, identity)"""
    max_reward_drop_pct: float = 2.0
    min_agreement: float | None = None
    """also the per-layer search's proxy when set; else 0.95 (discrete) / 0.98 (continuous)"""
    max_p99_ms: float | None = None
    budget_min: float = 15.0
    calibration: Path | None = None
    episodes: int = 20
    """paired closed-loop episodes per candidate"""
    confirm_episodes: int = 40
    """fresh paired episodes that re-check a close call"""
    seed: int = 1000
    latency_samples: int = 500
    max_threads: int | None = None
    env: str | None = None
    algo: str | None = None
    vecnormalize: Path | None = None
    kinds: tuple[str, ...] | None = None
    """candidate families to search (KINDS); None: all. The fp32 reference is always measured"""
    address: str | None = None
    """Ray cluster for the host-side probes; None: local Ray (when installed), else in process"""

    def __post_init__(self) -> None:
        if not self.budget_min * 60 >= MIN_BUDGET_S:
            raise InputError(f"--budget-min {self.budget_min:g} is too small to measure anything",
                             f"give at least {MIN_BUDGET_S / 60:.1f} minutes, e.g. --budget-min 10")  # fmt: skip
        if not 0 <= self.max_reward_drop_pct < float("inf"):
            raise InputError(
                "--max-reward-drop must be a finite percentage >= 0", "e.g. --max-reward-drop 2%"
            )
        if self.episodes < 2 or self.confirm_episodes < 0:
            raise InputError(
                "--episodes must be at least 2 (a paired interval needs two)", "e.g. --episodes 20"
            )
        unknown = [k for k in self.kinds or () if k not in KINDS]
        if unknown:
            raise InputError(f"unknown candidate kind {unknown[0]!r}", f"--kinds takes: {', '.join(KINDS)}")
        if self.min_agreement is not None and not 0 <= self.min_agreement <= 1:
            raise InputError("--min-agreement must be between 0 and 1", "e.g. --min-agreement 0.95")


class State:
    """Every measurement of one tune, keyed by what it depends on; saved after each one."""

    def __init__(self, path: Path, key: str) -> None:
        self.path, self.key = path, key
        data: dict[str, Any] = {}
        try:
            loaded = json.loads(path.read_text())
            if isinstance(loaded, dict) and loaded.get("key") == key:
                data = loaded
        except (OSError, ValueError):
            pass
        self.data: dict[str, dict[str, Any]] = {k: dict(data.get(k) or {}) for k in ("layers", "screen", "latency",
                                                                                  "closed", "confirm")}  # fmt: skip
        self.reused = sum(len(v) for v in self.data.values())

    def get(self, stage: str, name: str) -> Any:
        return self.data[stage].get(name)

    def put(self, stage: str, name: str, value: Any) -> Any:
        self.data[stage][name] = value
        atomic_write_json(self.path, {"format": "quarl-edge/tune-state", "key": self.key, **self.data})
        return value


def _key(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def device_formats(facts: dict[str, Any], device: str) -> tuple[str, ...]:
    runtimes = facts.get("runtimes") or {}
    formats = tuple(f for f, mods in (("onnx", ("onnxruntime",)), ("tflite", TFLITE_RUNTIMES))
                    if any(runtimes.get(m) for m in mods))  # fmt: skip
    if not formats:
        raise InputError(f"device {device!r} has no runtime for any format (onnxruntime or LiteRT)",
                         f"install one there with `quarl-edge devices setup {device}`")  # fmt: skip
    return formats


def _host_can_export_tflite() -> bool:
    import importlib.util

    return importlib.util.find_spec("litert_torch") is not None


@dataclass
class Search:
    cfg: TuneConfig
    log: Log
    policy: Policy
    trace_path: Path
    state: State
    work: Path
    deadline: float
    reference: str = "onnx-fp32"
    ref_actions: Any = None
    notes: list[str] = field(default_factory=list)
    trace: Any = None
    manifests: dict[Path, Any] = field(default_factory=dict)

    def over_budget(self) -> bool:
        return time.monotonic() > self.deadline

    def agreement(self, bundle: Path, model: str) -> float:
        # the trace and each bundle's manifest (its hash check covers every model) are read once
        if self.trace is None:
            self.trace = load_trace(self.trace_path)
        if bundle not in self.manifests:
            self.manifests[bundle] = load_manifest(bundle)
        return model_agreement(bundle, model, self.manifests[bundle], self.trace, self.ref_actions)

    def proxy(self) -> float:
        if self.cfg.min_agreement is not None:
            return self.cfg.min_agreement
        return 0.95 if self.policy.spec.action_space.is_discrete else 0.98

    def probe(self, cands: Sequence[Candidate]) -> dict[str, float]:
        """Agreement of each candidate exported alone (cached; the uncached fan out)."""
        todo = [c for c in cands if self.state.get("layers", c.name) is None]
        if todo:
            run = fan_out(self.policy, self.trace_path, self.ref_actions, self.cfg.address)
            for c, value in zip(todo, run([c.variant() for c in todo]), strict=True):
                self.state.put("layers", c.name, value)
        return {c.name: float(self.state.get("layers", c.name)) for c in cands}

    def export(self, name: str, variants: tuple[Variant, ...], targets: tuple[str, ...] = ()) -> Path:
        out = self.work / f"{name}-{_key([v.name for v in variants], targets)}"
        if not (out / "manifest.json").is_file():
            export_bundle(self.policy, BundleRequest(out=out, targets=targets, variants=variants,
                                                     calibration=self.trace_path))  # fmt: skip
        return out


def _candidates(s: Search, formats: tuple[str, ...]) -> tuple[list[Candidate], list[dict[str, Any]]]:
    """The grid plus each format's per-layer search; a search split equal to the default split is the
    default candidate already."""
    kinds = s.cfg.kinds or KINDS
    everything = grid(formats, s.policy.arch.model == "nature_cnn")
    cands = [everything[0]] + [c for c in everything[1:] if c.kind in kinds]  # the reference stays
    default = default_float_layers(s.policy)
    evidence = []
    for fmt in formats if "int8-layers" in kinds else ():
        found, ev = layer_search(s.policy, fmt, s.proxy(), s.probe, s.over_budget, s.log)
        evidence.append(ev)
        for c in found:
            if c.float_layers == default and "int8-default" in kinds:
                s.notes.append(
                    f"{fmt}: the search's split {list(default)} is the default split (judged as such)"
                )
            else:
                cands.append(c)
    return cands, evidence


def run_tune(cfg: TuneConfig, log: Log = lambda _m: None, stage: Stage = lambda _m: None) -> dict[str, Any]:
    """The whole search; returns the result (tune.json's content, see tune/report.py for the files).
    ``stage`` hears each stage's start (the CLI's progress bar)."""
    t0 = time.monotonic()
    profile = load_profile(cfg.device, cfg.overrides)
    policy = load_policy(cfg.policy, cfg.env, cfg.algo, cfg.vecnormalize, calibration=cfg.calibration)
    stage("check the device")
    facts = check_device(profile).facts
    if profile.transport != "local":  # the closed loop runs there: its env packages, before any work
        check_env(policy.spec.env, facts, profile.name)
    formats = device_formats(facts, profile.name)
    if "tflite" in formats and not _host_can_export_tflite():
        formats = tuple(f for f in formats if f != "tflite")
    cores = int(facts.get("cores") or 1)
    threads = list(range(1, min(cores, cfg.max_threads or cores) + 1))
    work = cfg.out / ".cache"
    work.mkdir(parents=True, exist_ok=True)
    trace_path = _calibration(cfg, policy, work, log)
    key = _key(sha256_file(trace_path), policy.spec.to_dict(), profile.name, cfg.seed, cfg.episodes,
               cfg.latency_samples, cfg.min_agreement, threads, formats, STATE_VERSION)  # fmt: skip
    state = State(work / "state.json", key)
    if state.reused:
        log(f"resuming: {state.reused} measurements of an earlier run with the same inputs are reused")
    s = Search(
        cfg, log, policy, trace_path, state, work, t0 + cfg.budget_min * 60, reference=f"{formats[0]}-fp32"
    )
    ref_bundle = s.export("reference", (), (s.reference,))
    s.trace = load_trace(trace_path)
    s.ref_actions = PolicyRunner(ref_bundle, s.reference, threads=1).replay(s.trace).actions
    stage("per-layer search (host)")
    cands, layer_evidence = _candidates(s, formats)
    stage("export the candidates")
    bundle = s.export("candidates", tuple(c.variant() for c in cands[1:]), (s.reference,))
    rows = {c.name: {**c.to_dict()} for c in cands}
    rows[s.reference]["agreement"] = 1.0
    stage("agreement screen (host)")
    for c in cands[1:]:
        rows[c.name]["agreement"] = s.state.get("screen", c.name) or s.state.put("screen", c.name,
                                                                                 s.agreement(bundle, c.name))  # fmt: skip
    log(f"{len(cands)} candidates screened on the host; latency on {profile.name} at {threads} thread(s)")
    transport = transport_for(profile)
    device = {"name": profile.name, "transport": profile.transport, "emulated": profile.emulated}
    try:
        stage(f"latency on {profile.name}")
        latency(s, bundle, threads, rows, device, transport)
        stage(f"closed loop on {profile.name}")
        choice = closed_loop(s, bundle, rows, device, transport)
        result = _result(s, cfg, policy, profile, facts, cores, threads, rows, choice, bundle, trace_path, t0)
        result["layer_search"] = layer_evidence
        log(f"chosen: {choice['name'] if choice else 'none'}; benching it against fp32 for tune.json")
        stage("bench the choice, write the outputs")
        result["files"] = [str(f) for f in write_outputs(result, cfg, policy, device, transport)]
    finally:
        close = getattr(transport, "close", None)
        if close is not None:
            close()
    return result


def _result(s: Search, cfg: TuneConfig, policy: Policy, profile: Any, facts: dict[str, Any], cores: int,
            threads: list[int], rows: dict[str, dict[str, Any]], choice: dict[str, Any] | None, bundle: Path,
            trace_path: Path, t0: float) -> dict[str, Any]:  # fmt: skip
    device = {"name": profile.name, "transport": profile.transport, "emulated": profile.emulated}
    return {"format": "quarl-edge/tune", "policy": policy.spec.name, "env": policy.spec.env.id,
            "calibration": str(trace_path), "device": {**device, "cores": cores, "cpu_model": facts.get("cpu_model"), "machine": facts.get("machine")},
            "reference": s.reference, "candidates": list(rows.values()), "choice": choice, "bundle": str(bundle),
            "settings": {"max_reward_drop_pct": cfg.max_reward_drop_pct, "min_agreement": cfg.min_agreement,
                         "max_p99_ms": cfg.max_p99_ms, "episodes": cfg.episodes, "seed": cfg.seed,
                         "confirm_episodes": cfg.confirm_episodes, "budget_min": cfg.budget_min, "threads": threads,
                         "proxy_agreement": s.proxy()},
            "notes": s.notes, "search_s": round(time.monotonic() - t0, 1), "reused_measurements": s.state.reused}  # fmt: skip


def _calibration(cfg: TuneConfig, policy: Policy, work: Path, log: Log) -> Path:
    if cfg.calibration is not None:
        return cfg.calibration
    path = work / "calibration.npz"
    if not path.is_file():
        from quarl_edge.record import RecordConfig, record

        log("no --calibration given: recording 10 episodes for calibration and the agreement screen")
        save_trace(record(policy, RecordConfig(episodes=10, epsilon=0.1, seed=0, max_samples=2000)), path)
    return path
