"""Bench every model of a bundle on the same seeds and compare each against the fp32 reference.

Each model runs in its own process (the device runner, ``python -m quarl_edge.runtimes run``), so
load time, first inference and peak RSS are its own, and the runner's imports are those of a device.
Devices other than ``local`` plug in as transports that run the same runner elsewhere (SSH:
quarl_edge.devices.remote). A transport may also have ``prepare(bundle, trace)`` (connect, upload),
``harness`` (its own timings, for the report) and ``device_facts`` (merged into the report's device).
Finished episodes are kept in a partial file as they arrive (quarl_edge.bench.partial), so a bench that stops
part-way can be resumed.
"""

from __future__ import annotations

import datetime as _dt
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from quarl_edge import __version__
from quarl_edge.bench.partial import PartialBench
from quarl_edge.bench.transport import Event, Transport, local_transport
from quarl_edge.devices.preflight import check_ready
from quarl_edge.runtimes.envs import bounds, make_env
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.fsutil import sha256_file
from quarl_edge.runtimes.loop import check_hz, in_loop_stats
from quarl_edge.runtimes.manifest import MANIFEST_NAME, Manifest, ModelEntry, load_manifest
from quarl_edge.runtimes.sustained import check_duration, sustained_warnings
from quarl_edge.runtimes.trace import check_fits, load_trace
from quarl_edge.stats import mean_ci95, mean_std

REPORT_FORMAT = "quarl-edge/report"
REPORT_VERSION = 1


@dataclass(frozen=True)
class BenchConfig:
    episodes: int = 20
    """closed-loop episodes per model, on seeds seed .. seed+episodes-1 (the same for every model)"""
    seed: int = 1000
    threads: int = 1
    latency_samples: int = 1000
    warmup: int = 50
    max_steps: int | None = None
    models: tuple[str, ...] | None = None
    """bench only these models (the fp32 reference is always added)"""
    trace: Path | None = None
    """replay trace for action agreement; default: the bundle's own trace.npz"""
    oversubscribe: bool = False
    """let --threads exceed the device's cores (the runner refuses that otherwise)"""
    env_on_host: bool = False
    """closed-loop episodes with the env on this machine and only the policy on the device, one step at a
    time over the link (for an env the board cannot install); the report splits policy from link time"""
    hz: float | None = None
    """control rate: time act() inside the episodes against a 1/hz budget (runtimes.loop)"""
    duration_s: float | None = None
    """a sustained loop per model, with the board's temperature, clock and throttling (runtimes.sustained)"""

    def __post_init__(self) -> None:
        check_hz(self.hz)
        check_duration(self.duration_s)
        if self.episodes < 0:
            raise InputError(f"--episodes must be >= 0 (got {self.episodes})", "e.g. --episodes 20")
        if self.threads < 1:
            raise InputError(f"--threads must be >= 1 (got {self.threads})", "e.g. --threads 1")
        if self.threads > 1024:
            raise InputError(
                f"--threads {self.threads} is not a thread count of any board", "e.g. --threads 4"
            )
        if self.seed < 0:
            raise InputError(f"--seed must be >= 0 (got {self.seed}): environments take non-negative seeds",
                             "e.g. --seed 1000")  # fmt: skip
        if self.latency_samples < 0:
            raise InputError("--latency-samples must be >= 0", "e.g. --latency-samples 1000")

    @property
    def seeds(self) -> list[int]:
        return list(range(self.seed, self.seed + self.episodes))


def _runner_args(cfg: BenchConfig, model: str, seeds: list[int], measured: bool = False) -> list[str]:
    """Runner arguments; ``measured``: latency and replay are kept from an earlier run, skip them."""
    args = ["--model", model, "--threads", str(cfg.threads), "--seeds", ",".join(map(str, seeds))]
    args += ["--latency-samples", "0" if measured else str(cfg.latency_samples), "--warmup", str(cfg.warmup)]
    if measured:
        args.append("--no-replay")
    if cfg.max_steps:
        args += ["--max-steps", str(cfg.max_steps)]
    if cfg.trace:
        args += ["--trace", str(cfg.trace)]
    if cfg.oversubscribe:
        args.append("--oversubscribe")
    if cfg.hz is not None:
        args += ["--hz", repr(cfg.hz)]
    if cfg.duration_s is not None and not measured:
        args += ["--duration", repr(cfg.duration_s)]
    return args


