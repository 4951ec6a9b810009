"""Which layers stay float, and ONNX's activation type: the choices `quarl-edge tune` searches (issue 16).

ExportConfig.float_layers names the compute layers kept in float (module paths); activation_type picks
int8 (S8S8) or uint8 (U8S8) activations for ONNX. For ONNX int8 and TFLite int8, on the shipped Pendulum
SAC (MLP) and the trained zoo Pong DQN (Nature-CNN): the file itself (ONNX initializers and Q/DQ nodes,
read with onnx; tensor types read with the LiteRT interpreter) holds the requested split, the manifest
names the same layers, an unknown name is refused before calibration with nothing written, U8S8 runs
with uint8 activations, and the default split is the one the exporters made before the option existed.
Run with `pytest -s` to see the agreements.
"""

from __future__ import annotations

import ast
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from conftest import assert_absent
from export_files import check_manifest_records, inspect_int8, tflite_io_dtypes, tflite_layers
from onnx import numpy_helper
from torch import nn

from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.exporters.base import EXPORTERS, ExportConfig, ExportContext, compute_layers
from quarl_edge.exporters.targets import load_builtin
from quarl_edge.policy.net import Policy, load_checkpoint
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.manifest import ModelEntry, load_manifest
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.trace import load_trace

pytestmark = pytest.mark.slow  # ~36 s of exports: `make test`, not the fast tier

TARGETS = ("onnx-int8", "tflite-int8")
CALIBRATION_SAMPLES = 300
MIN_AGREEMENT = 0.95
ONNX_COMPUTE = ("Conv", "Gemm", "MatMul")

load_builtin()


@dataclass(frozen=True)
class Case:
    policy: Policy
    calibration: Path
    layers: tuple[str, ...]
    default_float: tuple[str, ...]
    """the float layers the exporters chose before float_layers existed (first + output layer for a
    vector observation, the output layer for frames): fixed here, not derived from the code"""
    not_a_layer: str
    """a module of the policy that is not a compute layer (an activation)"""


@pytest.fixture(scope="module")
def cases(pendulum_policy: Path, pendulum_calib: Path, zoo_pong: tuple[Path, Path]) -> dict[str, Case]:
    pendulum = load_checkpoint(pendulum_policy)
    pong = load_checkpoint(zoo_pong[0])
    return {
        "pendulum": Case(pendulum, pendulum_calib, ("mlp.0", "mlp.2", "out"), ("mlp.0", "out"), "mlp.1"),
        "pong": Case(pong, zoo_pong[1], ("cnn.0", "cnn.2", "cnn.4", "cnn_fc.0", "out"), ("out",), "cnn.1"),
    }


@dataclass
class Bundle:
    path: Path
    case: Case

    def entry(self, target: str) -> ModelEntry:
        return load_manifest(self.path).model(target)

    def file(self, target: str) -> Path:
        return self.path / self.entry(target).file

    def agreement(self, target: str) -> float:
        """With the torch fp32 policy on the bundle's recorded trace: the share of equal actions
        (discrete), or 1 - mean |diff| / action range (continuous)."""
        trace = load_trace(self.path / "trace.npz")
        rep = PolicyRunner(self.path, target).replay(trace)
        assert rep.valid.all()
        want = _fp32_actions(self.case.policy, trace.obs)
        space = self.case.policy.spec.action_space
        if space.kind == "discrete":
            return float((rep.actions == want).mean())
        span = float(np.max(np.asarray(space.high) - np.asarray(space.low)))
        return float(1.0 - np.abs(rep.actions - want).mean() / span)


_FP32: dict[tuple[int, bytes], np.ndarray] = {}


def _fp32_actions(policy: Policy, obs: np.ndarray) -> np.ndarray:
    """The torch fp32 policy's actions, computed once per policy and trace (every bundle of a policy
    records the same trace)."""
    key = (id(policy), hashlib.sha256(obs.tobytes()).digest())
    if key not in _FP32:
        _FP32[key] = policy.predict(obs.astype(np.float32) if obs.dtype == np.float64 else obs)
    return _FP32[key]


Export = Callable[..., Bundle]


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory, cases: dict[str, Case]) -> Export:
    """``export(which, **config)``: ONNX int8 + TFLite int8 of one policy in one bundle, each config
    exported once per module (300 calibration observations)."""
    done: dict[tuple[str, tuple[tuple[str, Any], ...]], Bundle] = {}

    def run(which: str, **cfg: Any) -> Bundle:
        key = (which, tuple(sorted(cfg.items())))
        if key not in done:
            case = cases[which]
            out = tmp_path_factory.mktemp(which) / "bundle"
            config = ExportConfig(max_calibration_samples=CALIBRATION_SAMPLES, **cfg)
            export_bundle(
                case.policy,
                BundleRequest(out=out, targets=TARGETS, calibration=case.calibration, config=config),
            )
            done[key] = Bundle(out, case)
        return done[key]

    return run


# ---- what the files hold, read without the exporters' own mapping ----------------------------------


