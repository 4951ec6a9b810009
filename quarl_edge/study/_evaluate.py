"""One evaluation of a policy variant on paired seeds, run inside a Ray task by the studies (and tune):
torch variants (fp32, weight-only n-bit, random) through the PolicyNet, runtime variants through the
device runner (runtimes/); optionally its actions on recorded states, for fidelity."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from quarl_edge.runtimes.errors import QuarlError


def _returns_torch(policy_dir: str, variant: str, bits: int | None, seeds: list[int]) -> list[float]:
    import torch

    from quarl_edge.policy.net import load_checkpoint
    from quarl_edge.quant.weights import quantize_weights
    from quarl_edge.runtimes.envs import make_env
    from quarl_edge.runtimes.runner import run_episodes

    torch.set_num_threads(1)
    policy = load_checkpoint(policy_dir)
    if bits is not None:
        policy = quantize_weights(policy, bits)
    env = make_env(policy.spec.env)
    act = (lambda _obs: env.action_space.sample()) if variant == "random" else policy.act
    try:
        return [e.ret for e in run_episodes(env, act, seeds, catch=False)]
    finally:
        env.close()


def _returns_runtime(bundle: str, model: str, seeds: list[int]) -> list[float]:
    from quarl_edge.runtimes.runner import PolicyRunner

    runner = PolicyRunner(bundle, model, threads=1)
    return [e.ret for e in runner.episodes(seeds)]


FIDELITY_STATES = 1000  # recorded calibration states on which each variant's actions are compared with fp32's


def _trace_obs(path: str) -> np.ndarray:
    from quarl_edge.runtimes.trace import load_trace

    obs = load_trace(path).obs
    idx = np.linspace(0, len(obs) - 1, min(FIDELITY_STATES, len(obs))).astype(int)
    return obs[idx]


def _actions(kind: str, target: str, variant: str, bits: int | None, trace: str) -> np.ndarray | None:
    """The variant's actions on the recorded states (None for the random policy)."""
    obs = _trace_obs(trace)
    if variant == "random":
        return None
    if kind == "torch":
        from quarl_edge.policy.net import load_checkpoint
        from quarl_edge.quant.weights import quantize_weights

        policy = load_checkpoint(target)
        if bits is not None:
            policy = quantize_weights(policy, bits)
        x = obs if obs.dtype == np.uint8 else obs.astype(np.float32)
        return np.concatenate([policy.predict(x[i : i + 256]) for i in range(0, len(x), 256)])
    from quarl_edge.runtimes.runner import PolicyRunner

    runner = PolicyRunner(target, variant, threads=1)
    return np.stack([np.asarray(runner.act(o)) for o in obs])


@dataclass(frozen=True)
class Evaluation:
    """One variant's evaluation: its returns on the seeds and its actions on the recorded states, or why it
    was skipped."""

    returns: list[float] = field(default_factory=list)
    actions: np.ndarray | None = None
    skipped: str | None = None


def evaluate_task(
    kind: str, target: str, variant: str, bits: int | None, seeds: list[int], trace: str | None = None
) -> Evaluation:
    """One evaluation (a Ray task); never raises for user errors: they are the evaluation's ``skipped``."""
    try:
        if kind == "torch":
            returns = _returns_torch(target, variant, bits, seeds)
        else:
            returns = _returns_runtime(target, variant, seeds)
        actions = _actions(kind, target, variant, bits, trace) if trace is not None else None
        return Evaluation(returns=returns, actions=actions)
    except QuarlError as e:
        return Evaluation(skipped=str(e))
    except ImportError as e:
        return Evaluation(skipped=f"not installed: {e}")
