"""MultiInputPolicy over a Dict of image and vector keys (SB3's CombinedExtractor): PPO (discrete, camera
height-width-channels) and SAC (continuous, camera channels first) trained here on
tests/quarl_dict_envs.py, imported weights-only, exported to ONNX fp32 + int8 and acting as SB3's own
predict on the env's dicts; keys, shapes, dtypes and kinds are manifest data, a bad frame is one
InputError naming its key, and a graph slicing the keys in another order or without /255 fails the parity."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import quarl_dict_envs  # noqa: F401  (registers the envs)
import torch
from conftest import tests_on_pythonpath
from stable_baselines3 import PPO, SAC
from stable_baselines3.common.base_class import BaseAlgorithm

from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.inspect import inspect_policy, lines
from quarl_edge.policy.load import load_policy
from quarl_edge.policy.net import Policy
from quarl_edge.record import RecordConfig, record
from quarl_edge.runtimes import load_policy as load_runtime
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.parity import ModelParity
from quarl_edge.runtimes.trace import save_trace

KEYS = ("agent", "camera", "velocity")


@dataclass(frozen=True)
class Case:
    id: str
    env: str
    camera: tuple[int, ...]
    kind: str


CASES = [
    Case("ppo", "quarl_dict_envs:QuarlDictImage-v0", (36, 36, 3), "image_hwc"),
    Case("sac", "quarl_dict_envs:QuarlDictImageContinuous-v0", (3, 36, 36), "image_chw"),
]


@dataclass
class Trained:
    case: Case
    model: BaseAlgorithm
    zip_path: Path
    policy: Policy
    calib: Path
    bundle: Path


@pytest.fixture(scope="module", autouse=True)
def _env_module_on_path() -> Iterator[None]:
    # the bench runner is a subprocess: it imports quarl_dict_envs by the env id's module part
    with tests_on_pythonpath(single_torch_thread=True):
        yield


def _train(case: Case) -> BaseAlgorithm:
    """A few hundred steps, then the action layer re-drawn larger: so short a training leaves the
    actions almost the same in every state, and the parity needs a policy whose actions vary."""
    kw = {"net_arch": [32, 32], "features_extractor_kwargs": {"cnn_output_dim": 64}}
    model: BaseAlgorithm
    if case.id == "ppo":
        model = PPO("MultiInputPolicy", case.env, seed=0, device="cpu", n_steps=128, batch_size=64,
                    n_epochs=2, policy_kwargs=kw)  # fmt: skip
        model.learn(256)
        torch.nn.init.normal_(model.policy.action_net.weight, 0.0, 1.0)
    else:
        model = SAC("MultiInputPolicy", case.env, seed=0, device="cpu", learning_starts=100,
                    buffer_size=1000, batch_size=32, policy_kwargs=kw)  # fmt: skip
        model.learn(150)
        torch.nn.init.normal_(model.policy.actor.mu.weight, 0.0, 0.5)
    return model


@pytest.fixture(scope="module", params=CASES, ids=[c.id for c in CASES])
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    case: Case = request.param
    out = tmp_path_factory.mktemp(case.id)
    model = _train(case)
    zip_path = out / "model.zip"
    model.save(zip_path)
    policy = load_policy(zip_path, env_id=case.env)
    trace = record(policy, RecordConfig(episodes=25, epsilon=0.2, seed=1, max_samples=1000))
    calib = save_trace(trace, out / "calib.npz")
    bundle = out / "bundle"
    export_bundle(policy, BundleRequest(out=bundle, targets=("onnx-fp32", "onnx-int8"), calibration=calib))
    return Trained(case, model, zip_path, policy, calib, bundle)


def _parity(bundle: Path) -> ModelParity:
    parity = load_manifest(bundle).source_parity
    assert parity is not None and parity.error is None, parity
    (m,) = parity.models
    assert m.samples == 1000
    return m


def test_keys_shapes_and_kinds_are_manifest_data(trained: Trained) -> None:
    t = trained
    (w,) = [w for w in load_manifest(t.bundle).policy.env.wrappers if w.name == "dict_obs"]
    assert w.kwargs["keys"] == list(KEYS)
    assert w.kwargs["shapes"] == [[2], list(t.case.camera), [2]]
    assert w.kwargs["dtypes"] == ["float32", "uint8", "float32"]
    assert w.kwargs["kinds"] == ["vector", t.case.kind, "vector"]
    ins = inspect_policy(t.zip_path, env_id=t.case.env)
    assert ins.model == "combined" and ins.scale_uint8
    assert [(k.key, k.kind) for k in ins.observation_keys] == list(zip(KEYS, w.kwargs["kinds"], strict=True))
    text = dict(lines(ins))["observation"]
    assert f"camera {list(t.case.camera)} uint8 {t.case.kind}" in text and "agent [2]" in text, text
    assert any(la.name.startswith("combined.cnns.0.") for la in ins.layers)


def test_fp32_parity_with_sb3_predict(trained: Trained) -> None:
    m = _parity(trained.bundle)
    if trained.case.id == "ppo":
        assert m.agreement >= 0.999, m
    else:
        assert m.max_abs_diff is not None and m.max_abs_diff <= 1e-5, m


def test_act_takes_the_envs_dict(trained: Trained) -> None:
    t = trained
    fp32 = load_runtime(t.bundle, model="onnx-fp32")
    int8 = load_runtime(t.bundle, model="onnx-int8")
    assert fp32.info.observation_keys == KEYS
    env = fp32.make_env()
    obs, _ = env.reset(seed=7)
    assert obs["camera"].dtype == np.uint8 and obs["camera"].shape == t.case.camera
    env.action_space.seed(7)
    got, want, q = [], [], []
    for i in range(60):
        expected = t.model.predict(obs, deterministic=True)[0]
        got.append(fp32.act(obs))
        want.append(expected)
        q.append(int8.act(obs))
        # every other step a random push: the greedy policy alone soon sits against a wall
        obs, *_ = env.step(expected if i % 2 else env.action_space.sample())
    env.close()
    got_a, want_a, q_a = np.asarray(got), np.asarray(want), np.asarray(q)
    if t.case.id == "ppo":
        assert np.array_equal(got_a, want_a) and len(set(want_a.tolist())) > 1
        assert np.mean(q_a == want_a) > 0.7
    else:
        np.testing.assert_allclose(got_a, want_a, atol=1e-5)
        assert np.ptp(want_a, axis=0).min() > 0.05, "degenerate: actions hardly vary"
        assert float(np.abs(q_a - want_a).mean()) < 0.1


def test_calibration_and_trace_hold_the_flattened_dict(trained: Trained) -> None:
    with np.load(trained.calib) as z:
        obs = z["obs"]
    assert obs.shape[1:] == (2 + 36 * 36 * 3 + 2,) and obs.dtype == np.float32
    camera = obs[:, 2:-2]
    assert camera.min() >= 0 and camera.max() == 255 and np.all(camera == np.round(camera))


def test_a_bad_frame_or_key_is_one_line_naming_it(trained: Trained) -> None:
    policy = load_runtime(trained.bundle, model="onnx-int8")
    env = policy.make_env()
    obs, _ = env.reset(seed=0)
    env.close()
    cam = obs["camera"]
    cases = (
        ({**obs, "camera": cam.astype(np.float32) / 255.0}, "observation['camera'] is an image of float32"),
        ({**obs, "camera": cam.astype(np.int16) + 300}, "observation['camera'] has pixel values 300..555"),
        (
            {**obs, "camera": cam[..., :2] if cam.shape[-1] == 3 else cam[:2]},
            "observation['camera'] of shape",
        ),
        ({k: v for k, v in obs.items() if k != "velocity"}, "no key 'velocity'"),
    )
    for given, needle in cases:
        with pytest.raises(InputError) as ei:
            policy.act(given)
        assert needle in str(ei.value) and "\n" not in str(ei.value)
    assert policy.stats.refused == len(cases)
    policy.act(obs)  # the env's own dict still acts


def test_closed_loop_fp32_and_int8(trained: Trained) -> None:
    report = bench(trained.bundle, BenchConfig(episodes=3, latency_samples=20, warmup=2, max_steps=40))
    by = {m["name"]: m for m in report.to_dict()["models"]}
    for name in ("onnx-fp32", "onnx-int8"):
        reward = by[name]["reward"]
        assert reward["episodes"] == 3 and reward["mean"] < 0, reward
    print({n: (round(m["reward"]["mean"], 2), m.get("agreement")) for n, m in by.items()})


@pytest.mark.parametrize("broken", ["keys in insertion order", "no /255"])
def test_a_broken_graph_fails_the_parity(trained: Trained, broken: str, tmp_path: Path) -> None:
    policy = trained.policy
    net = load_policy(trained.zip_path, env_id=trained.case.env).net  # a fresh module to break
    if broken == "no /255":
        net.combined.scale = False
    else:  # the graph slices the keys in another order than the runtime flattens them (camera first)
        agent, camera, velocity = net.combined.parts
        net.combined.parts = (camera, agent, velocity)
    bad = replace(policy, net=net)
    out = tmp_path / "broken"
    export_bundle(bad, BundleRequest(out=out, targets=("onnx-fp32",), calibration=trained.calib))
    m = _parity(out)
    if trained.case.id == "ppo":
        assert m.agreement < 0.99, m
    else:
        assert m.max_abs_diff is not None and m.max_abs_diff > 1e-3, m
