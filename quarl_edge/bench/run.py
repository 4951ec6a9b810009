"""Bench every model of a bundle on the same seeds and compare each against the fp32 reference.

Each model runs in its own process (the device runner, ``python -m quarl_edge.runtimes run``), so
load time, first inference and peak RSS are its own, and the runner's imports are those of a device.
Devices other than ``local`` plug in as transports that run the same runner elsewhere (the Transport
protocol and its registry: bench/transport.py; SSH: quarl_edge.devices.remote). Finished episodes are kept in a partial file as they arrive (quarl_edge.bench.partial), so a bench that stops
part-way can be resumed.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from quarl_edge import __version__
from quarl_edge.bench.config import BenchConfig
from quarl_edge.bench.device_run import DeviceRun
from quarl_edge.bench.env_on_host import host_episodes
from quarl_edge.bench.partial import DEVICE_FIX, PartialBench, PartialKey
from quarl_edge.bench.result import (
    EXACT_MATCH,
    FIX,
    RANGE_MATCH,
    Agreement,
    BenchReport,
    BundleInfo,
    Device,
    Harness,
    LinkTiming,
    ModelResult,
    Resumed,
    Reward,
    Settings,
)
from quarl_edge.bench.transport import Event, Transport, local_transport
from quarl_edge.devices.preflight import check_ready
from quarl_edge.devices.remote import Preflight
from quarl_edge.runtimes.envs import bounds, make_env
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.fsutil import sha256_file
from quarl_edge.runtimes.inloop import InLoopStats
from quarl_edge.runtimes.manifest import MANIFEST_NAME, Manifest, ModelEntry, load_manifest
from quarl_edge.runtimes.runner import episodes_in_loop
from quarl_edge.runtimes.sustained import sustained_warnings
from quarl_edge.runtimes.trace import check_fits, load_trace
from quarl_edge.stats import drift_scale, mean_std, paired_drift
from quarl_edge.typed import load


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


def action_agreement(
    manifest: Manifest, ref: Sequence[Any] | None, other: Sequence[Any] | None
) -> Agreement | None:
    """Agreement with fp32 on the trace's states (None without a trace); in [0, 1]: a continuous action's
    error counts at most its dimension's whole range, and a non-finite action as that whole range (a model
    that answers NaN disagrees, it is not left out)."""
    if ref is None or other is None:
        return None
    pairs = [(a, b) for a, b in zip(ref, other, strict=True) if a is not None and b is not None]
    if not pairs:
        return None
    space = manifest.policy.action_space
    if space.is_integer:  # per component for MultiDiscrete / MultiBinary actions
        match = float(np.mean([np.mean(np.asarray(a) == np.asarray(b)) for a, b in pairs]))
        return Agreement(EXACT_MATCH, match, samples=len(pairs))
    a = np.asarray([p[0] for p in pairs], dtype=np.float64).reshape(len(pairs), -1)
    b = np.asarray([p[1] for p in pairs], dtype=np.float64).reshape(len(pairs), -1)
    low, high = bounds(space)
    rng = (high - low).reshape(-1)
    rng = np.where(np.isfinite(rng) & (rng > 0), rng, 1.0)
    with np.errstate(invalid="ignore"):
        err = np.minimum(np.nan_to_num(np.abs(a - b) / rng, nan=1.0, posinf=1.0), 1.0)
    mad = float(np.mean(err))
    diff = np.nan_to_num(np.abs(a - b), nan=np.inf)  # the action error in action units (NaN: no bound)
    return Agreement(RANGE_MATCH, 1.0 - mad, mean_abs_diff_rel=mad, samples=len(pairs),
                     mean_abs_diff=_finite_or_none(diff.mean()),
                     p99_abs_diff=_finite_or_none(np.percentile(diff.max(axis=1), 99)),
                     max_abs_diff=_finite_or_none(diff.max()))  # fmt: skip


def _finite_or_none(x: Any) -> float | None:
    return float(x) if np.isfinite(x) else None


def _returns(run: DeviceRun) -> list[float | None]:
    """Each episode's return in seed order; None for one that failed or whose return is not finite."""
    return [e.ret if e.finished else None for e in run.episodes]


def _reward(run: DeviceRun) -> Reward:
    rets = [r for r in _returns(run) if r is not None]
    m, s = mean_std(rets)
    return Reward(mean=m if rets else None, std=s if rets else None, episodes=len(rets),
                  per_episode=tuple(e.ret for e in run.episodes), seeds=tuple(e.seed for e in run.episodes))  # fmt: skip


def _warnings(run: DeviceRun, unit_scale: bool) -> list[str]:
    out = []
    nonfinite = sum(e.nonfinite_obs for e in run.episodes)
    if nonfinite:
        out.append(f"{nonfinite} non-finite (NaN/inf) observations during episodes")
    if run.replay_nonfinite_obs:
        out.append(f"{run.replay_nonfinite_obs} non-finite observations in the trace were skipped")
    for e in run.episodes:
        if e.error:
            out.append(f"episode seed {e.seed} failed: {e.error}")
        elif e.ret is None:
            out.append(f"episode seed {e.seed} returned a return that is not a finite number: left out")
    if unit_scale:
        out.append("the fp32 mean return is 0: the drop is in % of one reward unit (stats.drift_scale)")
    if run.torch_imported:
        out.append("the runner imported torch or tensorflow (it must not on a device)")
    return out + sustained_warnings(None if run.sustained is None else run.sustained.to_dict())


