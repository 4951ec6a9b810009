"""torch -> ONNX: fp32 (torch.onnx dynamo exporter), fp16 (float32 I/O kept), int8 (ORT static QDQ).

int8 is onnxruntime.quantization static quantization in QDQ format with int8 weights and, by default,
int8 activations (S8S8), the fast format on x86 with VNNI and on ARM; QOperator with int8 activations
was 8x slower here. ExportConfig.activation_type="U8S8" gives uint8 activations (QuantType.QUInt8),
which ORT's own guidance prefers on x86 without VNNI. ExportConfig.float_layers names the layers kept
in float (module paths, mapped to the graph's Conv/Gemm/MatMul nodes by _layer_nodes).
"""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quarl_edge.exporters.base import (
    ExportContext,
    ExportedModel,
    compute_layers,
    dynamic_shapes,
    extra_inputs,
    output_names,
    quantized_layers,
    register,
    reraise_interrupt,
)
from quarl_edge.policy.net import Policy
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.schema import JSONObject
from quarl_edge.typed import integer, number, text

INPUT_NAME = "obs"
OUTPUT_NAME = "action"
LAYER_OPS = ("Conv", "Gemm", "MatMul")
ACTIVATION_NAMES = {"S8S8": "int8", "U8S8": "uint8"}


@dataclass(frozen=True)
class Port:
    """A graph input or output as the file declares it."""

    name: str
    dtype: str
    shape: tuple[int | str | None, ...]
    """a fixed size, a named free dimension (``batch``), or None (a free one without a name)"""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ValueError(f"graph port name is not a string ({str(self.name)[:40]!r})")
        text(self.dtype, f"graph port {self.name!r} dtype")
        for i, d in enumerate(self.shape):
            if not isinstance(d, str | None):
                integer(d, f"graph port {self.name!r} shape[{i}]")

    def to_dict(self) -> JSONObject:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class GraphIO:
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]

    def to_dict(self) -> JSONObject:
        """The manifest's ``io`` block."""
        return {"inputs": [p.to_dict() for p in self.inputs], "outputs": [p.to_dict() for p in self.outputs]}


def graph_io(model_path: Path) -> GraphIO:
    import onnx

    m = onnx.load(str(model_path), load_external_data=False)

    def port(v: Any) -> Port:
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
        return Port(v.name, onnx.helper.tensor_dtype_to_np_dtype(t.elem_type).name, tuple(dims))

    return GraphIO(tuple(port(v) for v in m.graph.input), tuple(port(v) for v in m.graph.output))


def _toolchain(quantizer: str | None = None) -> dict[str, str]:
    out = {"converter": f"torch.onnx dynamo exporter (torch {torch.__version__})"}
    if quantizer is not None:
        out["quantizer"] = quantizer
    return out


def input_dtype(obs_space: Any) -> np.dtype:
    """The graph's input type: uint8 frames stay uint8, every other observation is fed as float32
    (float64 observations, e.g. MuJoCo's, are cast, as the runner does)."""
    return np.dtype(np.uint8) if obs_space.dtype == "uint8" else np.dtype(np.float32)


def export_fp32(ctx: ExportContext, path: Path) -> Path:
    """The PolicyNet (with in-graph pre/postprocessing) as an ONNX graph with a dynamic batch; a foreign
    ONNX policy's own graph as it was imported (policy/onnx_source.py)."""
    policy = ctx.policy
    if policy.source_model is not None:
        path.write_bytes(policy.source_model)
        return path
    # every ONNX-based target of a bundle starts from this graph: exported once per net (GraphCache)
    if ctx.graphs is not None and ctx.graphs.get(policy.net, ctx.config.opset, path):
        return path
    obs_space = policy.spec.observation_space
    dtype = torch.uint8 if obs_space.dtype == "uint8" else torch.float32
    example = torch.zeros((2, *obs_space.shape), dtype=dtype)
    extras = extra_inputs(policy, 2)
    names = [INPUT_NAME, *extras]
    batch = torch.export.Dim("batch", min=1, max=65536)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # "torchvision is not installed" noise
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(
                policy.net,
                (example, *extras.values()),
                dynamo=True,
                external_data=False,
                input_names=names,
                output_names=output_names(policy, OUTPUT_NAME),
                dynamic_shapes=dynamic_shapes(policy, batch),
                opset_version=ctx.config.opset,
                verbose=False,
                optimize=True,
            )
        except Exception as e:  # the exporter raises many types; name the failing part for the user
            reraise_interrupt(e)
            first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
            raise InputError(
                f"ONNX export failed: {first}", "the policy uses an op torch.onnx cannot export"
            ) from None
    assert program is not None
    program.save(str(path))
    if ctx.graphs is not None:
        ctx.graphs.put(policy.net, ctx.config.opset, path)
    return path


