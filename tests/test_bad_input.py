"""Errors a user can cause: a domain error (QuarlError, exit code 2) that names the problem and the fix,
raised before the asked-for output is written, so none of it is left behind.

Each case calls the library the way its CLI command does (the ``export``/``record``/``bench``/``gate``/
``train`` helpers below mirror quarl_edge/cli/pipeline.py); one parametrized test then runs the
installed ``quarl-edge`` over a handful of them for the CLI's contract: exit 2, one ``error:`` line on
stderr, no traceback, nothing on stdout.

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
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import assert_absent, assert_no_report

from quarl_edge.bench.fleet import bench_on_device
from quarl_edge.bench.partial import PARTIAL_FORMAT, BenchInterrupted, partial_path
from quarl_edge.bench.report import read_report
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.exporters.base import ExportConfig
from quarl_edge.exporters.targets import resolve_targets
from quarl_edge.gate import GateConfig, evaluate, write_outputs
from quarl_edge.policy.load import load_policy
from quarl_edge.policy.net import load_checkpoint
from quarl_edge.record import RecordConfig, record_to_file
from quarl_edge.runtimes.errors import InputError, IntegrityError, QuarlError
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.spec import EnvConfig
from quarl_edge.runtimes.trace import load_trace, make_trace, save_trace
from quarl_edge.train.trainer import TrainConfig, train

FAST_BENCH = ("--episodes", "2", "--latency-samples", "50")
FAST_BENCH_CONFIG = BenchConfig(episodes=2, latency_samples=50)


@contextmanager
def user_error(
    kind: type[QuarlError], problem: Sequence[str] = (), fix: Sequence[str] = ()
) -> Iterator[pytest.ExceptionInfo[QuarlError]]:
    """The block raises ``kind`` with exit code 2, ``str(e) == "problem; fix"``, each of ``problem``
    in its problem and each of ``fix`` in its fix (which must be there)."""
    with pytest.raises(kind) as info:
        yield info
    e = info.value
    assert e.exit_code == 2, f"exit code {e.exit_code} for {e!r}"
    assert e.fix, f"no fix given: {e}"
    assert str(e) == f"{e.problem}; {e.fix}" and "\n" not in str(e), repr(str(e))
    missing = [s for s in problem if s not in e.problem] + [s for s in fix if s not in e.fix]
    assert not missing, f"{missing} not in {str(e)!r}"


# --- the library calls behind each command (as quarl_edge/cli/pipeline.py makes them) ---------------


def export(
    policy: Path,
    out: Path,
    to: str = "onnx-fp32,onnx-fp16,onnx-int8",
    calibration: Path | None = None,
    method: str = "minmax",
) -> None:
    cfg = ExportConfig(calibration_method=method)
    targets = tuple(resolve_targets(to))
    req = BundleRequest(
        out=out, targets=targets, calibration=calibration, config=cfg, reads=(("policy", policy),)
    )
    export_bundle(load_policy(policy), req)


def record(policy: Path, out: Path, env: str | None = None, cfg: RecordConfig = RecordConfig()) -> None:
    record_to_file(load_policy(policy, env), cfg, out, [("policy", policy)])


def bench_to(bundle: Path, out: Path, models: tuple[str, ...] | None = None) -> None:
    bench_on_device(bundle, dataclasses.replace(FAST_BENCH_CONFIG, models=models), out=out)


def gate(report: Path, junit: Path) -> None:
    data = read_report(report)
    write_outputs(data, evaluate(data, GateConfig()), junit, None, reads=[("report", report)])


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


def test_missing_policy_path(tmp_path: Path) -> None:
    out = tmp_path / "out" / "b"
    with user_error(InputError, ["no-such-policy", "does not exist"], ["checkpoint folder", ".zip"]):
        export(tmp_path / "no-such-policy", out)
    assert_absent(out)


def test_folder_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with user_error(InputError, ["empty", "policy.json"], ["quarl-edge train"]):
        record(tmp_path / "empty", tmp_path / "c.npz")
    assert_absent(tmp_path / "c.npz")


def test_checkpoint_with_altered_weights(cartpole_policy: Path, tmp_path: Path) -> None:
    ckpt = Path(shutil.copytree(cartpole_policy, tmp_path / "ckpt"))
    _flip_byte(ckpt / "weights.npz")
    out = tmp_path / "b"
    with user_error(IntegrityError, ["weights.npz", "sha256"], ["re-train or re-import"]):
        export(ckpt, out, to="onnx-fp32")
    assert_absent(out)


def test_checkpoint_whose_policy_json_is_not_json(cartpole_policy: Path, tmp_path: Path) -> None:
    ckpt = Path(shutil.copytree(cartpole_policy, tmp_path / "ckpt"))
    (ckpt / "policy.json").write_text('{"format": "quarl-edge/checkpoint", ')
    out = tmp_path / "b"
    with user_error(IntegrityError, ["policy.json", "not valid JSON"], ["re-train or re-import"]):
        export(ckpt, out)
    assert_absent(out)


def test_zip_that_is_not_a_zip(tmp_path: Path) -> None:
    (tmp_path / "ppo-CartPole-v1.zip").write_bytes(b"PK\x03\x04 this is not really a zip archive")
    out = tmp_path / "b"
    with user_error(IntegrityError, ["ppo-CartPole-v1.zip", "not a valid zip"], ["re-save"]):
        export(tmp_path / "ppo-CartPole-v1.zip", out)
    assert_absent(out)


# --- bundles ---------------------------------------------------------------------------------------


def test_bench_refuses_a_truncated_onnx(bundle_copy: Path, tmp_path: Path) -> None:
    f = bundle_copy / "policy.int8.onnx"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    report = tmp_path / "r.json"
    with user_error(IntegrityError, ["sha256 mismatch", "policy.int8.onnx"], ["re-export"]):
        bench_to(bundle_copy, report)
    assert_no_report(report)


def test_bench_refuses_a_truncated_onnx_even_with_a_matching_manifest(
    bundle_copy: Path, tmp_path: Path
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
    # fp32 and fp16 ran before int8 failed in the device runner: the bench stops and keeps their episodes
    # in the partial file (its "fix" is --resume; the runner's own fix, re-export, is in the problem)
    with user_error(
        BenchInterrupted,
        ["policy.int8.onnx", "not a loadable ONNX model", "re-export", "missing: onnx-int8"],
        ["--resume"],
    ):
        bench_to(bundle_copy, report)
    assert json.loads(partial_path(report).read_text())["format"] == PARTIAL_FORMAT
    assert_no_report(report)


def test_bench_refuses_a_modified_model_byte(bundle_copy: Path, tmp_path: Path) -> None:
    _flip_byte(bundle_copy / "policy.int8.onnx")
    report = tmp_path / "r.json"
    with user_error(IntegrityError, ["sha256 mismatch", "policy.int8.onnx"], ["re-export"]):
        bench_to(bundle_copy, report)
    assert_no_report(report)


def test_bench_refuses_a_modified_trace(bundle_copy: Path, tmp_path: Path) -> None:
    _flip_byte(bundle_copy / "trace.npz")
    report = tmp_path / "r.json"
    with user_error(IntegrityError, ["trace", "sha256"], ["re-export"]):
        bench_to(bundle_copy, report)
    assert_no_report(report)


def test_bench_on_a_folder_that_is_not_a_bundle(tmp_path: Path) -> None:
    (tmp_path / "nob").mkdir()
    with user_error(InputError, ["nob", "manifest.json"], ["quarl-edge export"]):
        bench_to(tmp_path / "nob", tmp_path / "r.json")
    assert_no_report(tmp_path / "r.json")


def test_bench_unknown_model(bundle_copy: Path, tmp_path: Path) -> None:
    with user_error(InputError, ["onnx-int4"], ["onnx-fp32", "onnx-fp16", "onnx-int8"]):
        bench_to(bundle_copy, tmp_path / "r.json", models=("onnx-int4",))
    assert_no_report(tmp_path / "r.json")


# --- calibration, environments, targets -------------------------------------------------------------


def test_calibration_recorded_on_another_env(
    cartpole_policy: Path, pendulum_calib: Path, tmp_path: Path
) -> None:
    out = tmp_path / "bundles" / "cp"
    # Pendulum observations vs CartPole's
    with user_error(InputError, ["shape [3]", "[4]", "Pendulum-v1", "CartPole-v1"], ["quarl-edge record"]):
        export(cartpole_policy, out, calibration=pendulum_calib)
    assert_absent(out)


def test_calibration_file_that_is_not_a_trace(cartpole_policy: Path, tmp_path: Path) -> None:
    (tmp_path / "calib.npz").write_bytes(b"not an npz")
    out = tmp_path / "b"
    with user_error(IntegrityError, ["calib.npz"], ["quarl-edge record"]):
        export(cartpole_policy, out, calibration=tmp_path / "calib.npz")
    assert_absent(out)


def test_train_unknown_env(tmp_path: Path) -> None:
    out = tmp_path / "X"
    with user_error(InputError, ["NotAnEnv-v0"], ["quarl-edge envs"]):
        train(TrainConfig(env="NotAnEnv-v0", algo="ppo", out=out))
    assert_absent(out)


def test_train_unknown_dm_control_task(tmp_path: Path) -> None:
    out = tmp_path / "X"
    with user_error(InputError, ["unknown DM Control task", "dm_control/walker-fly-v0"],
                    ["dm_control/<task>-v0", "walker-stand", "cartpole-balance", "finger-spin"]):  # fmt: skip
        train(TrainConfig(env="dm_control/walker-fly-v0", algo="sac", out=out))
    assert_absent(out)


def test_train_unknown_algo(tmp_path: Path) -> None:
    out = tmp_path / "X"
    with user_error(InputError, ["ppo2"], ["ppo", "dqn", "sac"]):
        train(TrainConfig(env="CartPole-v1", algo="ppo2", out=out))
    assert_absent(out)


@pytest.fixture(scope="module")
def sb3_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real (untrained) SB3 PPO CartPole model saved by SB3 itself."""
    from stable_baselines3 import PPO

    path = tmp_path_factory.mktemp("sb3") / "ppo-CartPole-v1.zip"
    PPO("MlpPolicy", "CartPole-v1", n_steps=64, batch_size=32, policy_kwargs={"net_arch": [8]}).save(path)
    return path


