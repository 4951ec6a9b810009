"""Action masks (MaskablePPO: the mask is a graph input at every step) and multi-part action spaces
(MultiDiscrete, MultiBinary): trained here on tests/quarl_test_envs.py, exported to ONNX (fp32, int8)
and TFLite, acting exactly as the zip's own predict with the env's masks, through the runtime API with
``act(obs, action_mask=...)``, in closed-loop episodes that read ``env.action_masks()``; agreement per
component."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import tests_on_pythonpath

pytest.importorskip("sb3_contrib")
import quarl_test_envs  # noqa: E402, F401  (registers the envs)
from sb3_contrib import MaskablePPO  # noqa: E402
from stable_baselines3 import PPO  # noqa: E402
from stable_baselines3.common.base_class import BaseAlgorithm  # noqa: E402

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
from quarl_edge.runtimes.runner import PolicyRunner  # noqa: E402
from quarl_edge.runtimes.trace import Trace, save_trace  # noqa: E402


@dataclass(frozen=True)
class Case:
    id: str
    cls: type[BaseAlgorithm]
    env: str
    head: str
    masked: bool


CASES = [
    Case("masked-discrete", MaskablePPO, "QuarlMasked-v0", "argmax", True),
    Case("masked-multidiscrete", MaskablePPO, "QuarlMultiDiscrete-v0", "multi_argmax", True),
    Case("multibinary", PPO, "QuarlMultiBinary-v0", "binary", False),
]


@dataclass
class Trained:
    case: Case
    model: BaseAlgorithm
    zip_path: Path
    trace: Trace
    bundle: Path


@pytest.fixture(scope="module", autouse=True)
def _env_module_on_path() -> Iterator[None]:
    # the bench runner is a subprocess: it imports quarl_test_envs by the env id's module part
    with tests_on_pythonpath(single_torch_thread=True):
        yield


def _predict(t: Trained, obs: np.ndarray, masks: np.ndarray | None) -> np.ndarray:
    if t.case.masked:
        return np.asarray(t.model.predict(obs, deterministic=True, action_masks=masks > 0.5)[0])
    return np.asarray(t.model.predict(obs, deterministic=True)[0])


@pytest.fixture(scope="module", params=CASES, ids=[c.id for c in CASES])
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    case: Case = request.param
    out = tmp_path_factory.mktemp(case.id)
    env_id = f"quarl_test_envs:{case.env}"
    model = case.cls("MlpPolicy", env_id, seed=0, device="cpu", n_steps=128, batch_size=64, n_epochs=2,
                     policy_kwargs={"net_arch": [32, 32]})  # fmt: skip
    model.learn(512)
    zip_path = out / "model.zip"
    model.save(zip_path)
    policy = load_policy(zip_path, env_id=env_id)
    trace = record(policy, RecordConfig(episodes=25, epsilon=0.2, seed=1, max_samples=1000))
    calib = save_trace(trace, out / "calib.npz")
    bundle = out / "bundle"
    export_bundle(policy, BundleRequest(out=bundle, targets=("onnx-fp32", "onnx-int8"), calibration=calib))
    return Trained(case, model, zip_path, trace, bundle)


def test_detected_and_inspected(trained: Trained) -> None:
    ins = inspect_policy(trained.zip_path, env_id=f"quarl_test_envs:{trained.case.env}")
    assert ins.head == trained.case.head and ins.action_mask is trained.case.masked
    assert ins.algo == ("ppo_mask" if trained.case.masked else "ppo")
    assert ("action_mask" in ins.graph_steps) is trained.case.masked


def test_fp32_acts_as_the_zips_predict_with_the_envs_masks(trained: Trained) -> None:
    t = trained
    assert (t.trace.action_masks is not None) is True  # every test env has action_masks()
    rep = PolicyRunner(t.bundle, "onnx-fp32").replay(t.trace)
    expected = _predict(t, t.trace.obs, t.trace.action_masks)
    assert rep.actions.shape == expected.shape == t.trace.actions.shape
    assert np.array_equal(rep.actions, expected)
    assert len({tuple(np.atleast_1d(a)) for a in expected}) > 2, "degenerate: few distinct actions"
    parity = load_manifest(t.bundle).source_parity
    assert parity is not None and parity.error is None and parity.models[0].agreement == 1.0
    if t.case.masked:  # the mask is fed: without it the same model picks masked-out actions
        unmasked = PolicyRunner(t.bundle, "onnx-fp32").policy.run_batch(t.trace.obs)
        assert not np.array_equal(unmasked.reshape(expected.shape), expected)
        allowed = _allowed(t, expected)
        assert allowed.all() and not _allowed(t, unmasked.reshape(expected.shape)).all()


def _allowed(t: Trained, actions: np.ndarray) -> np.ndarray:
    masks = t.trace.action_masks
    assert masks is not None
    if actions.ndim == 1:
        return masks[np.arange(len(actions)), actions] > 0.5
    offsets = np.concatenate([[0], np.cumsum([3, 4])[:-1]])
    return np.all(masks[np.arange(len(actions))[:, None], actions + offsets] > 0.5, axis=1)


def test_runtime_api_takes_the_mask_and_refuses_a_bad_one(trained: Trained) -> None:
    t = trained
    policy = load_runtime(t.bundle, model="onnx-int8")
    masks = t.trace.action_masks
    assert masks is not None
    given = masks if t.case.masked else [None] * len(masks)
    got = np.array([policy.act(o, action_mask=m) for o, m in zip(t.trace.obs[:50], given[:50], strict=True)])
    assert np.mean(got.reshape(50, -1) == _predict(t, t.trace.obs[:50], masks[:50]).reshape(50, -1)) > 0.9
    if not t.case.masked:
        with pytest.raises(InputError, match="takes no action mask"):
            policy.act(t.trace.obs[0], action_mask=masks[0])
        return
    n = masks.shape[1]
    for bad, why in (
        (np.ones(n + 1), "shape"),
        (np.zeros(n), "allows no action"),
        (np.full(n, 0.5), "other than 0/1"),
    ):
        with pytest.raises(InputError, match=why) as ei:
            policy.act(t.trace.obs[0], action_mask=bad)
        assert "\n" not in str(ei.value)
    batch = policy.act_batch(t.trace.obs[:8], action_masks=masks[:8])
    assert np.array_equal(
        batch,
        np.array([policy.act(o, action_mask=m) for o, m in zip(t.trace.obs[:8], masks[:8], strict=True)]),
    )


def test_closed_loop_bench_reads_the_envs_masks_and_gates(trained: Trained) -> None:
    report = bench(trained.bundle, BenchConfig(episodes=3, latency_samples=20, warmup=2)).to_dict()
    by = {m["name"]: m for m in report["models"]}
    ref, q = by["onnx-fp32"], by["onnx-int8"]
    assert ref["reward"]["episodes"] == 3 and not ref["warnings"]
    # the env rewards only allowed, pointed-at actions: a policy acting on what it sees earns above chance
    assert ref["reward"]["mean"] > 40 * 0.3
    assert q["agreement"]["metric"] == "exact_match_rate" and q["agreement"]["value"] > 0.9
    checks = evaluate(parse_report(report), GateConfig(max_reward_drop_pct=50.0, min_agreement=0.9))
    assert all(c.passed for c in checks), [c.message for c in checks if not c.passed]


@pytest.mark.slow
def test_tflite_int8_with_the_mask_input(trained: Trained, tmp_path: Path) -> None:
    pytest.importorskip("litert_torch")
    t = trained
    policy = load_policy(t.zip_path, env_id=f"quarl_test_envs:{t.case.env}")
    calib = save_trace(t.trace, tmp_path / "calib.npz")
    export_bundle(
        policy, BundleRequest(out=tmp_path / "b", targets=("tflite-fp32", "tflite-int8"), calibration=calib)
    )
    expected = _predict(t, t.trace.obs, t.trace.action_masks)
    assert np.array_equal(PolicyRunner(tmp_path / "b", "tflite-fp32").replay(t.trace).actions, expected)
    got = PolicyRunner(tmp_path / "b", "tflite-int8").replay(t.trace).actions
    assert np.mean(got.reshape(len(got), -1) == expected.reshape(len(got), -1)) > 0.9
    if t.case.masked:
        assert _allowed(t, got).all()