@register("onnx-fp32")
def _export_fp32(ctx: ExportContext, path: Path) -> ExportedModel:
    export_fp32(ctx, path)
    tools = (
        _toolchain() if ctx.policy.source_model is None else {"converter": "none: the imported ONNX graph"}
    )
    return ExportedModel(path, "onnx", "fp32", {"scheme": "none"}, graph_io(path).to_dict(), tools)


@register("onnx-fp16")
def _export_fp16(ctx: ExportContext, path: Path) -> ExportedModel:
    import onnx
    from onnxconverter_common import float16

    fp32 = export_fp32(ctx, ctx.workdir / "fp16-src.fp32.onnx")
    model = onnx.load(str(fp32))
    # Casts *to* float32 (the uint8 frame -> float of CNN policies) stay float32 with a cast to fp16
    # after them: the converter retypes their output to fp16 but keeps `to=FLOAT`, an invalid graph.
    to_float = [
        n.name for n in model.graph.node
        if n.op_type == "Cast" and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT for a in n.attribute)
    ]  # fmt: skip
    model16 = float16.convert_float_to_float16(
        model, keep_io_types=True, disable_shape_infer=False, node_block_list=to_float
    )
    onnx.save(model16, str(path))
    from importlib.metadata import version

    quant = {"scheme": "fp16 weights and activations, float32 I/O"}
    tools = _toolchain(f"onnxconverter-common {version('onnxconverter-common')}")
    return ExportedModel(path, "onnx", "fp16", quant, graph_io(path).to_dict(), tools)


class _Reader:
    """onnxruntime.quantization CalibrationDataReader over recorded observations."""

    def __init__(
        self,
        obs: np.ndarray,
        dtype: np.dtype,
        batch: int = 64,
        policy: Policy | None = None,
        state: tuple[np.ndarray, ...] = (),
    ) -> None:
        # All batches the same size (the largest divisor of the sample count up to `batch`): ORT's
        # histogram calibrators (percentile, entropy) np.asarray the per-batch outputs together and
        # fail on a short last batch.
        batch = max(d for d in range(1, batch + 1) if len(obs) % d == 0)
        self._batches = [
            np.ascontiguousarray(obs[i : i + batch], dtype=dtype) for i in range(0, len(obs), batch)
        ]
        self._extras = {k: v.numpy() for k, v in extra_inputs(policy, batch).items()} if policy else {}
        # a recurrent policy's recorded states ([N, layers, hidden] -> [layers, batch, hidden] per batch)
        names = [st.input for st in policy.spec.state] if policy else []
        self._states = [
            {n: np.ascontiguousarray(np.swapaxes(s[i : i + batch], 0, 1), np.float32) for n, s in zip(names, state, strict=True)}
            for i in range(0, len(obs), batch)
        ] if state else [{} for _ in self._batches]  # fmt: skip
        self._it = iter(zip(self._batches, self._states, strict=True))

    def get_next(self) -> dict[str, np.ndarray] | None:
        item = next(self._it, None)
        return None if item is None else {INPUT_NAME: item[0], **self._extras, **item[1]}

    def rewind(self) -> None:
        self._it = iter(zip(self._batches, self._states, strict=True))


@dataclass(frozen=True)
class ActivationQuant:
    scale: float
    zero_point: int

    def __post_init__(self) -> None:
        number(self.scale, "activation scale")
        integer(self.zero_point, "activation zero_point", lo=-128, hi=255)

    def to_dict(self) -> JSONObject:
        return {"scale": self.scale, "zero_point": self.zero_point}


