"""The first hour, replayed as a new user lives it (issue 29's acceptance): an SB3 zip the tests do not ship
(trained here, saved under SB3's own naming), then record, export, bench, gate, tune on a board, gate the
tune, deploy: each step the command the previous one printed as ``next:``, never an ``--env``. The board is
a real sshd on loopback whose sessions start in a login directory other than its $HOME
(conftest ``away_board``): the tune and the deploy must land under $HOME and leave the login directory
as it was. Marked slow and ssh (a full chain of CLI processes; the CLI's own contract is what is tested).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SSHD, Board

from quarl_edge.deploy import DEPLOYED

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ssh,
    pytest.mark.skipif(not SSHD.is_file(), reason="needs OpenSSH's sshd (apt-get install openssh-server)"),
]


def _train_zip(path: Path) -> None:
    """A small SB3 PPO on CartPole (seconds): its actions and returns vary from episode to episode."""
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=256, batch_size=64, n_epochs=4, seed=3, verbose=0)
    model.learn(4096)
    model.save(path)


def _run(cwd: Path, command: str) -> subprocess.CompletedProcess[str]:
    """A printed ``quarl-edge ...`` line, run as the user would paste it (this venv's quarl-edge)."""
    argv = shlex.split(command)
    assert argv[0] == "quarl-edge", command
    assert "--env" not in argv, f"a hint asks for --env: {command}"
    env = dict(os.environ, COLUMNS="200", PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, "-m", "quarl_edge.cli", *argv[1:]], cwd=cwd, capture_output=True,
                       text=True, timeout=1800, env=env)  # fmt: skip
    assert r.returncode == 0, f"{command}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def _next(r: subprocess.CompletedProcess[str], word: str = "next") -> str:
    """The command of the ``next:`` (or ``or:``) line a step printed, without the trailing remark."""
    for line in r.stderr.splitlines():
        for part in line.split("; "):
            if part.startswith(f"{word}: quarl-edge "):
                return part[len(word) + 2 :].split("   (", 1)[0].strip()
    raise AssertionError(f"no '{word}: quarl-edge' line in:\n{r.stderr[-3000:]}")


def test_a_new_user_goes_from_an_sb3_zip_to_a_board_with_the_printed_commands(
    away_board: tuple[Board, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    board, login = away_board
    monkeypatch.setenv("HOME", str(tmp_path / "host-home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "host-cache"))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    (tmp_path / "host-home").mkdir()
    board.device(tmp_path / "xdg" / "quarl-edge", tmp_path / "known_hosts", python="~/venv/bin/python",
                 cache_dir="~/.cache/quarl-edge")  # fmt: skip
    work = tmp_path / "work"
    work.mkdir()
    _train_zip(work / "ppo_CartPole-v1.zip")
    login_before = sorted(p.name for p in login.iterdir())

    # record: the one command a new user types whole (the docs' first step)
    r = _run(work, "quarl-edge record --policy ppo_CartPole-v1.zip --out calibration_data/ppo.npz")
    export = _next(r)
    assert export.startswith(
        "quarl-edge export --policy ppo_CartPole-v1.zip --calibration calibration_data/ppo.npz"
    )
    bench = _next(_run(work, export))
    assert bench.startswith("quarl-edge bench --bundle ")
    r = _run(work, bench)
    assert "fp32 vs source (PPO.predict" in r.stderr  # the exported fp32 model measured against the zip
    gate = _next(r)
    assert gate.startswith("quarl-edge gate ") and "--max-reward-drop 2%" in gate
    r = _run(work, gate)
    assert "PASS" in r.stderr
    tune = _next(r)  # the local tune, runnable as printed; on the board with --device (the remark says so)
    assert tune.startswith(
        "quarl-edge tune --policy ppo_CartPole-v1.zip --calibration calibration_data/ppo.npz"
    )
    assert _next(r, "or").startswith("quarl-edge deploy --bundle ")

    # the user's own choices for a short search on the board; the rest is the hint
    tuned = _run(work, f"{tune} --device board --kinds int8-default --episodes 4 --max-threads 1")
    gate_tune = _next(tuned)
    assert gate_tune.startswith("quarl-edge gate ") and gate_tune.endswith("tune.json")
    deploy = _next(_run(work, gate_tune))
    assert deploy.startswith("quarl-edge deploy --bundle ") and deploy.endswith("--device board")
    _run(work, deploy)

    deployed = board.home / DEPLOYED
    assert deployed.is_dir() and any(p.is_symlink() for p in deployed.iterdir())
    assert (board.home / ".cache" / "quarl-edge" / "bundles").is_dir()
    assert sorted(p.name for p in login.iterdir()) == login_before, "something landed in the login directory"
