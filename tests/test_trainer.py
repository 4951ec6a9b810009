"""Trainer smoke runs with tiny budgets (CleanRL-style): every algorithm trains, saves and reloads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from quarl_edge.policies import load_checkpoint
from quarl_edge.runtimes.envs import make_env

CASES = [
    ("ppo", "CartPole-v1", "argmax"),
    ("a2c", "CartPole-v1", "argmax"),
    ("dqn", "CartPole-v1", "argmax"),
    ("sac", "Pendulum-v1", "tanh_unscale"),
    ("td3", "Pendulum-v1", "tanh_unscale"),
    ("ddpg", "MountainCarContinuous-v0", "tanh_unscale"),
    ("ppo", "Pendulum-v1", "clip"),
]


@pytest.mark.parametrize(("algo", "env", "head"), CASES, ids=[f"{a}-{e}" for a, e, _ in CASES])
def test_train_saves_a_loadable_deterministic_policy(
    cli, tmp_path: Path, algo: str, env: str, head: str
) -> None:
    out = tmp_path / f"{algo}-run"
    proc = cli("train", "--env", env, "--algo", algo, "--steps", "256", "--eval-episodes", "1", "--out", out,
               "--net-arch", "32,32")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "policy.json").read_text())
    assert meta["spec"]["algo"] == algo and meta["spec"]["env"]["id"] == env
    assert meta["spec"]["train"]["steps"] >= 256 and "eval_return_mean" in meta["spec"]["train"]
    policy = load_checkpoint(out)
    assert policy.arch.head == head and policy.arch.hidden == (32, 32)
    e = make_env(policy.spec.env)
    obs, _ = e.reset(seed=0)
    action = policy.act(obs)
    assert e.action_space.contains(
        np.asarray(action, dtype=e.action_space.dtype) if head != "argmax" else action
    )


def test_train_rejects_algorithm_that_does_not_fit_the_action_space(cli, tmp_path: Path) -> None:
    proc = cli("train", "--env", "CartPole-v1", "--algo", "sac", "--out", tmp_path / "x")
    assert proc.returncode == 2
    assert "continuous actions" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()


def test_periodic_checkpoints_are_complete(cli, tmp_path: Path) -> None:
    out = tmp_path / "ckpt"
    proc = cli("train", "--env", "CartPole-v1", "--algo", "ppo", "--steps", "512", "--checkpoint-every", "256",
               "--eval-episodes", "0", "--out", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert load_checkpoint(out).spec.train["steps"] >= 512
    assert not list(tmp_path.glob(".ckpt.*"))  # no temp folders left behind
