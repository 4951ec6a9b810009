"""QAT really quantizes: grid of effective weights, fp32 before the delay, gradients flow, deploys."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from quarl_edge.bench.report import parse_report
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.gate import GateConfig, evaluate
from quarl_edge.policy.net import load_checkpoint
from quarl_edge.quant.config import QATConfig
from quarl_edge.quant.qat import QATClock, QATLinear, convert, fake_quant_weight, qat_layers
from quarl_edge.runtimes.errors import InputError
from quarl_edge.train.trainer import TrainConfig, train


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3))


def test_before_delay_the_network_is_exactly_fp32_and_after_it_is_not() -> None:
    fp32 = _mlp()
    net = copy.deepcopy(fp32)
    clock = QATClock(delay=100)
    assert convert(net, QATConfig(bits=2, delay=100), clock) == 3
    x = torch.randn(64, 6)
    net.train()
    clock.step = 99
    assert torch.equal(net(x), fp32(x))  # delay not reached: fp32 (ranges are tracked meanwhile)
    clock.step = 100
    assert not torch.allclose(net(x), fp32(x), atol=1e-3)
    for _, layer in qat_layers(net):
        w = layer.qat_weight()
        scale = layer.weight.detach().abs().max()  # 2 bits, symmetric: {-1, 0, 1} x max|w|
        assert len(torch.unique(w)) <= 4
        assert torch.allclose(torch.unique(w) / scale, torch.round(torch.unique(w) / scale), atol=1e-5)


def test_gradients_flow_through_fake_quantization() -> None:
    net = _mlp()
    clock = QATClock(delay=0)
    convert(net, QATConfig(bits=4), clock)
    before = [p.detach().clone() for p in net.parameters()]
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    loss = net(torch.randn(32, 6)).pow(2).mean()
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())
    opt.step()
    assert all(not torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True))


def test_per_channel_weights_for_convolutions() -> None:
    w = torch.randn(16, 4, 3, 3) * torch.linspace(0.1, 3, 16).reshape(16, 1, 1, 1)
    q = fake_quant_weight(w, 2, per_channel=True)
    for c in range(16):
        assert len(torch.unique(q[c])) <= 3 and torch.isclose(q[c].abs().max(), w[c].abs().max())


def test_unsupported_layer_is_refused_by_name() -> None:
    net = nn.Sequential(nn.Linear(4, 8), nn.LSTM(8, 8))
    with pytest.raises(InputError, match="'1'.*LSTM"):
        convert(net, QATConfig(bits=4), QATClock(0))


@pytest.mark.parametrize("bits", ["1", "9"])
def test_bits_out_of_range_exit_2(cli, tmp_path: Path, bits: str) -> None:
    proc = cli("train", "--env", "CartPole-v1", "--algo", "ppo", "--qat-bits", bits, "--out", tmp_path / "x")
    assert proc.returncode == 2 and "between 2 and 8" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()


# ranges are tracked in training mode, i.e. in gradient updates: DQN's start after learning_starts=1000
CASES = [("ppo", "CartPole-v1", 600), ("dqn", "CartPole-v1", 1500), ("sac", "Pendulum-v1", 600)]


@pytest.mark.slow
@pytest.mark.parametrize(("algo", "env", "steps"), CASES)
def test_qat_training_checkpoint_carries_bits_ranges_and_delay(
    cli, tmp_path: Path, algo: str, env: str, steps: int
) -> None:
    """The first case through `quarl-edge train --qat-bits 2 --quant-delay 200` (the options reach the
    trainer), the others through the library it calls."""
    out = tmp_path / f"{algo}-qat"
    if (algo, env, steps) == CASES[0]:
        proc = cli("train", "--env", env, "--algo", algo, "--steps", str(steps), "--qat-bits", "2",
                   "--quant-delay", "200", "--eval-episodes", "1", "--net-arch", "32,32", "--out", out)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    else:
        train(TrainConfig(env=env, algo=algo, out=out, steps=steps, qat=QATConfig(bits=2, delay=200),
                          eval_episodes=1, net_arch=(32, 32)))  # fmt: skip
    meta = json.loads((out / "policy.json").read_text())
    assert meta["arch"]["qat"]["bits"] == 2 and meta["arch"]["qat"]["delay"] == 200
    assert meta["spec"]["train"]["qat"]["active"] is True
    with np.load(out / "weights.npz") as z:
        his = [z[k] for k in z.files if k.endswith("act_hi")]
        assert his and all(float(h) > 0 for h in his)  # ranges learned in training, stored
    policy = load_checkpoint(out)
    layers = qat_layers(policy.net)
    assert layers and all(isinstance(m, QATLinear) for _, m in layers)
    for _, m in layers:  # the deployed torch policy runs on the 2-bit grid
        assert len(torch.unique(m.qat_weight())) <= 4
    obs = np.stack(
        [policy.spec.observation_space.shape and np.zeros(policy.spec.observation_space.shape)] * 2
    )
    assert policy.predict(obs.astype(np.float32)).shape[0] == 2


@pytest.fixture(scope="module")
def qat8_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One 8-bit QAT CartPole PPO (20k steps, delay 5k), shared by the ONNX and TFLite export tests."""
    policy = tmp_path_factory.mktemp("qat8") / "policy"
    train(TrainConfig(env="CartPole-v1", algo="ppo", out=policy, steps=20000, qat=QATConfig(bits=8, delay=5000),
                      eval_episodes=3))  # fmt: skip
    return policy


