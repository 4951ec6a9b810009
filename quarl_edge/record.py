"""Record rollouts of a policy as calibration data / replay traces.

Exploration noise (epsilon-greedy for discrete actions, Gaussian noise of ``epsilon`` x action range for
continuous ones) makes the calibration cover states off the greedy path.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quarl_edge import __version__
from quarl_edge.outputs import TRACE, claim
from quarl_edge.policy.net import Policy
from quarl_edge.runtimes.envs import action_masks, bounds, make_env, random_action
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.runner import EpisodeResult, run_episodes
from quarl_edge.runtimes.trace import Trace, check_fits, make_trace, save_trace


@dataclass(frozen=True)
class RecordConfig:
    episodes: int = 10
    """episodes to record, on seeds seed, seed+1, ..."""
    epsilon: float = 0.1
    """exploration: random-action probability (discrete) or noise scale relative to the action range"""
    seed: int = 0
    max_steps: int | None = None
    """cap on steps per episode"""
    max_samples: int | None = None
    """cap on recorded steps in total (recording stops at an episode end or at the cap)"""

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise InputError(f"--episodes must be at least 1 (got {self.episodes})", "e.g. --episodes 10")
        if not 0.0 <= self.epsilon <= 1.0:
            raise InputError(f"--epsilon must be in [0, 1] (got {self.epsilon})", "e.g. --epsilon 0.1")
        if self.max_samples is not None and self.max_samples < 1:
            raise InputError("--max-samples must be at least 1", "e.g. --max-samples 5000")


def record(policy: Policy, cfg: RecordConfig, progress: object | None = None) -> Trace:
    """Episodes on seeds cfg.seed, cfg.seed+1, ... (the runner's run_episodes), every step recorded."""
    spec = policy.spec
    rng = np.random.default_rng(cfg.seed)
    env = make_env(spec.env)
    obs_l, act_l, rew_l, done_l, ep_l, mask_l = [], [], [], [], [], []
    discrete = spec.action_space.is_discrete
    integer = spec.action_space.is_integer
    if not integer:
        low, high = bounds(spec.action_space)
        low, high = low.astype(np.float32), high.astype(np.float32)
    masks: list[np.ndarray | None] = [None]

    def act(obs: np.ndarray) -> Any:
        masks[0] = mask = action_masks(env)  # MaskablePPO's envs: the allowed actions, an input at every step
        action = policy.act(obs, mask) if mask is not None else policy.act(obs)
        if discrete and mask is None:
            if rng.random() < cfg.epsilon:
                action = int(rng.integers(spec.action_space.n or 1))
        elif integer:
            if rng.random() < cfg.epsilon:
                action = random_action(env.action_space, mask)
        elif cfg.epsilon > 0:
            action = np.clip(action + rng.normal(0, cfg.epsilon, action.shape) * (high - low), low, high)
            action = action.astype(np.float32)
        return action

    def step(obs: np.ndarray, action: Any, reward: float, end: bool) -> bool:
        obs_l.append(obs)
        act_l.append(action)
        if masks[0] is not None:
            mask_l.append(masks[0])
        rew_l.append(reward)
        done_l.append(end)
        ep_l.append(len(episodes))
        full = cfg.max_samples is not None and len(obs_l) >= cfg.max_samples
        if full:  # the cap ends the recording, and the episode with it
            done_l[-1] = True
        return not full

    episodes: list[EpisodeResult] = []

    def finished(e: EpisodeResult) -> None:
        episodes.append(e)
        if progress is not None:
            progress(len(episodes), cfg.episodes)  # type: ignore[operator]

    try:
        # reset: a recurrent policy's state starts each episode at zeros
        run_episodes(env, act, range(cfg.seed, cfg.seed + cfg.episodes), max_steps=cfg.max_steps,
                     reset=policy.reset, on_step=step, on_episode=finished, catch=False)  # fmt: skip
    finally:
        env.close()
    seeds = [e.seed for e in episodes]
    meta = {
        "policy": spec.name,
        "algo": spec.algo,
        "env_id": spec.env.id,
        "env": spec.env.to_dict(),
        "obs_shape": list(spec.observation_space.shape),
        "obs_dtype": spec.observation_space.dtype,
        "epsilon": cfg.epsilon,
        "seed": cfg.seed,
        "tool_version": __version__,
    }
    return make_trace(
        obs=np.stack(obs_l).astype(spec.observation_space.dtype),
        actions=np.asarray(act_l, dtype=np.int64 if integer else np.float32),
        action_masks=np.stack(mask_l) if mask_l and len(mask_l) == len(obs_l) else None,
        rewards=np.asarray(rew_l),
        dones=np.asarray(done_l),
        episode_ids=np.asarray(ep_l),
        seeds=np.asarray(seeds),
        meta=meta,
    )


def record_to_file(
    policy: Policy, cfg: RecordConfig, out: Path, reads: Iterable[tuple[str, Path | None]] = ()
) -> Trace:
    """Record and save to ``out`` (.npz), refusing another suffix, or a target that is not absent or a
    trace (outputs.claim; ``reads``: the (label, path) of the policy and other inputs), before any
    episode runs."""
    if out.suffix != ".npz":
        raise InputError(
            f"--out {str(out)!r} must end in .npz", f"e.g. --out calibration_data/{out.stem}.npz"
        )
    reads = list(reads)
    claim(out, TRACE, reads)
    trace = record(policy, cfg)
    claim(out, TRACE, reads)  # again: recording took a while
    save_trace(trace, out)
    return trace


def check_trace_fits(trace: Trace, policy: Policy, path: str | Path) -> None:
    """Refuse calibration data recorded on another environment or observation shape."""
    check_fits(trace, policy.spec, path)
