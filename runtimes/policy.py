"""The runtime API: one model of a bundle in the user's own control loop.

    from quarl_edge.runtimes import load_policy
    policy = load_policy("bundles/cartpole-ppo")   # hashes verified, warmed up
    policy.reset()                                  # at every episode start
    action = policy.act(obs)                        # the env's observation in, the env's action out
    actions = policy.act_batch(observations)        # N environments at once (a VecEnv's observations)
    policy.stats                                    # what act() was given: refused, NaN/inf, out of range

Device side: numpy and the model's runtime only (never torch or TensorFlow). The bench runner's
closed-loop episodes go through this same ``Policy.act`` (runtimes.runner), so what a bench measured is
what a control loop runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .adapters import ModelSession, check_input, open_model
from .envs import DICT_OBS, bounds, make_env, split_wrappers
from .errors import InputError
from .fsutil import sha256_file
from .inputs import (
    ON_NONFINITE,
    ON_OUT_OF_RANGE,
    CalibrationRange,
    InputGuard,
    OnNonfinite,
    OnOutOfRange,
    PolicyStats,
)
from .manifest import MANIFEST_NAME, Manifest, ModelEntry, model_path, verify_model
from .modelio import DictInput, ModelInputs
from .onnx import OrtOptions
from .selection import fp32_model
from .spec import EnvConfig, WrapperConfig
from .telemetry import FieldLogger, LogStats

Action = int | np.ndarray
"""an index for a discrete action space, a float32 array for a continuous one"""

WARMUP_CALLS = 3
"""inferences run at load: the first one pays for lazy allocation and kernel selection"""


@dataclass(frozen=True)
class PolicyInfo:
    """What is loaded, from where, and how long loading and the first calls took."""

    bundle: str
    model: str
    """the model's name in the bundle, e.g. ``onnx-int8``"""
    chosen_by: str
    """why this model: ``argument`` (model=), ``tune`` (the bundle's tune choice), ``only model``"""
    format: str
    precision: str
    runtime: str
    """e.g. ``onnxruntime``, ``ai-edge-litert``"""
    runtime_version: str
    threads: int
    threads_from: str
    """``argument`` (threads=N), ``tune`` (the bundle's tune block, threads="tune"), ``default`` (1)"""
    file: str
    sha256: str
    """of the model file, checked against the manifest at load"""
    size_bytes: int
    manifest_sha256: str
    policy: str
    algo: str
    env_id: str
    observation_shape: tuple[int, ...]
    """what ``act`` takes: one observation of ``make_env()``'s environment"""
    model_input_shape: tuple[int, ...]
    """what the model takes (after the frame stack)"""
    frame_stack: int
    """observations stacked by the policy (1: none)"""
    discrete_actions: int | None
    """the number of actions of a discrete action space (None: continuous)"""
    action_shape: tuple[int, ...]
    tune_device: str | None
    """the device `quarl-edge tune` chose the model on, when the bundle is tune's"""
    tune_threads: int | None
    load_ms: float
    """opening the model in its runtime (hash checks not included)"""
    first_call_ms: float | None
    """the first inference after load (None: not run yet, ``warmup=0``)"""
    warmup_ms: tuple[float, ...]
    """every warm-up inference, in order; the first is the first call"""
    on_nonfinite: str
    on_out_of_range: str
    fp32_model: str | None
    """the model that answers out-of-range observations (``on_out_of_range="fp32"``), else None"""
    device: str | None
    """the device named at load (``device=`` or $QUARL_EDGE_DEVICE), else None"""
    observation_keys: tuple[str, ...] | None = None
    """a Dict observation's keys, in the order they are flattened (``act`` takes the env's dict)"""


