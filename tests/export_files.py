"""What an exported model file itself contains, read with the format's own tools (onnx's graph, LiteRT's
interpreter), never with our exporters' read-back: the checks of tests/test_export_matrix.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from ai_edge_litert.interpreter import Interpreter
from onnx import numpy_helper

from quarl_edge.runtimes.fsutil import sha256_file
from quarl_edge.runtimes.manifest import ModelEntry

# ---- ONNX: the QDQ graph ---------------------------------------------------------------------------

ONNX_COMPUTE_OPS = ("Conv", "Gemm", "MatMul")


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
        if n.op_type not in ONNX_COMPUTE_OPS:
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
    """The manifest's quantization block describes the int8 ONNX file as it is."""
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


def onnx_io_types(path: Path) -> tuple[list[int], list[int]]:
    m = onnx.load(str(path))
    return (
        [v.type.tensor_type.elem_type for v in m.graph.input],
        [v.type.tensor_type.elem_type for v in m.graph.output],
    )


def onnx_weight_types(path: Path) -> set[int]:
    m = onnx.load(str(path))
    return {i.data_type for i in m.graph.initializer if len(i.dims) >= 2}


# ---- TFLite: the interpreter's own tensor details --------------------------------------------------

TFLITE_COMPUTE_OPS = ("FULLY_CONNECTED", "CONV_2D")


@dataclass
class Layer:
    op: str
    weights: str
    weight_scales: int
    input: str
    output: str


def tflite_layers(path: Path) -> list[Layer]:
    interp = Interpreter(model_path=str(path))
    tensors = {d["index"]: d for d in interp.get_tensor_details()}
    out = []
    for op in interp._get_ops_details():
        if op["op_name"] in TFLITE_COMPUTE_OPS:
            x, w, y = (tensors[i] for i in (op["inputs"][0], op["inputs"][1], op["outputs"][0]))
            scales = w["quantization_parameters"]["scales"]
            out.append(
                Layer(
                    op["op_name"], w["dtype"].__name__, len(scales), x["dtype"].__name__, y["dtype"].__name__
                )
            )
    return out


def tflite_io_dtypes(path: Path) -> tuple[str, str]:
    interp = Interpreter(model_path=str(path))
    return interp.get_input_details()[0]["dtype"].__name__, interp.get_output_details()[0]["dtype"].__name__


def tflite_tensor_dtypes(path: Path) -> set[str]:
    return {d["dtype"].__name__ for d in Interpreter(model_path=str(path)).get_tensor_details()}
