"""Run one model of a bundle: act, closed-loop episodes on given seeds, trace replay, latency.

Device side: imports numpy, the model's runtime and gymnasium only (never torch or TensorFlow).
"""

from __future__ import annotations

import math
import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import defaults
from .adapters import ModelSession
from .envs import action_masks, make_env
from .errors import InputError
from .facts import is_emulated
from .inloop import InLoopStats, check_hz, in_loop_stats
from .loop import LoopConfig, Pace
from .manifest import Manifest, ModelEntry, load_manifest
from .policy import Policy
from .schema import Event, JSONObject
from .sustained import SustainedStats, check_duration, sustained
from .trace import Trace, check_fits, load_trace

Progress = Callable[[Event], None]
Act = Callable[[np.ndarray], Any]
"""an observation in, the env's action out"""
OnStep = Callable[[np.ndarray, Any, float, bool], bool]
"""``(obs, action, reward, episode_ended) -> go_on``: sees every step; False stops after this step (this
episode ends there and no other starts)"""


@dataclass
class EpisodeResult:
    seed: int
    ret: float
    length: int
    nonfinite_obs: int = 0
    error: str | None = None
    act_ns: list[int] | None = None
    """every act() call's time, in step order (only when the run measures in-loop latency)"""
    warmed: list[bool] | None = None
    """paced (bench --hz): per step, whether the loop runner warmed up before it (every other step)"""
    overruns: int = 0
    """paced: steps whose act() + env.step ended after the next deadline"""


@dataclass
class LatencyStats:
    count: int
    p50_us: float
    p90_us: float
    p99_us: float
    mean_us: float
    std_us: float
    min_us: float
    max_us: float
    throughput_per_s: float

    @classmethod
    def from_ns(cls, samples_ns: np.ndarray) -> LatencyStats:
        us = samples_ns.astype(np.float64) / 1e3
        mean = float(us.mean())
        return cls(
            count=int(us.size),
            p50_us=float(np.percentile(us, 50)),
            p90_us=float(np.percentile(us, 90)),
            p99_us=float(np.percentile(us, 99)),
            mean_us=mean,
            std_us=float(us.std()),
            min_us=float(us.min()),
            max_us=float(us.max()),
            throughput_per_s=1e6 / mean if mean > 0 else math.inf,
        )


@dataclass
class ReplayResult:
    actions: np.ndarray
    nonfinite_obs: int
    valid: np.ndarray  # rows whose observation was finite and therefore evaluated


@dataclass
class ModelRun:
    """Everything measured for one model; the JSON form goes into the bench report."""

    model: str
    format: str
    precision: str
    runtime: str
    threads: int
    size_bytes: int
    load_ms: float
    first_inference_ms: float
    latency: LatencyStats | None = None
    episodes: list[EpisodeResult] = field(default_factory=list)
    replay_actions: list[Any] | None = None
    replay_nonfinite_obs: int = 0
    peak_rss_mb: float = 0.0
    torch_imported: bool = False
    in_loop: InLoopStats | None = None
    """act() timed inside the episodes against the control period (runtimes.loop; with ``hz``)"""
    sustained: SustainedStats | None = None
    """the model run back to back for ``duration_s``, with the board's thermal readings"""

    def to_dict(self) -> JSONObject:
        d = asdict(self)
        d["episodes"] = [asdict(e) for e in self.episodes]
        return d


