"""The runtime API (`quarl_edge.runtimes.load_policy`) on real bundles: the same actions and rewards as
the bench's closed loop, the default model, hashes, the frame stack and `reset()`, no torch, and the
fixed-rate control-loop example."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import onnxruntime
import pytest
import torch
from gymnasium.wrappers import FrameStackObservation

from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.policy.net import NetArch, build_policy, load_checkpoint
from quarl_edge.runtimes import PolicyInfo, load_policy
from quarl_edge.runtimes.envs import make_env, space_spec
from quarl_edge.runtimes.errors import InputError, IntegrityError, QuarlError
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.realtime import SETTINGS
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.spec import WrapperConfig

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "control_loop.py"


def one_line(e: QuarlError) -> str:
    text = str(e)
    assert "\n" not in text and "; " in text, text  # the problem; the fix
    return text


def returns(bundle: Path, model: str, seeds: list[int], env_id: str) -> list[float]:
    """Episodes as a user's loop runs them: plain gymnasium, reset() at each start, act() per step."""
    policy = load_policy(bundle, model=model)
    env = gym.make(env_id)
    out = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        policy.reset()
        ret, done = 0.0, False
        while not done:
            obs, r, term, trunc, _ = env.step(policy.act(obs))
            ret, done = ret + float(r), term or trunc
        out.append(ret)
    env.close()
    return out


@pytest.mark.parametrize("which", ["cartpole_bundle", "pendulum_bundle"])
def test_act_earns_the_rewards_of_the_bench_closed_loop(which: str, request: pytest.FixtureRequest) -> None:
    bundle: Path = request.getfixturevalue(which)
    report = bench(
        bundle, BenchConfig(episodes=3, seed=7, latency_samples=20, models=("onnx-int8",))
    ).to_dict()
    env_id = report["bundle"]["env"]
    for m in report["models"]:
        assert returns(bundle, m["name"], [7, 8, 9], env_id) == m["reward"]["per_episode"], m["name"]
    if which == "pendulum_bundle":  # returns that vary by seed: equality is not a coincidence
        assert len(set(report["models"][0]["reward"]["per_episode"])) == 3


def test_act_is_the_model_answer_of_a_plain_onnxruntime_session(pendulum_bundle: Path) -> None:
    """Along a real episode, act() returns exactly what the model file says (the bench's closed loop
    runs the same act(), so this pins both to the model, not to each other)."""
    policy = load_policy(pendulum_bundle, model="onnx-int8")
    sess = onnxruntime.InferenceSession(
        str(pendulum_bundle / policy.info.file), providers=["CPUExecutionProvider"]
    )
    name = sess.get_inputs()[0].name
    env = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=3)
    policy.reset()
    for _ in range(50):
        action = policy.act(obs)
        want = sess.run(None, {name: np.asarray(obs, np.float32)[None]})[0][0]
        assert isinstance(action, np.ndarray) and action.dtype == np.float32
        np.testing.assert_array_equal(action, want)
        obs, *_ = env.step(action)
    env.close()


def test_default_model_and_the_error_that_lists_the_models(cartpole_bundle: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError) as e:  # fp32, fp16 and int8: which one is the user's choice
        load_policy(cartpole_bundle)
    line = one_line(e.value)
    assert all(n in line for n in ("onnx-fp32", "onnx-fp16", "onnx-int8")) and "model=" in line
    with pytest.raises(InputError, match="models in this bundle: onnx-fp32, onnx-fp16, onnx-int8"):
        load_policy(cartpole_bundle, model="tflite-int8")

    tuned = tmp_path / "tuned"  # the manifest's tune block names the default
    shutil.copytree(cartpole_bundle, tuned)
    manifest = json.loads((tuned / "manifest.json").read_text())
    manifest["tune"] = {"chosen": "onnx-fp16", "threads": 2, "device": "rpi4", "emulated": False}
    (tuned / "manifest.json").write_text(json.dumps(manifest))
    info = load_policy(tuned).info
    want = ("onnx-fp16", "tune", "rpi4", 2)
    assert (info.model, info.chosen_by, info.tune_device, info.tune_threads) == want
    assert (info.threads, info.threads_from) == (2, "tune")  # threads="tune", the default, takes tune's count
    assert load_policy(tuned, threads=1).info.threads == 1  # an explicit count is the caller's
    other = load_policy(tuned, model="onnx-int8").info  # tune's count was measured for its choice only
    assert (other.chosen_by, other.threads, other.threads_from) == ("argument", 1, "default")
    manifest["tune"]["chosen"] = "onnx-gone"  # a choice naming no model of the bundle: refused, no fallback
    (tuned / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match="tune choice"):
        load_policy(tuned)
    assert load_policy(tuned, model="onnx-int8").info.model == "onnx-int8"  # an explicit name still loads
    for chosen in (7, None):  # a choice that is no name at all: the manifest is damaged, refused on load
        manifest["tune"]["chosen"] = chosen
        (tuned / "manifest.json").write_text(json.dumps(manifest))
        for model in (None, "onnx-int8"):
            with pytest.raises(InputError, match="bundle manifest tune.chosen is not a string"):
                load_policy(tuned, model=model)

    pair = tmp_path / "pair"  # fp32 + one quantized model: the quantized one
    shutil.copytree(cartpole_bundle, pair)
    manifest = json.loads((pair / "manifest.json").read_text())
    manifest["models"] = [m for m in manifest["models"] if m["name"] != "onnx-fp16"]
    (pair / "manifest.json").write_text(json.dumps(manifest))
    assert load_policy(pair).info.model == "onnx-int8"