class FrameStack:
    """gymnasium's ``FrameStackObservation`` held by the policy: the last ``size`` observations, oldest
    first, padded at an episode's start with its first observation (``reset``) or zeros (``zero``)."""

    def __init__(self, size: int, zero: np.ndarray, padding: str) -> None:
        self.frames = np.repeat(zero[None], size, axis=0)
        self.padding = padding
        self._zero = zero
        self._fresh = True
        self._scratch = self.frames.copy()

    def reset(self) -> None:
        self._fresh = True

    def push(self, obs: np.ndarray) -> np.ndarray:
        if self._fresh:
            self.frames[:-1] = obs if self.padding == "reset" else self._zero
            self._fresh = False
        else:
            self.frames[:-1] = self.frames[1:]  # numpy copies overlapping slices correctly
        self.frames[-1] = obs
        return self.frames

    def peek(self, obs: np.ndarray) -> np.ndarray:
        """What ``push(obs)`` would return, built in a scratch buffer: the stack is left as it is."""
        out = self._scratch
        if self._fresh:
            out[:-1] = obs if self.padding == "reset" else self._zero
        else:
            out[:-1] = self.frames[1:]
        out[-1] = obs
        return out


def _frame_stacks(wrappers: tuple[WrapperConfig, ...], space: Any) -> list[FrameStack]:
    """The policy's frame stacks, innermost first, for the bundle's observation space."""
    fix = "re-export the bundle"
    shape, dtype = tuple(space.shape), np.dtype(space.dtype)
    if len(wrappers) > len(shape):
        raise InputError(f"{len(wrappers)} frame stacks for observations of shape {list(shape)}", fix)
    low, high = bounds(space)
    stacks = []
    for level, w in enumerate(wrappers):
        size, padding = w.kwargs.get("stack_size"), w.kwargs.get("padding_type", "reset")
        lead = len(wrappers) - 1 - level  # stack dimensions added by the stacks outside this one
        if not isinstance(size, int) or isinstance(size, bool) or size != shape[lead]:
            raise InputError(
                f"frame_stack of size {size!r} does not fit observations of shape {list(shape)}", fix
            )
        if padding not in ("reset", "zero"):
            raise InputError(
                f"frame_stack padding {str(padding)[:40]!r} is not supported", "use 'reset' or 'zero'"
            )
        frame_low, frame_high = low[(0,) * (lead + 1)], high[(0,) * (lead + 1)]
        zero = np.clip(np.zeros(frame_low.shape), frame_low, frame_high).astype(dtype)  # gymnasium's "zero"
        stacks.append(FrameStack(size, zero, padding))
    return stacks


