"""ActorQ D4PG: an fp32 distributional learner with Ray actors running fp32 / fp16 / int8 copies of the actor.

Reads top to bottom like CleanRL's ddpg_continuous_action.py: Args, the networks, the replay buffer,
the categorical projection, then the loop. D4PG (Barth-Maron et al. 2018) is DDPG with a distributional
critic over ``atoms`` fixed support points in [v_min, v_max] (C51's projected cross-entropy), n-step
returns computed by the actors, and Gaussian exploration noise in the actors. The deterministic actor is
broadcast exactly like DQN's Q-network (quarl_edge/actorq/broadcast.py: a tanh-scaled ONNX graph,
int8 = ORT static QDQ) and every role records its time the same way; log.json has the same fields.
"""

from __future__ import annotations

import json
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

from quarl_edge.actorq.actors import LEARNER_FIELDS, ContinuousActor, LapTimer
from quarl_edge.actorq.broadcast import PRECISIONS, quantize_broadcast
from quarl_edge.actorq.dqn import LOG_VERSION, _write_json
from quarl_edge.actorq.throughput import actor_throughput
from quarl_edge.runtimes.errors import InputError, MissingDependencyError


@dataclass(frozen=True)
class Args:
    env: str = "Pendulum-v1"
    """gymnasium id of a task with a Box action space (Pendulum-v1, HalfCheetah-v5)"""
    out: Path = Path("runs/actorq-d4pg")
    """folder for log.json, breakdown.png, curve.png and checkpoint/"""
    algo: str = "d4pg"
    """learner: always d4pg here"""
    actors: int = 2
    """number of Ray actors collecting experience"""
    actor_precision: str = "int8"
    """precision of the actors' policy copy: fp32, fp16 or int8 (ONNX Runtime QDQ S8S8)"""
    update_period: int = 100
    """actor steps between weight pulls (an actor pulls only when a newer broadcast exists)"""
    steps: int = 20_000
    """total environment steps over all actors"""
    seed: int = 0
    """seed of the learner, the actors (seed * 1000 + actor id) and their environments"""
    address: str | None = None
    """Ray cluster address; None starts a local Ray with one CPU per actor"""
    resume: bool = False
    """continue from out/checkpoint when it exists"""
    hidden: tuple[int, ...] = (256, 256)
    """hidden layer sizes of the actor and the critic MLPs"""
    learning_rate: float = 3e-4
    """Adam learning rate of the actor and the critic"""
    buffer_size: int = 100_000
    """replay buffer capacity (n-step transitions)"""
    gamma: float = 0.99
    """discount factor"""
    n_step: int = 5
    """steps summed into each return target (computed in the actors)"""
    atoms: int = 51
    """support points of the critic's categorical value distribution"""
    v_min: float = -1000.0
    """lowest support point (Pendulum's discounted returns lie in about [-1000, 0])"""
    v_max: float = 0.0
    """highest support point"""
    tau: float = 0.005
    """soft target-network update rate"""
    exploration_noise: float = 0.2
    """Gaussian action noise std in units of half the action range, added in the actors"""
    batch_size: int = 256
    """n-step transitions per learner update"""
    learning_starts: int = 1_000
    """environment steps before the first learner update"""
    train_frequency: int = 2
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
        if self.algo != "d4pg":
            raise InputError(f"quarl_edge.actorq.d4pg runs --algo d4pg, not {self.algo!r}", "see actorq.dqn")
        if self.actors < 1:
            raise InputError(f"--actors must be at least 1 (got {self.actors})", "e.g. --actors 2")
        if self.actor_precision not in PRECISIONS:
            raise InputError(
                f"unknown --actor-precision {self.actor_precision!r}", f"known: {', '.join(PRECISIONS)}"
            )
        for name in ("update_period", "steps", "chunk", "broadcast_every", "batch_size", "buffer_size",
                     "n_step", "train_frequency"):  # fmt: skip
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(self, name)})")
        if self.atoms < 2 or not self.v_min < self.v_max:
            raise InputError(
                f"need atoms >= 2 and v_min < v_max (got {self.atoms}, {self.v_min}, {self.v_max})"
            )
        if not self.hidden or min(self.hidden) < 1:
            raise InputError(f"hidden sizes must be positive (got {self.hidden})", "e.g. --hidden 256,256")
        import gymnasium as gym

        try:
            env = gym.make(self.env)
        except Exception as e:  # gymnasium raises several types for unknown or broken ids
            raise InputError(f"cannot make environment {self.env!r}: {e}", "e.g. --env Pendulum-v1") from None
        space = env.action_space
        env.close()
        if not isinstance(space, gym.spaces.Box):
            raise InputError(f"D4PG needs a continuous (Box) action space; {self.env} has {space}",
                             "use --algo dqn, or e.g. --env Pendulum-v1")  # fmt: skip