def test_record_sb3_zip_with_unknown_env(sb3_zip: Path, tmp_path: Path) -> None:
    out = tmp_path / "rec.npz"
    with user_error(InputError, ["NotAnEnv-v0"], ["quarl-edge envs"]):
        record(sb3_zip, out, env="NotAnEnv-v0")
    assert_absent(out)
    # the same zip records fine on its own environment (the error above was about the env only)
    record(sb3_zip, out, cfg=RecordConfig(episodes=1, max_steps=20))
    assert load_trace(out).meta["env_id"] == "CartPole-v1"


def test_export_unknown_target(cartpole_policy: Path, tmp_path: Path) -> None:
    out = tmp_path / "b"
    with user_error(InputError, ["onnx-int3"], ["known targets", "onnx-fp32", "onnx-fp16", "onnx-int8"]):
        export(cartpole_policy, out, to="onnx-int3")
    assert_absent(out)


def test_export_unknown_calibration_method(cartpole_policy: Path, tmp_path: Path) -> None:
    out = tmp_path / "b"
    with user_error(InputError, ["foo"], ["minmax", "percentile", "entropy"]):
        export(cartpole_policy, out, method="foo")
    assert_absent(out)


BAD_REPORT = {
    "format": "quarl-edge/report",
    "reference": "onnx-fp32",
    "bundle": {"policy": "p"},
    "device": {"name": "local"},
    "settings": {},
    "models": [{"name": "onnx-fp32", "precision": "fp32", "size_bytes": 1}],
}