def onnx_split(path: Path, layers: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(int8 layers, float layers) of an ONNX int8 file by module path. A layer is int8 when its weights
    are an int8 initializer behind a DequantizeLinear and its input comes through QuantizeLinear ->
    DequantizeLinear (inspect_int8 asserts both); each node is named by the module scope torch.onnx
    recorded on it, not by the graph order the exporter relies on."""
    g = inspect_int8(path)
    module: dict[str, str] = {}
    for n in onnx.load(str(path)).graph.node:
        if n.op_type in ONNX_COMPUTE:
            meta = {m.key: m.value for m in n.metadata_props}
            (module[n.name],) = [
                s for s in ast.literal_eval(meta["pkg.torch.onnx.name_scopes"]) if s in layers
            ]
    assert len(module) == len(layers), module
    return [module[n] for n in g.int8_layers], [module[n] for n in g.float_layers]


def tflite_split(path: Path, layers: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """(integer layers, float layers) of a .tflite file: int8 weights, input and output, or float32
    all three (nothing in between); the interpreter runs the compute ops in the policy's layer order."""
    found = tflite_layers(path)
    assert len(found) == len(layers), found
    integer = [
        n for n, lay in zip(layers, found, strict=True) if lay.weights == lay.input == lay.output == "int8"
    ]
    floating = [
        n for n, lay in zip(layers, found, strict=True) if lay.weights == lay.input == lay.output == "float32"
    ]
    assert len(integer) + len(floating) == len(layers), found
    return integer, floating


def file_split(bundle: Bundle, target: str) -> tuple[list[str], list[str]]:
    read = onnx_split if target.startswith("onnx") else tflite_split
    return read(bundle.file(target), bundle.case.layers)


def assert_manifest_names(bundle: Bundle, target: str, integer: list[str], floating: list[str]) -> None:
    entry = bundle.entry(target)
    q = entry.quantization
    assert q["float_layers"] == floating
    if target == "onnx-int8":
        assert q["int8_layers"] == integer
        assert q["int8_weight_tensors"] == len(integer)
        check_manifest_records(bundle.path, entry, inspect_int8(bundle.file(target)))
    else:
        assert q["integer_layers"] == q["requested_int8_layers"] == integer
        assert q["float_nodes"] == floating
        assert q["int8_weight_tensors"] == len(integer)


# ---- the tests ----------------------------------------------------------------------------------------


def test_compute_layers_are_the_names_float_layers_takes(cases: dict[str, Case]) -> None:
    for case in cases.values():
        assert tuple(compute_layers(case.policy)) == case.layers


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("which", ["pendulum", "pong"])
def test_no_float_layers_makes_every_compute_layer_int8(export: Export, which: str, target: str) -> None:
    bundle = export(which, float_layers=())
    integer, floating = file_split(bundle, target)
    assert integer == list(bundle.case.layers) and floating == []
    assert_manifest_names(bundle, target, integer, floating)
    if target == "onnx-int8":
        assert inspect_int8(bundle.file(target)).float_weight_matrices == []  # no float weight is left
    elif which == "pendulum":
        assert tflite_io_dtypes(bundle.file(target))[0] == "int8"  # the first layer is int8: so is the input
    print(f"\n{which} {target}, every layer int8: agreement with fp32 {bundle.agreement(target):.3f}")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("which", ["pendulum", "pong"])
def test_one_float_layer_stays_float_and_the_rest_is_int8(export: Export, which: str, target: str) -> None:
    bundle = export(which, float_layers=("out",))
    integer, floating = file_split(bundle, target)
    assert floating == ["out"] and integer == [n for n in bundle.case.layers if n != "out"]
    assert_manifest_names(bundle, target, integer, floating)
    if target == "onnx-int8":
        g = inspect_int8(bundle.file(target))
        # the output layer's weights are the only float matrix, and its node heads the excluded ones
        assert len(g.float_weight_matrices) == 1
        assert bundle.entry(target).quantization["float_nodes"][0] == g.float_layers[0]
    print(f"\n{which} {target}, 'out' float: agreement with fp32 {bundle.agreement(target):.3f}")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("which", ["pendulum", "pong"])
def test_the_default_split_is_unchanged(export: Export, which: str, target: str) -> None:
    """float_layers=None is today's choice, and naming today's layers gives the same file, byte for byte."""
    default = export(which)
    integer, floating = file_split(default, target)
    want = list(default.case.default_float)
    assert floating == want and integer == [n for n in default.case.layers if n not in want]
    assert_manifest_names(default, target, integer, floating)
    q = default.entry(target).quantization
    assert q["activation_type"] == "S8S8" and "activation_type_requested" not in q
    explicit = export(which, float_layers=default.case.default_float)
    assert explicit.entry(target).sha256 == default.entry(target).sha256
    assert explicit.entry(target).quantization["float_nodes"] == q["float_nodes"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("which", ["pendulum", "pong"])
def test_an_unknown_layer_is_refused_before_calibration_and_nothing_is_written(
    cases: dict[str, Case], which: str, target: str, tmp_path: Path
) -> None:
    case = cases[which]
    bad = ExportConfig(float_layers=("out", case.not_a_layer))
    # no calibration at all: the layer check comes first, or this would be the missing-calibration error
    ctx = ExportContext(policy=case.policy, calibration=None, config=bad, workdir=tmp_path)
    file = tmp_path / "policy.int8"
    with pytest.raises(InputError) as ei:
        EXPORTERS[target](ctx, file)
    msg = str(ei.value)
    assert f"unknown layer {case.not_a_layer!r}" in msg and ", ".join(case.layers) in msg and "\n" not in msg
    assert not file.exists() and sorted(p.name for p in tmp_path.iterdir()) == []
    out = tmp_path / "bundle"
    with pytest.raises(InputError, match=f"unknown layer '{case.not_a_layer}'"):
        export_bundle(
            case.policy, BundleRequest(out=out, targets=(target,), calibration=case.calibration, config=bad)
        )
    assert_absent(out)


def _activation_zero_points(path: Path) -> list[np.dtype]:
    """The types of the activations' zero points (every QuantizeLinear in a QDQ graph is an activation)."""
    model = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return [inits[n.input[2]].dtype for n in model.graph.node if n.op_type == "QuantizeLinear"]


@pytest.mark.parametrize("which", ["pendulum", "pong"])
def test_u8s8_has_uint8_activations_and_agrees_with_fp32(export: Export, which: str) -> None:
    bundle, s8 = export(which, activation_type="U8S8"), export(which)
    path = bundle.file("onnx-int8")
    zero_points = _activation_zero_points(path)
    assert zero_points and set(zero_points) == {np.dtype(np.uint8)}
    assert set(_activation_zero_points(s8.file("onnx-int8"))) == {np.dtype(np.int8)}
    integer, floating = onnx_split(path, bundle.case.layers)  # weights still int8 (inspect_int8 checks)
    assert floating == list(bundle.case.default_float)
    q = bundle.entry("onnx-int8").quantization
    assert q["activation_type"] == "U8S8" and "uint8 activations" in q["scheme"]
    assert 0 <= q["input"]["zero_point"] <= 255
    assert_manifest_names(bundle, "onnx-int8", integer, floating)
    agree, agree_s8 = bundle.agreement("onnx-int8"), s8.agreement("onnx-int8")
    print(f"\n{which} ONNX int8 agreement with fp32: U8S8 {agree:.4f}, S8S8 {agree_s8:.4f}")
    assert agree >= MIN_AGREEMENT, agree
    # TFLite ignores the option: the manifest says so, and the file is the S8S8 one
    tq = bundle.entry("tflite-int8").quantization
    assert tq["activation_type"] == "S8S8" and "not applicable to TFLite" in tq["activation_type_requested"]
    assert bundle.entry("tflite-int8").sha256 == s8.entry("tflite-int8").sha256


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"activation_type": "U8U8"}, "unknown activation type 'U8U8'; choose one of: S8S8, U8S8"),
        ({"float_layers": "out"}, "float_layers must be a tuple of layer names, not the string 'out'"),
        ({"float_layers": ("out", "out")}, "float_layers names 'out' twice"),
        ({"float_layers": ("out", "")}, "float_layers holds '', not a layer name"),
    ],
)
def test_config_refuses_a_bad_choice(cfg: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as ei:
        ExportConfig(**cfg)
    assert message in str(ei.value)


def test_config_keeps_float_layers_as_a_tuple() -> None:
    cfg = ExportConfig(float_layers=["mlp.0", "out"])  # type: ignore[arg-type]
    assert cfg.float_layers == ("mlp.0", "out")
    assert hash(cfg) == hash(ExportConfig(float_layers=("mlp.0", "out")))  # still usable as a cache key


class Rotate(nn.Module):
    """A matrix product that is not a Linear layer: one more MatMul in the graph than compute layers."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.register_buffer("r", torch.eye(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ self.r)


def test_a_graph_whose_nodes_do_not_match_the_layers_is_refused(
    cartpole_policy: Path, cartpole_calib: Path, tmp_path: Path
) -> None:
    """The ONNX exporter maps layer names to Conv/Gemm/MatMul nodes in order; an extra product would
    shift every name by one, so it is refused instead of quantizing the wrong layers."""
    policy = load_checkpoint(cartpole_policy)
    policy.net.mlp[1] = Rotate(policy.net.mlp[0].out_features)
    calib = load_trace(cartpole_calib).obs[:64]
    ctx = ExportContext(
        policy=policy, calibration=calib, config=ExportConfig(float_layers=("out",)), workdir=tmp_path
    )
    with pytest.raises(InputError) as ei:
        EXPORTERS["onnx-int8"](ctx, tmp_path / "policy.int8.onnx")
    msg = str(ei.value)
    assert "4 compute nodes (Gemm, MatMul, Gemm, Gemm)" in msg and "3 layers (mlp.0, mlp.2, out)" in msg, msg
    assert not (tmp_path / "policy.int8.onnx").exists()