def _in_loop(run: DeviceRun, hz: float | None) -> InLoopStats | None:
    """In-loop act() latency over every episode (a resumed bench's kept ones included)."""
    if hz is None:
        return None
    settings = run.in_loop.os_settings if run.in_loop is not None else ()
    return episodes_in_loop(run.episodes, hz, run.first_inference_ms, settings)


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


def board_preflight(manifest: Manifest, cfg: BenchConfig, names: list[str], where: str) -> Preflight:
    """The check a transport's ``prepare`` runs once it knows the board's facts, before any upload:
    raises (one line naming ``where`` and the fix) when the board cannot run this bench."""
    on_board = 0 if cfg.env_on_host else len(cfg.seeds)  # episodes whose env runs there
    return lambda facts, nbytes: check_ready(manifest, facts, where, names, on_board, nbytes)


def partial_key(bundle: Path, cfg: BenchConfig, names: list[str], device: str) -> PartialKey:
    """What a resumed bench must share with the interrupted one."""
    return PartialKey(bundle_manifest_sha256=sha256_file(bundle / MANIFEST_NAME), device=device, models=tuple(names),
                      seeds=tuple(cfg.seeds), threads=cfg.threads, latency_samples=cfg.latency_samples,
                      warmup=cfg.warmup, max_steps=cfg.max_steps,
                      trace_sha256=sha256_file(cfg.trace) if cfg.trace else None, env_on_host=cfg.env_on_host,
                      hz=cfg.hz, duration_s=cfg.duration_s)  # fmt: skip


def bundle_info(bundle: Path, manifest: Manifest) -> BundleInfo:
    """The report's ``bundle``: where it was, its manifest's sha256, and the policy it holds."""
    return BundleInfo(path=str(bundle), manifest_sha256=sha256_file(bundle / MANIFEST_NAME),
                      policy=manifest.policy.name, env=manifest.policy.env.id, algo=manifest.policy.algo)  # fmt: skip


def bench(
    bundle: str | Path,
    cfg: BenchConfig,
    *,
    device: Device | Mapping[str, object] | None = None,
    transport: Transport = local_transport,
    progress: Callable[[Event], None] | None = None,
    partial: Path | None = None,
    resume: bool = False,
) -> BenchReport:
    """Run every model on the same seeds; return the report. ``device``: the profile's name, transport
    and whether it is emulated (the transport adds the facts the device reports about itself); a mapping of
    those fields is read as one.

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
    stub = (
        device
        if isinstance(device, Device)
        else load(
            lambda: Device.from_dict(dict(device or {"name": "local"}), "the device"), "the device", FIX
        )
    )
    key = partial_key(bundle, cfg, names, stub.name)
    if partial is not None and resume:
        state = PartialBench.resume(partial, key, names, cfg.seeds)
    else:
        state = PartialBench.start(partial, key, names, cfg.seeds)
    startup: dict[str, float] = {}
    runs: dict[str, DeviceRun] = {}
    try:
        # a board: checked for what this bench needs before any upload
        transport.prepare(bundle, cfg.trace, preflight=board_preflight(manifest, cfg, names, stub.name))
        if cfg.env_on_host and cfg.seeds:
            make_env(manifest.policy.env).close()  # the env runs here: a missing package stops it now
        facts = transport.device_facts
        for name in names:
            runs[name] = _run_model(name, cfg, bundle, manifest, transport, state, progress, startup)
            if progress:
                progress({"event": "model_done", "model": name})
    except QuarlError as e:
        if not state.has_progress():
            raise
        raise state.interrupted(e) from e
    where = f"the runner on {stub.name}"
    # the profile's name, transport and emulation stand; the device's own facts fill in the rest
    dev = load(lambda: Device.from_dict({**facts, **stub.to_dict()}, "the device's facts"), where, FIX)
    return load(lambda: BenchReport(
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        tool_version=__version__,
        bundle=bundle_info(bundle, manifest),
        device=dev,
        settings=Settings(episodes=cfg.episodes, seeds=tuple(cfg.seeds), threads=cfg.threads,
                          latency_samples=cfg.latency_samples, warmup=cfg.warmup, hz=cfg.hz, duration_s=cfg.duration_s),
        reference=ref.name,
        models=tuple(_model_result(name, runs[name], runs[ref.name], manifest, cfg, name == ref.name, where)
                     for name in names),
        harness=harness(transport, startup),
        resumed=Resumed(state.resumed_episodes) if resume else None,
        reward_not_measured=not_measured,
        source_parity=manifest.source_parity,
    ), where, "run the bench again; if it repeats, the device's runner is not quarl-edge's")  # fmt: skip


def harness(transport: Transport, startup: dict[str, float]) -> Harness:
    """The report's harness: the transport's own timings, and each model's runner start-up."""
    t = transport.timings
    if t is None:
        return Harness(transport=transport.name, runner_startup_s=startup)
    return Harness(transport=transport.name, connect_s=t.connect_s, cache_check_s=t.cache_check_s, upload_s=t.upload_s,
                   uploaded_files=tuple(t.uploaded_files), uploaded_bytes=t.uploaded_bytes, info_s=t.info_s,
                   runner_startup_s=startup)  # fmt: skip


