"""ActorQ actors: Ray actors that collect experience with a quantized copy of the policy.

`Actor` is DQN's (epsilon-greedy over the Q-network); `ContinuousActor` is D4PG's (a deterministic
actor network plus Gaussian exploration noise, emitting n-step transitions).

Each `collect` call runs `steps` environment steps and returns the transitions as numpy arrays (the
learner inserts them into its replay buffer), the finished episodes, and where the actor's time went.
The learner hands every call the newest broadcast as ``[ObjectRef]`` (a list, so Ray does not resolve
it); the actor only fetches it once ``update_period`` of its steps have passed since its last pull.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from quarl_edge.actorq.broadcast import graph_name, int8_evidence
from quarl_edge.actorq.result import RoleTime, Throughput
from quarl_edge.actorq.sessions import open_model
from quarl_edge.actorq.throughput import inference_throughput
from quarl_edge.policy.registry import make

ACTOR_FIELDS = ("inference", "env_step", "record", "weight_pull", "deserialize", "weight_load", "idle")
LEARNER_FIELDS = (
    "receive",
    "replay_insert",
    "replay_sample",
    "learner_update",
    "quantize_broadcast",
    "checkpoint",
    "bookkeeping",
    "idle",
)


@dataclass(frozen=True)
class Batch:
    """What one ``collect`` call sends the learner: the transitions as arrays (its replay buffer inserts
    them: obs, actions, rewards, next_obs, and dones or D4PG's discounts), the episodes that ended, and
    where the actor's time went."""

    actor_id: int
    env_steps: int
    """environment steps taken (D4PG's n-step transitions are not one per step)"""
    transitions: dict[str, np.ndarray]
    episodes: list[tuple[float, int]]
    """(return, length) of each episode that ended in this call"""
    version: int
    """the broadcast the actor ran"""
    breakdown: RoleTime


@dataclass(frozen=True)
class ActorInfo:
    """What an actor is running (``inspect``): the tests' evidence that int8 actors run int8."""

    precision: str
    runtime: str
    version: int
    """the broadcast it last pulled"""
    steps: int
    graph: str | None = None
    """``qnet`` or ``actor``: what its payload holds (None: no payload pulled yet)"""
    evidence: dict[str, int] | None = None
    """quantize / dequantize ops and int8 vs float weight matrices of its payload (broadcast.int8_evidence)"""


class LapTimer:
    """Attributes every moment since the previous lap to the named field, so fields sum to wall time;
    also the CPU seconds this process has used since (energy.py)."""

    def __init__(self, fields: tuple[str, ...]) -> None:
        self.start = self.last = time.perf_counter()
        self.cpu_start = time.process_time()
        self.seconds = dict.fromkeys(fields, 0.0)

    def lap(self, field: str) -> float:
        now = time.perf_counter()
        dt = now - self.last
        self.seconds[field] += dt
        self.last = now
        return dt

    def cpu_s(self) -> float:
        """User + system CPU seconds of this process (all its threads) since the timer started."""
        return time.process_time() - self.cpu_start

    def report(self) -> RoleTime:
        wall = time.perf_counter() - self.start
        return RoleTime(
            wall_s=wall, seconds=dict(self.seconds), sum_s=sum(self.seconds.values()), cpu_s=self.cpu_s()
        )


class Actor:
    """One experience collector (wrapped with ``ray.remote`` by the learner)."""

    def __init__(self, env_id: str, seed: int, actor_id: int) -> None:
        self.actor_id = actor_id
        self.env = make(env_id)  # with the registry's preprocessing (DM Control: flattened Dict)
        self.rng = np.random.default_rng(seed)
        self.obs, _ = self.env.reset(seed=seed)
        self.episode_return, self.episode_len = 0.0, 0
        self.session: Any = None
        self.precision = "none"
        self.runtime = "none"
        self.version = -1
        self.since_pull = 0
        self.steps = 0
        self._last_model: bytes | None = None
        self.timer = LapTimer(ACTOR_FIELDS)

    def _pull(self, box: list[Any]) -> None:
        import ray

        payload = ray.get(box[0])
        self.timer.lap("weight_pull")
        if payload.runtime == "onnx":
            import onnx

            onnx.load_model_from_string(payload.model)  # parse + validate the bytes before loading
        # a TFLite flatbuffer is read in place: the interpreter's verifier runs inside weight_load
        self.timer.lap("deserialize")
        self.session = open_model(payload.runtime, payload.model)
        self.precision, self.version, self.since_pull = payload.precision, payload.version, 0
        self.runtime = payload.runtime
        self._last_model = payload.model
        self.timer.lap("weight_load")

    def collect(self, steps: int, epsilon: float, version: int, box: list[Any], update_period: int) -> Batch:
        t = self.timer
        t.lap("idle")  # since the previous call returned: waiting for the learner
        if self.session is None or (self.since_pull >= update_period and version > self.version):
            self._pull(box)
        n_obs = int(np.prod(self.env.observation_space.shape or (1,)))
        obs_buf = np.empty((steps, n_obs), np.float32)
        next_buf = np.empty((steps, n_obs), np.float32)
        act_buf = np.empty(steps, np.int64)
        rew_buf = np.empty(steps, np.float32)
        done_buf = np.empty(steps, np.float32)
        episodes: list[tuple[float, int]] = []
        n_actions = int(self.env.action_space.n)  # type: ignore[attr-defined]
        for i in range(steps):
            obs = np.asarray(self.obs, np.float32).reshape(1, -1)
            if self.rng.random() < epsilon:
                action = int(self.rng.integers(n_actions))
            else:
                action = int(np.argmax(self.session(obs)[0]))
            t.lap("inference")
            next_obs, reward, terminated, truncated, _ = self.env.step(action)
            t.lap("env_step")
            obs_buf[i], next_buf[i], act_buf[i] = obs[0], next_obs, action
            rew_buf[i], done_buf[i] = reward, float(terminated)  # truncation is not a terminal state
            self.episode_return += float(reward)
            self.episode_len += 1
            self.since_pull += 1
            self.steps += 1
            if terminated or truncated:
                episodes.append((self.episode_return, self.episode_len))
                self.episode_return, self.episode_len = 0.0, 0
                next_obs, _ = self.env.reset()
            self.obs = next_obs
            t.lap("record")
            if self.since_pull >= update_period and version > self.version:
                self._pull(box)
        arrays: dict[str, np.ndarray] = {
            "obs": obs_buf,
            "next_obs": next_buf,
            "actions": act_buf,
            "rewards": rew_buf,
            "dones": done_buf,
        }
        return Batch(self.actor_id, steps, arrays, episodes, self.version, t.report())

    def inspect(self) -> ActorInfo:
        """What this actor is running: precision, broadcast version and the session's graph evidence."""
        model = self._last_model
        return ActorInfo(self.precision, self.runtime, self.version, self.steps,
                         None if model is None else graph_name(self.runtime, model),
                         None if model is None else int8_evidence(self.runtime, model))  # fmt: skip

    def benchmark(self, boxes: dict[str, list[Any]], calls: int | None = None) -> Throughput:
        """Inference throughput of each broadcast payload in this actor's process (one thread, batch 1)."""
        import ray

        payloads = {p: ray.get(b[0]) for p, b in boxes.items()}
        n_obs = int(np.prod(self.env.observation_space.shape or (1,)))
        obs = self.rng.standard_normal((64, n_obs)).astype(np.float32)
        models = {p: x.model for p, x in payloads.items()}
        runtimes = {p: x.runtime for p, x in payloads.items()}
        return replace(inference_throughput(models, obs, calls, runtimes=runtimes), actor=self.actor_id)


class ContinuousActor(Actor):
    """D4PG's collector: action = clip(policy(obs) + N(0, (noise * half range)^2)), n-step transitions.

    A transition is (obs_t, a_t, sum_k gamma^k r_t+k, obs_t+n, gamma^n or 0 if the episode terminated);
    at an episode's end the shorter tails are flushed, so every step appears as a start exactly once.
    """

    def __init__(self, env_id: str, seed: int, actor_id: int, n_step: int, gamma: float) -> None:
        super().__init__(env_id, seed, actor_id)
        self.n_step, self.gamma = n_step, gamma
        space = self.env.action_space
        self.low, self.high = space.low.astype(np.float32), space.high.astype(np.float32)  # type: ignore[attr-defined]
        self.window: deque[tuple[np.ndarray, np.ndarray, float]] = deque()

    def _emit(self, out: list[tuple], next_obs: np.ndarray, terminated: bool) -> None:
        obs, action, _ = self.window[0]
        ret = sum(self.gamma**k * r for k, (_, _, r) in enumerate(self.window))
        discount = 0.0 if terminated else self.gamma ** len(self.window)
        out.append((obs, action, ret, next_obs, discount))
        self.window.popleft()

    def collect(self, steps: int, noise: float, version: int, box: list[Any], update_period: int) -> Batch:
        t = self.timer
        t.lap("idle")
        if self.session is None or (self.since_pull >= update_period and version > self.version):
            self._pull(box)
        out: list[tuple] = []
        episodes: list[tuple[float, int]] = []
        half = (self.high - self.low) / 2
        for _ in range(steps):
            obs = np.asarray(self.obs, np.float32).reshape(1, -1)
            action = self.session(obs)[0]
            t.lap("inference")
            action = np.clip(action + self.rng.normal(0.0, noise, action.shape) * half, self.low, self.high)
            action = action.astype(np.float32)
            next_obs, reward, terminated, truncated, _ = self.env.step(action)
            t.lap("env_step")
            self.window.append((obs[0], action, float(reward)))
            next_obs = np.asarray(next_obs, np.float32)
            if len(self.window) == self.n_step:
                self._emit(out, next_obs, bool(terminated))
            self.episode_return += float(reward)
            self.episode_len += 1
            self.since_pull += 1
            self.steps += 1
            if terminated or truncated:
                while self.window:
                    self._emit(out, next_obs, bool(terminated))
                episodes.append((self.episode_return, self.episode_len))
                self.episode_return, self.episode_len = 0.0, 0
                next_obs, _ = self.env.reset()
            self.obs = next_obs
            t.lap("record")
            if self.since_pull >= update_period and version > self.version:
                self._pull(box)
        n_obs, n_act = int(np.prod(self.env.observation_space.shape or (1,))), len(self.low)
        cols: list[Any] = list(zip(*out, strict=True)) if out else [[]] * 5
        arrays: dict[str, np.ndarray] = {
            "obs": np.asarray(cols[0], np.float32).reshape(-1, n_obs),
            "actions": np.asarray(cols[1], np.float32).reshape(-1, n_act),
            "rewards": np.asarray(cols[2], np.float32),
            "next_obs": np.asarray(cols[3], np.float32).reshape(-1, n_obs),
            "discounts": np.asarray(cols[4], np.float32),
        }
        return Batch(self.actor_id, steps, arrays, episodes, self.version, t.report())
