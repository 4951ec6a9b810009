"""ONNX export: int8 really is int8 (QDQ graph, int8 weights, recorded in the manifest), fp16 keeps
float32 I/O, quantized actions agree with fp32, and every calibration method yields a usable model."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import assert_discriminating
from onnx import TensorProto, numpy_helper

from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.exporters.base import ExportConfig
from quarl_edge.policy.net import Policy, load_checkpoint
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.fsutil import sha256_file
from quarl_edge.runtimes.manifest import ModelEntry, load_manifest
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.trace import Trace, load_trace, save_trace

# onnxconverter-common warns about tiny weights rounded to fp16's smallest values: expected for fp16
pytestmark = pytest.mark.filterwarnings("ignore:the float32 number .* will be truncated:UserWarning")

COMPUTE_OPS = ("Conv", "Gemm", "MatMul")
PONG_SAMPLES = 400
INT8_AGREEMENT = 0.85  # trained Pong DQN, int8 vs fp32 on recorded frames (measured: see the print)


@dataclass
class QdqGraph:
    """What the int8 ONNX file itself contains."""

    quantize_nodes: int = 0
    dequantize_nodes: int = 0
    int8_layers: list[str] = field(default_factory=list)  # int8 weights and a quantized input
    float_layers: list[str] = field(default_factory=list)  # float32 weights
    per_channel_layers: list[str] = field(default_factory=list)
    float_weight_matrices: list[str] = field(default_factory=list)  # float32 initializers with ndim >= 2


def inspect_int8(path: Path) -> QdqGraph:
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    producer = {out: n for n in model.graph.node for out in n.output}

    def int8_weight(name: str) -> onnx.NodeProto | None:
        dq = producer.get(name)
        if dq is None or dq.op_type != "DequantizeLinear":
            return None
        w = inits.get(dq.input[0])
        return dq if w is not None and w.dtype == np.int8 and w.ndim >= 2 else None

    def quantized_activation(name: str) -> bool:
        dq = producer.get(name)
        q = producer.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
        return q is not None and q.op_type == "QuantizeLinear"

    g = QdqGraph()
    for n in model.graph.node:
        g.quantize_nodes += n.op_type == "QuantizeLinear"
        g.dequantize_nodes += n.op_type == "DequantizeLinear"
        if n.op_type not in COMPUTE_OPS:
            continue
        dq = int8_weight(n.input[1])
        if dq is not None:
            assert quantized_activation(n.input[0]), f"{n.name}: int8 weights but a float input"
            g.int8_layers.append(n.name)
            if inits[dq.input[1]].size > 1:
                g.per_channel_layers.append(n.name)
        else:
            assert inits[n.input[1]].dtype == np.float32, f"{n.name}: weights neither int8 nor float32"
            g.float_layers.append(n.name)
    g.float_weight_matrices = [k for k, v in inits.items() if v.dtype == np.float32 and v.ndim >= 2]
    return g


def check_manifest_records(bundle: Path, entry: ModelEntry, g: QdqGraph) -> None:
    """The manifest's quantization block describes the file as it is."""
    path = bundle / entry.file
    assert entry.sha256 == sha256_file(path) and entry.size_bytes == path.stat().st_size
    q = entry.quantization
    assert "int8" in q["scheme"]
    assert q["quantize_linear_nodes"] == g.quantize_nodes > 0
    assert q["dequantize_linear_nodes"] == g.dequantize_nodes > 0
    assert q["int8_weight_tensors"] == len(g.int8_layers) > 0
    assert q["per_channel_weight_tensors"] == len(g.per_channel_layers)
    assert len(g.per_channel_layers) == (len(g.int8_layers) if q["per_channel"] else 0)
    # layers left in float are named in the manifest; none of the int8 ones is
    assert set(g.float_layers) <= set(q["float_nodes"])
    assert not set(g.int8_layers) & set(q["float_nodes"])
    assert g.float_weight_matrices == [] or len(g.float_layers) > 0
    # the saved manifest.json carries the same block
    saved = {m["name"]: m for m in json.loads((bundle / "manifest.json").read_text())["models"]}
    assert saved[entry.name]["quantization"]["int8_weight_tensors"] == q["int8_weight_tensors"]


