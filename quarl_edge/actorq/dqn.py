"""ActorQ DQN: an fp32 learner with Ray actors running fp32 / fp16 / int8 copies of the Q-network.

Reads top to bottom like CleanRL's dqn.py: Args, the Q-network, the replay buffer, the update rule. The
actor-learner loop it runs in is quarl_edge/actorq/loop.py (Ray, the actor pool, broadcasts, the time
breakdown, checkpoints, log.json and plots), shared with D4PG; the actors that collect experience with
epsilon-greedy over the broadcast Q-network are quarl_edge/actorq/actors.py's `Actor`.
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

from quarl_edge.actorq.actors import Actor
from quarl_edge.actorq.broadcast import Squash
from quarl_edge.actorq.checkpoint import Part
from quarl_edge.actorq.loop import ActorQArgs, OnChunk, run
from quarl_edge.actorq.result import LOG_VERSION, ActorQLog
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.schema import JSONObject

__all__ = ["ALGOS", "LOG_VERSION", "Args", "DQNLearner", "QNetwork", "ReplayBuffer", "train"]

ALGOS = ("dqn", "d4pg")


@dataclass(frozen=True, kw_only=True)
class Args(ActorQArgs):
    """DQN's settings; the actor-learner ones (actors, actor_precision, update_period, ...) are ActorQArgs'."""

    env: str = "CartPole-v1"
    """gymnasium id of a task with a discrete action space (CartPole-v1, Acrobot-v1, MountainCar-v0)"""
    out: Path = Path("runs/actorq")
    """folder for log.json, breakdown.png, curve.png and checkpoint/"""
    algo: str = "dqn"
    """learner: dqn here (d4pg: quarl_edge/actorq/d4pg.py)"""
    steps: int = 50_000
    """total environment steps over all actors"""
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
    train_frequency: int = 10
    """environment steps per learner update"""

    def validate(self) -> None:
        """Raise InputError for unusable values, before Ray or any environment starts."""
        if self.algo not in ALGOS:
            raise InputError(f"unknown --algo {self.algo!r}", f"known: {', '.join(ALGOS)}")
        if self.algo != "dqn":
            raise InputError(f"quarl_edge.actorq.dqn runs --algo dqn, not {self.algo!r}", "see actorq.d4pg")
        self.validate_shared(positive=("buffer_size",))
        import gymnasium as gym

        space = self.action_space()
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

    def add_batch(self, b: Mapping[str, np.ndarray]) -> None:
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


class DQNLearner:
    """The Q-network, its target copy, Adam and the replay buffer, with DQN's TD update (a loop.Learner)."""

    actor_class = Actor

    def __init__(self, args: Args, n_obs: int, action_space: Any) -> None:
        self.args = args
        self.q_network = QNetwork(n_obs, int(action_space.n), args.hidden)
        self.optimizer = torch.optim.Adam(self.q_network.parameters(), lr=args.learning_rate)
        self.target_network = QNetwork(n_obs, int(action_space.n), args.hidden)
        self.replay = ReplayBuffer(args.buffer_size, n_obs)
        self.target_network.load_state_dict(self.q_network.state_dict())

    def actor_args(self) -> tuple[Any, ...]:
        return ()

    def parts(self) -> dict[str, Part]:
        return {"q": self.q_network, "target": self.target_network, "opt": self.optimizer}

    def policy(self) -> tuple[dict[str, torch.Tensor], Squash | None]:
        return self.q_network.state_dict(), None

    def exploration(self, env_steps: int) -> float:
        a = self.args
        return linear_schedule(a.start_e, a.end_e, int(a.exploration_fraction * a.steps), env_steps)

    def update(self, batch: tuple[torch.Tensor, ...], n: int) -> None:
        obs, act, rew, next_obs, dones = batch
        with torch.no_grad():
            target_max, _ = self.target_network(next_obs).max(dim=1)
            td_target = rew + self.args.gamma * target_max * (1 - dones)
        old_val = self.q_network(obs).gather(1, act.unsqueeze(1)).squeeze(1)
        loss = F.mse_loss(td_target, old_val)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        if n % self.args.target_network_frequency == 0:
            self.target_network.load_state_dict(self.q_network.state_dict())

    def summary(self) -> JSONObject:
        return {}


def train(args: Args, on_chunk: OnChunk | None = None) -> ActorQLog:
    """Run ActorQ DQN; returns the log also written to ``args.out / 'log.json'``.

    ``on_chunk(env_steps, actor_handles)`` is called after every received batch (tests kill actors).
    """
    return run(args, DQNLearner, on_chunk)
