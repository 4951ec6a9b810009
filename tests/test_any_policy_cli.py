"""The CLI's own contract for policies from anywhere: the `next:` hints of record and export run as
printed with no --env (the env found in the zip's SB3 name or the calibration file), `inspect --json`
puts data alone on stdout, and a custom policy class is one line, exit 2."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from conftest import CliRun
from stable_baselines3 import PPO


@pytest.fixture(scope="module")
def plain_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("zip")
    model = PPO("MlpPolicy", "CartPole-v1", seed=0, device="cpu", n_steps=64, batch_size=32, n_epochs=1)
    model.learn(64)
    model.save(out / "ppo_CartPole-v1.zip")
    shutil.copyfile(out / "ppo_CartPole-v1.zip", out / "model.zip")  # a name that says nothing
    return out / "model.zip"


def _next(stderr: str) -> list[str]:
    line = next(ln for ln in stderr.splitlines() if ln.strip().startswith("next:"))
    return shlex.split(line.split("next:", 1)[1])


def test_record_then_the_printed_export_runs_without_env(
    cli: CliRun, plain_zip: Path, tmp_path: Path
) -> None:
    r = cli(
        "record",
        "--policy",
        plain_zip,
        "--env",
        "CartPole-v1",
        "--episodes",
        "2",
        "--out",
        tmp_path / "c.npz",
    )
    assert r.returncode == 0, r.stderr
    cmd = _next(r.stderr)
    assert cmd[:2] == ["quarl-edge", "export"] and "--env" not in cmd
    r2 = cli(*cmd[1:], "--to", "onnx-fp32", cwd=tmp_path)  # as printed (a later --to wins)
    assert r2.returncode == 0, r2.stderr
    assert "fp32 vs source (PPO.predict" in r2.stderr
    bench = _next(r2.stderr)
    assert bench[:2] == ["quarl-edge", "bench"] and (tmp_path / bench[3]).is_dir()


def test_inspect_json_and_a_custom_class(cli: CliRun, plain_zip: Path, tmp_path: Path) -> None:
    r = cli("inspect", plain_zip.parent / "ppo_CartPole-v1.zip", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["source"] == "sb3" and data["env_from"] == "file name" and data["algo"] == "ppo"
    r = cli("inspect", plain_zip)
    assert r.returncode == 2 and "does not say which environment" in r.stderr and "--env" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