class Policy:
    """One model of a bundle, loaded with an explicit thread count. Build it with ``load_policy``."""

    log: FieldLogger | None = None
    """the field log (``load_policy(..., log_dir=...)``: LoggedPolicy), else None"""

    def __init__(
        self,
        bundle: Path,
        manifest: Manifest,
        entry: ModelEntry,
        threads: int = 1,
        chosen_by: str = "argument",
        *,
        on_nonfinite: OnNonfinite = "raise",
        on_out_of_range: OnOutOfRange = "count",
        session_options: OrtOptions | None = None,
        threads_from: str = "argument",
        device: str | None = None,
    ) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise InputError(f"threads must be an integer (got {str(threads)[:24]!r})", "e.g. threads=1")
        if on_nonfinite not in ON_NONFINITE:
            raise InputError(f"on_nonfinite {str(on_nonfinite)[:40]!r} is not one of {', '.join(ON_NONFINITE)}",
                             "e.g. on_nonfinite='hold'")  # fmt: skip
        if on_out_of_range not in ON_OUT_OF_RANGE:
            raise InputError(f"on_out_of_range {str(on_out_of_range)[:40]!r} is not one of "
                             f"{', '.join(ON_OUT_OF_RANGE)}", "e.g. on_out_of_range='count'")  # fmt: skip
        self.bundle, self.manifest, self.entry, self.threads = Path(bundle), manifest, entry, threads
        self.spec = manifest.policy
        self.chosen_by, self.threads_from, self.device = chosen_by, threads_from, device
        self.on_nonfinite, self.on_out_of_range = on_nonfinite, on_out_of_range
        self.model_input_shape = tuple(self.spec.observation_space.shape)
        self.env_config: EnvConfig
        self.env_config, policy_side = split_wrappers(self.spec.env)
        dict_obs = [w for w in policy_side if w.name == DICT_OBS]
        self._dict = DictInput(dict_obs[0].kwargs) if dict_obs else None
        stack_wrappers = tuple(w for w in policy_side if w.name != DICT_OBS)
        self._stacks = _frame_stacks(stack_wrappers, self.spec.observation_space)
        self.observation_shape = self.model_input_shape[len(self._stacks) :]
        rng = CalibrationRange.from_manifest(manifest.calibration, self.observation_shape)
        if on_out_of_range != "count" and rng is None:
            raise InputError(f"on_out_of_range={on_out_of_range!r} needs the calibration range, and this bundle "
                             "records none", "re-export it with this quarl-edge, or use on_out_of_range='count'")  # fmt: skip
        self._guard = InputGuard(self.spec.observation_space, self.observation_shape, rng)
        fp32 = fp32_model(manifest, entry) if on_out_of_range == "fp32" else None
        path = model_path(self.bundle, entry)
        t0 = time.perf_counter_ns()
        self.session: ModelSession = open_model(path, entry.format, threads, session_options)
        self.load_ns = time.perf_counter_ns() - t0
        check_input(self.session, self.spec.observation_space, path)
        self.fp32_entry = fp32
        self._fp32: ModelSession | None = None
        if fp32 is not None:  # opened now: the first out-of-range step must not pay for a load
            if fp32 is entry:
                self._fp32 = self.session
            else:
                fp32_path = verify_model(self.bundle, fp32)
                options = session_options if fp32.format == entry.format else None
                self._fp32 = open_model(fp32_path, fp32.format, threads, options)
                check_input(self._fp32, self.spec.observation_space, fp32_path)
        self._discrete = self.spec.action_space.is_discrete
        self._integer = self.spec.action_space.is_integer
        self._io = ModelInputs(self.spec)
        self._last: Action | None = None
        self._last_batch: np.ndarray | None = None
        self.first_call_ns: int | None = None
        self.warmup_ns: tuple[int, ...] = ()
        self._manifest_sha256 = sha256_file(self.bundle / MANIFEST_NAME)

    # -- the control loop ---------------------------------------------------------------------------

    def reset(self) -> None:
        """Start a new episode: forget the observations of the last one (the frame stack), the recurrent
        state (zeros: what the manifest's ``policy.state`` says at an episode start) and the last action
        (``on_nonfinite="hold"`` never carries an action into a new episode)."""
        for s in self._stacks:
            s.reset()
        self._io.reset()  # a recurrent policy's state: zeros
        self._last = None

    def act(self, obs: ArrayLike, action_mask: ArrayLike | None = None) -> Action:
        """The environment action for the environment's observation (one per step, in order: the
        policy stacks frames itself). ``obs`` is an observation of ``make_env()``'s environment, checked
        first (docs/runtime.md, the input contract): an InputError when it cannot be used as given.
        ``action_mask``: a masked policy's allowed actions now (``env.action_masks()``; None: all)."""
        g = self._guard
        if self._dict is not None:  # the env's dict: each key checked, flattened in the manifest's order
            g.observations += 1
            obs = self._dict.flatten(obs, g.refuse)
            g.observations -= 1  # counted once, by array() below
        x = g.array(obs, self.observation_shape)
        if action_mask is not None or self._io.active:
            self._io.set_mask(action_mask, None)
        session = None
        if not g.ok(x):  # NaN/inf, or outside the calibration range: decided per on_nonfinite/on_out_of_range
            y, session = self._off_nominal(x)
            if y is None:
                return self._hold()
            x = y
        for s in self._stacks:
            x = s.push(x)
        out = (self.run_batch(x[None]) if session is None else self._run_on(session, x[None]))[0]
        action: Action = int(out) if self._discrete else out.astype(self._action_dtype())
        self._last = action
        return action

    def rehearse(self, obs: ArrayLike, action_mask: ArrayLike | None = None) -> None:
        """A throw-away ``act(obs)``: the same code (conversion, checks, frame stack, inference, the action's
        conversion) with no effect: nothing counted in ``stats`` or logged, the frame stack, the recurrent
        state and the last action unchanged. The loop runner calls it before each deadline so that the real
        act() finds its code and data in the caches (runtimes.loop). An observation act() would refuse is
        ignored."""
        g = self._guard
        counts = g.observations, g.refused
        saved = self._io.snapshot()
        try:
            if self._dict is not None:
                obs = self._dict.flatten(obs, g.refuse)
            x = g.array(obs, self.observation_shape)
            if action_mask is not None:
                self._io.set_mask(action_mask, None)
        except InputError:
            self._io.restore(saved)
            return
        finally:
            g.observations, g.refused = counts
        session = self.session
        if not g.ok(x) and self._fp32 is not None:
            session = self._fp32
        for s in self._stacks:
            x = s.peek(x)
        try:
            out = (self.run_batch(x[None]) if session is self.session else self._run_on(session, x[None]))[0]
        finally:
            self._io.restore(saved)
        _ = int(out) if self._discrete else out.astype(np.float32)

    def act_on_input(self, model_input: ArrayLike, action_mask: ArrayLike | None = None) -> Action:
        """The action for one model input (frames already stacked, as the observations of a trace),
        checked as ``act`` checks an observation; the policy's own frame stack is not used."""
        g = self._guard
        x = g.array(model_input, self.model_input_shape, "model input")
        if action_mask is not None or self._io.active:
            self._io.set_mask(action_mask, None)
        session = None
        if not g.ok_all(x):
            y, session = self._off_nominal(x)
            if y is None:
                return self._hold()
            x = y
        return self._action(x, session)

    def act_batch(self, obs: ArrayLike, action_masks: ArrayLike | None = None) -> np.ndarray:
        """The actions for N model inputs at once (``obs[N, ...]``, e.g. a VecEnv's observations), the
        same as N ``act_on_input`` calls, in one inference: an int64 array ``[N]`` for a discrete action
        space, float32 ``[N, *action_shape]`` for a continuous one. Every row is checked as ``act``
        checks an observation. The policy's own frame stack is not used: for a frame-stacked policy each
        row is a stacked observation (as a VecFrameStack gives). Under ``on_nonfinite="hold"`` a row with
        NaN/inf gets that row's action of the previous batch (of the same N)."""
        g = self._guard
        x = g.array(obs, self.model_input_shape, "batch", batch=True)
        n = x.shape[0]
        if action_masks is not None or self._io.active:
            self._io.set_mask(action_masks, n)
        if n == 0:
            return np.empty((0, *self._action_shape()), self._action_dtype())
        if g.ok_all(x):
            out = self._actions(self.run_batch(x), n)
        else:
            out = self._off_nominal_batch(x, n)
        self._last_batch = out
        return out

    def _run_on(self, session: ModelSession, batch: np.ndarray) -> np.ndarray:
        return self._io.run(session, batch) if self._io.active else session.run(batch)

    def _action(self, x: np.ndarray, session: ModelSession | None) -> Action:
        out = (self.run_batch(x[None]) if session is None else self._run_on(session, x[None]))[0]
        action: Action = int(out) if self._discrete else out.astype(self._action_dtype())
        self._last = action
        return action

    def _hold(self) -> Action:
        self._guard.held += 1
        last = self._last
        return last.copy() if isinstance(last, np.ndarray) else last  # type: ignore[return-value]

    def _off_nominal(self, x: np.ndarray) -> tuple[np.ndarray | None, ModelSession | None]:
        """One input that failed the fast check: (None, None) to hold the last action; else the input to
        run (clipped under "clip") and the session to run it on (None: the policy's own)."""
        g = self._guard
        nonfinite, outside = g.screen(x, 1)
        if nonfinite[0]:
            if self.on_nonfinite == "hold" and self._last is not None:
                return None, None
            raise g.refuse(
                "observation holds NaN or inf" + self._no_hold("earlier action"), self._nonfinite_fix()
            )
        if outside[0] and self.on_out_of_range == "clip":
            g.clipped += 1
            return g.clip(x), None
        if outside[0] and self.on_out_of_range == "fp32":
            g.fp32_steps += 1
            return x, self._fp32
        return x, None

    def _off_nominal_batch(self, x: np.ndarray, n: int) -> np.ndarray:
        g = self._guard
        nonfinite, outside = g.screen(x, n)
        last = self._last_batch
        if nonfinite.any():
            if self.on_nonfinite != "hold" or last is None or len(last) != n:
                row = int(np.argmax(nonfinite))
                raise g.refuse(f"row {row} of the batch holds NaN or inf" + self._no_hold(f"previous batch of {n}"),
                               self._nonfinite_fix(), n)  # fmt: skip
            g.held += int(nonfinite.sum())
        out: np.ndarray = np.empty((n, *self._action_shape()), self._action_dtype())
        if last is not None and nonfinite.any():
            out[nonfinite] = last[nonfinite]
        rows, fp32_rows = ~nonfinite, np.zeros(n, bool)
        if self.on_out_of_range == "clip" and outside.any():
            g.clipped += int(outside.sum())
            x = x.copy() if x.dtype.kind == "f" else x.astype(np.float64)
            x[outside] = g.clip(x[outside])
        elif self.on_out_of_range == "fp32" and outside.any():
            g.fp32_steps += int(outside.sum())
            fp32_rows, rows = outside, rows & ~outside
            assert self._fp32 is not None  # opened at load for on_out_of_range="fp32"
            out[fp32_rows] = self._actions(self._run_on(self._fp32, x[fp32_rows]), int(fp32_rows.sum()))
        if rows.any():
            out[rows] = self._actions(self.run_batch(x[rows]), int(rows.sum()))
        return out

    def _no_hold(self, what: str) -> str:
        return f", and there is no {what} to hold" if self.on_nonfinite == "hold" else ""

    def _nonfinite_fix(self) -> str:
        if self.on_nonfinite == "hold":
            return "act on a finite observation first: a held action repeats one the policy gave"
        return "check the sensor, or load with on_nonfinite='hold' to repeat the last action instead"

    def _action_shape(self) -> tuple[int, ...]:
        return () if self._discrete else tuple(self.spec.action_space.shape)

    def _action_dtype(self) -> type:
        return np.int64 if self._integer else np.float32

    def _actions(self, raw: np.ndarray, n: int) -> np.ndarray:
        return raw.astype(self._action_dtype(), copy=False).reshape(n, *self._action_shape())

    def zero_observation(self) -> Any:
        """An observation of zeros in the form ``act`` takes (a dict for a Dict observation), e.g. to check
        that a deployed policy loads and acts."""
        dtype = np.dtype(self.spec.observation_space.dtype)
        if self._dict is not None:
            return {
                k: np.zeros(s, np.float32) for k, s in zip(self._dict.keys, self._dict.shapes, strict=True)
            }
        return np.zeros(self.observation_shape, dtype)

    @property
    def recurrent_state(self) -> tuple[np.ndarray, ...]:
        """A recurrent policy's state as the next ``act`` feeds it (zeros after ``reset()``), a copy;
        () for a feed-forward policy. Its names and shapes: ``policy.spec.state``."""
        return self._io.state if self._io.state_specs else ()

    @property
    def action_mask_size(self) -> int | None:
        """A masked policy's mask length (one entry per logit: ``act(obs, action_mask=...)``), else None."""
        return self._io.mask_len

    @property
    def stats(self) -> PolicyStats:
        """What ``act``, ``act_on_input`` and ``act_batch`` were given since load: refused observations,
        NaN/inf ones, those outside the calibration range (per feature), clipped, answered by fp32."""
        return self._guard.stats()

    def run_batch(self, batch: np.ndarray, action_masks: np.ndarray | None = None) -> np.ndarray:
        """The model's raw output for a batch of model inputs, unchecked (``act_batch`` is the checked
        call); the first call after load is timed. ``action_masks`` [N, logits]: a masked policy's."""
        if action_masks is not None:
            self._io.set_mask(action_masks, len(batch))
        if self._io.active:
            return self._run_timed(lambda: self._io.run(self.session, batch))
        if self.first_call_ns is None:
            t0 = time.perf_counter_ns()
            out = self.session.run(batch)
            self.first_call_ns = time.perf_counter_ns() - t0
            return out
        return self.session.run(batch)

    def _run_timed(self, run: Callable[[], np.ndarray]) -> np.ndarray:
        if self.first_call_ns is None:
            t0 = time.perf_counter_ns()
            out = run()
            self.first_call_ns = time.perf_counter_ns() - t0
            return out
        return run()

    @property
    def log_stats(self) -> LogStats | None:
        """The field log so far (``load_policy(..., log_dir=...)``), else None."""
        return self.log.stats() if self.log is not None else None

    def close(self) -> None:
        """Write the field log's open chunk and stop its writer (nothing to do without a log_dir; also
        done at exit). The policy can still act, unlogged."""
        if self.log is not None:
            self.log.close()

    def __enter__(self) -> Policy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def make_env(self, render_mode: str | None = None) -> Any:
        """The bundle's environment (gymnasium, with the preprocessing that changes the environment,
        e.g. Atari frame skipping) whose observations ``act`` takes."""
        return make_env(self.env_config, render_mode)

    # -- load-time ----------------------------------------------------------------------------------

    def warm_up(self, calls: int = WARMUP_CALLS, model_input: np.ndarray | None = None) -> None:
        """Run ``calls`` inferences on ``model_input`` (default: zeros), each timed, so that the first
        real call is not the slow one (the fp32 model of on_out_of_range="fp32" too, untimed). The frame
        stack is left as it was."""
        space = self.spec.observation_space
        x = np.zeros(space.shape, np.dtype(space.dtype)) if model_input is None else np.asarray(model_input)
        batch = np.ascontiguousarray(x[None])
        times = []
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            self.run_batch(batch)
            times.append(time.perf_counter_ns() - t0)
            if self._fp32 is not None and self._fp32 is not self.session:
                self._run_on(self._fp32, batch)
        self.warmup_ns = self.warmup_ns + tuple(times)
        self._io.reset()  # warm-up calls must not leave a recurrent state behind

    @property
    def info(self) -> PolicyInfo:
        runtime, _, version = self.session.runtime.rpartition(" ")
        tune = self.manifest.tune if self.chosen_by == "tune" else None
        a = self.spec.action_space
        return PolicyInfo(
            bundle=str(self.bundle),
            model=self.entry.name,
            chosen_by=self.chosen_by,
            format=self.entry.format,
            precision=self.entry.precision,
            runtime=runtime or version,
            runtime_version=version if runtime else "",
            threads=self.threads,
            threads_from=self.threads_from,
            file=self.entry.file,
            sha256=self.entry.sha256,
            size_bytes=self.entry.size_bytes,
            manifest_sha256=self._manifest_sha256,
            policy=self.spec.name,
            algo=self.spec.algo,
            env_id=self.spec.env.id,
            observation_shape=self.observation_shape,
            model_input_shape=self.model_input_shape,
            frame_stack=int(np.prod(self.model_input_shape[: len(self._stacks)])) if self._stacks else 1,
            discrete_actions=a.n if a.is_discrete else None,
            action_shape=tuple(a.shape),
            tune_device=tune.device if tune else None,
            tune_threads=tune.threads if tune else None,
            load_ms=self.load_ns / 1e6,
            first_call_ms=None if self.first_call_ns is None else self.first_call_ns / 1e6,
            warmup_ms=tuple(t / 1e6 for t in self.warmup_ns),
            on_nonfinite=self.on_nonfinite,
            on_out_of_range=self.on_out_of_range,
            fp32_model=None if self.fp32_entry is None else self.fp32_entry.name,
            device=self.device,
            observation_keys=None if self._dict is None else self._dict.keys,
        )
