"""Trainer smoke runs with tiny budgets (CleanRL-style): every algorithm trains, saves and reloads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from quarl_edge.policy.net import load_checkpoint
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


@pytest.mark.slow
@pytest.mark.parametrize(("algo", "env", "head"), CASES, ids=[f"{a}-{e}" for a, e, _ in CASES])
def test_train_saves_a_loadable_deterministic_policy(
    cli, tmp_path: Path, algo: str, env: str, head: str
) -> None:
    """The first case through `quarl-edge train` (the command's own contract: exit 0, the checkpoint
    written), the others through the library it calls (a CLI process per case only re-imports torch)."""
    from quarl_edge.train.trainer import TrainConfig, train

    out = tmp_path / f"{algo}-run"
    if (algo, env, head) == CASES[0]:
        proc = cli("train", "--env", env, "--algo", algo, "--steps", "256", "--eval-episodes", "1", "--out", out,
                   "--net-arch", "32,32")  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    else:
        train(TrainConfig(env=env, algo=algo, out=out, steps=256, eval_episodes=1, net_arch=(32, 32)))
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


@pytest.mark.slow
def test_every_periodic_checkpoint_is_complete_and_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each checkpoint written during training (not only the last) is a whole, verified checkpoint: a
    copy is taken the moment each one is saved, and each copy loads with its sha256 checked."""
    import shutil

    from quarl_edge.train import trainer

    out, seen = tmp_path / "ckpt", []
    real_save = trainer.save_checkpoint

    def save_and_snapshot(policy, path, **kw):  # type: ignore[no-untyped-def]
        real_save(policy, path, **kw)
        snap = tmp_path / f"snap{len(seen)}"
        shutil.copytree(path, snap)
        seen.append(snap)

    monkeypatch.setattr(trainer, "save_checkpoint", save_and_snapshot)
    trainer.train(trainer.TrainConfig(env="CartPole-v1", algo="ppo", out=out, steps=768, checkpoint_every=256,
                                      eval_episodes=0, net_arch=(16,)))  # fmt: skip
    assert len(seen) >= 3  # at 256, 512 (periodic) and the final save
    steps = []
    for snap in seen:
        policy = load_checkpoint(snap)  # checks the weights' sha256 against policy.json
        steps.append(policy.spec.train["steps"])
        assert (snap / "weights.npz").is_file() and (snap / "policy.json").is_file()
    periodic = seen[:-1]
    assert all(load_checkpoint(s).spec.train.get("partial") for s in periodic)
    assert not load_checkpoint(seen[-1]).spec.train.get("partial")
    assert steps == sorted(steps) and steps[0] >= 256 and steps[-1] >= 768
    assert (out / "resume" / "sb3_model.zip").is_file()  # and the state to resume from
    assert not list(tmp_path.glob(".ckpt.*"))  # no temp folders left behind


@pytest.mark.slow
def test_keep_best_ends_with_the_best_scored_weights_and_survives_resume(cli, tmp_path: Path) -> None:
    from quarl_edge.train.trainer import SELECT_SEED0, evaluate

    out = tmp_path / "kb"
    common = ("--env", "CartPole-v1", "--algo", "ppo", "--checkpoint-every", "512", "--keep-best", "3",
              "--eval-episodes", "2", "--net-arch", "16", "--out", out)  # fmt: skip
    proc = cli("train", "--steps", "1024", *common)
    assert proc.returncode == 0, proc.stderr
    first = json.loads((out / "selection.json").read_text())["history"]
    assert [h["step"] for h in first] == [512, 1024] and first[0]["kept"]
    assert (out / "best" / "policy.json").is_file() and (out / "resume").is_dir()

    proc = cli("train", "--steps", "2048", "--resume", *common)
    assert proc.returncode == 0, proc.stderr
    history = json.loads((out / "selection.json").read_text())["history"]
    assert history[:2] == first and [h["step"] for h in history] == [512, 1024, 1536, 2048]
    best = max(h["mean"] for h in history)
    assert [h["mean"] for h in history if h["kept"]][-1] == best

    policy = load_checkpoint(out)
    train = policy.spec.train
    sel = train["selection"]
    assert train["steps"] == 2048 and train["keep_best"] == 3 and "partial" not in train
    assert sel["best"]["mean"] == best
    # the chosen weights really are the better of final and best, on the selection seeds
    mean, _, _ = evaluate(policy, 3, seed0=SELECT_SEED0)
    assert mean == pytest.approx(max(best, sel["final"]["mean"]), abs=1e-3)
    want = sel["final"]["step"] if sel["final"]["mean"] >= best else sel["best"]["step"]
    assert train["selected_step"] == want
    assert "--keep-best" in proc.stderr + proc.stdout


def test_keep_best_needs_checkpoints(cli, tmp_path: Path) -> None:
    proc = cli("train", "--env", "CartPole-v1", "--algo", "ppo", "--keep-best", "3", "--out", tmp_path / "x")
    assert proc.returncode == 2 and "--checkpoint-every" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()


def test_a_damaged_keep_best_history_is_refused_naming_the_file(tmp_path: Path) -> None:
    from quarl_edge.runtimes.errors import InputError
    from quarl_edge.train.trainer import BestKeeper, Score

    assert Score(2048, 500.0, 0.0, kept=True).to_dict() == {
        "step": 2048,
        "mean": 500.0,
        "std": 0.0,
        "kept": True,
    }
    assert Score.from_dict({"step": 1024, "mean": 9.5, "std": 1.0}, "final") == Score(1024, 9.5, 1.0)
    with pytest.raises(ValueError, match="std is -1, outside >= 0"):
        Score(1024, 9.5, -1.0)
    with pytest.raises(ValueError, match="kept is not true or false"):
        Score(1024, 9.5, 1.0, kept="yes")  # type: ignore[arg-type]
    (tmp_path / "selection.json").write_text(
        json.dumps({"history": [{"step": 1024, "mean": "high", "std": 0}]})
    )
    with pytest.raises(InputError, match="selection.json' is damaged"):
        BestKeeper(tmp_path, 3)