def test_info_names_what_was_loaded_and_the_warm_up(cartpole_bundle: Path) -> None:
    policy = load_policy(cartpole_bundle, model="onnx-int8", threads=2)
    info = policy.info
    entry = load_manifest(cartpole_bundle).model("onnx-int8")
    assert isinstance(info, PolicyInfo)
    assert (info.model, info.format, info.precision, info.threads) == ("onnx-int8", "onnx", "int8", 2)
    assert (info.runtime, info.runtime_version) == ("onnxruntime", onnxruntime.__version__)
    assert (info.sha256, info.size_bytes, info.file) == (entry.sha256, entry.size_bytes, entry.file)
    assert (info.env_id, info.policy, info.algo) == ("CartPole-v1", "cartpole-ppo", "ppo")
    assert (info.observation_shape, info.frame_stack, info.discrete_actions) == ((4,), 1, 2)
    assert info.load_ms > 0 and info.first_call_ms is not None and info.first_call_ms > 0
    assert len(info.warmup_ms) == 3 and info.warmup_ms[0] >= info.first_call_ms
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.model = "x"  # type: ignore[misc]
    cold = load_policy(cartpole_bundle, model="onnx-int8", warmup=0)
    assert cold.info.first_call_ms is None and cold.info.warmup_ms == ()
    cold.act(np.zeros(4, np.float32))
    assert cold.info.first_call_ms is not None


def test_a_tampered_model_file_fails_the_hash_check(cartpole_bundle: Path, tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    shutil.copytree(cartpole_bundle, bundle)
    path = bundle / "policy.int8.onnx"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError) as e:
        load_policy(bundle, model="onnx-int8")
    assert "sha256 mismatch for 'policy.int8.onnx'" in one_line(e.value)
    assert load_policy(bundle, model="onnx-fp32").act(np.zeros(4, np.float32)) in (0, 1)  # only what it loads


def test_bad_arguments_are_one_line_errors(cartpole_bundle: Path, tmp_path: Path) -> None:
    policy = load_policy(cartpole_bundle, model="onnx-fp32")
    with pytest.raises(InputError) as e:
        policy.act(np.zeros(5, np.float32))
    assert "observation of shape [5], the policy takes [4]" in one_line(e.value)
    for kwargs in ({"threads": 0}, {"threads": 1.5}, {"warmup": -1}):
        with pytest.raises(InputError) as e:
            load_policy(cartpole_bundle, model="onnx-fp32", **kwargs)  # type: ignore[arg-type]
        one_line(e.value)
    with pytest.raises(InputError) as e:
        load_policy(tmp_path)
    assert "is not a bundle" in one_line(e.value)


# ---- the frame stack lives in the policy: reset() clears it ------------------------------------------

THETA_OLDEST, THETA_NEWEST = 2, 10  # the pole angle of the first and last of 3 stacked CartPole frames


@pytest.fixture(scope="module")
def stacked_bundle(tmp_path_factory: pytest.TempPathFactory, cartpole_policy: Path) -> Path:
    """CartPole with 3 stacked frames and a net that pushes right (1) exactly when the oldest frame's
    pole angle differs from the newest's, left (0) when they are equal: at an episode's first step,
    after reset() (the stack padded with the first observation), it must push left."""
    spec = load_checkpoint(cartpole_policy).spec
    stack = WrapperConfig("frame_stack", {"stack_size": 3})
    env = dataclasses.replace(spec.env, wrappers=(*spec.env.wrappers, stack))
    arch = NetArch(model="mlp", hidden=(2,), activation="relu", out_dim=2, head="argmax")
    obs_space = space_spec(FrameStackObservation(gym.make("CartPole-v1"), 3).observation_space)
    spec = dataclasses.replace(spec, name="cartpole-stacked", env=env, observation_space=obs_space,
                               graph_steps=arch.graph_steps())  # fmt: skip
    w1 = torch.zeros(2, 12)
    w1[0, THETA_OLDEST], w1[0, THETA_NEWEST], w1[1, THETA_OLDEST], w1[1, THETA_NEWEST] = 1, -1, -1, 1
    state = {"mlp.0.weight": w1, "mlp.0.bias": torch.zeros(2),
             "out.weight": torch.tensor([[0.0, 0.0], [1.0, 1.0]]), "out.bias": torch.tensor([1e-3, 0.0])}  # fmt: skip
    out = tmp_path_factory.mktemp("stacked") / "bundle"
    export_bundle(
        build_policy(spec, arch, state), BundleRequest(out=out, targets=("onnx-fp32",), record_episodes=2)
    )
    return out