def run_episodes(
    env: Any,
    act: Act,
    seeds: Sequence[int],
    *,
    max_steps: int | None = None,
    reset: Callable[[], None] | None = None,
    timed: bool = False,
    on_step: OnStep | None = None,
    on_episode: Callable[[EpisodeResult], None] | None = None,
    catch: bool = True,
    reraise: tuple[type[BaseException], ...] = (),
    pace: Pace | None = None,
) -> list[EpisodeResult]:
    """The one seeded closed loop: one episode per seed, in order, ``act`` choosing every action.

    Each episode starts from ``env.reset(seed=seed)`` with the action space seeded alike (a random or
    exploring policy samples the same actions on every run), so two variants run on the same seeds play
    paired episodes: the same start states, and the same env randomness, step for step. ``reset``: called
    at each episode's start (a policy's frame stack, recurrent state). ``timed``: each episode keeps the
    time of every act() call (between two real env steps, as in a control loop). ``catch``: an episode
    that raises is reported with its error and the others go on (a bench); exceptions of ``reraise`` (a
    dropped link: not the episode's doing) and, without ``catch``, every exception end the run. ``pace``:
    every step waits for its deadline at the loop runner's rate (runtimes.loop.Pace, entered by the
    caller), its act() timed and whether it was warmed up kept per step (``timed`` then holds).
    """
    results: list[EpisodeResult] = []
    go_on = True
    last: Any = None  # the last observation acted on: the pace's warm-up runs on it
    for seed in seeds:
        if not go_on:
            break
        seed = int(seed)
        obs, _ = env.reset(seed=seed)
        env.action_space.seed(seed)
        if reset is not None:
            reset()
        clock = time.perf_counter_ns
        times: list[int] | None = [] if timed or pace is not None else None
        warmed: list[bool] | None = [] if pace is not None else None
        ret, steps, nonfinite, error, overruns = 0.0, 0, 0, None, 0
        try:
            while go_on:
                if not isinstance(obs, dict):  # a Dict observation goes to act() as the env gave it
                    obs = np.asarray(obs)
                    if obs.dtype.kind == "f" and not np.all(np.isfinite(obs)):
                        nonfinite += 1
                if pace is not None:
                    pace.wait(last)
                if times is None:
                    action = act(obs)
                else:  # between two real env steps: the caches are the env's, as in a control loop
                    t0 = clock()
                    action = act(obs)
                    times.append(clock() - t0)
                last = obs
                next_obs, reward, terminated, truncated, _ = env.step(action)
                if pace is not None and warmed is not None and times is not None:
                    warmed.append(pace.warmed)
                    overruns += pace.done(times[-1])
                ret += float(reward)
                steps += 1
                end = bool(terminated or truncated or (max_steps is not None and steps >= max_steps))
                if on_step is not None:
                    go_on = on_step(obs, action, float(reward), end)
                if end:
                    break
                obs = next_obs
        except reraise:
            raise
        except Exception as e:  # a broken episode is reported, the others go on
            if not catch:
                raise
            error = f"{type(e).__name__}: {e}"
        results.append(EpisodeResult(seed, ret, steps, nonfinite, error, times, warmed, overruns))
        if on_episode is not None:
            on_episode(results[-1])
    return results


def episodes_in_loop(episodes: Sequence[Any], hz: float, first_call_ms: float | None,
                     os_settings: Sequence[str] = ()) -> InLoopStats | None:  # fmt: skip
    """The in-loop stats of episodes (EpisodeResult here, the host's typed Episode after a resume)."""
    return in_loop_stats((e.act_ns for e in episodes), hz, first_call_ms, (e.warmed for e in episodes),
                         sum(e.overruns or 0 for e in episodes), os_settings)  # fmt: skip


def peak_rss_mb() -> float:
    # ru_maxrss is KiB on Linux, bytes on macOS
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


