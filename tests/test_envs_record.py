"""Environment registry (preprocessing as data) and recorded traces (hash-checked, no pickle)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from quarl_edge.policy.net import load_checkpoint
from quarl_edge.policy.registry import BUILTIN, env_config
from quarl_edge.record import RecordConfig, record
from quarl_edge.runtimes.envs import make_env, space_spec
from quarl_edge.runtimes.errors import InputError, IntegrityError
from quarl_edge.runtimes.spec import EnvConfig
from quarl_edge.runtimes.trace import load_trace, save_trace


def test_atari_preprocessing_is_data_and_gives_stacked_uint8_frames() -> None:
    cfg = env_config("ALE/Pong-v5")
    round_trip = EnvConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert [w.name for w in round_trip.wrappers] == ["atari_preprocessing", "frame_stack"]
    env = make_env(round_trip)
    obs, _ = env.reset(seed=0)
    spec = space_spec(env.observation_space)
    env.close()
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    assert spec.is_image and spec.low == 0.0 and spec.high == 255.0


@pytest.mark.parametrize(
    "env_id", [e for e, v in BUILTIN.items() if v.family in ("classic", "box2d", "mujoco")]
)
def test_builtin_vector_envs_make_and_describe(env_id: str) -> None:
    env = make_env(env_config(env_id))
    obs, _ = env.reset(seed=0)
    spec = space_spec(env.observation_space)
    env.close()
    assert tuple(spec.shape) == np.asarray(obs).shape
    json.dumps(spec.to_dict(), allow_nan=False)  # infinite bounds are encoded as strings


def test_unknown_env_is_a_user_error() -> None:
    with pytest.raises(InputError, match="unknown environment id"):
        make_env(env_config("NotAnEnv-v0"))


def test_record_round_trip_and_tamper_detection(cartpole_policy: Path, tmp_path: Path) -> None:
    policy = load_checkpoint(cartpole_policy)
    trace = record(policy, RecordConfig(episodes=3, epsilon=0.2, seed=7, max_steps=50))
    assert trace.episodes == 3 and trace.samples == 150 and trace.dones.sum() == 3
    assert list(trace.seeds) == [7, 8, 9]
    path = save_trace(trace, tmp_path / "t.npz")
    back = load_trace(path)
    assert back.sha256 == trace.sha256 and np.array_equal(back.obs, trace.obs)
    assert back.meta["env_id"] == "CartPole-v1" and back.meta["epsilon"] == 0.2
    # the exploration really leaves the greedy path
    greedy = policy.predict(trace.obs)
    assert 0.0 < float(np.mean(greedy != trace.actions)) < 0.5
    # altering the content (re-saved as a valid npz) is detected by the content hash
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["rewards"] = arrays["rewards"] + 1
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(IntegrityError, match="hash mismatch"):
        load_trace(tmp_path / "bad.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(IntegrityError):
        load_trace(tmp_path / "junk.npz")


def test_record_cli_writes_calibration_file(cli, cartpole_policy: Path, tmp_path: Path) -> None:
    proc = cli(
        "record",
        "--policy",
        cartpole_policy,
        "--episodes",
        "2",
        "--max-steps",
        "30",
        "--out",
        "c.npz",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["samples"] == 60 and load_trace(tmp_path / "c.npz").sha256 == summary["sha256"]