def test_gate_on_a_report_missing_fields(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps(BAD_REPORT))
    with user_error(InputError, ["r.json", "onnx-fp32", "lacks the field"], ["quarl-edge bench"]):
        gate(tmp_path / "r.json", tmp_path / "j.xml")
    assert_absent(tmp_path / "j.xml")


# --- the CLI's one-line error contract, on the installed entry point ---------------------------------


@dataclass(frozen=True)
class CliCase:
    setup: Callable[[Path], list[str | Path]]
    """makes the case's files in the work folder; returns the arguments"""
    says: tuple[str, ...]
    """what the error line must contain"""
    leaves_no: str
    """the output the command was asked for, which must not exist afterwards"""


LONG_NAME = "a-policy-folder-with-a-very-long-name-" * 6
CHECKPOINT = Path(__file__).resolve().parent.parent / "quarl_edge" / "assets" / "policies" / "cartpole-ppo"
EXE = Path(sys.executable).parent / "quarl-edge"


def _write_bad_report(tmp: Path) -> list[str | Path]:
    (tmp / "r.json").write_text(json.dumps(BAD_REPORT))
    return ["gate", "r.json", "--junit", "j.xml"]


def _mkdir(tmp: Path, name: str) -> Path:
    (tmp / name).mkdir()
    return tmp / name


