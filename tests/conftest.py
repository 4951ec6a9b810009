"""Shared fixtures: the shipped policies, their calibration data, a CLI runner and a CartPole bundle."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def _export_shipped(out: Path, policy: Path, calibration: Path, targets: tuple[str, ...]) -> Path:
    from quarl_edge.bundle import BundleRequest, export_bundle
    from quarl_edge.policy.net import load_checkpoint

    export_bundle(load_checkpoint(policy), BundleRequest(out=out, targets=targets, calibration=calibration))
    return out


@pytest.fixture(scope="session")
def cartpole_bundle(
    tmp_path_factory: pytest.TempPathFactory, cartpole_policy: Path, cartpole_calib: Path
) -> Path:
    """fp32 + fp16 + int8 ONNX bundle of the shipped CartPole PPO (exported once per session)."""
    out = tmp_path_factory.mktemp("bundles") / "cartpole-ppo"
    return _export_shipped(out, cartpole_policy, cartpole_calib, ("onnx-fp32", "onnx-fp16", "onnx-int8"))


@pytest.fixture(scope="session")
def zoo_pong() -> tuple[Path, Path]:
    """The trained zoo Pong DQN (Nature-CNN, 2.25M steps) and its 1,000 recorded frames."""
    return POLICIES / "pong-dqn", CALIB / "pong-dqn.npz"


def assert_discriminating(
    actions: Any, n_actions: int, min_distinct: int = 3, max_share: float = 0.6
) -> None:
    """An accuracy check is only as good as its policy: one that takes a single action (a random-init
    CNN picks action 0 on every frame) agrees with any constant model. Fail if it ever becomes so."""
    import numpy as np

    counts = np.bincount(np.asarray(actions, dtype=np.int64).reshape(-1), minlength=n_actions)
    share = counts.max() / counts.sum()
    assert (counts > 0).sum() >= min_distinct and share <= max_share, (
        f"degenerate policy: action counts {counts}"
    )


@pytest.fixture(scope="session")
def pendulum_bundle(
    tmp_path_factory: pytest.TempPathFactory, pendulum_policy: Path, pendulum_calib: Path
) -> Path:
    """fp32 + int8 ONNX bundle of the shipped Pendulum SAC (continuous actions, returns that vary by seed)."""
    out = tmp_path_factory.mktemp("bundles") / "pendulum-sac"
    return _export_shipped(out, pendulum_policy, pendulum_calib, ("onnx-fp32", "onnx-int8"))


@dataclass(frozen=True)
class InstalledWheel:
    wheel: Path
    venv: Path

    @property
    def exe(self) -> Path:
        return self.venv / "bin" / "quarl-edge"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"


_SKIP_COPY = shutil.ignore_patterns(
    ".git", ".venv", "build", ".cache", "*.egg-info", "__pycache__", "out", "runs"
)


@pytest.fixture(scope="session")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> InstalledWheel:
    """quarl-edge as a user gets it: the wheel built from a clean copy of the source tree, pip-installed
    (no editable finder) into a fresh venv whose dependencies are the test venv's (no download)."""
    work = tmp_path_factory.mktemp("wheel")
    src = work / "src"
    shutil.copytree(ROOT, src, ignore=_SKIP_COPY)  # a stale build/lib would leak old modules into the wheel
    dist = work / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "-w", str(dist), str(src)], check=True, capture_output=True, timeout=600)  # fmt: skip
    (wheel,) = dist.glob("quarl_edge-*.whl")
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True, timeout=600)  # fmt: skip
    # the test venv's packages, as a plain path entry: its .pth files (our editable finder) do not run
    site = next((venv / "lib").glob("python3*/site-packages"))
    deps = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "zz-test-venv-deps.pth").write_text("\n".join(deps) + "\n")
    return InstalledWheel(wheel, venv)


