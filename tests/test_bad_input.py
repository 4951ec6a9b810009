"""Errors a user can cause: exit 2, one `error:` line on stderr, no traceback, no partial output left.

Plus non-finite observations, which are not errors: the bench goes on and reports them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.policy.net import load_checkpoint
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.spec import EnvConfig
from quarl_edge.runtimes.trace import load_trace, make_trace, save_trace

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


@pytest.fixture
def bundle_copy(cartpole_bundle: Path, tmp_path: Path) -> Path:
    """A private, modifiable copy of the session's CartPole bundle."""
    return Path(shutil.copytree(cartpole_bundle, tmp_path / "bundle"))


def _flip_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


# --- policies --------------------------------------------------------------------------------------


def test_missing_policy_path(cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "out" / "b"
    line = assert_one_error(cli("export", "--policy", tmp_path / "no-such-policy", "--out", out))
    assert "no-such-policy" in line and "does not exist" in line
    assert_absent(out)


def test_folder_that_is_not_a_checkpoint(cli: Any, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    line = assert_one_error(cli("record", "--policy", "empty", "--out", "c.npz"))
    assert "policy.json" in line
    assert_absent(tmp_path / "c.npz")


def test_checkpoint_with_altered_weights(cli: Any, cartpole_policy: Path, tmp_path: Path) -> None:
    ckpt = Path(shutil.copytree(cartpole_policy, tmp_path / "ckpt"))
    _flip_byte(ckpt / "weights.npz")
    out = tmp_path / "b"
    line = assert_one_error(cli("export", "--policy", ckpt, "--out", out, "--to", "onnx-fp32"))
    assert "weights.npz" in line and "sha256" in line
    assert_absent(out)


def test_checkpoint_whose_policy_json_is_not_json(cli: Any, cartpole_policy: Path, tmp_path: Path) -> None:
    ckpt = Path(shutil.copytree(cartpole_policy, tmp_path / "ckpt"))
    (ckpt / "policy.json").write_text('{"format": "quarl-edge/checkpoint", ')
    out = tmp_path / "b"
    line = assert_one_error(cli("export", "--policy", ckpt, "--out", out))
    assert "policy.json" in line and "not valid JSON" in line
    assert_absent(out)


def test_zip_that_is_not_a_zip(cli: Any, tmp_path: Path) -> None:
    (tmp_path / "ppo-CartPole-v1.zip").write_bytes(b"PK\x03\x04 this is not really a zip archive")
    out = tmp_path / "b"
    line = assert_one_error(cli("export", "--policy", "ppo-CartPole-v1.zip", "--out", out))
    assert "not a valid zip" in line
    assert_absent(out)


# --- bundles ---------------------------------------------------------------------------------------


def test_bench_refuses_a_truncated_onnx(cli: Any, bundle_copy: Path, tmp_path: Path) -> None:
    f = bundle_copy / "policy.int8.onnx"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    report = tmp_path / "r.json"
    line = assert_one_error(cli("bench", "--bundle", bundle_copy, *FAST_BENCH, "--out", report))
    assert "sha256 mismatch" in line and "policy.int8.onnx" in line
    assert_no_report(report)


def test_bench_refuses_a_truncated_onnx_even_with_a_matching_manifest(
    cli: Any, bundle_copy: Path, tmp_path: Path
) -> None:
    """Someone "fixed" the manifest hash to match the damaged file: the ONNX load still fails."""
    f = bundle_copy / "policy.int8.onnx"
    data = f.read_bytes()[:5000]
    f.write_bytes(data)
    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    for m in manifest["models"]:
        if m["file"] == f.name:
            m["sha256"], m["size_bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    (bundle_copy / "manifest.json").write_text(json.dumps(manifest))
    report = tmp_path / "r.json"
    line = assert_one_error(cli("bench", "--bundle", bundle_copy, *FAST_BENCH, "--out", report))
    assert "policy.int8.onnx" in line and "not a loadable ONNX model" in line
    assert_no_report(report)


def test_bench_refuses_a_modified_model_byte(cli: Any, bundle_copy: Path, tmp_path: Path) -> None:
    _flip_byte(bundle_copy / "policy.int8.onnx")
    report = tmp_path / "r.json"
    line = assert_one_error(cli("bench", "--bundle", bundle_copy, *FAST_BENCH, "--out", report))
    assert "sha256 mismatch" in line and "policy.int8.onnx" in line and "re-export" in line
    assert_no_report(report)


def test_bench_refuses_a_modified_trace(cli: Any, bundle_copy: Path, tmp_path: Path) -> None:
    _flip_byte(bundle_copy / "trace.npz")
    report = tmp_path / "r.json"
    line = assert_one_error(cli("bench", "--bundle", bundle_copy, *FAST_BENCH, "--out", report))
    assert "trace" in line and "sha256" in line
    assert_no_report(report)


def test_bench_on_a_folder_that_is_not_a_bundle(cli: Any, tmp_path: Path) -> None:
    (tmp_path / "nob").mkdir()
    line = assert_one_error(cli("bench", "--bundle", "nob", "--out", "r.json"))
    assert "manifest.json" in line
    assert_no_report(tmp_path / "r.json")


def test_bench_unknown_model(cli: Any, bundle_copy: Path, tmp_path: Path) -> None:
    line = assert_one_error(cli("bench", "--bundle", bundle_copy, "--models", "onnx-int4", "--out", "r.json"))
    assert "onnx-int4" in line and "onnx-int8" in line
    assert_no_report(tmp_path / "r.json")


# --- calibration, environments, targets -------------------------------------------------------------


def test_calibration_recorded_on_another_env(
    cli: Any, cartpole_policy: Path, pendulum_calib: Path, tmp_path: Path
) -> None:
    out = tmp_path / "bundles" / "cp"
    line = assert_one_error(
        cli("export", "--policy", cartpole_policy, "--calibration", pendulum_calib, "--out", out)
    )
    assert "shape [3]" in line and "[4]" in line  # Pendulum observations vs CartPole's
    assert "Pendulum-v1" in line and "CartPole-v1" in line
    assert_absent(out)


def test_calibration_file_that_is_not_a_trace(cli: Any, cartpole_policy: Path, tmp_path: Path) -> None:
    (tmp_path / "calib.npz").write_bytes(b"not an npz")
    out = tmp_path / "b"
    line = assert_one_error(
        cli("export", "--policy", cartpole_policy, "--calibration", "calib.npz", "--out", out)
    )
    assert "calib.npz" in line
    assert_absent(out)


def test_train_unknown_env(cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "X"
    line = assert_one_error(cli("train", "--env", "NotAnEnv-v0", "--algo", "ppo", "--out", out))
    assert "NotAnEnv-v0" in line and "quarl-edge envs" in line
    assert_absent(out)


def test_train_unknown_algo(cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "X"
    line = assert_one_error(cli("train", "--env", "CartPole-v1", "--algo", "ppo2", "--out", out))
    assert "ppo2" in line and "dqn" in line
    assert_absent(out)


@pytest.fixture(scope="module")
def sb3_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (untrained) SB3 PPO CartPole model saved by SB3 itself."""
    from stable_baselines3 import PPO

    path = tmp_path_factory.mktemp("sb3") / "ppo-CartPole-v1.zip"
    PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, policy_kwargs={"net_arch": [8]}).save(path)
    return path


def test_record_sb3_zip_with_unknown_env(cli: Any, sb3_zip: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec.npz"
    line = assert_one_error(cli("record", "--policy", sb3_zip, "--env", "NotAnEnv-v0", "--out", out))
    assert "NotAnEnv-v0" in line
    assert_absent(out)
    # the same zip records fine on its own environment (the error above was about the env only)
    ok = cli("record", "--policy", sb3_zip, "--out", out, "--episodes", "1", "--max-steps", "20")
    assert ok.returncode == 0, ok.stderr
    assert load_trace(out).meta["env_id"] == "CartPole-v1"


def test_export_unknown_target(cli: Any, cartpole_policy: Path, tmp_path: Path) -> None:
    out = tmp_path / "b"
    line = assert_one_error(cli("export", "--policy", cartpole_policy, "--to", "onnx-int3", "--out", out))
    assert "onnx-int3" in line
    assert "known targets" in line and all(t in line for t in ("onnx-fp32", "onnx-fp16", "onnx-int8"))
    assert_absent(out)


def test_export_unknown_calibration_method(cli: Any, cartpole_policy: Path, tmp_path: Path) -> None:
    out = tmp_path / "b"
    line = assert_one_error(cli("export", "--policy", cartpole_policy, "--method", "foo", "--out", out))
    assert "foo" in line and all(m in line for m in ("minmax", "percentile", "entropy"))
    assert_absent(out)


def test_gate_on_a_report_missing_fields(cli: Any, tmp_path: Path) -> None:
    report = {
        "format": "quarl-edge/report",
        "reference": "onnx-fp32",
        "bundle": {"policy": "p"},
        "device": {"name": "local"},
        "settings": {},
        "models": [{"name": "onnx-fp32", "precision": "fp32", "size_bytes": 1}],
    }
    (tmp_path / "r.json").write_text(json.dumps(report))
    line = assert_one_error(cli("gate", "r.json", "--junit", "j.xml"))
    assert "onnx-fp32" in line and "lacks the field" in line
    assert_absent(tmp_path / "j.xml")


def test_long_error_stays_on_one_line(cli: Any, tmp_path: Path) -> None:
    """rich must not wrap the error line, even when it is far wider than the terminal."""
    long_name = "a-policy-folder-with-a-very-long-name-" * 6
    p = cli("export", "--policy", tmp_path / long_name, "--out", tmp_path / "b")
    line = assert_one_error(p)
    assert long_name in line and len(line) > 200


# --- non-finite observations: reported, not fatal ----------------------------------------------------


def test_bench_with_nan_observations_in_the_trace(
    cli: Any, cartpole_bundle: Path, cartpole_calib: Path, tmp_path: Path
) -> None:
    src = load_trace(cartpole_calib)
    obs = src.obs.copy()
    nan_rows = np.arange(0, len(obs), 10)
    obs[nan_rows] = np.nan
    obs[5, 2] = np.inf  # one row with a single non-finite value
    trace = make_trace(
        obs=obs, actions=src.actions, rewards=src.rewards, dones=src.dones,
        episode_ids=src.episode_ids, seeds=src.seeds, meta=src.meta,
    )  # fmt: skip
    save_trace(trace, tmp_path / "nan.npz")
    n_bad = len(nan_rows) + 1
    p = cli("bench", "--bundle", cartpole_bundle, *FAST_BENCH, "--trace", "nan.npz", "--out", "r.json")
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert (tmp_path / "r.md").is_file()
    for m in report["models"]:
        assert any("non-finite" in w and str(n_bad) in w for w in m["warnings"]), m["warnings"]
        assert m["reward"]["episodes"] == 2  # closed-loop episodes still ran
        if m["name"] != report["reference"]:
            assert m["agreement"]["samples"] == len(obs) - n_bad  # over the finite rows only
            assert 0.8 <= m["agreement"]["value"] <= 1.0
    assert "warning:" in p.stderr and "non-finite" in p.stderr
    assert "Warnings:" in (tmp_path / "r.md").read_text()


NANENV = '''
"""CartPole whose 5th step returns a NaN observation (a sensor dropout)."""
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.envs.registration import register


class NaNCartPole(CartPoleEnv):
    def reset(self, *, seed=None, options=None):
        self._t = 0
        return super().reset(seed=seed, options=options)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        self._t += 1
        if self._t == 5:
            obs = np.full_like(obs, np.nan)
        return obs, reward, terminated, truncated, info


register(id="NaNCartPole-v0", entry_point=NaNCartPole, max_episode_steps=500)
'''


@pytest.fixture(scope="module")
def nanenv_bundle(tmp_path_factory: pytest.TempPathFactory, cartpole_policy: Path) -> Iterator[Path]:
    """The CartPole policy exported for the custom env "quarl_test_nanenv:NaNCartPole-v0"."""
    module = "quarl_test_nanenv"
    root = tmp_path_factory.mktemp("nanenv")
    (root / f"{module}.py").write_text(NANENV)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(root))
        # the bench runs each model in a child process: it finds the module through PYTHONPATH
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
        policy = load_checkpoint(cartpole_policy)
        env = EnvConfig(id=f"{module}:NaNCartPole-v0")
        policy = dataclasses.replace(policy, spec=dataclasses.replace(policy.spec, env=env))
        out = root / "nan-bundle"
        # calibration recorded on the custom env itself (two episodes, each with one NaN observation)
        export_bundle(policy, BundleRequest(out=out, targets=("onnx-fp32", "onnx-int8"), record_episodes=2))
        yield out
    sys.modules.pop(module, None)


def test_closed_loop_nan_observation_is_counted(nanenv_bundle: Path) -> None:
    manifest = json.loads((nanenv_bundle / "manifest.json").read_text())
    assert manifest["policy"]["env"]["id"] == "quarl_test_nanenv:NaNCartPole-v0"
    for model in ("onnx-fp32", "onnx-int8"):
        results = PolicyRunner(nanenv_bundle, model).episodes([0, 1, 2], max_steps=50)
        assert [r.seed for r in results] == [0, 1, 2]
        for r in results:
            assert r.error is None, r.error
            assert r.nonfinite_obs == 1  # exactly the NaN of step 5, counted, not fatal
            assert r.length == 50 and r.ret == 50.0


def test_bench_reports_closed_loop_nan_observations(nanenv_bundle: Path) -> None:
    report = bench(nanenv_bundle, BenchConfig(episodes=2, latency_samples=20, max_steps=30))
    for m in report["models"]:
        assert "2 non-finite (NaN/inf) observations during episodes" in m["warnings"], m["warnings"]
        assert m["reward"]["per_episode"] == [30.0, 30.0]
    assert report["models"][1]["drift"]["paired_episodes"] == 2