@dataclass(frozen=True)
class QDQParams:
    """What the quantized graph holds: its Q/DQ nodes, int8 weight tensors and activation grids."""

    quantize_linear_nodes: int
    dequantize_linear_nodes: int
    int8_weight_tensors: int
    per_channel_weight_tensors: int
    activations: tuple[tuple[str, ActivationQuant], ...]
    """each per-tensor quantized activation (by tensor name), in graph order"""

    def __post_init__(self) -> None:
        for name in ("quantize_linear_nodes", "dequantize_linear_nodes", "int8_weight_tensors",
                     "per_channel_weight_tensors"):  # fmt: skip
            integer(getattr(self, name), name)

    def to_dict(self) -> JSONObject:
        """The quantization block's read-back part."""
        acts = {name: q.to_dict() for name, q in self.activations}
        return {
            "quantize_linear_nodes": self.quantize_linear_nodes,
            "dequantize_linear_nodes": self.dequantize_linear_nodes,
            "int8_weight_tensors": self.int8_weight_tensors,
            "per_channel_weight_tensors": self.per_channel_weight_tensors,
            "activations": acts,
            "input": acts.get(next(iter(acts), "")),
        }


def _qdq_params(path: Path) -> QDQParams:
    """Scales and zero points read back from the quantized graph."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    acts: dict[str, ActivationQuant] = {}
    weights_int8, weights_per_channel, q_nodes, dq_nodes = 0, 0, 0, 0
    for n in m.graph.node:
        if n.op_type == "QuantizeLinear":
            q_nodes += 1
            scale, zp = inits.get(n.input[1]), inits.get(n.input[2]) if len(n.input) > 2 else None
            if scale is not None and scale.size == 1:
                acts[n.input[0]] = ActivationQuant(
                    float(scale.reshape(())), int(zp.reshape(())) if zp is not None else 0
                )
        elif n.op_type == "DequantizeLinear":
            dq_nodes += 1
            src = inits.get(n.input[0])
            if src is not None and src.dtype == np.int8 and src.ndim >= 1 and src.size > 1:
                weights_int8 += 1
                scale = inits.get(n.input[1])
                if scale is not None and scale.size > 1:
                    weights_per_channel += 1
    return QDQParams(q_nodes, dq_nodes, weights_int8, weights_per_channel, tuple(acts.items()))


def _quantize_qdq(pre: Path, path: Path, reader: Any, activation_type: str, **kwargs: Any) -> None:
    """ORT static quantization to QDQ with int8 (S8S8) or uint8 (U8S8) activations; the other settings
    come from the caller."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    logging.getLogger().setLevel(logging.ERROR)  # ORT's quantizer logs advice to the root logger
    # the histogram calibrators print their progress to stdout, which must stay clean for --json; it
    # says nothing a user acts on, so it goes nowhere
    with contextlib.redirect_stdout(io.StringIO()):
        quantize_static(
            str(pre),
            str(path),
            reader,
            quant_format=QuantFormat.QDQ,
            activation_type={"S8S8": QuantType.QInt8, "U8S8": QuantType.QUInt8}[activation_type],
            **kwargs,
        )


