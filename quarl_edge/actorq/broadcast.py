"""Weight broadcast for ActorQ: the learner quantizes once, every actor loads the same payload.

The payload is a self-contained model (bytes) of the policy MLP at the actors' precision (DQN's
Q-network, or D4PG's deterministic actor with its tanh squash scaled to the action bounds), built
straight from the learner's fp32 weights (no torch export: a few ms), for one of two actor runtimes
(RUNTIMES), so actors need only numpy and that runtime:
- ``onnx``: an ONNX graph; int8 is ONNX Runtime static quantization, QDQ, int8 weights and activations
  (S8S8, per-tensor), calibrated on observations sampled from the learner's replay buffer.
- ``litert``: a TFLite flatbuffer (actorq/tflite.py); int8 is full-integer, per-channel weights,
  calibrated on the same observations.
Which is faster depends on the network size and the CPU (``--actor-runtime auto`` measures both in a
live actor at the start of a run; benchmarks/actorq_inference.py prints the table).

Why ONNX Runtime QDQ and not torch ``quantize_dynamic`` (fbgemm/x86 int8 Linear): measured here, one
thread, batch 1, on a loaded 2-core AVX-512 VNNI machine (see README "ActorQ"):

    MLP 4-64-64-2       torch fp32 20 us, torch int8-dynamic 55 us (0.37x), ORT fp32 7.3 us, ORT int8 6.0 us (1.21x)
    MLP 4-2048x3-2      torch fp32 1484 us, torch int8-dynamic 161 us (9.2x), ORT fp32 1127 us, ORT int8 94 us (12x)

ORT is the faster int8 path at both sizes and its fp32 is also the faster fp32 baseline, so all three
precisions run on the same runtime and the comparison isolates precision. The price is paid once per
broadcast on the learner (calibrate + quantize: ~0.1 s small, ~0.8 s for the 2048-wide MLP).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from quarl_edge.actorq.tflite import graph_name as tflite_graph_name
from quarl_edge.actorq.tflite import int8_evidence as tflite_evidence
from quarl_edge.actorq.tflite import mlp_tflite

if TYPE_CHECKING:
    import torch  # the actors never import torch (an int8 session in a process with torch runs slower)

PRECISIONS = ("fp32", "fp16", "int8")
RUNTIMES = ("onnx", "litert")
INPUT_NAME, OUTPUT_NAME = "obs", "q"
Squash = tuple[np.ndarray, np.ndarray]
"""(scale, bias) of a continuous actor: action = tanh(mlp(obs)) * scale + bias, per action dimension"""

StateDict = dict[str, "torch.Tensor"]
"""a policy network's ``state_dict()``: what the learner broadcasts"""


@dataclass(frozen=True)
class Payload:
    """What the learner `ray.put`s once per broadcast; every actor pulls the same object."""

    version: int
    precision: str
    model: bytes
    runtime: str = "onnx"
    """onnx or litert: what the actors open ``model`` with"""

    @property
    def nbytes(self) -> int:
        return len(self.model)


def mlp_layers(state_dict: StateDict) -> list[tuple[np.ndarray, np.ndarray]]:
    """(weight [out, in], bias [out]) of each Linear of an nn.Sequential MLP, in order."""
    weights = sorted(k for k in state_dict if k.endswith(".weight"))
    weights.sort(key=lambda k: int(k.split(".")[-2]))
    return [
        (
            state_dict[k].detach().cpu().numpy().astype(np.float32),
            state_dict[k[: -len("weight")] + "bias"].detach().cpu().numpy().astype(np.float32),
        )
        for k in weights
    ]


