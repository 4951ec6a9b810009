"""Recurrent policies with the state as data: RecurrentPPO (sb3-contrib) trained here, its LSTM state an
explicit graph input/output (h_in, c_in -> action, h_out, c_out) in ONNX and TFLite, zeros at every episode
start; parity with RecurrentPPO's own predict over whole episodes with the state carried, and the same
check failing when the state is not fed back or not reset."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("sb3_contrib")
from sb3_contrib import RecurrentPPO  # noqa: E402

from quarl_edge.bench.report import parse_report  # noqa: E402
from quarl_edge.bench.run import BenchConfig, bench  # noqa: E402
from quarl_edge.bundle import BundleRequest, export_bundle  # noqa: E402
from quarl_edge.gate import GateConfig, evaluate  # noqa: E402
from quarl_edge.inspect import inspect_policy  # noqa: E402
from quarl_edge.policy.load import load_policy  # noqa: E402
from quarl_edge.record import RecordConfig, record  # noqa: E402
from quarl_edge.runtimes import load_policy as load_runtime  # noqa: E402
from quarl_edge.runtimes.manifest import load_manifest  # noqa: E402
from quarl_edge.runtimes.trace import Trace, load_trace, save_trace  # noqa: E402


@dataclass
class Rec:
    model: RecurrentPPO
    zip_path: Path
    bundle: Path
    trace: Trace


@pytest.fixture(scope="module")
def rec(tmp_path_factory: pytest.TempPathFactory) -> Rec:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("ppo_lstm")
    model = RecurrentPPO("MlpLstmPolicy", "Pendulum-v1", seed=0, device="cpu", n_steps=64, batch_size=32,
                         policy_kwargs={"net_arch": [32], "lstm_hidden_size": 16})  # fmt: skip
    model.learn(128)
    # a wide action layer, as after fine-tuning: actions that vary with the state, so parity means something
    torch.nn.init.normal_(model.policy.action_net.weight, std=0.5)
    zip_path = out / "ppo_lstm-Pendulum-v1.zip"
    model.save(zip_path)
    policy = load_policy(zip_path)
    calib = save_trace(
        record(policy, RecordConfig(episodes=5, epsilon=0.1, seed=1, max_samples=1000)), out / "c.npz"
    )
    bundle = out / "bundle"
    export_bundle(policy, BundleRequest(out=bundle, targets=("onnx-fp32", "onnx-int8"), calibration=calib))
    return Rec(model, zip_path, bundle, load_trace(bundle / "trace.npz"))


def _reference(r: Rec) -> np.ndarray:
    state, out = None, []
    for obs, start in zip(r.trace.obs, r.trace.episode_starts(), strict=True):
        a, state = r.model.predict(
            obs[None], state=state, episode_start=np.array([start]), deterministic=True
        )
        out.append(a[0])
    return np.asarray(out)


def _replay(r: Rec, model: str, feed_back: bool = True, reset: bool = True) -> np.ndarray:
    """Whole episodes through the runtime API, as a control loop runs them (or broken as named)."""
    policy = load_runtime(r.bundle, model=model)
    out = []
    for obs, start in zip(r.trace.obs, r.trace.episode_starts(), strict=True):
        if start and reset:
            policy.reset()
        out.append(policy.act(obs))
        if not feed_back:
            policy.reset()  # the state the graph returned is dropped: every step starts from zeros
    return np.asarray(out)


def test_state_is_manifest_data_and_inspected(rec: Rec) -> None:
    spec = load_manifest(rec.bundle).policy
    assert [(s.input, s.output, s.shape) for s in spec.state] == [("h_in", "h_out", (1, 1, 16)),
                                                                  ("c_in", "c_out", (1, 1, 16))]  # fmt: skip
    io = load_manifest(rec.bundle).model("onnx-fp32").io
    assert [i["name"] for i in io["inputs"]] == ["obs", "h_in", "c_in"]
    assert [o["name"] for o in io["outputs"]] == ["action", "h_out", "c_out"]
    ins = inspect_policy(rec.zip_path)
    assert ins.algo == "ppo_lstm" and "lstm" in ins.graph_steps
    assert [s.name for s in ins.recurrent_state] == ["h_in", "c_in"]
    assert rec.trace.episodes >= 4 and rec.trace.samples == 1000  # whole episodes, in order


def test_parity_over_whole_episodes_with_the_state_carried(rec: Rec) -> None:
    expected = _reference(rec)
    assert float(np.std(expected)) > 0.05, "degenerate: constant actions"
    got = _replay(rec, "onnx-fp32")
    assert float(np.abs(got - expected).max()) <= 1e-5
    parity = load_manifest(rec.bundle).source_parity
    assert parity is not None and parity.error is None
    assert (parity.models[0].max_abs_diff or 0.0) <= 1e-5
    assert float(np.abs(_replay(rec, "onnx-int8") - expected).mean()) < 0.1


def test_a_broken_state_feedback_fails_the_same_check(rec: Rec) -> None:
    expected = _reference(rec)
    not_fed_back = _replay(rec, "onnx-fp32", feed_back=False)
    not_reset = _replay(rec, "onnx-fp32", reset=False)
    assert float(np.abs(not_fed_back - expected).max()) > 1e-2
    assert float(np.abs(not_reset - expected).max()) > 1e-2
    starts = np.flatnonzero(rec.trace.episode_starts())[1:]  # not reset: wrong from the second episode on
    assert float(np.abs(not_reset[: starts[0]] - expected[: starts[0]]).max()) <= 1e-5


def test_closed_loop_bench_carries_the_state(rec: Rec) -> None:
    report = bench(rec.bundle, BenchConfig(episodes=2, latency_samples=20, warmup=2, max_steps=100)).to_dict()
    by = {m["name"]: m for m in report["models"]}
    assert by["onnx-int8"]["reward"]["episodes"] == 2 and not by["onnx-int8"]["warnings"]
    assert by["onnx-int8"]["agreement"]["samples"] == 1000
    checks = evaluate(parse_report(report), GateConfig(max_reward_drop_pct=100.0, min_agreement=0.9))
    assert all(c.passed for c in checks), [c.message for c in checks if not c.passed]


@pytest.mark.slow
def test_tflite_fp32_and_int8_carry_the_state(rec: Rec, tmp_path: Path) -> None:
    pytest.importorskip("litert_torch")
    policy = load_policy(rec.zip_path)
    calib = save_trace(rec.trace, tmp_path / "c.npz")
    export_bundle(
        policy, BundleRequest(out=tmp_path / "b", targets=("tflite-fp32", "tflite-int8"), calibration=calib)
    )
    r = Rec(rec.model, rec.zip_path, tmp_path / "b", rec.trace)
    expected = _reference(r)
    assert float(np.abs(_replay(r, "tflite-fp32") - expected).max()) <= 1e-5
    assert float(np.abs(_replay(r, "tflite-int8") - expected).mean()) < 0.1
