"""Dict observations: a goal-conditioned HER agent (SB3 SAC + HerReplayBuffer, MultiInputPolicy) on
gymnasium-robotics' PointMaze, trained here; keys, shapes and order are manifest data, the deployed policy
takes the env's dict (``act(obs_dict)``), a missing key is one InputError naming it, and the exported
models act as SB3's own predict on the dicts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

gym_robotics = pytest.importorskip("gymnasium_robotics")
import gymnasium as gym  # noqa: E402
from stable_baselines3 import SAC, HerReplayBuffer  # noqa: E402

from quarl_edge.bench.report import parse_report  # noqa: E402
from quarl_edge.bench.run import BenchConfig, bench  # noqa: E402
from quarl_edge.bundle import BundleRequest, export_bundle  # noqa: E402
from quarl_edge.gate import GateConfig, evaluate  # noqa: E402
from quarl_edge.inspect import inspect_policy  # noqa: E402
from quarl_edge.policy.load import load_policy  # noqa: E402
from quarl_edge.record import RecordConfig, record  # noqa: E402
from quarl_edge.runtimes import load_policy as load_runtime  # noqa: E402
from quarl_edge.runtimes.errors import InputError  # noqa: E402
from quarl_edge.runtimes.manifest import load_manifest  # noqa: E402
from quarl_edge.runtimes.trace import save_trace  # noqa: E402

ENV = "PointMaze_UMazeDense-v3"
KEYS = ("achieved_goal", "desired_goal", "observation")


@dataclass
class Her:
    model: SAC
    zip_path: Path
    bundle: Path


@pytest.fixture(scope="module")
def her(tmp_path_factory: pytest.TempPathFactory) -> Her:
    return make_her(tmp_path_factory.mktemp("her"))


def make_her(out: Path) -> Her:
    """Train the agent (a few seconds), import it with no --env, record, export fp32 + int8."""
    torch.set_num_threads(1)
    gym.register_envs(gym_robotics)
    model = SAC("MultiInputPolicy", ENV, seed=0, device="cpu", learning_starts=350, buffer_size=5000,
                replay_buffer_class=HerReplayBuffer, replay_buffer_kwargs={"n_sampled_goal": 4},
                policy_kwargs={"net_arch": [32, 32]})  # fmt: skip
    # SB3 made the env with gym.make: gymnasium-robotics left its maze model file in the temp folder
    Path(model.get_env().envs[0].unwrapped.tmp_xml_file_path).unlink(missing_ok=True)  # type: ignore[union-attr]
    model.learn(700)
    zip_path = out / f"sac_{ENV}.zip"  # SB3's own naming: no --env anywhere below
    model.save(zip_path)
    policy = load_policy(zip_path)
    trace = record(policy, RecordConfig(episodes=4, epsilon=0.3, seed=1, max_samples=1000))
    calib = save_trace(trace, out / "calib.npz")
    bundle = out / "bundle"
    export_bundle(policy, BundleRequest(out=bundle, targets=("onnx-fp32", "onnx-int8"), calibration=calib))
    return Her(model, zip_path, bundle)


def test_keys_shapes_and_order_are_manifest_data(her: Her) -> None:
    ins = inspect_policy(her.zip_path)
    assert [k.key for k in ins.observation_keys] == list(KEYS)
    assert [k.shape for k in ins.observation_keys] == [(2,), (2,), (4,)]
    assert ins.to_dict()["observation_keys"][0] == {
        "key": KEYS[0],
        "shape": [2],
        "dtype": "float64",
        "kind": "vector",
    }
    (w,) = [w for w in load_manifest(her.bundle).policy.env.wrappers if w.name == "dict_obs"]
    assert w.kwargs["keys"] == list(KEYS) and w.kwargs["shapes"] == [[2], [2], [4]]
    parity = load_manifest(her.bundle).source_parity
    assert parity is not None and parity.error is None, parity
    m = parity.models[0]
    assert m.max_abs_diff is not None and m.max_abs_diff <= 1e-5 and m.samples == 1000


def test_act_takes_the_envs_dict(her: Her) -> None:
    fp32 = load_runtime(her.bundle, model="onnx-fp32")
    int8 = load_runtime(her.bundle, model="onnx-int8")
    assert fp32.info.observation_keys == KEYS
    env = fp32.make_env()
    obs, _ = env.reset(seed=5)
    diffs = []
    for _ in range(50):
        expected = her.model.predict(obs, deterministic=True)[0]
        np.testing.assert_allclose(fp32.act(obs), expected, atol=1e-5)
        diffs.append(np.abs(int8.act(obs) - expected).max())
        obs, *_ = env.step(expected)
    env.close()
    assert float(np.mean(diffs)) < 0.1


def test_a_missing_or_misshapen_key_is_one_line_naming_it(her: Her) -> None:
    policy = load_runtime(her.bundle, model="onnx-int8")
    env = policy.make_env()
    obs, _ = env.reset(seed=0)
    env.close()
    bad = {k: v for k, v in obs.items() if k != "desired_goal"}
    for given, needle in ((bad, "no key 'desired_goal'"), ({**obs, "observation": np.zeros(3)}, "observation['observation']"),
                          (np.zeros(8, np.float32), "takes a dict")):  # fmt: skip
        with pytest.raises(InputError, match=needle.replace("[", r"\[").replace("]", r"\]")) as ei:
            policy.act(given)
        assert "\n" not in str(ei.value)
    assert policy.stats.refused == 3


def test_closed_loop_return_kept_at_int8(her: Her) -> None:
    report = bench(her.bundle, BenchConfig(episodes=2, latency_samples=20, warmup=2, max_steps=100)).to_dict()
    by = {m["name"]: m for m in report["models"]}
    assert by["onnx-int8"]["reward"]["episodes"] == 2 and not by["onnx-int8"]["warnings"]
    checks = evaluate(parse_report(report), GateConfig(max_reward_drop_pct=10.0, min_agreement=0.95))
    assert all(c.passed for c in checks), [c.message for c in checks if not c.passed]


def test_an_observation_key_of_an_unknown_kind_or_a_bad_shape_is_refused() -> None:
    from quarl_edge.inspect import ObservationKey, RecurrentState

    with pytest.raises(ValueError, match="kind 'video' is not one of vector, image_hwc, image_chw"):
        ObservationKey("camera", (64, 64, 3), "uint8", "video")
    with pytest.raises(ValueError, match=r"shape\[1\] is not an integer"):
        ObservationKey("agent", (2, -1), "float32", "vector")
    with pytest.raises(ValueError, match="recurrent state name is not a non-empty string"):
        RecurrentState("", "h_out", (1, 64))


def test_a_maze_env_leaves_no_model_file_in_the_temp_folder() -> None:
    """gymnasium-robotics writes each maze's generated model to <temp>/ant_maze<time>.xml and leaves it;
    the env quarl-edge makes removes that file (MuJoCo has read it) and still steps."""
    from quarl_edge.runtimes.envs import make_env
    from quarl_edge.runtimes.spec import EnvConfig

    gym.register_envs(gym_robotics)
    env = make_env(EnvConfig(ENV, family="robotics"))
    written = Path(env.unwrapped.tmp_xml_file_path)
    assert written.name.startswith("ant_maze") and not written.exists()
    obs, _ = env.reset(seed=0)
    assert set(obs) == set(KEYS)
    env.step(env.action_space.sample())
    env.close()
    # the library's own env, made directly, leaves it (what the removal is for)
    raw = gym.make(ENV)
    left = Path(raw.unwrapped.tmp_xml_file_path)
    assert left.is_file()
    left.unlink()  # made by this test
    raw.close()