def replay(bundle: Path, model: str, trace: Trace) -> np.ndarray:
    rep = PolicyRunner(bundle, model).replay(trace)
    assert rep.valid.all()
    return rep.actions


# ---- fixtures --------------------------------------------------------------------------------------


@dataclass
class Exported:
    bundle: Path
    policy: Policy
    trace: Trace

    def entry(self, name: str) -> ModelEntry:
        return load_manifest(self.bundle).model(name)


@pytest.fixture(scope="module")
def cartpole(cartpole_bundle: Path, cartpole_policy: Path) -> Exported:
    return Exported(
        cartpole_bundle, load_checkpoint(cartpole_policy), load_trace(cartpole_bundle / "trace.npz")
    )


@pytest.fixture(scope="module")
def pong_cnn(tmp_path_factory: pytest.TempPathFactory, zoo_pong: tuple[Path, Path]) -> Exported:
    """The trained zoo Pong DQN (Nature-CNN), fp32 + fp16 + int8, calibrated on 400 of its recorded frames.
    A trained policy, whose actions vary from frame to frame: agreement with fp32 means something."""
    policy_dir, frames = zoo_pong
    policy = load_checkpoint(policy_dir)
    trace = load_trace(frames).subsample(PONG_SAMPLES, seed=0)
    assert trace.obs.shape == (PONG_SAMPLES, 4, 84, 84) and trace.obs.dtype == np.uint8
    assert_discriminating(policy.predict(trace.obs), 6)
    out = tmp_path_factory.mktemp("pong")
    calib = save_trace(trace, out / "pong.npz")
    export_bundle(
        policy,
        BundleRequest(out=out / "bundle", targets=("onnx-fp32", "onnx-fp16", "onnx-int8"), calibration=calib),
    )
    return Exported(out / "bundle", policy, trace)


@pytest.fixture(scope="module")
def pendulum(
    tmp_path_factory: pytest.TempPathFactory, pendulum_policy: Path, pendulum_calib: Path
) -> Exported:
    out = tmp_path_factory.mktemp("pendulum") / "bundle"
    policy = load_checkpoint(pendulum_policy)
    export_bundle(
        policy, BundleRequest(out=out, targets=("onnx-fp32", "onnx-fp16"), calibration=pendulum_calib)
    )
    return Exported(out, policy, load_trace(out / "trace.npz"))


# ---- (a) int8 is int8 ------------------------------------------------------------------------------


def test_cartpole_int8_is_a_qdq_graph_with_int8_weights(cartpole: Exported) -> None:
    entry = cartpole.entry("onnx-int8")
    assert entry.precision == "int8"
    g = inspect_int8(cartpole.bundle / entry.file)
    assert len(g.int8_layers) + len(g.float_layers) == len(cartpole.policy.arch.hidden) + 1
    assert g.int8_layers, "no layer of the int8 model is int8"
    check_manifest_records(cartpole.bundle, entry, g)
    assert entry.quantization["per_channel"] is False  # default for MLPs
    assert entry.quantization["calibration_method"] == "minmax"


def test_cartpole_all_layers_int8_without_float_io(
    cartpole: Exported, cartpole_calib: Path, tmp_path: Path
) -> None:
    manifest = export_bundle(
        cartpole.policy,
        BundleRequest(
            out=tmp_path / "b", targets=("onnx-int8",), calibration=cartpole_calib,
            config=ExportConfig(float_io_layers=False),
        ),
    )  # fmt: skip
    entry = manifest.model("onnx-int8")
    g = inspect_int8(tmp_path / "b" / entry.file)
    assert g.float_layers == [] and g.float_weight_matrices == []
    assert len(g.int8_layers) == len(cartpole.policy.arch.hidden) + 1
    assert entry.quantization["float_nodes"] == []
    check_manifest_records(tmp_path / "b", entry, g)
    agree = (
        replay(tmp_path / "b", "onnx-int8", cartpole.trace) == cartpole.policy.predict(cartpole.trace.obs)
    ).mean()
    assert agree >= 0.9