def _bench_and_gate(bundle: Path) -> None:
    """int8 with the learned ranges acts like fp32 (agreement on the recorded states) and its reward is
    not distinguishably lower. A 20k-step CartPole policy's returns spread widely over 20 episodes
    (measured here: drops of +2.2% ONNX, +5.4% TFLite, each inside its paired 95% interval), so the
    reward bound is the interval, not a 2% point estimate; agreement is what a broken int8 fails."""
    data = bench(bundle, BenchConfig(episodes=20, latency_samples=100)).to_dict()
    (q,) = [m for m in data["models"] if m["name"] != data["reference"]]
    assert q["agreement"]["value"] >= 0.95, q["agreement"]
    lo, hi = q["drift"]["rel_ci95"]
    assert lo <= 0.0 <= hi or q["drift"]["reward_drop_pct"] <= 2.0, q["drift"]
    checks = evaluate(parse_report(data), GateConfig(max_reward_drop_pct=10.0, min_agreement=0.95))
    assert checks and all(c.passed for c in checks), [c.message for c in checks if not c.passed]


@pytest.mark.slow
def test_qat8_policy_exports_onnx_int8_with_learned_ranges_and_passes_the_gate(
    tmp_path: Path, qat8_policy: Path
) -> None:
    policy = qat8_policy
    # no --calibration: int8 takes the ranges learned in training
    export_bundle(
        load_checkpoint(policy), BundleRequest(out=tmp_path / "b", targets=("onnx-fp32", "onnx-int8"))
    )
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    quant = next(m for m in manifest["models"] if m["name"] == "onnx-int8")["quantization"]
    assert (
        quant["ranges"].startswith("learned in quantization-aware training")
        and quant["calibration_samples"] == 0
    )
    assert quant["int8_weight_tensors"] == 3  # every layer int8, as trained
    layers = qat_layers(load_checkpoint(policy).net)
    lo, hi = float(layers[0][1].act_lo), float(layers[0][1].act_hi)
    assert quant["input"]["scale"] == pytest.approx((hi - min(lo, 0.0)) / 255, rel=1e-5)
    _bench_and_gate(tmp_path / "b")


@pytest.mark.slow
def test_qat8_policy_exports_tflite_int8_with_learned_ranges_and_passes_the_gate(
    tmp_path: Path, qat8_policy: Path
) -> None:
    pytest.importorskip("litert_torch")
    policy = qat8_policy
    export_bundle(
        load_checkpoint(policy), BundleRequest(out=tmp_path / "b", targets=("onnx-fp32", "tflite-int8"))
    )
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    quant = next(m for m in manifest["models"] if m["name"] == "tflite-int8")["quantization"]
    assert quant["ranges"].startswith("learned in quantization-aware training")
    assert quant["calibration_samples"] == 0
    # the hidden layers run int8 kernels; the output layer (whose output QAT never quantized) is float
    assert quant["integer_layers"] == ["mlp.0", "mlp.2"] and quant["float_layers"] == ["out"]
    layers = qat_layers(load_checkpoint(policy).net)
    for (name, layer), read in zip(layers, quant["layers"], strict=False):
        if read["layer"] not in quant["integer_layers"]:
            continue
        lo, hi = min(float(layer.act_lo), 0.0), max(float(layer.act_hi), 0.0)
        q = read["input_quantization"]  # as the .tflite file states it
        scale = (hi - lo) / 255
        assert q["scale"] == pytest.approx(scale, rel=1e-5), name
        assert abs(q["zero_point"] - (-128 - round(lo / scale))) <= 1, name
    _bench_and_gate(tmp_path / "b")


@pytest.mark.slow
def test_int4_onnx_export_keeps_weights_on_the_4bit_grid_and_runs_in_onnxruntime(
    tmp_path: Path, cartpole_policy: Path, cartpole_calib: Path
) -> None:
    import onnx
    from onnx import numpy_helper

    export_bundle(load_checkpoint(cartpole_policy), BundleRequest(out=tmp_path / "b", targets=("onnx-fp32", "onnx-int4"),
                                                                  calibration=cartpole_calib))  # fmt: skip
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    entry = next(m for m in manifest["models"] if m["name"] == "onnx-int4")
    assert entry["precision"] == "int4" and entry["quantization"]["int4_weight_tensors"] == 3
    model = onnx.load(str(tmp_path / "b" / entry["file"]))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    fp32 = {
        i.name: numpy_helper.to_array(i)
        for i in onnx.load(str(tmp_path / "b" / "policy.fp32.onnx")).graph.initializer
    }
    int4 = [i.name for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT4 and i.dims]
    assert len(int4) == 3
    for name in int4:
        layer = name.removesuffix("_quantized")
        q = inits[name].astype(np.int64)
        scale, zero = (
            inits[f"{layer}_scale"].astype(np.float64),
            inits[f"{layer}_zero_point"].astype(np.int64),
        )
        w = fp32[layer].astype(np.float64)  # the policy's own fp32 weights, from the fp32 model
        assert len(np.unique(q)) > 8, (layer, np.unique(q))  # the 16-level grid is used, not a few levels

        # on the grid and the nearest point of it: each dequantized weight within half a step of fp32's
        def nearest(q: np.ndarray, w: np.ndarray = w, scale: Any = scale, zero: Any = zero) -> bool:
            return bool(np.all(np.abs(w - scale * (q - zero)) <= scale / 2 + 1e-6 * np.abs(w).max()))

        assert nearest(q), layer
        off = q.copy()
        off.flat[int(np.argmax(np.abs(w)))] -= 1  # mutation: one weight a grid step off
        assert not nearest(off), layer
    report = bench(tmp_path / "b", BenchConfig(episodes=5, latency_samples=50)).to_dict()
    agree = next(m for m in report["models"] if m["name"] == "onnx-int4")["agreement"]["value"]
    assert agree >= 0.9, agree  # int4 still picks fp32's action on the recorded states (measured 0.96)