def _agreement(manifest: Manifest, ref: list[Any] | None, other: list[Any] | None) -> dict[str, Any] | None:
    if ref is None or other is None:
        return None
    pairs = [(a, b) for a, b in zip(ref, other, strict=True) if a is not None and b is not None]
    if not pairs:
        return None
    space = manifest.policy.action_space
    if space.is_integer:  # per component for MultiDiscrete / MultiBinary actions
        match = float(np.mean([np.mean(np.asarray(a) == np.asarray(b)) for a, b in pairs]))
        return {"metric": "exact_match_rate", "value": match, "samples": len(pairs)}
    a = np.asarray([p[0] for p in pairs], dtype=np.float64).reshape(len(pairs), -1)
    b = np.asarray([p[1] for p in pairs], dtype=np.float64).reshape(len(pairs), -1)
    low, high = bounds(space)
    rng = (high - low).reshape(-1)
    rng = np.where(np.isfinite(rng) & (rng > 0), rng, 1.0)
    mad = float(np.mean(np.abs(a - b) / rng))
    diff = np.abs(a - b)
    return {
        "metric": "1 - mean_abs_diff/action_range",
        "value": 1.0 - mad,
        "mean_abs_diff_rel": mad,
        "samples": len(pairs),
        # the action error in action units (gate --max-action-error judges max_abs_diff)
        "mean_abs_diff": float(diff.mean()),
        "p99_abs_diff": float(np.percentile(diff.max(axis=1), 99)),
        "max_abs_diff": float(diff.max()),
    }


def _reward(run: dict[str, Any]) -> dict[str, Any]:
    rets = [e["ret"] for e in run["episodes"] if e.get("error") is None and e.get("ret") is not None]
    m, s = mean_std(rets)
    return {
        "mean": m,
        "std": s,
        "episodes": len(rets),
        "per_episode": [e.get("ret") for e in run["episodes"]],
        "seeds": [e.get("seed") for e in run["episodes"]],
    }


def _drift(ref: dict[str, Any], run: dict[str, Any]) -> dict[str, Any] | None:
    diffs = [
        b["ret"] - a["ret"]
        for a, b in zip(ref["episodes"], run["episodes"], strict=True)
        if a.get("error") is None
        and b.get("error") is None
        and a.get("ret") is not None
        and b.get("ret") is not None
    ]
    if not diffs:
        return None
    ref_mean = _reward(ref)["mean"]
    m, lo, hi = mean_ci95(diffs)
    scale = abs(ref_mean) if ref_mean and math.isfinite(ref_mean) else math.nan
    rel = m / scale if scale == scale and scale > 0 else 0.0 if m == 0 else math.nan
    return {
        "paired_episodes": len(diffs),
        "abs": m,
        "abs_ci95": [lo, hi],
        "rel": rel,
        "rel_ci95": [lo / scale, hi / scale] if scale == scale and scale > 0 else [math.nan, math.nan],
        "reward_drop_pct": -100.0 * rel,
    }


def _warnings(run: dict[str, Any]) -> list[str]:
    out = []
    nonfinite = sum(e.get("nonfinite_obs", 0) for e in run["episodes"])
    if nonfinite:
        out.append(f"{nonfinite} non-finite (NaN/inf) observations during episodes")
    if run.get("replay_nonfinite_obs"):
        out.append(f"{run['replay_nonfinite_obs']} non-finite observations in the trace were skipped")
    for e in run["episodes"]:
        if e.get("error"):
            out.append(f"episode seed {e['seed']} failed: {e['error']}")
    if run.get("torch_imported"):
        out.append("the runner imported torch or tensorflow (it must not on a device)")
    return out + sustained_warnings(run.get("sustained"))


def _in_loop(run: dict[str, Any], hz: float | None) -> dict[str, Any] | None:
    """In-loop act() latency over every episode (a resumed bench's kept ones included)."""
    if hz is None:
        return None
    stats = in_loop_stats((e.get("act_ns") for e in run["episodes"]), hz, run.get("first_inference_ms"))
    return stats.to_dict() if stats else None


def plan(bundle: Path, cfg: BenchConfig) -> tuple[Manifest, list[str], ModelEntry]:
    """The verified manifest, the models a bench of it runs (``cfg.models`` and the fp32 reference, in
    the bundle's order) and that reference; every mistake in the request is an InputError here, before
    any runner starts."""
    manifest = load_manifest(bundle)
    if cfg.trace is not None:  # a trace of another env is the user's mistake
        check_fits(load_trace(cfg.trace), manifest.policy, cfg.trace)
    ref = manifest.reference()
    if ref is None:
        raise InputError("the bundle has no fp32 model to compare against", "export with --to onnx-fp32,...")
    names = [m.name for m in manifest.models]
    if cfg.models:
        unknown = [n for n in cfg.models if n not in names]
        if unknown:
            raise InputError(
                f"bundle has no model {unknown[0]!r}", f"models in this bundle: {', '.join(names)}"
            )
        names = [n for n in names if n in cfg.models or n == ref.name]
    return manifest, names, ref


