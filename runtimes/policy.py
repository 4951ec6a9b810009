"""The runtime API: one model of a bundle in the user's own control loop.

    from quarl_edge.runtimes import load_policy
    policy = load_policy("bundles/cartpole-ppo")   # hashes verified, warmed up
    policy.reset()                                  # at every episode start
    action = policy.act(obs)                        # the env's observation in, the env's action out

Device side: numpy and the model's runtime only (never torch or TensorFlow). The bench runner's
closed-loop episodes go through this same ``Policy.act`` (runtimes.runner), so what a bench measured is
what a control loop runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from .adapters import ModelSession, check_input, open_model
from .envs import bounds, make_env, split_wrappers
from .errors import InputError
from .fsutil import sha256_file
from .manifest import MANIFEST_NAME, Manifest, ModelEntry, load_manifest, model_path, verify_model
from .spec import EnvConfig, WrapperConfig

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


class FrameStack:
    """gymnasium's ``FrameStackObservation`` held by the policy: the last ``size`` observations, oldest
    first, padded at an episode's start with its first observation (``reset``) or zeros (``zero``)."""

    def __init__(self, size: int, zero: np.ndarray, padding: str) -> None:
        self.frames = np.repeat(zero[None], size, axis=0)
        self.padding = padding
        self._zero = zero
        self._fresh = True

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

    def __init__(
        self,
        bundle: Path,
        manifest: Manifest,
        entry: ModelEntry,
        threads: int = 1,
        chosen_by: str = "argument",
    ) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int):
            raise InputError(f"threads must be an integer (got {threads!r})", "e.g. threads=1")
        self.bundle, self.manifest, self.entry, self.threads = Path(bundle), manifest, entry, threads
        self.spec = manifest.policy
        self.chosen_by = chosen_by
        path = model_path(self.bundle, entry)
        t0 = time.perf_counter_ns()
        self.session: ModelSession = open_model(path, entry.format, threads)
        self.load_ns = time.perf_counter_ns() - t0
        check_input(self.session, self.spec.observation_space, path)
        self.env_config: EnvConfig
        self.env_config, stack_wrappers = split_wrappers(self.spec.env)
        self._stacks = _frame_stacks(stack_wrappers, self.spec.observation_space)
        self.model_input_shape = tuple(self.spec.observation_space.shape)
        self.observation_shape = self.model_input_shape[len(self._stacks) :]
        self._discrete = self.spec.action_space.is_discrete
        self.first_call_ns: int | None = None
        self.warmup_ns: tuple[int, ...] = ()
        self._manifest_sha256 = sha256_file(self.bundle / MANIFEST_NAME)

    # -- the control loop ---------------------------------------------------------------------------

    def reset(self) -> None:
        """Start a new episode: forget the observations of the last one (the frame stack)."""
        for s in self._stacks:
            s.reset()

    def act(self, obs: ArrayLike) -> Action:
        """The environment action for the environment's observation (one per step, in order: the
        policy stacks frames itself). ``obs`` is an observation of ``make_env()``'s environment."""
        x = np.asarray(obs)
        if x.shape != self.observation_shape:
            raise InputError(
                f"observation of shape {list(x.shape)}, the policy takes {list(self.observation_shape)}",
                "pass one observation of the environment policy.make_env() builds",
            )
        for s in self._stacks:
            x = s.push(x)
        return self.act_on_input(x)

    def act_on_input(self, x: ArrayLike) -> Action:
        """The action for one model input (frames already stacked, as the observations of a trace)."""
        out = self.run_batch(np.asarray(x)[None])[0]
        return int(out) if self._discrete else out.astype(np.float32)

    def run_batch(self, batch: np.ndarray) -> np.ndarray:
        """The model's raw output for a batch of model inputs; the first call after load is timed."""
        if self.first_call_ns is None:
            t0 = time.perf_counter_ns()
            out = self.session.run(batch)
            self.first_call_ns = time.perf_counter_ns() - t0
            return out
        return self.session.run(batch)

    def make_env(self, render_mode: str | None = None) -> Any:
        """The bundle's environment (gymnasium, with the preprocessing that changes the environment,
        e.g. Atari frame skipping) whose observations ``act`` takes."""
        return make_env(self.env_config, render_mode)

    # -- load-time ----------------------------------------------------------------------------------

    def warm_up(self, calls: int = WARMUP_CALLS, model_input: np.ndarray | None = None) -> None:
        """Run ``calls`` inferences on ``model_input`` (default: zeros), each timed, so that the first
        real call is not the slow one. The frame stack is left as it was."""
        space = self.spec.observation_space
        x = np.zeros(space.shape, np.dtype(space.dtype)) if model_input is None else np.asarray(model_input)
        batch = np.ascontiguousarray(x[None])
        times = []
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            self.run_batch(batch)
            times.append(time.perf_counter_ns() - t0)
        self.warmup_ns = self.warmup_ns + tuple(times)

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
            tune_device=str(tune.get("device")) if tune and tune.get("device") is not None else None,
            tune_threads=tune.get("threads") if tune and isinstance(tune.get("threads"), int) else None,
            load_ms=self.load_ns / 1e6,
            first_call_ms=None if self.first_call_ns is None else self.first_call_ns / 1e6,
            warmup_ms=tuple(t / 1e6 for t in self.warmup_ns),
        )


def choose_model(manifest: Manifest, model: str | None, bundle: Path) -> tuple[ModelEntry, str]:
    """The model to load and why: ``model`` when given, else tune's choice, else the only model that is
    not the fp32 reference. Several candidates and no choice: an InputError listing them."""
    if model is not None:
        return manifest.model(model), "argument"
    names = [m.name for m in manifest.models]
    chosen = (manifest.tune or {}).get("chosen")
    if isinstance(chosen, str) and chosen in names:
        return manifest.model(chosen), "tune"
    if len(manifest.models) == 1:
        return manifest.models[0], "only model"
    ref = manifest.reference()
    others = [m for m in manifest.models if m is not ref]
    if len(others) == 1:
        return others[0], "only model besides the fp32 reference"
    if not names:
        raise InputError(f"bundle {str(bundle)!r} has no models", "re-export it with `quarl-edge export`")
    raise InputError(
        f"bundle {str(bundle)!r} has {len(names)} models and no tune choice: {', '.join(names)}",
        f"pick one, e.g. load_policy({str(bundle)!r}, model={names[-1]!r})",
    )


def load_policy(
    bundle: str | Path,
    model: str | None = None,
    threads: int = 1,
    *,
    warmup: int = WARMUP_CALLS,
    require_signature: bool = False,
) -> Policy:
    """Load one model of a bundle for a control loop: its sha256 checked against the manifest, opened
    with ``threads`` threads, and warmed up with ``warmup`` inferences on a zero observation.

    ``model``: a model name of the bundle; default: the model `quarl-edge tune` chose when the bundle
    is tune's, else the bundle's only model besides the fp32 reference (a bundle with several needs
    ``model=``). ``require_signature``: refuse a bundle that is not signed by a key this machine
    trusts (a machine with trusted keys requires that anyway: docs/runtime.md). Errors are
    ``QuarlError``s whose ``str()`` is one line: the problem and the fix.
    """
    bundle = Path(bundle)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise InputError(f"warmup must be an integer >= 0 (got {warmup!r})", f"e.g. warmup={WARMUP_CALLS}")
    manifest = load_manifest(bundle, verify=False, require_signature=require_signature)
    entry, why = choose_model(manifest, model, bundle)
    verify_model(bundle, entry)
    policy = Policy(bundle, manifest, entry, threads, chosen_by=why)
    policy.warm_up(warmup)
    return policy