def _actions_along(env: Any, act: Callable[[Any], Any], seeds: list[int], steps: int,
                   on_reset: Callable[[], None] = lambda: None) -> list[list[Any]]:  # fmt: skip
    out = []
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        on_reset()
        acts: list[Any] = []
        for _ in range(steps):
            acts.append(act(obs))
            obs, _, term, trunc, _ = env.step(acts[-1])
            if term or trunc:
                break
        out.append(acts)
    env.close()
    return out


def wrapper_actions(bundle: Path, model: str, seeds: list[int], steps: int) -> list[list[Any]]:
    """The actions along episodes where gymnasium's wrappers stack the frames (the trainer's and the
    recorder's environment), the model fed the stacked observation."""
    runner = PolicyRunner(bundle, model)
    return _actions_along(make_env(runner.spec.env), runner.act, seeds, steps)


def policy_actions(
    bundle: Path, model: str, seeds: list[int], steps: int, reset: bool = True
) -> list[list[Any]]:
    """The same episodes through the runtime API: the env's own frames, the policy stacks them."""
    policy = load_policy(bundle, model=model)
    return _actions_along(
        policy.make_env(), policy.act, seeds, steps, policy.reset if reset else lambda: None
    )


def test_the_policy_stacks_frames_as_gymnasium_and_reset_clears_them(stacked_bundle: Path) -> None:
    policy = load_policy(stacked_bundle)
    assert (policy.info.observation_shape, policy.info.model_input_shape) == ((4,), (3, 4))
    assert policy.info.frame_stack == 3 and policy.make_env().observation_space.shape == (4,)
    seeds = [3, 4, 5]
    wrapped = wrapper_actions(stacked_bundle, "onnx-fp32", seeds, 500)
    assert policy_actions(stacked_bundle, "onnx-fp32", seeds, 500) == wrapped
    assert all(ep[0] == 0 for ep in wrapped) and any(1 in ep for ep in wrapped)
    stale = policy_actions(stacked_bundle, "onnx-fp32", seeds, 500, reset=False)
    assert stale[0] == wrapped[0]  # a fresh policy starts clean
    assert [ep[0] for ep in stale[1:]] == [1, 1], (
        "without reset() the last episode's frames are still stacked"
    )


def test_pong_frame_stack_in_the_policy_picks_the_wrapper_actions(
    zoo_pong: tuple[Path, Path], tmp_path: Path
) -> None:
    pytest.importorskip("ale_py")
    policy_dir, frames = zoo_pong
    bundle = tmp_path / "pong"
    export_bundle(
        load_checkpoint(policy_dir), BundleRequest(out=bundle, targets=("onnx-fp32",), calibration=frames)
    )
    info = load_policy(bundle).info
    assert (info.observation_shape, info.frame_stack) == ((84, 84), 4)
    wrapped = wrapper_actions(bundle, "onnx-fp32", [1, 2], 120)
    assert len(set(wrapped[0] + wrapped[1])) >= 3  # a policy that plays, not one stuck on an action
    assert policy_actions(bundle, "onnx-fp32", [1, 2], 120) == wrapped


# ---- no torch on the device side; the control-loop example -------------------------------------------


def test_load_policy_never_imports_torch(cartpole_bundle: Path, tmp_path: Path) -> None:
    code = (
        "import sys, numpy as np\nimport quarl_edge.runtimes as rt\n"
        f"p = rt.load_policy({str(cartpole_bundle)!r}, model='onnx-int8')\n"
        "p.reset(); a = p.act(np.zeros(4, np.float32))\n"
        "print(a, sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'tensorflow')))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr
    action, loaded = p.stdout.split(" ", 1)
    assert action in ("0", "1") and loaded.strip() == "[]"


def test_the_control_loop_example_runs_at_a_fixed_rate(cartpole_bundle: Path, tmp_path: Path) -> None:
    args = [str(cartpole_bundle), "--model", "onnx-int8", "--hz", "200", "--steps", "40", "--json"]
    p = subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert (r["hz"], r["steps"], r["model"]) == (200.0, 40, "onnx-int8")
    act = r["act"]
    assert 0 <= r["overruns"] <= 40 and 0 < act["p50_us"] <= act["p99_us"] <= act["max_us"]
    assert r["work"]["max_us"] >= act["max_us"] and r["runtime"].startswith("onnxruntime")
    assert [s["name"] for s in r["settings"]] == list(SETTINGS)
    bad = subprocess.run([sys.executable, str(EXAMPLE), str(cartpole_bundle), "--hz", "0"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    many = subprocess.run([sys.executable, str(EXAMPLE), str(cartpole_bundle)], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert many.returncode == 2 and "onnx-fp16" in many.stderr and many.stderr.count("\n") == 1