def _layer_nodes(path: Path, policy: Policy) -> tuple[dict[str, str], list[str]]:
    """Each compute layer's node (module path -> node name) and the nodes after the output layer
    (tanh/unscale, clip, argmax), which every integer export keeps in float.

    The exporter emits one Conv/Gemm/MatMul per Linear/Conv2d, in the order compute_layers lists them
    (checked here, and against each node's recorded module scope where the exporter wrote one): a graph
    that does not match is refused rather than quantized by the wrong names. Unnamed nodes get names,
    saved back to ``path``, so they can be excluded.
    """
    import onnx

    model = onnx.load(str(path))
    nodes = list(model.graph.node)
    for i, n in enumerate(nodes):
        if not n.name:
            n.name = f"{n.op_type}_{i}"
    onnx.save(model, str(path))
    names = compute_layers(policy)
    at = [i for i, n in enumerate(nodes) if n.op_type in LAYER_OPS]
    if len(at) != len(names):
        raise InputError(
            f"the ONNX graph has {len(at)} compute nodes ({', '.join(nodes[i].op_type for i in at)}), "
            f"the policy {len(names)} layers ({', '.join(names)})",
            "the layers cannot be matched to the graph: export without float_layers or to tflite-int8",
        )
    for i, name in zip(at, names, strict=True):
        scopes = next(
            (m.value for m in nodes[i].metadata_props if m.key == "pkg.torch.onnx.name_scopes"), None
        )
        if scopes is not None and name not in _onnx_scopes(scopes):
            raise InputError(
                f"ONNX node {nodes[i].name!r} runs in {scopes}, not in layer {name!r}",
                "the layers cannot be matched to the graph: export without float_layers or to tflite-int8",
            )
    after: list[str] = []
    if at:
        live = set(nodes[at[-1]].output)
        for n in nodes[at[-1] + 1 :]:
            if live.intersection(n.input):
                after.append(n.name)
                live.update(n.output)
    return {name: nodes[i].name for i, name in zip(at, names, strict=True)}, after


def _onnx_scopes(value: str) -> list[str]:
    """The module paths a node ran in, from torch.onnx's name_scopes metadata: "['', 'mlp', ...]"."""
    import ast

    try:
        scopes = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return [value]
    return [str(x) for x in scopes] if isinstance(scopes, list) else [value]


def _layer_split(path: Path, layer_nodes: dict[str, str]) -> tuple[list[str], list[str]]:
    """(quantized layers, float layers) by module path as the quantized file has them: a layer is
    quantized when its weights come from a DequantizeLinear of an integer initializer."""
    import onnx

    model = onnx.load(str(path))
    ints = {
        i.name
        for i in model.graph.initializer
        if i.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8, onnx.TensorProto.INT4)
    }
    producer = {out: n for n in model.graph.node for out in n.output}
    by_name = {n.name: n for n in model.graph.node}
    quantized: list[str] = []
    floating: list[str] = []
    for layer, node_name in layer_nodes.items():
        node = by_name.get(node_name)
        dq = producer.get(node.input[1]) if node is not None and len(node.input) > 1 else None
        is_int = dq is not None and dq.op_type == "DequantizeLinear" and dq.input[0] in ints
        (quantized if is_int else floating).append(layer)
    return quantized, floating


def _excluded(layer_nodes: dict[str, str], float_layers: list[str], after_last: list[str]) -> list[str]:
    return [layer_nodes[n] for n in float_layers] + after_last


def _scheme(activation_type: str) -> str:
    if activation_type == "U8S8":
        return "static QDQ, uint8 activations, int8 weights (U8S8)"
    return "static QDQ, int8 activations and weights (S8S8)"