class PolicyRunner:
    """One model of a bundle, loaded with an explicit thread count, ready to act, replay and be timed.

    Its closed-loop episodes run ``Policy.act`` (runtimes.policy), the runtime API's own path.
    """

    def __init__(
        self, bundle: str | Path, model: str, threads: int = 1, manifest: Manifest | None = None
    ) -> None:
        self.bundle = Path(bundle)
        self.manifest = manifest or load_manifest(self.bundle, models=[model])
        # a NaN from the env's sensor is counted and answered with the last action: the bench goes on
        self.policy = Policy(
            self.bundle, self.manifest, self.manifest.model(model), threads, on_nonfinite="hold"
        )
        self.entry: ModelEntry = self.policy.entry
        self.spec = self.manifest.policy
        self.threads = threads
        self.session: ModelSession = self.policy.session
        # one inference as a control loop calls it: the model's extra inputs (mask, recurrent state) included
        plain = self.policy.action_mask_size is None and not self.spec.state
        self.infer = self.session.run if plain else self.policy.run_batch
        self.load_ns = self.policy.load_ns

    @property
    def first_inference_ns(self) -> int | None:
        return self.policy.first_call_ns

    def act_batch(self, obs: np.ndarray, action_masks: np.ndarray | None = None) -> np.ndarray:
        return self.policy.run_batch(obs, action_masks)

    def act(self, obs: np.ndarray) -> Any:
        """The environment action for one observation of the policy's observation space (frames
        already stacked, as in a trace)."""
        return self.policy.act_on_input(obs)

    def episodes(
        self,
        seeds: Sequence[int],
        max_steps: int | None = None,
        progress: Progress | None = None,
        timed: bool = False,
        pace: Pace | None = None,
    ) -> list[EpisodeResult]:
        """Closed-loop episodes on ``seeds`` through ``Policy.act`` (run_episodes); ``timed``: each keeps
        the time of every act() call; ``pace``: at the loop runner's rate."""
        if not seeds:  # latency only, or the env runs on the host (bench --env-on-host): no env here
            return []

        def done(e: EpisodeResult) -> None:
            if progress:
                progress({"event": "episode", "model": self.entry.name, **asdict(e)})

        env = self.policy.make_env()
        act: Act = self.policy.act
        if self.policy.action_mask_size is not None:  # MaskablePPO: the env's allowed actions at every step
            act = lambda obs: self.policy.act(obs, action_masks(env))  # noqa: E731
        try:
            return run_episodes(env, act, seeds, max_steps=max_steps, reset=self.policy.reset,
                                timed=timed, on_episode=done, pace=pace)  # fmt: skip
        finally:
            env.close()

    def replay(self, trace: Trace) -> ReplayResult:
        """Actions for every recorded observation; non-finite observations are skipped and counted."""
        obs = trace.obs
        if tuple(obs.shape[1:]) != tuple(self.spec.observation_space.shape):
            raise InputError(
                f"trace observations have shape {list(obs.shape[1:])}, "
                f"the policy expects {list(self.spec.observation_space.shape)}",
                "use a trace recorded on this policy's environment",
            )
        flat = obs.reshape(obs.shape[0], -1)
        valid = np.all(np.isfinite(flat), axis=1) if obs.dtype.kind == "f" else np.ones(obs.shape[0], bool)
        act_shape = self.spec.action_space.shape
        dtype = np.int64 if self.spec.action_space.is_integer else np.float32
        actions = np.full((obs.shape[0], *act_shape), -1 if dtype == np.int64 else np.nan, dtype=dtype)
        masks = trace.action_masks if self.policy.action_mask_size is not None else None
        starts = trace.episode_starts()
        for i in np.flatnonzero(valid):
            if starts[i]:  # a recurrent policy replays each episode in order from a zero state
                self.policy.reset()
            actions[i] = self.act_batch(obs[i : i + 1], None if masks is None else masks[i : i + 1])[0]
        return ReplayResult(actions=actions, nonfinite_obs=int((~valid).sum()), valid=valid)

    def latency(
        self, observations: np.ndarray, samples: int = defaults.LATENCY_SAMPLES, warmup: int = defaults.WARMUP
    ) -> LatencyStats:
        """Single-observation latency, cycling through ``observations``, after ``warmup`` runs."""
        batches = timing_batches(observations)
        for i in range(warmup):
            self.act_batch(batches[i % len(batches)])
        out = np.empty(samples, dtype=np.int64)
        clock = time.perf_counter_ns
        run = self.infer
        for i in range(samples):
            b = batches[i % len(batches)]
            t0 = clock()
            run(b)
            out[i] = clock() - t0
        return LatencyStats.from_ns(out)


def timing_batches(observations: np.ndarray) -> list[np.ndarray]:
    """Up to 256 single-observation batches of the finite ``observations``, to time a model on."""
    flat = observations.reshape(observations.shape[0], -1)
    if observations.dtype.kind == "f":
        observations = observations[np.all(np.isfinite(flat), axis=1)]
    if observations.shape[0] == 0:
        raise InputError(
            "no finite observations to time the model on", "record a trace with finite observations"
        )
    return [np.ascontiguousarray(observations[i : i + 1]) for i in range(min(observations.shape[0], 256))]