def board_preflight(
    manifest: Manifest, cfg: BenchConfig, names: list[str], where: str
) -> Callable[[dict[str, Any], int], None]:
    """The check a transport's ``prepare`` runs once it knows the board's facts, before any upload:
    raises (one line naming ``where`` and the fix) when the board cannot run this bench."""
    on_board = 0 if cfg.env_on_host else len(cfg.seeds)  # episodes whose env runs there
    return lambda facts, nbytes: check_ready(manifest, facts, where, names, on_board, nbytes)


def partial_key(bundle: Path, cfg: BenchConfig, names: list[str], device: str) -> dict[str, Any]:
    """What a resumed bench must share with the interrupted one."""
    return {
        "bundle_manifest_sha256": sha256_file(bundle / MANIFEST_NAME),
        "device": device,
        "models": names,
        "seeds": cfg.seeds,
        "threads": cfg.threads,
        "latency_samples": cfg.latency_samples,
        "warmup": cfg.warmup,
        "max_steps": cfg.max_steps,
        "trace_sha256": sha256_file(cfg.trace) if cfg.trace else None,
        "env_on_host": cfg.env_on_host,
        "hz": cfg.hz,
        "duration_s": cfg.duration_s,
    }


def bundle_info(bundle: Path, manifest: Manifest) -> dict[str, Any]:
    """The report's ``bundle``: where it was, its manifest's sha256, and the policy it holds."""
    return {
        "path": str(bundle),
        "manifest_sha256": sha256_file(bundle / MANIFEST_NAME),
        "policy": manifest.policy.name,
        "env": manifest.policy.env.id,
        "algo": manifest.policy.algo,
    }


