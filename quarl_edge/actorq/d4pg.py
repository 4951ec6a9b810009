"""ActorQ D4PG: an fp32 distributional learner with Ray actors running fp32 / fp16 / int8 copies of the actor.

Reads top to bottom like CleanRL's ddpg_continuous_action.py: Args, the networks, the replay buffer,
the categorical projection, then the update rule; the actor-learner loop it runs in is
quarl_edge/actorq/loop.py, shared with DQN. D4PG (Barth-Maron et al. 2018) is DDPG with a distributional
critic over ``atoms`` fixed support points in [v_min, v_max] (C51's projected cross-entropy), n-step
returns computed by the actors, and Gaussian exploration noise in the actors. The deterministic actor is
broadcast exactly like DQN's Q-network (quarl_edge/actorq/broadcast.py: a tanh-scaled ONNX graph,
int8 = ORT static QDQ) and every role records its time the same way; log.json has the same fields
(plus the last update's losses).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from quarl_edge.actorq.actors import ContinuousActor
from quarl_edge.actorq.broadcast import Squash
from quarl_edge.actorq.checkpoint import Part
from quarl_edge.actorq.loop import ActorQArgs, OnChunk, run
from quarl_edge.actorq.result import LOG_VERSION, ActorQLog
from quarl_edge.policy.registry import make
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.schema import JSONObject

__all__ = ["LOG_VERSION", "Actor", "Args", "Critic", "D4PGLearner", "ReplayBuffer", "project", "train"]


@dataclass(frozen=True, kw_only=True)
class Args(ActorQArgs):
    """D4PG's settings; the actor-learner ones (actors, actor_precision, update_period, ...) are ActorQArgs'."""

    env: str = "Pendulum-v1"
    """gymnasium id of a task with a Box action space (Pendulum-v1, HalfCheetah-v5)"""
    out: Path = Path("runs/actorq-d4pg")
    """folder for log.json, breakdown.png, curve.png and checkpoint/"""
    algo: str = "d4pg"
    """learner: always d4pg here"""
    steps: int = 20_000
    """total environment steps over all actors"""
    hidden: tuple[int, ...] = (256, 256)
    """hidden layer sizes of the actor MLP (and of the critic's unless critic_hidden is set)"""
    critic_hidden: tuple[int, ...] | None = None
    """hidden layer sizes of the critic MLP; None: the actor's (Acme's D4PG: (512, 512, 256))"""
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
    v_min: float | None = None
    """lowest support point; None: from SUPPORTS, else estimated (see `support`)"""
    v_max: float | None = None
    """highest support point; None: like v_min"""
    tau: float = 0.005
    """soft target-network update rate"""
    exploration_noise: float = 0.2
    """Gaussian action noise std in units of half the action range, added in the actors"""
    batch_size: int = 256
    """n-step transitions per learner update"""
    train_frequency: int = 2
    """environment steps per learner update"""

    def validate(self) -> None:
        """Raise InputError for unusable values, before Ray or any environment starts."""
        if self.algo != "d4pg":
            raise InputError(f"quarl_edge.actorq.d4pg runs --algo d4pg, not {self.algo!r}", "see actorq.dqn")
        self.validate_shared(positive=("buffer_size", "n_step"))
        if self.critic_hidden is not None and (not self.critic_hidden or min(self.critic_hidden) < 1):
            raise InputError(f"critic hidden sizes must be positive (got {self.critic_hidden})",
                             "e.g. critic_hidden=(512, 512, 256)", cli_fix="e.g. --critic-hidden 512,512,256")  # fmt: skip
        if self.atoms < 2:
            raise InputError(f"need at least 2 atoms (got {self.atoms})", "e.g. atoms=51")
        if (self.v_min is None) != (self.v_max is None):
            raise InputError("give both --v-min and --v-max, or neither", "e.g. --v-min -1000 --v-max 0")
        if self.v_min is not None and self.v_max is not None and not self.v_min < self.v_max:
            raise InputError(
                f"need v_min < v_max (got {self.v_min}, {self.v_max})", "e.g. --v-min -1000 --v-max 0"
            )
        import gymnasium as gym

        space = self.action_space()
        if not isinstance(space, gym.spaces.Box):
            raise InputError(f"D4PG needs a continuous (Box) action space; {self.env} has {space}",
                             "use --algo dqn, or e.g. --env Pendulum-v1")  # fmt: skip


# Value supports known to fit (discounted n-step returns); other tasks get an estimate (see `support`).
# Supports that fit each task's discounted returns from random to well trained (gamma 0.99), by task name
# without its version. Other tasks get an estimate (see `support`); --v-min/--v-max override both.
SUPPORTS: dict[str, tuple[float, float]] = {
    "Pendulum": (-1000.0, 0.0),
    "MountainCarContinuous": (-100.0, 100.0),  # +100 at the goal, which random actions never reach
    "LunarLanderContinuous": (-300.0, 300.0),
    "BipedalWalker": (-200.0, 300.0),
    "HalfCheetah": (-200.0, 1200.0),
    "Hopper": (-100.0, 400.0),
    "Walker2d": (-100.0, 600.0),
    "Ant": (-200.0, 800.0),
    "Humanoid": (-100.0, 800.0),
    "Swimmer": (-50.0, 50.0),
    "Reacher": (-100.0, 0.0),
    "InvertedPendulum": (0.0, 100.0),
    "InvertedDoublePendulum": (0.0, 1000.0),
}


def support(args: Args, probe_steps: int = 2_000) -> tuple[float, float, str]:
    """(v_min, v_max, source) of the critic's atoms: the user's, a known task's, or an estimate from
    random actions: the range [lo, hi] of the discounted returns-to-go seen in ``probe_steps`` steps,
    widened to [min(lo, 0) - span, max(hi, 0) + span] (span = hi - lo) since a trained policy earns
    more than random actions. A reward random actions never see still needs --v-min/--v-max."""
    if args.v_min is not None and args.v_max is not None:
        return args.v_min, args.v_max, "set"
    if args.env.startswith("dm_control/"):  # every suite task rewards each step within [0, 1]
        return 0.0, round(1 / (1 - args.gamma), 3), "DM Control: rewards in [0, 1] per step"
    base = args.env.split("/")[-1].rsplit("-v", 1)[0]
    if base in SUPPORTS:
        return (*SUPPORTS[base], "known task")
    env = make(args.env)
    env.action_space.seed(args.seed)
    env.reset(seed=args.seed)
    episodes: list[list[float]] = [[]]
    for _ in range(probe_steps):
        _, r, term, trunc, _ = env.step(env.action_space.sample())
        episodes[-1].append(float(r))
        if term or trunc:
            env.reset()
            episodes.append([])
    env.close()
    returns = []
    for rewards in episodes:  # discounted return-to-go at every step (a truncated tail counts as is)
        g = 0.0
        for r in reversed(rewards):
            g = r + args.gamma * g
            returns.append(g)
    lo, hi = min(returns, default=0.0), max(returns, default=0.0)
    span = max(hi - lo, 1.0)
    v_min, v_max = min(lo, 0.0) - span, max(hi, 0.0) + span
    return round(v_min, 3), round(v_max, 3), f"estimated from {probe_steps} random-action steps"


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

    def add_batch(self, b: Mapping[str, np.ndarray]) -> None:
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


class D4PGLearner:
    """Actor, critic, their target copies and Adams, and the replay buffer, with D4PG's update (a
    loop.Learner)."""

    actor_class = ContinuousActor

    def __init__(self, args: Args, n_obs: int, action_space: Any) -> None:
        self.args = args
        low, high = action_space.low, action_space.high
        n_act = len(low)
        self.actor = Actor(n_obs, low, high, args.hidden)
        self.target_actor = Actor(n_obs, low, high, args.hidden)
        critic_hidden = args.critic_hidden or args.hidden
        self.critic = Critic(n_obs, n_act, critic_hidden, args.atoms)
        self.target_critic = Critic(n_obs, n_act, critic_hidden, args.atoms)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=args.learning_rate)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=args.learning_rate)
        v_min, v_max, self.support_source = support(args)
        self.support = torch.linspace(v_min, v_max, args.atoms)
        self.replay = ReplayBuffer(args.buffer_size, n_obs, n_act)
        self.target_actor.load_state_dict(self.actor.state_dict())
        self.target_critic.load_state_dict(self.critic.state_dict())
        self.losses: dict[str, float] = {}

    def actor_args(self) -> tuple[Any, ...]:
        return (self.args.n_step, self.args.gamma)

    def parts(self) -> dict[str, Part]:
        nets = {"actor": self.actor, "critic": self.critic}
        targets = {"target_actor": self.target_actor, "target_critic": self.target_critic}
        return {**nets, **targets, "actor_opt": self.actor_opt, "critic_opt": self.critic_opt}

    def policy(self) -> tuple[dict[str, torch.Tensor], Squash | None]:
        return self.actor.mlp_state(), self.actor.squash()

    def exploration(self, env_steps: int) -> float:
        return self.args.exploration_noise

    def update(self, batch: tuple[torch.Tensor, ...], n: int) -> None:
        obs, act, rew, next_obs, disc = batch
        actor, critic, support = self.actor, self.critic, self.support
        with torch.no_grad():
            next_probs = F.softmax(self.target_critic(next_obs, self.target_actor(next_obs)), dim=1)
            target = project(next_probs, rew, disc, support)
        critic_loss = -(target * F.log_softmax(critic(obs, act), dim=1)).sum(1).mean()
        self.critic_opt.zero_grad()
        critic_loss.backward()
        self.critic_opt.step()
        q = (F.softmax(critic(obs, actor(obs)), dim=1) * support).sum(1)
        actor_loss = -q.mean()
        self.actor_opt.zero_grad()
        actor_loss.backward()
        self.actor_opt.step()
        with torch.no_grad():
            for net, tgt in ((actor, self.target_actor), (critic, self.target_critic)):
                for p, tp in zip(net.parameters(), tgt.parameters(), strict=True):
                    tp.mul_(1 - self.args.tau).add_(p, alpha=self.args.tau)
        self.losses = {"critic_loss": critic_loss.item(), "actor_loss": actor_loss.item()}

    def summary(self) -> JSONObject:
        return {"losses": self.losses,
                "support": {"v_min": float(self.support[0]), "v_max": float(self.support[-1]),
                            "atoms": len(self.support), "source": self.support_source}}  # fmt: skip


def train(args: Args, on_chunk: OnChunk | None = None) -> ActorQLog:
    """Run ActorQ D4PG; returns the log also written to ``args.out / 'log.json'``."""
    return run(args, D4PGLearner, on_chunk)