def pytest_addoption(parser: Any) -> None:
    parser.addoption(
        "--fuzz-examples", default=200, type=int, help="cases per artifact in tests/test_fuzz.py"
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """How many fuzz cases ran per artifact; one line naming every tier (test file) that skipped tests,
    and why: nothing skips silently."""
    fuzz = sys.modules.get("test_fuzz")
    counts = getattr(fuzz, "COUNTS", None)
    if counts:
        terminalreporter.write_line("fuzz cases: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    by_file: dict[str, set[str]] = {}
    for rep in terminalreporter.stats.get("skipped", []):
        where = str(rep.location[0]) if getattr(rep, "location", None) else "?"
        reason = str(rep.longrepr[2]) if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        by_file.setdefault(where, set()).add(reason.removeprefix("Skipped: "))
    if by_file:
        parts = [f"{f} ({'; '.join(sorted(r))})" for f, r in sorted(by_file.items())]
        terminalreporter.write_line("skipped tiers: " + ", ".join(parts))


# ---- the one-line error contract, shared by the CLI tests of several files ----------------------------

FAST_BENCH = ("--episodes", "2", "--latency-samples", "50")


def assert_one_error(p: subprocess.CompletedProcess[str]) -> str:
    """Exit 2 and exactly one non-blank stderr line, starting with `error:`; returns that line."""
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2, f"exit {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}"
    assert "Traceback" not in p.stderr, p.stderr
    assert len(lines) == 1, f"expected one error line, got {len(lines)}:\n{p.stderr}"
    assert lines[0].startswith("error:"), lines[0]
    assert len(lines[0]) > len("error: ") + 10
    return lines[0]


def assert_absent(path: Path) -> None:
    """Neither the output nor a temporary sibling (`.name.*.tmp`, `.name.old-*`) is left behind."""
    assert not path.exists(), f"{path} was left behind"
    leftovers = sorted(p.name for p in path.parent.glob(f".{path.name}.*"))
    assert not leftovers, f"temporary files left in {path.parent}: {leftovers}"


def assert_no_report(path: Path) -> None:
    assert_absent(path)
    assert_absent(path.with_suffix(".md"))


def interruptible() -> None:
    """``preexec_fn`` for a child that a test stops with SIGINT, as Ctrl-C would: a shell that started
    pytest in the background (``cmd &`` without job control, e.g. under nohup) ignores SIGINT, the
    children inherit that, and the CLI would never see the interrupt (seen in a CI check run so)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# ---- the runtime API's bundles: ONNX and LiteRT side by side (tests/test_runtime_*.py) ------------------


@pytest.fixture(scope="session")
def pong_rt_bundle(tmp_path_factory: pytest.TempPathFactory, zoo_pong: tuple[Path, Path]) -> Path:
    """The zoo Pong DQN (uint8 4x84x84 frames) as onnx-int8 and tflite-int8."""
    out = tmp_path_factory.mktemp("rt-bundles") / "pong-dqn"
    return _export_shipped(out, zoo_pong[0], zoo_pong[1], ("onnx-int8", "tflite-int8"))


@pytest.fixture(scope="session")
def cartpole_rt_bundle(
    tmp_path_factory: pytest.TempPathFactory, cartpole_policy: Path, cartpole_calib: Path
) -> Path:
    """The zoo CartPole PPO (discrete) as onnx-fp32, onnx-int8, tflite-fp32 and tflite-int8."""
    out = tmp_path_factory.mktemp("rt-bundles") / "cartpole-ppo"
    targets = ("onnx-fp32", "onnx-int8", "tflite-fp32", "tflite-int8")
    return _export_shipped(out, cartpole_policy, cartpole_calib, targets)


@pytest.fixture(scope="session")
def pendulum_rt_bundle(
    tmp_path_factory: pytest.TempPathFactory, pendulum_policy: Path, pendulum_calib: Path
) -> Path:
    """The zoo Pendulum SAC (continuous) as onnx-fp32, onnx-int8, tflite-fp32 and tflite-int8."""
    out = tmp_path_factory.mktemp("rt-bundles") / "pendulum-sac"
    targets = ("onnx-fp32", "onnx-int8", "tflite-fp32", "tflite-int8")
    return _export_shipped(out, pendulum_policy, pendulum_calib, targets)


# ---- C export (issue 31): zoo bundles with ONNX and C models, exported once per session ------------

C_TARGETS = ("onnx-fp32", "onnx-int8", "c-fp32", "c-int8")


@pytest.fixture(scope="session")
def c_bundle(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """name -> a bundle of that zoo policy with C_TARGETS, exported on first use, once per session."""
    root = tmp_path_factory.mktemp("c-bundles")
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = _export_shipped(root / name, POLICIES / name, CALIB / f"{name}.npz", C_TARGETS)
        return made[name]

    return get