CLI_CASES = {
    "missing-policy": CliCase(
        lambda t: ["export", "--policy", t / "no-such-policy", "--out", t / "b"],
        ("no-such-policy", "does not exist"),
        "b",
    ),
    "not-a-checkpoint": CliCase(
        lambda t: ["record", "--policy", _mkdir(t, "empty"), "--out", "c.npz"], ("policy.json",), "c.npz"
    ),
    "unknown-export-target": CliCase(
        lambda t: ["export", "--policy", CHECKPOINT, "--to", "onnx-int3", "--out", "b"],
        ("onnx-int3", "known targets", "onnx-fp32", "onnx-int8"),
        "b",
    ),
    "bench-not-a-bundle": CliCase(
        lambda t: ["bench", "--bundle", _mkdir(t, "nob"), "--out", "r.json"],
        ("manifest.json",),
        "r.json",
    ),
    "gate-bad-report": CliCase(_write_bad_report, ("onnx-fp32", "lacks the field"), "j.xml"),
    "train-unknown-dmc-task": CliCase(
        lambda t: ["train", "--env", "dm_control/walker-fly-v0", "--algo", "sac", "--out", "X"],
        ("unknown DM Control task", "walker-fly", "walker-stand", "reacher-easy"),
        "X",
    ),
    "train-unknown-algo": CliCase(
        lambda t: ["train", "--env", "CartPole-v1", "--algo", "ppo2", "--out", "X"], ("ppo2", "dqn"), "X"
    ),
    # rich must not wrap the error line, even when it is far wider than the terminal (COLUMNS=80)
    "long-error-one-line": CliCase(
        lambda t: ["export", "--policy", t / LONG_NAME, "--out", t / "b"], (LONG_NAME,), "b"
    ),
}


@pytest.mark.parametrize("case", list(CLI_CASES.values()), ids=list(CLI_CASES))
def test_cli_error_is_one_line(case: CliCase, tmp_path: Path) -> None:
    """Exit 2, exactly one non-blank stderr line starting with `error:`, no traceback, empty stdout."""
    args = case.setup(tmp_path)
    env = dict(os.environ, PYTHONWARNINGS="ignore", COLUMNS="80")
    p = subprocess.run([str(EXE), *map(str, args)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env=env)  # fmt: skip
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2, f"exit {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}"
    assert "Traceback" not in p.stderr, p.stderr
    assert len(lines) == 1, f"expected one error line, got {len(lines)}:\n{p.stderr}"
    assert lines[0].startswith("error: "), lines[0]
    assert p.stdout == "", p.stdout
    missing = [s for s in case.says if s not in lines[0]]
    assert not missing, f"{missing} not in {lines[0]!r}"
    assert_absent(tmp_path / case.leaves_no)


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
    report = bench(nanenv_bundle, BenchConfig(episodes=2, latency_samples=20, max_steps=30)).to_dict()
    for m in report["models"]:
        assert "2 non-finite (NaN/inf) observations during episodes" in m["warnings"], m["warnings"]
        assert m["reward"]["per_episode"] == [30.0, 30.0]
    assert report["models"][1]["drift"]["paired_episodes"] == 2
