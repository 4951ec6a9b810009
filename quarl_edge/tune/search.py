"""`quarl-edge tune`: the fastest deployable variant of a policy that keeps its reward, chosen on the device.

Stages, cheapest first, each measurement cached in ``DIR/.cache/state.json`` so an interrupted tune
resumes and a second tune with the same inputs is nearly free:

1. per-layer fallback (host): starting from every layer int8, each compute layer's sensitivity is the
   action agreement on the recorded states when it alone is int8; the most sensitive layers go back
   to float, greedily, until the agreement proxy passes (OpenVINO's accuracy-aware ranking, judged by
   the policy's own actions);
2. the candidates bundle: fp32, fp16, int8 x calibration method x {default split, the search's split};
3. screen (host): each candidate's agreement with fp32 on the recorded states;
4. latency on the device, one model at a time, at every thread count up to the device's cores;
5. closed loop on the device, fastest first: paired-seed reward against fp32; a close call is
   re-checked on fresh seeds; the first that passes the gate is the choice (fp32 passes by definition,
   so the choice is never slower than the fastest fp32 measured).

A time budget stops the search with the best so far.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quarl_edge.bench.device import transport_for
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bundle import BundleRequest, Variant, export_bundle
from quarl_edge.devices.check import check_device
from quarl_edge.devices.profiles import load_profile
from quarl_edge.exporters.base import compute_layers
from quarl_edge.policy.load import load_policy
from quarl_edge.policy.net import Policy
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.fsutil import atomic_write_json, sha256_file
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.trace import load_trace, save_trace
from quarl_edge.tune.candidates import Candidate, grid
from quarl_edge.tune.report import write_outputs

Log = Callable[[str], None]
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

    # -- host-side proxy ------------------------------------------------------------------------------

    def agreement(self, bundle: Path, model: str) -> float:
        from quarl_edge.bench.run import _agreement

        # the trace and each bundle's manifest (its hash check covers every model) are read once
        if self.trace is None:
            self.trace = load_trace(self.trace_path)
        if bundle not in self.manifests:
            self.manifests[bundle] = load_manifest(bundle)
        manifest = self.manifests[bundle]
        actions = PolicyRunner(bundle, model, threads=1, manifest=manifest).replay(self.trace).actions
        a = _agreement(manifest, self.ref_actions.tolist(), actions.tolist())
        return float(a["value"]) if a else 0.0

    def proxy(self) -> float:
        if self.cfg.min_agreement is not None:
            return self.cfg.min_agreement
        return 0.95 if self.policy.spec.action_space.is_discrete else 0.98

    def export(self, name: str, variants: tuple[Variant, ...], targets: tuple[str, ...] = ()) -> Path:
        out = self.work / f"{name}-{_key([v.name for v in variants], targets)}"
        if not (out / "manifest.json").is_file():
            export_bundle(self.policy, BundleRequest(out=out, targets=targets, variants=variants,
                                                     calibration=self.trace_path))  # fmt: skip
        return out

    def layer_search(self, fmt: str) -> Candidate | None:
        """Per-layer fallback from every layer int8; None when all-int8 already passes the proxy."""
        layers = compute_layers(self.policy)
        proxy = self.proxy()

        def probe(float_layers: tuple[str, ...], why: str) -> float:
            c = Candidate(fmt, "int8", float_layers=float_layers, origin=why)
            cached = self.state.get("layers", c.name)
            if cached is None:
                bundle = self.export("probe", (c.variant(),))
                cached = self.state.put("layers", c.name, self.agreement(bundle, c.name))
            return float(cached)

        all_int8 = probe((), "every layer int8")
        self.log(f"{fmt} int8, every layer: agreement {all_int8:.3f} (proxy {proxy:g})")
        if all_int8 >= proxy:
            return Candidate(
                fmt, "int8", float_layers=(), origin=f"every layer int8: agreement {all_int8:.3f}"
            )
        # sensitivity: how much agreement each layer loses when it alone is int8
        alone = {lay: probe(tuple(x for x in layers if x != lay), f"only {lay} int8") for lay in layers}
        ranked = sorted(layers, key=lambda lay: alone[lay])
        self.log("layer sensitivity (agreement with only that layer int8): "
                 + ", ".join(f"{lay} {alone[lay]:.3f}" for lay in ranked))  # fmt: skip
        kept: list[str] = []
        for lay in ranked:
            if self.over_budget():
                break
            kept.append(lay)
            if len(kept) == len(layers):
                break
            value = probe(tuple(kept), "")
            if value >= proxy:
                why = (f"all-int8 agreement {all_int8:.3f} < {proxy:g}; most sensitive "
                       + ", ".join(f"{k} (alone {alone[k]:.3f})" for k in kept) + f" kept in float: {value:.3f}")  # fmt: skip
                self.log(f"{fmt} int8 with {', '.join(kept)} in float: agreement {value:.3f}")
                return Candidate(fmt, "int8", float_layers=tuple(kept), origin=why)
        self.notes.append(f"{fmt} int8: no layer split passed the agreement proxy {proxy:g}")
        return None


def run_tune(cfg: TuneConfig, log: Log = lambda _m: None) -> dict[str, Any]:
    """The whole search; returns the result (tune.json's content, see tune/report.py for the files)."""
    t0 = time.monotonic()
    profile = load_profile(cfg.device, cfg.overrides)
    policy = load_policy(cfg.policy, cfg.env, cfg.algo, cfg.vecnormalize)
    facts = check_device(profile).facts
    formats = device_formats(facts, profile.name)
    if "tflite" in formats and not _host_can_export_tflite():
        formats = tuple(f for f in formats if f != "tflite")
    cores = int(facts.get("cores") or 1)
    threads = list(range(1, min(cores, cfg.max_threads or cores) + 1))
    work = cfg.out / ".cache"
    work.mkdir(parents=True, exist_ok=True)
    trace_path = _calibration(cfg, policy, work, log)
    key = _key(sha256_file(trace_path), policy.spec.to_dict(), profile.name, cfg.seed, cfg.episodes,
               cfg.latency_samples, cfg.min_agreement, threads, formats)  # fmt: skip
    state = State(work / "state.json", key)
    if state.reused:
        log(f"resuming: {state.reused} measurements of an earlier run with the same inputs are reused")
    s = Search(
        cfg, log, policy, trace_path, state, work, t0 + cfg.budget_min * 60, reference=f"{formats[0]}-fp32"
    )
    ref_bundle = s.export("reference", (), (s.reference,))
    s.trace = load_trace(trace_path)
    s.ref_actions = PolicyRunner(ref_bundle, s.reference, threads=1).replay(s.trace).actions

    cands = grid(formats)
    for fmt in formats:
        found = s.layer_search(fmt)
        if found is not None:
            cands.append(found)
    bundle = s.export("candidates", tuple(c.variant() for c in cands[1:]), (s.reference,))
    by_name = {c.name: c for c in cands}
    rows = {c.name: {**c.to_dict()} for c in cands}
    rows[s.reference]["agreement"] = 1.0
    for c in cands[1:]:
        rows[c.name]["agreement"] = s.state.get("screen", c.name) or s.state.put("screen", c.name,
                                                                                 s.agreement(bundle, c.name))  # fmt: skip
    log(f"{len(cands)} candidates screened on the host; latency on {profile.name} at {threads} thread(s)")
    transport = transport_for(profile)
    device = {"name": profile.name, "transport": profile.transport, "emulated": profile.emulated}
    try:
        _latency(s, bundle, threads, rows, device, transport)
        choice = _closed_loop(s, bundle, rows, by_name, device, transport)
        result = _result(s, cfg, policy, profile, facts, cores, threads, rows, choice, bundle, trace_path, t0)
        log(f"chosen: {choice['name'] if choice else 'none'}; benching it against fp32 for tune.json")
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


def _latency(s: Search, bundle: Path, threads: list[int], rows: dict[str, dict[str, Any]], device: dict[str, Any],
             transport: Any) -> None:  # fmt: skip
    for t in threads:
        if s.over_budget() and t > 1:
            s.notes.append(f"budget reached: latency not measured beyond {t - 1} thread(s)")
            break
        missing = [n for n in rows if s.state.get("latency", f"{n}@{t}") is None]
        if missing:
            cfg = BenchConfig(episodes=0, threads=t, latency_samples=s.cfg.latency_samples, seed=s.cfg.seed,
                              models=tuple(missing))  # fmt: skip
            report = bench(bundle, cfg, device=device, transport=transport)
            for m in report["models"]:
                lat = m.get("latency") or {}
                s.state.put(
                    "latency", f"{m['name']}@{t}", {"p50_us": lat.get("p50_us"), "p99_us": lat.get("p99_us")}
                )
        for n, row in rows.items():
            row.setdefault("latency", {})[str(t)] = s.state.get("latency", f"{n}@{t}")
    for row in rows.values():
        lat = {t: v for t, v in row["latency"].items() if v and v.get("p50_us")}
        best = min(lat, key=lambda t: lat[t]["p50_us"]) if lat else None
        row["threads"] = int(best) if best else None
        row["p50_us"] = lat[best]["p50_us"] if best else None
        row["p99_us"] = lat[best]["p99_us"] if best else None


def _closed_loop(s: Search, bundle: Path, rows: dict[str, dict[str, Any]], by_name: dict[str, Candidate],
                 device: dict[str, Any], transport: Any) -> dict[str, Any] | None:  # fmt: skip
    cfg = s.cfg
    ref = rows[s.reference]
    ref.update(verdict="pass", why="the fp32 reference", drop_pct=0.0)
    order = sorted((r for r in rows.values() if r.get("p50_us")), key=lambda r: r["p50_us"])
    for row in order:
        name = row["name"]
        if name == s.reference:
            break  # nothing faster passed: the reference is the choice
        if cfg.max_p99_ms is not None and row["p99_us"] > cfg.max_p99_ms * 1000:
            row.update(verdict="rejected", why=f"p99 {row['p99_us'] / 1000:.3f} ms > {cfg.max_p99_ms:g} ms")
            continue
        if cfg.min_agreement is not None and (row.get("agreement") or 0) < cfg.min_agreement:
            row.update(
                verdict="rejected", why=f"agreement {row['agreement']:.3f} < {cfg.min_agreement:g} (screen)"
            )
            continue
        if s.over_budget():
            row.update(verdict="not judged", why="the time budget ran out")
            s.notes.append("budget reached before every faster candidate was judged in closed loop")
            break
        drift = s.state.get("closed", name) or s.state.put("closed", name, _reward(s, bundle, name, cfg.seed,
                                                                               cfg.episodes, device, transport))  # fmt: skip
        row.update(
            drop_pct=drift["drop_pct"], drop_ci95_pct=drift["drop_ci95_pct"], episodes_judged=cfg.episodes
        )
        ok = drift["drop_pct"] <= cfg.max_reward_drop_pct
        lo, hi = drift["drop_ci95_pct"]
        # a close call either way: the paired interval holds the limit, so these episodes cannot tell;
        # fresh seeds decide, on all the episodes together
        if lo <= cfg.max_reward_drop_pct <= hi and cfg.confirm_episodes > 0 and not s.over_budget():
            more = s.state.get("confirm", name) or s.state.put("confirm", name, _reward(
                s, bundle, name, cfg.seed + cfg.episodes, cfg.confirm_episodes, device, transport))  # fmt: skip
            n1, n2 = cfg.episodes, cfg.confirm_episodes
            pooled = (drift["drop_pct"] * n1 + more["drop_pct"] * n2) / (n1 + n2)
            ok = pooled <= cfg.max_reward_drop_pct
            row.update(confirm_drop_pct=pooled, confirm_episodes=n1 + n2, episodes_judged=n1 + n2)
        limit = f"{cfg.max_reward_drop_pct:g}%"
        if ok:
            shown = row.get("confirm_drop_pct", row["drop_pct"])
            again = f" over {row.get('confirm_episodes')} episodes (a close call, re-checked on fresh seeds)"
            row.update(verdict="pass", why=f"reward drop {shown:+.2f}% <= {limit}" + (again if "confirm_drop_pct" in row else ""))  # fmt: skip
            _slower(rows, row)
            return _choice(row, ref)
        row.update(
            verdict="rejected",
            why=f"reward drop {row.get('confirm_drop_pct', row['drop_pct']):+.2f}% > {limit}",
        )
    if cfg.max_p99_ms is not None and ref["p99_us"] and ref["p99_us"] > cfg.max_p99_ms * 1000:
        ref.update(verdict="rejected", why=f"p99 {ref['p99_us'] / 1000:.3f} ms > {cfg.max_p99_ms:g} ms")
        return None
    _slower(rows, ref)
    return _choice(ref, ref)


def _slower(rows: dict[str, dict[str, Any]], chosen: dict[str, Any]) -> None:
    for r in rows.values():
        if "verdict" not in r and r.get("p50_us") and r["p50_us"] >= chosen["p50_us"]:
            r.update(verdict="not needed", why=f"slower than {chosen['name']}, which passed")


def _reward(s: Search, bundle: Path, name: str, seed: int, episodes: int, device: dict[str, Any],
            transport: Any) -> dict[str, Any]:  # fmt: skip
    s.log(f"closed loop: {name} vs {s.reference}, {episodes} paired episodes from seed {seed}")
    report = bench(bundle, BenchConfig(episodes=episodes, seed=seed, threads=1, latency_samples=0, models=(name,)),
                   device=device, transport=transport)  # fmt: skip
    m = next(m for m in report["models"] if m["name"] == name)
    d = m.get("drift") or {}
    if d.get("reward_drop_pct") is None:
        raise QuarlError(f"no paired episodes for {name}", "run again; the runner reported none")
    lo, hi = d["rel_ci95"]
    return {"drop_pct": d["reward_drop_pct"], "drop_ci95_pct": [-100 * hi, -100 * lo], "episodes": episodes,
            "mean": m["reward"]["mean"], "ref_mean": next(x for x in report["models"] if x["name"] == s.reference)["reward"]["mean"]}  # fmt: skip


def _choice(row: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    speed = ref["p50_us"] / row["p50_us"] if row.get("p50_us") and ref.get("p50_us") else None
    return {"name": row["name"], "threads": row["threads"], "p50_us": row["p50_us"], "p99_us": row["p99_us"],
            "speedup_vs_fp32": speed, "drop_pct": row.get("confirm_drop_pct", row.get("drop_pct")),
            "episodes": row.get("episodes_judged"), "why": row.get("why")}  # fmt: skip