@pytest.mark.slow
def test_pong_cnn_int8_is_int8_and_3x_smaller(pong_cnn: Exported) -> None:
    fp32, int8 = pong_cnn.entry("onnx-fp32"), pong_cnn.entry("onnx-int8")
    g = inspect_int8(pong_cnn.bundle / int8.file)
    # all three convolutions and the 3136x512 layer (99% of the weights) are int8
    assert len(g.int8_layers) >= 4 and len(g.int8_layers) + len(g.float_layers) == 5
    check_manifest_records(pong_cnn.bundle, int8, g)
    q = int8.quantization
    assert q["per_channel"] is True and len(g.per_channel_layers) == len(g.int8_layers)  # default for CNNs
    assert q["calibration_samples"] == PONG_SAMPLES
    assert int8.io["inputs"][0]["dtype"] == "uint8"  # raw frames in, the /255 lives in the graph
    size32 = (pong_cnn.bundle / fp32.file).stat().st_size
    size8 = (pong_cnn.bundle / int8.file).stat().st_size
    assert size8 * 3 <= size32, f"int8 {size8} B vs fp32 {size32} B"
    actions = replay(pong_cnn.bundle, "onnx-int8", pong_cnn.trace)
    assert actions.shape == (PONG_SAMPLES,) and set(np.unique(actions)) <= set(range(6))
    agree = float((actions == pong_cnn.policy.predict(pong_cnn.trace.obs)).mean())
    print(f"\nzoo Pong DQN int8 ONNX action agreement with torch fp32 on {PONG_SAMPLES} frames: {agree:.3f}")
    assert agree >= INT8_AGREEMENT, agree


# ---- (b) fp16 --------------------------------------------------------------------------------------


def _io_types(path: Path) -> tuple[list[int], list[int]]:
    m = onnx.load(str(path))
    return (
        [v.type.tensor_type.elem_type for v in m.graph.input],
        [v.type.tensor_type.elem_type for v in m.graph.output],
    )


def _float_weight_types(path: Path) -> set[int]:
    m = onnx.load(str(path))
    return {i.data_type for i in m.graph.initializer if len(i.dims) >= 2}


@pytest.mark.parametrize("which", ["cartpole", "pendulum"])
def test_fp16_keeps_float32_io(which: str, request: pytest.FixtureRequest) -> None:
    ex: Exported = request.getfixturevalue(which)
    fp32, fp16 = ex.entry("onnx-fp32"), ex.entry("onnx-fp16")
    ins16, outs16 = _io_types(ex.bundle / fp16.file)
    ins32, outs32 = _io_types(ex.bundle / fp32.file)
    assert ins16 == ins32 == [TensorProto.FLOAT]
    assert outs16 == outs32  # int64 actions for CartPole, float32 for Pendulum
    assert TensorProto.FLOAT16 not in outs16
    assert _float_weight_types(ex.bundle / fp16.file) == {TensorProto.FLOAT16}  # weights really are fp16
    assert fp16.io["inputs"][0]["dtype"] == "float32"
    assert fp16.size_bytes < fp32.size_bytes


def test_fp16_pong_cnn_keeps_uint8_input_and_matches_fp32(pong_cnn: Exported) -> None:
    """The uint8 frame -> float cast stays a valid float32 cast (the converter used to retype it)."""
    fp16 = pong_cnn.entry("onnx-fp16")
    ins16, _ = _io_types(pong_cnn.bundle / fp16.file)
    assert ins16 == [TensorProto.UINT8]
    assert TensorProto.FLOAT16 in _float_weight_types(pong_cnn.bundle / fp16.file)
    a32 = replay(pong_cnn.bundle, "onnx-fp32", pong_cnn.trace)
    a16 = replay(pong_cnn.bundle, "onnx-fp16", pong_cnn.trace)  # loads and runs in onnxruntime
    assert_discriminating(a32, 6)
    assert (a16 == a32).mean() >= 0.95


def test_fp16_cartpole_matches_fp32_on_the_trace(cartpole: Exported) -> None:
    a32 = replay(cartpole.bundle, "onnx-fp32", cartpole.trace)
    a16 = replay(cartpole.bundle, "onnx-fp16", cartpole.trace)
    assert cartpole.trace.samples == 1000
    # identical on this trace; a tie within fp16 rounding could flip one action, hence not == 1.0
    assert (a16 == a32).mean() >= 0.99


def test_fp16_pendulum_close_to_fp32(pendulum: Exported) -> None:
    a32 = replay(pendulum.bundle, "onnx-fp32", pendulum.trace)
    a16 = replay(pendulum.bundle, "onnx-fp16", pendulum.trace)
    assert a16.dtype == np.float32
    np.testing.assert_allclose(a16, a32, rtol=0, atol=0.05)  # action range is [-2, 2]