def bench(
    bundle: str | Path,
    cfg: BenchConfig,
    *,
    device: dict[str, Any] | None = None,
    transport: Transport = local_transport,
    progress: Callable[[Event], None] | None = None,
    partial: Path | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Run every model on the same seeds; return the report (JSON-able dict).

    ``partial``: keep finished work in this file as it arrives; it is left in place, for the caller to
    remove once the report is safely on disk (bench.device.bench_on_device does), so a report that
    cannot be written loses nothing. ``resume``: continue the bench saved there, running only what is
    missing.
    """
    bundle = Path(bundle)
    manifest, names, ref = plan(bundle, cfg)
    not_measured = None
    if manifest.policy.env.family == "external":  # recorded observations stand in: no episodes to run
        not_measured = f"the policy's environment {manifest.policy.env.id!r} cannot run here"
        cfg = replace(cfg, episodes=0)
    if resume and partial is None:
        raise InputError("--resume needs the report path of the interrupted bench", "pass the same --out")
    device = dict(device or {"name": "local", "emulated": False})
    key = partial_key(bundle, cfg, names, str(device.get("name", "local")))
    if partial is not None and resume:
        state = PartialBench.resume(partial, key, names, cfg.seeds)
    else:
        state = PartialBench.start(partial, key, names, cfg.seeds)
    startup: dict[str, float] = {}
    runs: dict[str, dict[str, Any]] = {}
    try:
        prepare = getattr(transport, "prepare", None)
        if prepare is not None:  # a board: checked for what this bench needs before any upload
            prepare(
                bundle,
                cfg.trace,
                preflight=board_preflight(manifest, cfg, names, str(device.get("name") or "the device")),
            )
        if cfg.env_on_host and cfg.seeds:
            make_env(manifest.policy.env).close()  # the env runs here: a missing package stops it now
        device.update(getattr(transport, "device_facts", None) or {})
        for name in names:
            runs[name] = _run_model(name, cfg, bundle, manifest, transport, state, progress, startup)
            if progress:
                progress({"event": "model_done", "model": name})
    except QuarlError as e:
        if not state.has_progress():
            raise
        raise state.interrupted(e) from e
    ref_run = runs[ref.name]
    models = []
    for name in names:
        run = runs[name]
        lat, ref_lat = run.get("latency"), ref_run.get("latency")
        models.append(
            {
                "name": name,
                "format": run["format"],
                "precision": run["precision"],
                "runtime": run["runtime"],
                "toolchain": manifest.model(
                    name
                ).toolchain,  # converter, quantizer, runtime it was checked with
                "threads": run["threads"],
                "size_bytes": run["size_bytes"],
                "size_ratio_vs_ref": ref_run["size_bytes"] / run["size_bytes"] if run["size_bytes"] else None,
                "load_ms": run["load_ms"],
                "first_inference_ms": run["first_inference_ms"],
                "peak_rss_mb": run["peak_rss_mb"],
                "latency": lat,
                "speedup_p50_vs_ref": (ref_lat["p50_us"] / lat["p50_us"])
                if lat and ref_lat and lat["p50_us"]
                else None,
                "reward": _reward(run),
                "drift": None if name == ref.name else _drift(ref_run, run),
                "agreement": None
                if name == ref.name
                else _agreement(manifest, ref_run.get("replay_actions"), run.get("replay_actions")),
                "warnings": _warnings(run),
                "env_on_host": run.get("env_on_host"),
                "in_loop": _in_loop(run, cfg.hz),
                "sustained": run.get("sustained"),
            }
        )
    return {
        "format": REPORT_FORMAT,
        "schema_version": REPORT_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "tool_version": __version__,
        "bundle": bundle_info(bundle, manifest),
        "device": device,
        "settings": {
            "episodes": cfg.episodes,
            "seeds": cfg.seeds,
            "threads": cfg.threads,
            "latency_samples": cfg.latency_samples,
            "warmup": cfg.warmup,
            "hz": cfg.hz,
            "duration_s": cfg.duration_s,
        },
        "reference": ref.name,
        "reward_not_measured": not_measured,
        "source_parity": manifest.source_parity,
        "models": models,
        "harness": {
            **(getattr(transport, "harness", None) or {"transport": "local"}),
            "runner_startup_s": startup,
        },
        "resumed": {"episodes_kept": state.resumed_episodes} if resume else None,
    }


def _run_model(
    name: str,
    cfg: BenchConfig,
    bundle: Path,
    manifest: Manifest,
    transport: Transport,
    state: PartialBench,
    progress: Callable[[Event], None] | None,
    startup: dict[str, float],
) -> dict[str, Any]:
    """One model through the runner (only its missing seeds on a resume); the merged run."""
    kept = state.models[name]
    if kept.run is not None:
        return kept.run
    seeds = state.seeds_left(name)
    measured = kept.measured is not None
    if measured and not seeds:
        return state.finish(name, None)
    on_board = [] if cfg.env_on_host else seeds
    result: dict[str, Any] | None = None
    if not (measured and not on_board):
        result = _runner_result(name, cfg, bundle, transport, on_board, measured, state, progress, startup)
    link = None
    if cfg.env_on_host and seeds:
        result = dict(result or {})
        result["episodes"], link = _episodes_on_host(
            name, cfg, bundle, manifest, transport, seeds, state, progress
        )
    run = state.finish(name, result)
    if link is not None:  # the link's timing, kept beside the device's own measurements
        run["env_on_host"] = link
        state.save()
    return run


def _runner_result(name: str, cfg: BenchConfig, bundle: Path, transport: Transport, seeds: list[int], measured: bool,
                   state: PartialBench, progress: Callable[[Event], None] | None,
                   startup: dict[str, float]) -> dict[str, Any]:  # fmt: skip
    result: dict[str, Any] | None = None
    t0 = time.perf_counter()
    for ev in transport(bundle, _runner_args(cfg, name, seeds, measured)):
        kind = ev.get("event")
        if kind == "start" and name not in startup:
            startup[name] = time.perf_counter() - t0
        if kind == "result":
            result = ev["result"]
        elif kind == "error":
            raise QuarlError(ev.get("message", "runner failed"))
        else:
            state.on_event(name, ev)
            if progress:
                progress(ev)
    if result is None:
        raise QuarlError(f"the runner returned no result for {name!r}", "run again with --debug")
    return result


def _episodes_on_host(name: str, cfg: BenchConfig, bundle: Path, manifest: Manifest, transport: Transport, seeds: list[int],
                      state: PartialBench, progress: Callable[[Event], None] | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    from quarl_edge.bench.env_on_host import host_episodes
    from quarl_edge.devices.link import local_link

    opener = getattr(transport, "policy_link", None)
    link = opener(bundle, name, cfg.threads) if opener is not None else local_link(bundle, name, cfg.threads)

    def on_episode(ep: dict[str, Any]) -> None:
        ev = {"event": "episode", "model": name, **ep}
        state.on_event(name, ev)
        if progress:
            progress(ev)

    try:
        return host_episodes(manifest.policy.env, link, manifest.policy.action_space.is_discrete, seeds,
                             cfg.max_steps, on_episode)  # fmt: skip
    finally:
        link.close()


def finite_json(obj: Any) -> Any:
    """NaN/inf are not JSON: write them as null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def model_names(report: dict[str, Any]) -> Sequence[str]:
    return [m["name"] for m in report.get("models", [])]