def _model_result(name: str, run: DeviceRun, ref_run: DeviceRun, manifest: Manifest, cfg: BenchConfig,
                  is_ref: bool, where: str) -> ModelResult:  # fmt: skip
    """One model's results from its runner's (and the reference's) run: what the device sent is checked here."""
    lat, ref_lat = run.latency, ref_run.latency
    ref_rets, rets = _returns(ref_run), _returns(run)
    drift = None if is_ref else paired_drift(ref_rets, rets)
    paired = [a for a, b in zip(ref_rets, rets, strict=True) if a is not None and b is not None]
    unit = bool(paired) and drift_scale(sum(paired) / len(paired)) != abs(sum(paired) / len(paired))
    try:
        return ModelResult(
            name=name, format=run.format, precision=run.precision, runtime=run.runtime,
            toolchain=manifest.model(name).toolchain,  # converter, quantizer, runtime it was checked with
            threads=run.threads, size_bytes=run.size_bytes,
            size_ratio_vs_ref=ref_run.size_bytes / run.size_bytes if run.size_bytes else None,
            load_ms=run.load_ms, first_inference_ms=run.first_inference_ms, peak_rss_mb=run.peak_rss_mb,
            latency=lat,
            speedup_p50_vs_ref=ref_lat.p50_us / lat.p50_us if lat and ref_lat and lat.p50_us else None,
            reward=_reward(run), drift=drift,
            agreement=None if is_ref else action_agreement(manifest, ref_run.replay_actions, run.replay_actions),
            warnings=tuple(_warnings(run, unit and drift is not None)),
            env_on_host=run.env_on_host, in_loop=_in_loop(run, cfg.hz), sustained=run.sustained,
        )  # fmt: skip
    except ValueError as e:
        raise ValueError(f"{where}: model {name}: {e}") from None


def _run_model(
    name: str,
    cfg: BenchConfig,
    bundle: Path,
    manifest: Manifest,
    transport: Transport,
    state: PartialBench,
    progress: Callable[[Event], None] | None,
    startup: dict[str, float],
) -> DeviceRun:
    """One model through the runner (only its missing seeds on a resume); the merged run."""
    kept = state.models[name]
    if kept.run is not None:
        return kept.run
    seeds = state.seeds_left(name)
    measured = kept.measured is not None
    if measured and not seeds:
        return state.finish(name, None)
    on_board = [] if cfg.env_on_host else seeds
    result = None
    if not (measured and not on_board):
        result = _runner_result(name, cfg, bundle, transport, on_board, measured, state, progress, startup)
    link = None
    if cfg.env_on_host and seeds:  # its episodes are kept in ``state`` as they finish
        link = _episodes_on_host(name, cfg, bundle, manifest, transport, seeds, state, progress)
    return state.finish(name, result, link)


def _runner_result(name: str, cfg: BenchConfig, bundle: Path, transport: Transport, seeds: list[int], measured: bool,
                   state: PartialBench, progress: Callable[[Event], None] | None,
                   startup: dict[str, float]) -> DeviceRun:  # fmt: skip
    result: DeviceRun | None = None
    where = "the device's runner"
    t0 = time.perf_counter()
    for ev in transport(bundle, _runner_args(cfg, name, seeds, measured)):
        kind = ev.get("event")
        if kind == "start" and name not in startup:
            startup[name] = time.perf_counter() - t0
        if kind == "result":  # what the device sent: checked here, before anything uses it
            sent = ev.get("result")
            result = load(lambda: DeviceRun.from_dict(sent, f"{where}: {name}"), where, DEVICE_FIX)  # noqa: B023
        elif kind == "error":
            raise QuarlError(ev.get("message", "runner failed"))
        else:
            state.on_event(name, ev, where)
            if progress:
                progress(ev)
    if result is None:
        raise QuarlError(f"the runner returned no result for {name!r}", "run again with --debug")
    return result


def _episodes_on_host(name: str, cfg: BenchConfig, bundle: Path, manifest: Manifest, transport: Transport, seeds: list[int],
                      state: PartialBench, progress: Callable[[Event], None] | None) -> LinkTiming:  # fmt: skip
    link = transport.policy_link(bundle, name, cfg.threads)

    def on_episode(ep: Event) -> None:
        ev = {"event": "episode", "model": name, **ep}
        state.on_event(name, ev)
        if progress:
            progress(ev)

    try:
        return host_episodes(manifest.policy.env, link, manifest.policy.action_space.is_discrete, seeds,
                             cfg.max_steps, on_episode)  # fmt: skip
    finally:
        link.close()