# ---- (c) int8 agreement ----------------------------------------------------------------------------


def test_int8_cartpole_agrees_with_fp32(cartpole: Exported) -> None:
    a32 = replay(cartpole.bundle, "onnx-fp32", cartpole.trace)
    a8 = replay(cartpole.bundle, "onnx-int8", cartpole.trace)
    np.testing.assert_array_equal(a32, cartpole.policy.predict(cartpole.trace.obs))
    assert (a8 == a32).mean() >= 0.9


# ---- (d) calibration methods and per-channel -------------------------------------------------------


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
@pytest.mark.parametrize("method", ["minmax", "percentile", "entropy"])
def test_calibration_methods_give_a_loadable_int8_model(
    method: str,
    per_channel: bool,
    cartpole: Exported,
    cartpole_calib: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # default max_calibration_samples=2000 is not a multiple of the calibration batch (64)
    cfg = ExportConfig(calibration_method=method, per_channel=per_channel, percentile=99.99)
    manifest = export_bundle(
        cartpole.policy,
        BundleRequest(out=tmp_path / "b", targets=("onnx-int8",), calibration=cartpole_calib, config=cfg),
    )
    assert capsys.readouterr().out == ""  # ORT's calibrators print; stdout stays clean for --json
    entry = manifest.model("onnx-int8")
    q = entry.quantization
    assert q["calibration_method"] == method
    assert q["percentile"] == (99.99 if method == "percentile" else None)
    assert q["per_channel"] is per_channel
    assert q["calibration_samples"] == 2000
    g = inspect_int8(tmp_path / "b" / entry.file)
    check_manifest_records(tmp_path / "b", entry, g)
    assert (len(g.per_channel_layers) > 0) is per_channel
    actions = replay(tmp_path / "b", "onnx-int8", cartpole.trace)
    assert (actions == cartpole.policy.predict(cartpole.trace.obs)).mean() >= 0.9


@pytest.mark.parametrize("method", ["percentile", "entropy"])
def test_histogram_calibration_with_a_prime_sample_count(
    method: str, cartpole: Exported, cartpole_calib: Path, tmp_path: Path
) -> None:
    cfg = ExportConfig(calibration_method=method, max_calibration_samples=499)
    manifest = export_bundle(
        cartpole.policy,
        BundleRequest(out=tmp_path / "b", targets=("onnx-int8",), calibration=cartpole_calib, config=cfg),
    )
    assert manifest.model("onnx-int8").quantization["calibration_samples"] == 499
    assert replay(tmp_path / "b", "onnx-int8", cartpole.trace).shape == (cartpole.trace.samples,)


def test_unknown_calibration_method_is_refused() -> None:
    with pytest.raises(InputError, match="unknown calibration method 'kl'") as ei:
        ExportConfig(calibration_method="kl")
    assert "minmax, percentile, entropy" in str(ei.value)


@pytest.mark.slow
def test_float64_observations_calibrate_and_run_int8(tmp_path: Path) -> None:
    """MuJoCo observations are float64; the graphs take float32: calibration and the runner cast."""
    root = Path(__file__).resolve().parents[1]
    policy = load_checkpoint(root / "quarl_edge/assets/policies/halfcheetah-td3")
    calib = root / "calibration_data/halfcheetah-td3.npz"
    trace = load_trace(calib)
    assert policy.spec.observation_space.dtype == "float64" and trace.obs.dtype == np.float64
    export_bundle(policy, BundleRequest(out=tmp_path / "b", targets=("onnx-fp32", "onnx-int8", "tflite-int8"),
                                        calibration=calib))  # fmt: skip
    manifest = load_manifest(tmp_path / "b")
    assert {"onnx-int8", "tflite-int8"} <= {m.name for m in manifest.models}
    obs = trace.obs[:200]
    want = policy.predict(obs.astype(np.float32))
    for name in ("onnx-int8", "tflite-int8"):
        runner = PolicyRunner(tmp_path / "b", name, threads=1)
        got = np.stack([runner.act(o) for o in obs])
        assert got.shape == want.shape
        assert np.abs(got - want).mean() < 0.1, name  # int8 actions track fp32 on the recorded states