def _export_int8_learned_ranges(ctx: ExportContext, path: Path) -> ExportedModel:
    """An 8-bit QAT policy: int8 weights from its n-bit grid, activation ranges learned in training.

    Every quantized tensor is a quantized layer's input (outputs stay float, as in training), and each
    gets its scale/zero point from the QAT range via TensorQuantOverrides; the calibration pass that the
    ORT API requires runs on a few zero observations whose ranges are all overridden.
    """
    import onnx
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.shape_inference import quant_pre_process

    plain, ranges = ctx.quantizable, ctx.learned_ranges
    cfg = ctx.config
    # default: every layer int8, as trained (the outputs stay float: OpTypesToExcludeOutputQuantization)
    _, float_layers = quantized_layers(plain, False, () if cfg.float_layers is None else cfg.float_layers)
    fp32 = export_fp32(replace(ctx, policy=plain), ctx.workdir / "qat-src.fp32.onnx")
    pre = ctx.workdir / "qat-src.pre.onnx"
    try:
        quant_pre_process(str(fp32), str(pre), skip_symbolic_shape=True)
    except Exception as e:  # pre-processing is an optimization; quantize the plain graph if it fails
        reraise_interrupt(e)
        shutil.copyfile(fp32, pre)
    # tanh/unscale/argmax after the output layer stay float
    layer_nodes, after_last = _layer_nodes(pre, plain)
    if len(layer_nodes) != len(ranges):
        raise InputError(
            f"the exported graph has {len(layer_nodes)} layers, the QAT policy {len(ranges)}",
            "re-export with --calibration to calibrate instead of using the learned ranges",
        )
    model = onnx.load(str(pre))
    by_name = {n.name: n for n in model.graph.node}
    unsigned = cfg.activation_type == "U8S8"
    overrides: dict[str, list[dict[str, np.ndarray]]] = {}  # ORT's TensorQuantOverrides
    for (layer, node_name), rng in zip(layer_nodes.items(), ranges, strict=True):
        if rng is None or layer in float_layers:
            continue
        lo, hi = rng
        scale = max(hi - lo, 1e-8) / 255.0
        # the same grid either way: the uint8 zero point is the int8 one shifted by 128
        zero = int(np.clip(round(-lo / scale) - 128, -128, 127))
        zp = np.array(zero + 128, np.uint8) if unsigned else np.array(zero, np.int8)
        overrides[by_name[node_name].input[0]] = [{"scale": np.array(scale, np.float32), "zero_point": zp}]
    excluded = _excluded(layer_nodes, float_layers, after_last)
    obs_space = ctx.policy.spec.observation_space
    dummy = np.zeros((4, *obs_space.shape), dtype=input_dtype(obs_space))
    per_channel = ctx.policy.arch.model == "nature_cnn"
    _quantize_qdq(
        pre,
        path,
        _Reader(dummy, dummy.dtype, policy=plain),
        cfg.activation_type,
        weight_type=QuantType.QInt8,
        per_channel=per_channel,
        op_types_to_quantize=list(LAYER_OPS),
        nodes_to_exclude=excluded,
        extra_options={
            "TensorQuantOverrides": overrides,
            "OpTypesToExcludeOutputQuantization": list(LAYER_OPS),
        },
    )
    int8_layers, float_layers = _layer_split(path, layer_nodes)
    quant = {
        "scheme": _scheme(cfg.activation_type),
        "ranges": "learned in quantization-aware training (no calibration)",
        "qat": ctx.qat.to_dict() if ctx.qat else {},
        "per_channel": per_channel,
        "calibration_samples": 0,
        "activation_type": cfg.activation_type,
        "float_layers": float_layers,
        "int8_layers": int8_layers,
        "float_nodes": excluded,
        **_qdq_params(path).to_dict(),
    }
    import onnxruntime

    return ExportedModel(
        path,
        "onnx",
        "int8",
        quant,
        graph_io(path).to_dict(),
        _toolchain(f"onnxruntime.quantization {onnxruntime.__version__}"),
    )