def sample_observations(runner: PolicyRunner, n: int = 64, seed: int = 0) -> np.ndarray:
    """Observations from the environment itself, for timing when no trace is given."""
    env = make_env(runner.spec.env)
    try:
        obs, _ = env.reset(seed=seed)
        out = []
        for _ in range(n):
            out.append(np.asarray(obs))
            obs, _, term, trunc, _ = env.step(env.action_space.sample())
            if term or trunc:
                obs, _ = env.reset()
        return np.stack(out)
    finally:
        env.close()


def run_model(
    bundle: str | Path,
    model: str,
    *,
    seeds: Sequence[int],
    threads: int = defaults.THREADS,
    trace_path: str | Path | None = None,
    latency_samples: int = defaults.LATENCY_SAMPLES,
    warmup: int = defaults.WARMUP,
    max_steps: int | None = None,
    replay: bool = True,
    progress: Progress | None = None,
    oversubscribe: bool = False,
    hz: float | None = None,
    duration_s: float | None = None,
) -> ModelRun:
    """Measure one model: load, first inference, latency, trace replay, then episodes on ``seeds``.

    A ``measured`` event carries everything but the episodes before they start, so a host that loses
    the link mid-way keeps it and can resume with the missing seeds, ``latency_samples=0`` and
    ``replay=False``. ``hz``: the episodes run at that rate in the loop runner (real idle time between
    steps; the warm-up before every other step, OS settings where permitted), every act() timed against
    the 1/hz budget (``in_loop``: with and without the warm-up; each episode keeps its times, so a host
    that resumes merges them). ``duration_s``: after the
    latency, a sustained loop of that long with thermal readings (runtimes.sustained).
    """
    hz, duration_s = check_hz(hz), check_duration(duration_s)
    if any(s < 0 for s in seeds):
        raise InputError(f"episode seeds must be >= 0 (got {min(seeds)})", "e.g. --seed 1000")
    cores = os.cpu_count() or 1
    if threads > cores and not oversubscribe:  # more threads than cores only measures contention
        raise InputError(
            f"--threads {threads} is more than the {cores} cores of this device",
            f"use --threads {cores} or fewer, or pass --oversubscribe to measure it anyway",
        )
    runner = PolicyRunner(bundle, model, threads)
    trace = None
    if trace_path is not None:
        trace = load_trace(trace_path)
        check_fits(trace, runner.spec, trace_path)
    elif runner.manifest.trace is not None:
        trace = load_trace(Path(bundle) / runner.manifest.trace.file)
    obs_for_timing = trace.obs if trace is not None else sample_observations(runner)
    runner.act_batch(np.ascontiguousarray(obs_for_timing[:1]))  # first inference, timed
    result = ModelRun(
        model=runner.entry.name,
        format=runner.entry.format,
        precision=runner.entry.precision,
        runtime=runner.session.runtime,
        threads=threads,
        size_bytes=runner.entry.size_bytes,
        load_ms=runner.load_ns / 1e6,
        first_inference_ms=(runner.first_inference_ns or 0) / 1e6,
    )
    if latency_samples > 0:
        result.latency = runner.latency(obs_for_timing, latency_samples, warmup)
        if progress:
            progress({"event": "latency", "model": model, "p50_us": result.latency.p50_us})
    if duration_s is not None:
        result.sustained = sustained(runner.infer, timing_batches(obs_for_timing), duration_s, is_emulated())
    if trace is not None and replay:
        rep = runner.replay(trace)
        result.replay_actions = [
            a.tolist() if ok else None for a, ok in zip(rep.actions, rep.valid, strict=True)
        ]
        result.replay_nonfinite_obs = rep.nonfinite_obs
    if progress:
        result.peak_rss_mb = peak_rss_mb()
        progress({"event": "measured", "model": model, "run": result.to_dict()})
    if hz is None:
        result.episodes = runner.episodes(seeds, max_steps=max_steps, progress=progress)
    else:
        with Pace(runner.policy, LoopConfig(hz), alternate=True) as pace:
            result.episodes = runner.episodes(seeds, max_steps=max_steps, progress=progress, pace=pace)
        result.in_loop = episodes_in_loop(result.episodes, hz, result.first_inference_ms,
                                          [x.name for x in pace.settings if x.applied])  # fmt: skip
    result.peak_rss_mb = peak_rss_mb()
    result.torch_imported = "torch" in sys.modules or "tensorflow" in sys.modules
    return result
