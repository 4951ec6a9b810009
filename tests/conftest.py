"""Shared fixtures: the shipped policies, their calibration data, a CLI runner and a CartPole bundle."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ROOT / "quarl_edge" / "assets" / "policies"
CALIB = ROOT / "calibration_data"


@pytest.fixture(scope="session")
def cartpole_policy() -> Path:
    return POLICIES / "cartpole-ppo"


@pytest.fixture(scope="session")
def pendulum_policy() -> Path:
    return POLICIES / "pendulum-sac"


@pytest.fixture(scope="session")
def cartpole_calib() -> Path:
    return CALIB / "cartpole-ppo.npz"


@pytest.fixture(scope="session")
def pendulum_calib() -> Path:
    return CALIB / "pendulum-sac.npz"


CliRun = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(tmp_path: Path) -> CliRun:
    """Run `quarl-edge ARGS...` as a real subprocess in tmp_path; returns the CompletedProcess."""

    def run(
        *args: str | Path, timeout: float = 600, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, PYTHONWARNINGS="ignore", COLUMNS="200")
        return subprocess.run(
            [sys.executable, "-m", "quarl_edge.cli", *map(str, args)],
            cwd=cwd or tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )

    return run


@pytest.fixture(scope="session")
def cartpole_bundle(
    tmp_path_factory: pytest.TempPathFactory, cartpole_policy: Path, cartpole_calib: Path
) -> Path:
    """fp32 + fp16 + int8 ONNX bundle of the shipped CartPole PPO (exported once per session)."""
    from quarl_edge.bundle import BundleRequest, export_bundle
    from quarl_edge.policy.net import load_checkpoint

    out = tmp_path_factory.mktemp("bundles") / "cartpole-ppo"
    export_bundle(
        load_checkpoint(cartpole_policy),
        BundleRequest(out=out, targets=("onnx-fp32", "onnx-fp16", "onnx-int8"), calibration=cartpole_calib),
    )
    return out