@register("onnx-int8", calibrated=True)
def _export_int8(ctx: ExportContext, path: Path) -> ExportedModel:
    from onnxruntime.quantization import CalibrationMethod, QuantType
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if ctx.qat and ctx.qat.learned_int8_ranges:
        return _export_int8_learned_ranges(ctx, path)
    if ctx.policy.source_model is not None:
        return _export_int8_foreign(ctx, path)
    # fewer QAT bits: the n-bit weights are exported on an int8 grid, activations calibrated
    ctx = replace(ctx, policy=ctx.quantizable)
    cfg = ctx.config
    _, float_layers = quantized_layers(ctx.policy, cfg.float_io_layers, cfg.float_layers)
    if ctx.calibration is None or len(ctx.calibration) == 0:
        raise InputError("int8 export needs calibration observations", "pass --calibration FILE.npz")
    fp32 = export_fp32(ctx, ctx.workdir / "int8-src.fp32.onnx")
    pre = ctx.workdir / "int8-src.pre.onnx"
    try:
        quant_pre_process(str(fp32), str(pre), skip_symbolic_shape=True)
    except Exception as e:  # pre-processing is an optimization; quantize the plain graph if it fails
        reraise_interrupt(e)
        shutil.copyfile(fp32, pre)
    layer_nodes, after_last = _layer_nodes(pre, ctx.policy)
    # --full-int8 as before (float_io_layers=False, no float_layers) quantizes the action head's ops
    # too; any other choice keeps them float
    if cfg.float_layers is None and not cfg.float_io_layers:
        after_last = []
    excluded = _excluded(layer_nodes, float_layers, after_last)
    per_channel = cfg.per_channel if cfg.per_channel is not None else ctx.policy.arch.model == "nature_cnn"
    method = {
        "minmax": CalibrationMethod.MinMax,
        "percentile": CalibrationMethod.Percentile,
        "entropy": CalibrationMethod.Entropy,
    }[cfg.calibration_method]
    extra: dict[str, float] = {}  # ORT's extra_options
    if cfg.calibration_method == "percentile":
        extra["CalibPercentile"] = cfg.percentile
    dtype = input_dtype(ctx.policy.spec.observation_space)
    _quantize_qdq(
        pre,
        path,
        _Reader(ctx.calibration, dtype, policy=ctx.policy, state=ctx.calibration_state),
        cfg.activation_type,
        weight_type=QuantType.QInt8,
        per_channel=per_channel,
        calibrate_method=method,
        extra_options=extra,
        nodes_to_exclude=excluded,
    )
    params = _qdq_params(path).to_dict()
    int8_layers, float_layers = _layer_split(path, layer_nodes)
    quant = {
        "scheme": _scheme(cfg.activation_type),
        "calibration_method": cfg.calibration_method,
        "percentile": cfg.percentile if cfg.calibration_method == "percentile" else None,
        "per_channel": per_channel,
        "calibration_samples": int(len(ctx.calibration)),
        "activation_type": cfg.activation_type,
        "float_layers": float_layers,
        "int8_layers": int8_layers,
        "float_nodes": excluded,
        **params,
    }
    import onnxruntime

    tools = _toolchain(f"onnxruntime.quantization {onnxruntime.__version__}")
    return ExportedModel(path, "onnx", "int8", quant, graph_io(path).to_dict(), tools)


