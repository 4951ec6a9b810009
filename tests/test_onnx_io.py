"""A policy from the robot world: an rsl_rl-style recurrent ONNX exported the way Isaac Lab exports it
(torch.onnx, opset 11, batch 1, normalizer baked, ``obs, h_in, c_in -> actions, h_out, c_out``) with an
io.yaml and a recorded observation file: quantized, benched (latency + action error, reward "not
measured"), gated by --max-action-error, acting with its state through the runtime API; a state the
io.yaml does not name is one line."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from quarl_edge.bench.report import parse_report  # noqa: E402
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.gate import GateConfig, evaluate
from quarl_edge.inspect import inspect_policy
from quarl_edge.policy.load import load_policy
from quarl_edge.runtimes import load_policy as load_runtime
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.trace import load_trace

OBS, ACT, HIDDEN = 10, 3, 16
IO_YAML = """\
observation: {size: 10}
action: {size: 3}
activation: elu
control_hz: 50
recurrent: {inputs: [h_in, c_in], outputs: [h_out, c_out]}
onnx: {observation: obs, action: actions}
"""


class IsaacActor(nn.Module):
    """rsl_rl's _OnnxRNNModel: normalizer, LSTM, ELU MLP; (obs, h_in, c_in) -> (actions, h_out, c_out)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.mean, self.std = torch.randn(OBS), torch.rand(OBS) + 0.5
        self.rnn = nn.LSTM(OBS, HIDDEN, 1)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 32), nn.ELU(), nn.Linear(32, ACT))

    def forward(self, obs: torch.Tensor, h_in: torch.Tensor, c_in: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = (obs - self.mean) / (self.std + 0.01)
        x, (h, c) = self.rnn(x.unsqueeze(0), (h_in, c_in))
        return self.mlp(x.squeeze(0)), h, c


@pytest.fixture(scope="module")
def isaac(tmp_path_factory: pytest.TempPathFactory) -> tuple[IsaacActor, Path, Path, Path]:
    return make_isaac(tmp_path_factory.mktemp("isaac"))


def make_isaac(out: Path) -> tuple[IsaacActor, Path, Path, Path]:
    """The ONNX as Isaac Lab exports it, its io.yaml, a robot's log, and a bundle (fp32 + int8)."""
    actor = IsaacActor().eval()
    zeros = (torch.zeros(1, OBS), torch.zeros(1, 1, HIDDEN), torch.zeros(1, 1, HIDDEN))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(actor, zeros, out / "policy.onnx", dynamo=False, opset_version=11,
                          input_names=["obs", "h_in", "c_in"], output_names=["actions", "h_out", "c_out"])  # fmt: skip
    (out / "io.yaml").write_text(IO_YAML)
    t = np.arange(800)
    obs = np.sin(t[:, None] * np.linspace(0.03, 0.3, OBS) + np.linspace(0, 3, OBS)) * 2.0
    np.savez(out / "robot_log.npz", obs=obs.astype(np.float32), episode_ids=t // 200)
    policy = load_policy(out / "policy.onnx", io=out / "io.yaml")
    export_bundle(policy, BundleRequest(out=out / "bundle", targets=("onnx-fp32", "onnx-int8"),
                                        calibration=out / "robot_log.npz"))  # fmt: skip
    return actor, out / "policy.onnx", out / "io.yaml", out / "bundle"


def _reference(actor: IsaacActor, obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
    out, h, c = [], torch.zeros(1, 1, HIDDEN), torch.zeros(1, 1, HIDDEN)
    with torch.no_grad():
        for o, s in zip(obs, starts, strict=True):
            if s:
                h, c = torch.zeros_like(h), torch.zeros_like(c)
            a, h, c = actor(torch.as_tensor(o[None]), h, c)
            out.append(a[0].numpy())
    return np.asarray(out)


def test_inspected_with_its_state(isaac: tuple) -> None:
    _, onnx_path, io, bundle = isaac
    ins = inspect_policy(onnx_path, io=io)
    assert ins.source == "onnx" and ins.env_id == "external/policy"
    assert [s.name for s in ins.recurrent_state] == ["h_in", "c_in"]
    m = load_manifest(bundle)
    assert [s.input for s in m.policy.state] == ["h_in", "c_in"] and m.policy.train["control_hz"] == 50
    int8 = m.model("onnx-int8")
    assert int8.quantization["float_recurrent_ops"] == ["LSTM"] and "stays float" in int8.quantization["note"]
    assert [i["name"] for i in int8.io["inputs"]] == ["obs", "h_in", "c_in"]


def test_runtime_api_acts_with_state_over_whole_episodes(isaac: tuple) -> None:
    actor, _, _, bundle = isaac
    trace = load_trace(bundle / "trace.npz")
    expected = _reference(actor, trace.obs, trace.episode_starts())
    for model, tol in (("onnx-fp32", 1e-5), ("onnx-int8", 0.2)):
        policy = load_runtime(bundle, model=model)
        got = []
        for o, s in zip(trace.obs, trace.episode_starts(), strict=True):
            if s:
                policy.reset()
            got.append(policy.act(o))
        assert float(np.abs(np.asarray(got) - expected).max()) <= tol, model
        assert [x.shape for x in policy.recurrent_state] == [(1, 1, HIDDEN)] * 2


def test_benched_reward_not_measured_and_gated_by_action_error(isaac: tuple) -> None:
    report = bench(isaac[3], BenchConfig(episodes=5, latency_samples=50, warmup=5)).to_dict()
    assert report["reward_not_measured"]
    int8 = next(m for m in report["models"] if m["name"] == "onnx-int8")
    err = int8["agreement"]["max_abs_diff"]
    assert 0 < err < 0.2 and int8["latency"]["p50_us"] > 0
    assert all(c.passed for c in evaluate(parse_report(report), GateConfig(max_action_error=0.2)))
    assert not any(c.passed for c in evaluate(parse_report(report), GateConfig(max_action_error=err / 2)))


def test_state_names_missing_from_the_io_yaml_are_one_line(isaac: tuple, tmp_path: Path) -> None:
    _, onnx_path, _, _ = isaac
    io = tmp_path / "io.yaml"
    io.write_text("observation: {size: 10}\n")
    with pytest.raises(InputError, match="h_in, c_in beside the observation") as ei:
        load_policy(onnx_path, io=io)
    assert "recurrent:" in str(ei.value) and "\n" not in str(ei.value)
    with pytest.raises(InputError, match="h_in, c_in beside the observation"):
        load_policy(onnx_path)
    io.write_text("recurrent: {inputs: [h0, c0], outputs: [h_out, c_out]}\n")
    with pytest.raises(InputError, match="does not match"):
        load_policy(onnx_path, io=io)
    with pytest.raises(InputError, match="imported ONNX graph"):
        export_bundle(load_policy(onnx_path, io=isaac[2]),
                      BundleRequest(out=tmp_path / "b", targets=("tflite-fp32",), calibration=isaac[3] / "trace.npz"))  # fmt: skip
    assert not (tmp_path / "b").exists()


def test_per_channel_int8_of_an_opset_11_graph_is_one_line_not_a_graph_that_does_not_load(
    isaac: tuple, tmp_path: Path
) -> None:
    """ORT writes per-channel DequantizeLinear nodes an opset-11 graph (Isaac Lab's export) cannot hold, a
    model that then fails to load: refused before anything is written, naming the fix."""
    from quarl_edge.exporters.base import ExportConfig

    _, onnx_path, io, bundle = isaac
    with pytest.raises(InputError, match="opset 13") as ei:
        export_bundle(load_policy(onnx_path, io=io),
                      BundleRequest(out=tmp_path / "b", targets=("onnx-int8",), calibration=bundle / "trace.npz",
                                    config=ExportConfig(per_channel=True)))  # fmt: skip
    assert "--per-tensor" in str(ei.value) and "\n" not in str(ei.value)
    assert not (tmp_path / "b").exists()
