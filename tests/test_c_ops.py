"""The C generator's op coverage (issue 31): every op it claims, each checked against ONNX Runtime.

A hand-built ONNX graph holds the ops the zoo's graphs do not (baked observation normalization, Clip,
MatMul + Add, ELU, LeakyReLU, SiLU as Sigmoid * x, Sigmoid, Max/Min clipping); policies built here with
the exporter's own path cover normalization + ELU + the clip head with uint8 (U8S8) activations, and
every layer int8 (--full-int8). Ops outside the set are refused naming the op; the C program a file
holds is validated before anything renders it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from conftest import CALIB, POLICIES
from onnx import TensorProto, helper, numpy_helper

from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.exporters.base import ExportConfig
from quarl_edge.exporters.c_onnx import from_onnx
from quarl_edge.policy.net import build_policy, load_checkpoint
from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.c import CSession
from quarl_edge.runtimes.cprogram import Buffer, Op, Program
from quarl_edge.runtimes.csource import check_source, render_c, render_h
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.trace import load_trace

RNG = np.random.default_rng(0)


def _init(name: str, a: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(a, np.float32), name)


def synthetic_graph(path: Path, extra: list[onnx.NodeProto] | None = None) -> Path:
    n_in, h = 5, 24
    inits = [
        _init("mean", RNG.normal(size=n_in)), _init("std", RNG.uniform(0.5, 2, size=n_in)),
        _init("lo", [-3.0]), _init("hi", [3.0]),
        _init("w1", RNG.normal(size=(n_in, h)) * 0.5), _init("b1", RNG.normal(size=h) * 0.1),
        _init("w2", RNG.normal(size=(h, h)) * 0.3), _init("b2", RNG.normal(size=h) * 0.1),
        _init("w3", RNG.normal(size=(h, h)) * 0.3), _init("b3", RNG.normal(size=h) * 0.1),
        _init("w4", RNG.normal(size=(3, h)) * 0.3), _init("b4", RNG.normal(size=3) * 0.1),
        _init("amin", [-0.5, -1.0, -2.0]), _init("amax", [0.5, 1.0, 2.0]), _init("two", [2.0]),
    ]  # fmt: skip
    nodes = [
        helper.make_node("Sub", ["obs", "mean"], ["centred"]),
        helper.make_node("Div", ["centred", "std"], ["normed"]),
        helper.make_node("Clip", ["normed", "lo", "hi"], ["clipped"]),
        helper.make_node("MatMul", ["clipped", "w1"], ["mm1"]),
        helper.make_node("Add", ["mm1", "b1"], ["l1"]),
        helper.make_node("Elu", ["l1"], ["a1"], alpha=0.7),
        helper.make_node("Gemm", ["a1", "w2", "b2"], ["l2"]),
        helper.make_node("LeakyRelu", ["l2"], ["a2"], alpha=0.05),
        helper.make_node("Gemm", ["a2", "w3", "b3"], ["l3"]),
        helper.make_node("Sigmoid", ["l3"], ["sig"]),
        helper.make_node("Mul", ["l3", "sig"], ["a3"]),  # SiLU
        helper.make_node("Sigmoid", ["a3"], ["a4"]),
        helper.make_node("Mul", ["a4", "two"], ["a5"]),
        helper.make_node("Gemm", ["a5", "w4", "b4"], ["l4"], transB=1),
        helper.make_node("Max", ["l4", "amin"], ["m1"]),
        helper.make_node("Min", ["m1", "amax"], ["action"]),
        *(extra or []),
    ]
    graph = helper.make_graph(
        nodes, "synthetic",
        [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", n_in])],
        [helper.make_tensor_value_info("action", TensorProto.FLOAT, ["batch", 3])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def c_session(program: Program, tmp: Path) -> CSession:
    c_file = tmp / "policy.c"
    c_file.write_text(render_c(program))
    (tmp / program.header).write_text(render_h(program))
    return CSession(c_file)


def test_every_claimed_op_matches_onnxruntime(tmp_path: Path) -> None:
    path = synthetic_graph(tmp_path / "synthetic.onnx")
    program = from_onnx(path, "c-fp32", "synthetic", "policy.h")
    assert [o.op for o in program.ops] == ["sub", "div", "clip", "dense_f32", "elu", "dense_f32", "leaky_relu",
                                           "dense_f32", "silu", "sigmoid", "mul", "dense_f32", "max", "min"]  # fmt: skip
    obs = RNG.normal(size=(2000, 5)).astype(np.float32) * 3
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"obs": obs})[0]
    got = c_session(program, tmp_path).run(obs)
    assert float(np.abs(got - ref).max()) <= 1e-5
    assert (np.abs(ref) == np.array([0.5, 1.0, 2.0])).mean() > 0.05  # the clipping acted
    assert float(np.std(ref[:, 2])) > 0.1 and len(np.unique(ref[:, 2])) > 1000


@pytest.mark.parametrize("op", ["Softmax", "LSTM", "Conv"])
def test_an_op_outside_the_set_is_named(op: str, tmp_path: Path) -> None:
    path = synthetic_graph(tmp_path / "s.onnx")
    model = onnx.load(str(path))
    model.graph.node.insert(1, helper.make_node(op, ["centred"], ["odd"]))
    onnx.save(model, str(path))
    with pytest.raises(InputError) as e:
        from_onnx(path, "c-int8", "s", "policy.h")
    assert f"uses {op}," in str(e.value) and "tflite-int8" in str(e.value) and "\n" not in str(e.value)


def test_two_computed_tensors_added_are_refused(tmp_path: Path) -> None:
    extra = [helper.make_node("Add", ["a1", "a2"], ["res"])]
    path = synthetic_graph(tmp_path / "s.onnx", extra)
    with pytest.raises(InputError, match="Add of two computed tensors"):
        from_onnx(path, "c-fp32", "s", "policy.h")


def _program(**kw: object) -> Program:
    base = dict(name="p", precision="fp32", header="policy.h", obs_name="obs", action_name="action",
                discrete=False, buffers=(Buffer("f32", 2), Buffer("f32", 2)), ops=(Op("relu", 0, 1),), output=1,
                arrays={})  # fmt: skip
    return Program(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [
        {"name": 'x"; system("id'},
        {"name": "a*/b"},
        {"header": "../policy.h"},
        {"ops": (Op("system", 0, 1),)},
        {"ops": (Op("relu", 1, 1),)},  # reads a buffer nothing wrote
        {"ops": (Op("relu", 0, 0),)},  # writes the observation
        {"buffers": (Buffer("f32", 2), Buffer("f32", 3))},
        {"ops": (Op("clip", 0, 1, lo=1.0, hi=0.0),)},
        {"ops": (Op("elu", 0, 1, alpha=float("nan")),)},
        {"ops": (Op("relu", 0, 1, scale=1.0),)},
        {"ops": (Op("add", 0, 1, c="qe_c0"),), "arrays": {"qe_c0": np.zeros(3, np.float32)}},
        {"ops": (Op("add", 0, 1, c="qe_c0"),), "arrays": {"qe_c0": np.array([np.inf, 0], np.float32)}},
        {"buffers": (Buffer("f32", 2), Buffer("f32", 1 << 20))},
    ],
)
def test_a_program_is_validated_before_it_renders(bad: dict[str, object]) -> None:
    _program()  # the base is valid
    with pytest.raises(InputError) as e:
        _program(**bad)
    assert str(e.value).startswith("C program:")


def test_the_checked_source_round_trips(tmp_path: Path) -> None:
    program = from_onnx(synthetic_graph(tmp_path / "s.onnx"), "c-fp32", "synthetic", "policy.h")
    text = render_c(program)
    again = check_source(text, "x")
    assert render_c(again) == text
    for broken in (
        text.replace("qe_w", "qe_W", 1),
        text + "int x;\n",
        text.replace('"version":1', '"version":2'),
    ):
        with pytest.raises(InputError):
            check_source(broken, "x")


def _variant(
    tmp: Path, name: str, policy_dir: str, arch_changes: dict[str, object], cfg: ExportConfig
) -> Path:
    base = load_checkpoint(POLICIES / policy_dir)
    torch.manual_seed(3)
    arch = replace(base.arch, **arch_changes)  # type: ignore[arg-type]
    policy = build_policy(replace(base.spec, name=name), arch)
    net = policy.net
    with torch.no_grad():
        if arch.obs_norm:
            net.obs_mean.copy_(torch.randn_like(net.obs_mean) * 0.3)
            net.obs_var.copy_(torch.rand_like(net.obs_var) * 2 + 0.2)
        for p in net.parameters():
            p.mul_(2.0)  # actions that vary across the trace, beyond the clip head's bounds at times
    out = tmp / name
    export_bundle(policy, BundleRequest(out=out, targets=("onnx-fp32", "onnx-int8", "c-fp32", "c-int8"),
                                        calibration=CALIB / f"{policy_dir}.npz", config=cfg))  # fmt: skip
    return out


def _check_variant(bundle: Path, int8_tol: float) -> dict[str, float]:
    obs = load_trace(bundle / "trace.npz").obs
    acts = {m: load_policy(bundle, model=m, threads=1).act_batch(obs).astype(np.float64)
            for m in ("onnx-fp32", "onnx-int8", "c-fp32", "c-int8")}  # fmt: skip
    fig = {
        "fp32": float(np.abs(acts["c-fp32"] - acts["onnx-fp32"]).max()),
        "int8": float(np.abs(acts["c-int8"] - acts["onnx-int8"]).max()),
        "spread": float(np.ptp(acts["onnx-fp32"])),
    }
    assert fig["fp32"] <= 1e-5 and fig["int8"] <= int8_tol and fig["spread"] > 0.1, fig
    return fig


def test_normalization_elu_and_clip_head_with_uint8_activations(tmp_path: Path) -> None:
    bundle = _variant(tmp_path, "pendulum-norm-elu", "pendulum-sac",
                      {"obs_norm": True, "activation": "elu", "head": "clip", "hidden": (32, 32)},
                      ExportConfig(activation_type="U8S8", max_calibration_samples=500))  # fmt: skip
    program = check_source((bundle / "policy.int8.c").read_text(), "c")
    assert {"sub", "div", "clip", "elu", "dense_i8", "quantize"} <= {o.op for o in program.ops}
    print(_check_variant(bundle, 1e-4))


@pytest.mark.slow
def test_every_layer_int8_and_leaky_relu(tmp_path: Path) -> None:
    bundle = _variant(tmp_path, "cartpole-leaky-full", "cartpole-ppo", {"activation": "leaky_relu"},
                      ExportConfig(float_io_layers=False, max_calibration_samples=500))  # fmt: skip
    program = check_source((bundle / "policy.int8.c").read_text(), "c")
    assert [o.op for o in program.ops if o.op.startswith("dense")] == ["dense_i8"] * 3
    print(_check_variant(bundle, 0.0))