def mlp_onnx(
    layers: list[tuple[np.ndarray, np.ndarray]], fp16: bool = False, squash: Squash | None = None
) -> Any:
    """MatMul + Add (+ Relu between layers) graph, then Tanh * scale + bias with ``squash``; fp16 keeps
    float32 input and output."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    dtype = np.float16 if fp16 else np.float32
    nodes, inits = [], []
    x = INPUT_NAME
    if fp16:
        nodes.append(helper.make_node("Cast", [x], ["obs16"], to=TensorProto.FLOAT16))
        x = "obs16"
    for i, (w, b) in enumerate(layers):
        inits += [
            numpy_helper.from_array(w.T.astype(dtype), f"w{i}"),
            numpy_helper.from_array(b.astype(dtype), f"b{i}"),
        ]
        nodes += [
            helper.make_node("MatMul", [x, f"w{i}"], [f"mm{i}"]),
            helper.make_node("Add", [f"mm{i}", f"b{i}"], [f"a{i}"]),
        ]
        x = f"a{i}"
        if i < len(layers) - 1:
            nodes.append(helper.make_node("Relu", [x], [f"r{i}"]))
            x = f"r{i}"
    if squash is not None:
        inits += [
            numpy_helper.from_array(np.asarray(squash[0]).astype(dtype).reshape(-1), "act_scale"),
            numpy_helper.from_array(np.asarray(squash[1]).astype(dtype).reshape(-1), "act_bias"),
        ]
        nodes += [
            helper.make_node("Tanh", [x], ["tanh"]),
            helper.make_node("Mul", ["tanh", "act_scale"], ["scaled"]),
            helper.make_node("Add", ["scaled", "act_bias"], ["unscaled"]),
        ]
        x = "unscaled"
    if fp16:
        nodes.append(helper.make_node("Cast", [x], [OUTPUT_NAME], to=TensorProto.FLOAT))
    else:
        nodes.append(helper.make_node("Identity", [x], [OUTPUT_NAME]))
    n_in, n_out = layers[0][0].shape[1], layers[-1][0].shape[0]
    graph = helper.make_graph(
        nodes,
        "qnet" if squash is None else "actor",
        [helper.make_tensor_value_info(INPUT_NAME, TensorProto.FLOAT, ["batch", n_in])],
        [helper.make_tensor_value_info(OUTPUT_NAME, TensorProto.FLOAT, ["batch", n_out])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


class _Calibration:
    def __init__(self, obs: np.ndarray) -> None:
        self._it = iter([{INPUT_NAME: np.ascontiguousarray(obs, dtype=np.float32)}])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self._it, None)


def quantize_broadcast(
    state_dict: StateDict,
    precision: str,
    calib_obs: np.ndarray | None,
    version: int,
    squash: Squash | None = None,
    runtime: str = "onnx",
) -> Payload:
    """The learner's fp32 weights as one payload at ``precision`` for ``runtime`` (int8 calibrates on
    ``calib_obs``); ``squash`` makes it a continuous actor (tanh scaled to the action bounds)."""
    layers = mlp_layers(state_dict)
    calib = calib_obs
    if calib is None or len(calib) == 0:
        # before any experience: a unit-range guess, replaced at the next broadcast
        calib = np.random.default_rng(0).standard_normal((64, layers[0][0].shape[1])).astype(np.float32)
    if runtime == "litert":
        return Payload(version, precision, mlp_tflite(layers, precision, squash, calib), runtime)
    model = mlp_onnx(layers, fp16=precision == "fp16", squash=squash)
    if precision != "int8":
        return Payload(version, precision, model.SerializeToString())
    import logging

    import onnx
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    logging.getLogger().setLevel(logging.ERROR)  # ORT's "consider pre-processing" advice, every call
    with tempfile.TemporaryDirectory(prefix="quarl-aq-") as d:
        src, dst = Path(d) / "fp32.onnx", Path(d) / "int8.onnx"
        onnx.save(model, str(src))
        quantize_static(
            str(src),
            str(dst),
            _Calibration(calib),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            per_channel=False,
        )
        return Payload(version, precision, dst.read_bytes())


def graph_name(runtime: str, model: bytes) -> str:
    """``qnet`` or ``actor``: what a payload holds."""
    if runtime == "litert":
        return tflite_graph_name(model)
    import onnx

    return str(onnx.load_model_from_string(model).graph.name)


def int8_evidence(runtime: str, model: bytes) -> dict[str, int]:
    """Counts that show a payload really is int8, the same keys for both runtimes: quantize and
    dequantize ops, weight matrices stored as int8 and as float."""
    if runtime == "litert":
        return tflite_evidence(model)
    import onnx
    from onnx import TensorProto

    m = onnx.load_model_from_string(model)
    ops = [n.op_type for n in m.graph.node]
    matrices = [t for t in m.graph.initializer if len(t.dims) == 2]
    return {
        "quantize": ops.count("QuantizeLinear"),
        "dequantize": ops.count("DequantizeLinear"),
        "int8_weights": sum(t.data_type == TensorProto.INT8 for t in matrices),
        "float_weights": sum(t.data_type in (TensorProto.FLOAT, TensorProto.FLOAT16) for t in matrices),
    }