def _export_int8_foreign(ctx: ExportContext, path: Path) -> ExportedModel:
    """A foreign ONNX graph quantized as ORT quantizes any graph (QDQ, calibrated on the recorded
    observations and, for a recurrent graph, the states the fp32 graph had at each of them). ORT's QDQ
    quantizer has no LSTM/GRU kernels: a recurrent cell stays float, and the manifest says so."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantType

    cfg = ctx.config
    if ctx.calibration is None or len(ctx.calibration) == 0:
        raise InputError("int8 export needs calibration observations", "pass --calibration OBS.npz")
    fp32 = export_fp32(ctx, ctx.workdir / "foreign-src.fp32.onnx")
    src = onnx.load(str(fp32))
    opset = max((o.version for o in src.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if cfg.per_channel and opset < 13:  # ORT writes a per-channel DequantizeLinear it cannot load below 13
        raise InputError(f"per-channel int8 needs ONNX opset 13 or later; this graph is opset {opset}",
                         "export it with --per-tensor, or re-export the graph at opset 13+")  # fmt: skip
    dims = src.graph.input[0].type.tensor_type.shape.dim
    batch = dims[0].dim_value if dims and dims[0].HasField("dim_value") else 64
    method = {"minmax": CalibrationMethod.MinMax, "percentile": CalibrationMethod.Percentile,
              "entropy": CalibrationMethod.Entropy}[cfg.calibration_method]  # fmt: skip
    extra: dict[str, float] = (
        {"CalibPercentile": cfg.percentile} if cfg.calibration_method == "percentile" else {}
    )
    reader = _Reader(ctx.calibration, np.dtype(np.float32), batch, ctx.policy, ctx.calibration_state)
    _quantize_qdq(fp32, path, reader, cfg.activation_type, weight_type=QuantType.QInt8,
                  per_channel=bool(cfg.per_channel), calibrate_method=method, extra_options=extra)  # fmt: skip
    model = onnx.load(str(path))
    float_ops = sorted({n.op_type for n in model.graph.node if n.op_type in ("LSTM", "GRU", "RNN")})
    quant = {
        "scheme": _scheme(cfg.activation_type) + " (a foreign graph: every op ORT quantizes)",
        "calibration_method": cfg.calibration_method,
        "calibration_samples": int(len(ctx.calibration)),
        "activation_type": cfg.activation_type,
        "float_recurrent_ops": float_ops,
        **(
            {"note": f"{', '.join(float_ops)} stays float: ONNX Runtime has no int8 kernel for it"}
            if float_ops
            else {}
        ),
        **_qdq_params(path).to_dict(),
    }
    import onnxruntime

    tools = _toolchain(f"onnxruntime.quantization {onnxruntime.__version__}")
    tools["converter"] = "none: the imported ONNX graph"
    return ExportedModel(path, "onnx", "int8", quant, graph_io(path).to_dict(), tools)


@register("onnx-int4", calibrated=True)
def _export_int4(ctx: ExportContext, path: Path) -> ExportedModel:
    """Weights on the symmetric 4-bit grid (ONNX INT4 initializers, QDQ), int8 activations calibrated.

    A QAT policy exports its effective weights (already on its n-bit grid, n <= 4 keeps them exact up
    to the int4 rescale); a fp32 policy is post-training quantized to 4 bits. ONNX Runtime (>= 1.20)
    runs INT4 DequantizeLinear on CPU; see the README for what that costs at run time.
    """
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization.shape_inference import quant_pre_process

    ctx = replace(ctx, policy=ctx.quantizable)
    cfg = ctx.config
    # default: every layer int4 (float_io_layers is an int8 choice)
    _, float_layers = quantized_layers(
        ctx.policy, False, () if cfg.float_layers is None else cfg.float_layers
    )
    if ctx.calibration is None or len(ctx.calibration) == 0:
        raise InputError("int4 export needs calibration observations", "pass --calibration FILE.npz")
    fp32 = export_fp32(ctx, ctx.workdir / "int4-src.fp32.onnx")
    pre = ctx.workdir / "int4-src.pre.onnx"
    try:
        quant_pre_process(str(fp32), str(pre), skip_symbolic_shape=True)
    except Exception as e:  # pre-processing is an optimization; quantize the plain graph if it fails
        reraise_interrupt(e)
        shutil.copyfile(fp32, pre)
    layer_nodes, after_last = _layer_nodes(pre, ctx.policy)  # argmax / tanh / unscale stay float
    excluded = _excluded(layer_nodes, float_layers, after_last)
    per_channel = ctx.policy.arch.model == "nature_cnn"
    dtype = input_dtype(ctx.policy.spec.observation_space)
    _quantize_qdq(
        pre,
        path,
        _Reader(ctx.calibration, dtype, policy=ctx.policy, state=ctx.calibration_state),
        cfg.activation_type,
        weight_type=QuantType.QInt4,
        per_channel=per_channel,
        op_types_to_quantize=list(LAYER_OPS),
        nodes_to_exclude=excluded,
        extra_options={"WeightSymmetric": True},
    )
    params = _qdq_params(path).to_dict()
    int4_layers, float_layers = _layer_split(path, layer_nodes)
    acts = ACTIVATION_NAMES[cfg.activation_type]
    quant = {
        "scheme": f"static QDQ, int4 weights (symmetric), {acts} activations (minmax calibrated)",
        "weight_bits": 4,
        "per_channel": per_channel,
        "calibration_samples": int(len(ctx.calibration)),
        "activation_type": cfg.activation_type,
        "float_layers": float_layers,
        "int4_layers": int4_layers,
        "float_nodes": excluded,
        "int4_weight_tensors": _int4_weights(path),
        **params,
    }
    import onnxruntime

    tools = _toolchain(f"onnxruntime.quantization {onnxruntime.__version__}")
    return ExportedModel(path, "onnx", "int4", quant, graph_io(path).to_dict(), tools)


def _int4_weights(path: Path) -> int:
    import onnx

    m = onnx.load(str(path))
    return sum(1 for i in m.graph.initializer if i.data_type == onnx.TensorProto.INT4 and len(i.dims) >= 1)