def mlp(n_in: int, n_out: int, hidden: tuple[int, ...]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(n_in, h), nn.ReLU()]
        n_in = h
    return nn.Sequential(*layers, nn.Linear(n_in, n_out))


class Actor(nn.Module):
    """Deterministic policy: tanh(mlp(obs)) scaled to the action bounds (the broadcast graph, in torch)."""

    action_scale: torch.Tensor
    action_bias: torch.Tensor

    def __init__(self, n_obs: int, low: np.ndarray, high: np.ndarray, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.network = mlp(n_obs, len(low), hidden)
        self.register_buffer("action_scale", torch.tensor((high - low) / 2, dtype=torch.float32))
        self.register_buffer("action_bias", torch.tensor((high + low) / 2, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.network(x)) * self.action_scale + self.action_bias

    def squash(self) -> tuple[np.ndarray, np.ndarray]:
        return self.action_scale.numpy(), self.action_bias.numpy()

    def mlp_state(self) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.state_dict().items() if k.startswith("network.")}


class Critic(nn.Module):
    """Distributional critic: logits over the value atoms for (obs, action)."""

    def __init__(self, n_obs: int, n_act: int, hidden: tuple[int, ...], atoms: int) -> None:
        super().__init__()
        self.network = mlp(n_obs + n_act, atoms, hidden)

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.network(torch.cat([obs, act], 1))


class ReplayBuffer:
    """Uniform ring buffer of n-step transitions (obs, action, n-step return, obs after n, discount)."""

    KEYS = ("obs", "actions", "rewards", "next_obs", "discounts")

    def __init__(self, capacity: int, n_obs: int, n_act: int) -> None:
        self.obs = np.zeros((capacity, n_obs), np.float32)
        self.actions = np.zeros((capacity, n_act), np.float32)
        self.rewards = np.zeros(capacity, np.float32)
        self.next_obs = np.zeros((capacity, n_obs), np.float32)
        self.discounts = np.zeros(capacity, np.float32)
        self.capacity, self.pos, self.size = capacity, 0, 0

    def add_batch(self, b: dict[str, Any]) -> None:
        idx = (self.pos + np.arange(len(b["rewards"]))) % self.capacity
        for k in self.KEYS:
            getattr(self, k)[idx] = b[k]
        self.pos = int((self.pos + len(idx)) % self.capacity)
        self.size = min(self.size + len(idx), self.capacity)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[torch.Tensor, ...]:
        i = rng.integers(0, self.size, n)
        return tuple(torch.from_numpy(getattr(self, k)[i]) for k in self.KEYS)

    def arrays(self) -> dict[str, np.ndarray]:
        return {k: getattr(self, k)[: self.size] for k in self.KEYS}


def project(
    next_probs: torch.Tensor, rewards: torch.Tensor, discounts: torch.Tensor, support: torch.Tensor
) -> torch.Tensor:
    """C51 projection of the distribution of r + discount * Z onto ``support`` (probabilities [B, atoms])."""
    v_min, v_max, n = support[0], support[-1], len(support)
    delta = (v_max - v_min) / (n - 1)
    tz = (rewards[:, None] + discounts[:, None] * support[None, :]).clamp(v_min, v_max)
    b = (tz - v_min) / delta
    lo, hi = b.floor().long(), b.ceil().long()
    # when b lands on an atom lo == hi and both weights below would be 0: give it all to lo
    w_lo = (hi.float() - b) + (lo == hi).float()
    w_hi = b - lo.float()
    out = torch.zeros_like(next_probs)
    out.scatter_add_(1, lo, next_probs * w_lo)
    out.scatter_add_(1, hi, next_probs * w_hi)
    return out


def save_checkpoint(
    d: Path, nets: dict[str, nn.Module], opts: dict[str, Any], rb: ReplayBuffer, state: dict
) -> None:
    import os

    d.mkdir(parents=True, exist_ok=True)
    blob = {**{k: v.state_dict() for k, v in nets.items()}, **{k: v.state_dict() for k, v in opts.items()}}
    torch.save(blob, d / "model.pt.tmp")
    os.replace(d / "model.pt.tmp", d / "model.pt")
    with open(d / "replay.npz.tmp", "wb") as f:
        np.savez(f, **rb.arrays())  # type: ignore[arg-type]
    os.replace(d / "replay.npz.tmp", d / "replay.npz")
    _write_json(d / "state.json", state)  # last: a checkpoint is complete once state.json names its step


def train(args: Args, on_chunk: Callable[[int, list[Any]], None] | None = None) -> dict[str, Any]:
    """Run ActorQ D4PG; returns the log also written to ``args.out / 'log.json'``."""
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
    n_obs = int(np.prod(probe.observation_space.shape or (1,)))
    low, high = probe.action_space.low, probe.action_space.high  # type: ignore[attr-defined]
    probe.close()
    n_act = len(low)

    actor, target_actor = Actor(n_obs, low, high, args.hidden), Actor(n_obs, low, high, args.hidden)
    critic = Critic(n_obs, n_act, args.hidden, args.atoms)
    target_critic = Critic(n_obs, n_act, args.hidden, args.atoms)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=args.learning_rate)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=args.learning_rate)
    support = torch.linspace(args.v_min, args.v_max, args.atoms)
    rb = ReplayBuffer(args.buffer_size, n_obs, n_act)
    nets = {"actor": actor, "critic": critic, "target_actor": target_actor, "target_critic": target_critic}
    opts = {"actor_opt": actor_opt, "critic_opt": critic_opt}
    target_actor.load_state_dict(actor.state_dict())
    target_critic.load_state_dict(critic.state_dict())
    global_step, updates, version, curve, events = 0, 0, 0, [], []
    ckpt = args.out / "checkpoint"
    if args.resume and (ckpt / "state.json").is_file():
        saved = torch.load(ckpt / "model.pt", map_location="cpu", weights_only=True)
        modules: dict[str, Any] = {**nets, **opts}
        for k, m in modules.items():
            m.load_state_dict(saved[k])
        with np.load(ckpt / "replay.npz", allow_pickle=False) as z:
            rb.add_batch({k: z[k] for k in z.files})
        state = json.loads((ckpt / "state.json").read_text())
        global_step, updates, version = state["global_step"], state["updates"], state["version_broadcast"]
        curve = state.get("curve", [])
        events.append({"event": "resumed", "env_steps": global_step})
    args.out.mkdir(parents=True, exist_ok=True)

    t0 = time.perf_counter()
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address=args.address, num_cpus=None if args.address else args.actors,
                 include_dashboard=False, log_to_driver=False, configure_logging=False)  # fmt: skip
    ray_init_s = time.perf_counter() - t0
    RemoteActor = ray.remote(num_cpus=1)(ContinuousActor)
    next_id = 0

    def start_actor() -> Any:
        nonlocal next_id
        handle = RemoteActor.remote(args.env, args.seed * 1000 + next_id, next_id, args.n_step, args.gamma)  # type: ignore[attr-defined]
        events.append({"event": "actor_started", "actor": next_id, "env_steps": global_step})
        next_id += 1
        return handle

    def calibration() -> np.ndarray | None:
        return rb.obs[rng.integers(0, rb.size, args.calibration_size)] if rb.size else None

    def broadcast() -> list[Any]:
        payload = quantize_broadcast(
            actor.mlp_state(), args.actor_precision, calibration(), version, actor.squash()
        )
        payload_bytes.append(payload.nbytes)
        return [ray.put(payload)]  # once for all actors; the list keeps Ray from resolving it per call

    payload_bytes: list[int] = []
    actor_reports: dict[int, dict[str, Any]] = {}
    losses: dict[str, float] = {}
    try:
        actors = [start_actor() for _ in range(args.actors)]
        slot_ids = list(range(args.actors))
        box = broadcast()
        timer = LapTimer(LEARNER_FIELDS)
        start_wall = time.perf_counter()

        def submit(slot: int) -> Any:
            return actors[slot].collect.remote(
                args.chunk, args.exploration_noise, version, box, args.update_period
            )

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
            n_new = batch["env_steps"]
            global_step += n_new
            wall = time.perf_counter() - start_wall
            for ret, length in batch["episodes"]:
                curve.append({"wall_s": round(wall, 4), "env_steps": global_step, "return": ret,
                              "length": length, "actor": batch["actor_id"]})  # fmt: skip
            actor_reports[batch["actor_id"]] = {**batch["breakdown"], "version": batch["version"]}
            if on_chunk is not None:
                on_chunk(global_step, actors)
            timer.lap("bookkeeping")

            if global_step > args.learning_starts:
                for _ in range(n_new // args.train_frequency):
                    obs, act, rew, next_obs, disc = rb.sample(args.batch_size, rng)
                    timer.lap("replay_sample")
                    with torch.no_grad():
                        next_probs = F.softmax(target_critic(next_obs, target_actor(next_obs)), dim=1)
                        target = project(next_probs, rew, disc, support)
                    critic_loss = -(target * F.log_softmax(critic(obs, act), dim=1)).sum(1).mean()
                    critic_opt.zero_grad()
                    critic_loss.backward()
                    critic_opt.step()
                    q = (F.softmax(critic(obs, actor(obs)), dim=1) * support).sum(1)
                    actor_loss = -q.mean()
                    actor_opt.zero_grad()
                    actor_loss.backward()
                    actor_opt.step()
                    with torch.no_grad():
                        for net, tgt in ((actor, target_actor), (critic, target_critic)):
                            for p, tp in zip(net.parameters(), tgt.parameters(), strict=True):
                                tp.mul_(1 - args.tau).add_(p, alpha=args.tau)
                    updates += 1
                    losses = {"critic_loss": critic_loss.item(), "actor_loss": actor_loss.item()}
                    timer.lap("learner_update")
                    if updates % args.broadcast_every == 0:
                        version += 1
                        box = broadcast()
                        timer.lap("quantize_broadcast")

            if submitted < args.steps:
                pending[submit(slot)] = slot
                submitted += args.chunk
            timer.lap("bookkeeping")
            if global_step // args.checkpoint_every != (global_step - n_new) // args.checkpoint_every:
                save_checkpoint(ckpt, nets, opts, rb, _state(global_step, updates, version, curve))
                timer.lap("checkpoint")

        save_checkpoint(ckpt, nets, opts, rb, _state(global_step, updates, version, curve))
        timer.lap("checkpoint")
        learner = timer.report()
        throughput = actor_throughput(
            actors[0], actor.mlp_state(), args.actor_precision, calibration(), actor.squash()
        )
        for a in actors:
            ray.kill(a)
    finally:
        if started_ray:
            ray.shutdown()

    fp32_bytes = quantize_broadcast(actor.mlp_state(), "fp32", None, version, actor.squash()).nbytes
    log = {
        "version": LOG_VERSION,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(args).items()},
        "env_steps": global_step,
        "learner_updates": updates,
        "losses": losses,
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
