"""ActorQ DQN: an fp32 learner with Ray actors running fp32 / fp16 / int8 copies of the Q-network.

Reads top to bottom like CleanRL's dqn.py: Args, the Q-network, the replay buffer, then the loop. The
learner owns the replay buffer; actors (quarl_edge/actorq/actors.py) return batches of transitions
through Ray. Every `broadcast_every` learner updates the weights are quantized ONCE to the actors'
precision and `ray.put` once for all actors; each actor pulls the newest broadcast after
`update_period` of its own steps. Every role records where its time goes (LapTimer); the run writes
log.json, breakdown.png and curve.png to `out`, and a checkpoint the next run resumes from.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from quarl_edge.actorq.actors import LEARNER_FIELDS, Actor, LapTimer
from quarl_edge.actorq.broadcast import PRECISIONS, quantize_broadcast
from quarl_edge.actorq.throughput import actor_throughput
from quarl_edge.runtimes.errors import InputError, MissingDependencyError

ALGOS = ("dqn", "d4pg")
LOG_VERSION = 1


@dataclass(frozen=True)
class Args:
    env: str = "CartPole-v1"
    """gymnasium id of a task with a discrete action space (CartPole-v1, Acrobot-v1, MountainCar-v0)"""
    out: Path = Path("runs/actorq")
    """folder for log.json, breakdown.png, curve.png and checkpoint/"""
    algo: str = "dqn"
    """learner: dqn here (d4pg: quarl_edge/actorq/d4pg.py)"""
    actors: int = 2
    """number of Ray actors collecting experience"""
    actor_precision: str = "int8"
    """precision of the actors' policy copy: fp32, fp16 or int8 (ONNX Runtime QDQ S8S8)"""
    update_period: int = 100
    """actor steps between weight pulls (an actor pulls only when a newer broadcast exists)"""
    steps: int = 50_000
    """total environment steps over all actors"""
    seed: int = 0
    """seed of the learner, the actors (seed + actor id) and their environments"""
    address: str | None = None
    """Ray cluster address; None starts a local Ray with one CPU per actor"""
    resume: bool = False
    """continue from out/checkpoint when it exists"""
    hidden: tuple[int, ...] = (120, 84)
    """hidden layer sizes of the Q-network MLP"""
    learning_rate: float = 2.5e-4
    """Adam learning rate"""
    buffer_size: int = 10_000
    """replay buffer capacity (transitions)"""
    gamma: float = 0.99
    """discount factor"""
    target_network_frequency: int = 500
    """learner updates between target-network copies"""
    batch_size: int = 128
    """transitions per learner update"""
    start_e: float = 1.0
    """initial exploration epsilon"""
    end_e: float = 0.05
    """final exploration epsilon"""
    exploration_fraction: float = 0.5
    """fraction of `steps` over which epsilon decays linearly"""
    learning_starts: int = 1_000
    """environment steps before the first learner update"""
    train_frequency: int = 10
    """environment steps per learner update"""
    chunk: int = 64
    """environment steps an actor runs per Ray call (one batch of transitions)"""
    broadcast_every: int = 25
    """learner updates between weight broadcasts"""
    checkpoint_every: int = 10_000
    """environment steps between checkpoints (and one at the end)"""
    calibration_size: int = 256
    """replay observations that calibrate each int8 broadcast"""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    """free-form notes copied into log.json"""

    def validate(self) -> None:
        """Raise InputError for unusable values, before Ray or any environment starts."""
        if self.algo not in ALGOS:
            raise InputError(f"unknown --algo {self.algo!r}", f"known: {', '.join(ALGOS)}")
        if self.algo != "dqn":
            raise InputError(f"quarl_edge.actorq.dqn runs --algo dqn, not {self.algo!r}", "see actorq.d4pg")
        if self.actors < 1:
            raise InputError(f"--actors must be at least 1 (got {self.actors})", "e.g. --actors 2")
        if self.actor_precision not in PRECISIONS:
            raise InputError(
                f"unknown --actor-precision {self.actor_precision!r}", f"known: {', '.join(PRECISIONS)}"
            )
        for name in ("update_period", "steps", "chunk", "broadcast_every", "batch_size", "buffer_size"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if not self.hidden or min(self.hidden) < 1:
            raise InputError(f"hidden sizes must be positive (got {self.hidden})", "e.g. --hidden 120,84")
        import gymnasium as gym

        try:
            env = gym.make(self.env)
        except Exception as e:  # gymnasium raises several types for unknown or broken ids
            raise InputError(f"cannot make environment {self.env!r}: {e}", "e.g. --env CartPole-v1") from None
        space = env.action_space
        env.close()
        if not isinstance(space, gym.spaces.Discrete):
            raise InputError(f"DQN needs a discrete action space; {self.env} has {space}", "e.g. CartPole-v1")


class QNetwork(nn.Module):
    def __init__(self, n_obs: int, n_actions: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for h in hidden:
            layers += [nn.Linear(n_obs, h), nn.ReLU()]
            n_obs = h
        self.network = nn.Sequential(*layers, nn.Linear(n_obs, n_actions))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)


class ReplayBuffer:
    """Uniform ring buffer of (obs, action, reward, next_obs, done), filled with the actors' batches."""

    def __init__(self, capacity: int, n_obs: int) -> None:
        self.obs = np.zeros((capacity, n_obs), np.float32)
        self.next_obs = np.zeros((capacity, n_obs), np.float32)
        self.actions = np.zeros(capacity, np.int64)
        self.rewards = np.zeros(capacity, np.float32)
        self.dones = np.zeros(capacity, np.float32)
        self.capacity, self.pos, self.size = capacity, 0, 0

    def add_batch(self, b: dict[str, Any]) -> None:
        idx = (self.pos + np.arange(len(b["actions"]))) % self.capacity
        self.obs[idx], self.next_obs[idx], self.actions[idx] = b["obs"], b["next_obs"], b["actions"]
        self.rewards[idx], self.dones[idx] = b["rewards"], b["dones"]
        self.pos = int((self.pos + len(idx)) % self.capacity)
        self.size = min(self.size + len(idx), self.capacity)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[torch.Tensor, ...]:
        i = rng.integers(0, self.size, n)
        return tuple(
            torch.from_numpy(a[i]) for a in (self.obs, self.actions, self.rewards, self.next_obs, self.dones)
        )

    def arrays(self) -> dict[str, np.ndarray]:
        n = self.size
        return {k: getattr(self, k)[:n] for k in ("obs", "next_obs", "actions", "rewards", "dones")}


def linear_schedule(start_e: float, end_e: float, duration: int, t: int) -> float:
    return max(end_e, start_e + (end_e - start_e) * t / max(duration, 1))


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def save_checkpoint(d: Path, q: QNetwork, opt: torch.optim.Optimizer, rb: ReplayBuffer, state: dict) -> None:
    d.mkdir(parents=True, exist_ok=True)
    torch.save({"q": q.state_dict(), "opt": opt.state_dict()}, d / "model.pt.tmp")
    os.replace(d / "model.pt.tmp", d / "model.pt")
    with open(d / "replay.npz.tmp", "wb") as f:
        np.savez(f, **rb.arrays())  # type: ignore[arg-type]
    os.replace(d / "replay.npz.tmp", d / "replay.npz")
    _write_json(d / "state.json", state)  # last: a checkpoint is complete once state.json names its step


def train(args: Args, on_chunk: Callable[[int, list[Any]], None] | None = None) -> dict[str, Any]:
    """Run ActorQ DQN; returns the log also written to ``args.out / 'log.json'``.

    ``on_chunk(env_steps, actor_handles)`` is called after every received batch (tests kill actors).
    """
    args.validate()
    try:
        import ray
        from ray.exceptions import RayActorError
    except ImportError:
        raise MissingDependencyError("ActorQ runs on Ray", "pip install 'quarl-edge[actorq]'") from None
    import gymnasium as gym

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    probe = gym.make(args.env)
    n_obs, n_actions = int(np.prod(probe.observation_space.shape or (1,))), int(probe.action_space.n)  # type: ignore[attr-defined]
    probe.close()

    q_network = QNetwork(n_obs, n_actions, args.hidden)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)
    target_network = QNetwork(n_obs, n_actions, args.hidden)
    rb = ReplayBuffer(args.buffer_size, n_obs)
    global_step, updates, version, curve, events = 0, 0, 0, [], []
    ckpt = args.out / "checkpoint"
    if args.resume and (ckpt / "state.json").is_file():
        saved = torch.load(ckpt / "model.pt", map_location="cpu", weights_only=True)
        q_network.load_state_dict(saved["q"])
        optimizer.load_state_dict(saved["opt"])
        with np.load(ckpt / "replay.npz", allow_pickle=False) as z:
            rb.add_batch({k: z[k] for k in z.files})
        state = json.loads((ckpt / "state.json").read_text())
        global_step, updates, version = state["global_step"], state["updates"], state["version_broadcast"]
        curve = state.get("curve", [])
        events.append({"event": "resumed", "env_steps": global_step})
    target_network.load_state_dict(q_network.state_dict())
    args.out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address=args.address, num_cpus=None if args.address else args.actors,
                 include_dashboard=False, log_to_driver=False, configure_logging=False)  # fmt: skip
    ray_init_s = time.perf_counter() - t0
    RemoteActor = ray.remote(num_cpus=1)(Actor)
    next_id = 0

    def start_actor() -> Any:
        nonlocal next_id
        handle = RemoteActor.remote(args.env, args.seed * 1000 + next_id, next_id)  # type: ignore[attr-defined]
        events.append({"event": "actor_started", "actor": next_id, "env_steps": global_step})
        next_id += 1
        return handle

    def broadcast() -> list[Any]:
        calib = rb.obs[rng.integers(0, rb.size, args.calibration_size)] if rb.size else None
        payload = quantize_broadcast(q_network.state_dict(), args.actor_precision, calib, version)
        payload_bytes.append(payload.nbytes)
        return [ray.put(payload)]  # once for all actors; the list keeps Ray from resolving it per call

    payload_bytes: list[int] = []
    actor_reports: dict[int, dict[str, Any]] = {}
    try:
        actors = [start_actor() for _ in range(args.actors)]
        slot_ids = list(range(args.actors))
        box = broadcast()
        timer = LapTimer(LEARNER_FIELDS)
        start_wall = time.perf_counter()

        def submit(slot: int) -> Any:
            eps = linear_schedule(
                args.start_e, args.end_e, int(args.exploration_fraction * args.steps), global_step
            )
            return actors[slot].collect.remote(args.chunk, eps, version, box, args.update_period)

        pending = {submit(s): s for s in range(args.actors)}
        submitted = args.chunk * args.actors
        timer.lap("bookkeeping")
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            timer.lap("idle")
            slot = pending.pop(ready[0])
            try:
                batch = ray.get(ready[0])
            except RayActorError as e:
                dead = slot_ids[slot]
                events.append({"event": "actor_died", "actor": dead, "env_steps": global_step,
                               "error": type(e).__name__})  # fmt: skip
                actor_reports.setdefault(dead, {})["died"] = True
                actors[slot] = start_actor()
                slot_ids[slot] = next_id - 1
                if submitted < args.steps:
                    pending[submit(slot)] = slot
                    submitted += args.chunk
                timer.lap("bookkeeping")
                continue
            timer.lap("receive")
            rb.add_batch(batch)
            timer.lap("replay_insert")
            global_step += len(batch["actions"])
            wall = time.perf_counter() - start_wall
            for ret, length in batch["episodes"]:
                curve.append({"wall_s": round(wall, 4), "env_steps": global_step, "return": ret,
                              "length": length, "actor": batch["actor_id"]})  # fmt: skip
            actor_reports[batch["actor_id"]] = {**batch["breakdown"], "version": batch["version"]}
            if on_chunk is not None:
                on_chunk(global_step, actors)
            timer.lap("bookkeeping")

            if global_step > args.learning_starts:
                for _ in range(len(batch["actions"]) // args.train_frequency):
                    obs, act, rew, next_obs, dones = rb.sample(args.batch_size, rng)
                    timer.lap("replay_sample")
                    with torch.no_grad():
                        target_max, _ = target_network(next_obs).max(dim=1)
                        td_target = rew + args.gamma * target_max * (1 - dones)
                    old_val = q_network(obs).gather(1, act.unsqueeze(1)).squeeze(1)
                    loss = F.mse_loss(td_target, old_val)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    updates += 1
                    if updates % args.target_network_frequency == 0:
                        target_network.load_state_dict(q_network.state_dict())
                    timer.lap("learner_update")
                    if updates % args.broadcast_every == 0:
                        version += 1
                        box = broadcast()
                        timer.lap("quantize_broadcast")

            if submitted < args.steps:
                pending[submit(slot)] = slot
                submitted += args.chunk
            timer.lap("bookkeeping")
            if (
                global_step // args.checkpoint_every
                != (global_step - len(batch["actions"])) // args.checkpoint_every
            ):
                save_checkpoint(ckpt, q_network, optimizer, rb, _state(global_step, updates, version, curve))
                timer.lap("checkpoint")

        save_checkpoint(ckpt, q_network, optimizer, rb, _state(global_step, updates, version, curve))
        timer.lap("checkpoint")
        learner = timer.report()
        calib = rb.obs[rng.integers(0, rb.size, args.calibration_size)] if rb.size else None
        throughput = actor_throughput(actors[0], q_network.state_dict(), args.actor_precision, calib)
        for a in actors:
            ray.kill(a)
    finally:
        if started_ray:
            ray.shutdown()

    fp32_bytes = len(quantize_broadcast(q_network.state_dict(), "fp32", None, version).model)
    log = {
        "version": LOG_VERSION,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(args).items()},
        "env_steps": global_step,
        "learner_updates": updates,
        "broadcasts": len(payload_bytes),
        "payload_bytes": {args.actor_precision: payload_bytes[-1], "fp32": fp32_bytes},
        "startup_s": {"ray_init": ray_init_s},
        "inference_throughput": throughput,
        "breakdown": {"learner": learner, **{f"actor{k}": v for k, v in sorted(actor_reports.items())}},
        "curve": curve,
        "events": events,
    }
    _write_json(args.out / "log.json", log)
    from quarl_edge.actorq.plots import plot_breakdown, plot_curve

    plot_breakdown(log, args.out / "breakdown.png")
    plot_curve(log, args.out / "curve.png")
    return log


def _state(global_step: int, updates: int, version: int, curve: list) -> dict[str, Any]:
    return {"version": LOG_VERSION, "global_step": global_step, "updates": updates, "version_broadcast": version,
            "curve": curve}  # fmt: skip
