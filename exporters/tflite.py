"""torch -> TFLite (LiteRT) with litert-torch: fp32, fp16 (fp16 weights), int8 (PT2E static, full integer).

litert-torch converts the PolicyNet itself (pre- and postprocessing included), so a TFLite model takes the
raw observation and returns the environment action, like the ONNX one. int8 is PT2E static quantization
(torchao's prepare/convert with litert-torch's quantizer) calibrated on the same recorded observations as
ONNX: int8 weights (per-channel by default) and int8 activations, integer kernels for those layers. Image
policies take uint8 frames directly (the /255 stays in the graph); vector policies keep float32 input and
output. See the README for why litert-torch rather than TensorFlow's TFLiteConverter.

litert-torch, torchao and ai-edge-litert are the optional ``tflite`` extra; they are imported only when a
TFLite target runs, so this module registers its targets either way.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import sys
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from quarl_edge.exporters.base import (
    ExportConfig,
    ExportContext,
    ExportedModel,
    Requirement,
    compute_layers,
    dynamic_shapes,
    extra_inputs,
    missing_dependency,
    quantized_layers,
    register,
    reraise_interrupt,
)
from quarl_edge.exporters.tflite_readback import Layer, ReadBack, Tensor
from quarl_edge.policy.net import Policy
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.schema import JSONObject

TFLITE = Requirement(modules=("litert_torch", "torchao", "ai_edge_litert"), extra="tflite")
COMPUTE_OPS = ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D")
CALIBRATION_BATCH = 64


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


def _toolchain(**extra: str) -> dict[str, str]:
    return {
        "converter": f"litert-torch {_version('litert-torch')} (torch {torch.__version__})",
        "read_back_with": f"ai-edge-litert {_version('ai-edge-litert')}",
        **extra,
    }


def _litert_torch(name: str) -> Any:
    try:
        with _quiet():  # its native libraries log on import
            import litert_torch
    except ImportError as e:
        raise missing_dependency(name, e.name or "litert_torch", TFLITE) from None
    litert_torch.config.show_progress = False
    return litert_torch


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Keep the converter's chatter (progress lines, C++ logs, the quantizer's size report) off the
    terminal: stdout must stay clean for --json, and a failure must end in the one error line.
    QUARL_EDGE_DEBUG=1 (or --debug) lets it through."""
    if os.environ.get("QUARL_EDGE_DEBUG", "") not in ("", "0"):
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    root = logging.getLogger()
    level = root.level
    with tempfile.TemporaryFile() as sink, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        root.setLevel(logging.ERROR)
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                yield
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            root.setLevel(level)


def _example(policy: Policy, batch: int = 1) -> torch.Tensor:
    space = policy.spec.observation_space
    dtype = torch.uint8 if space.dtype == "uint8" else torch.float32
    return torch.zeros((batch, *space.shape), dtype=dtype)


def _args(policy: Policy, batch: int = 1) -> tuple[torch.Tensor, ...]:
    """Every graph input, in order: the observation, then extra_inputs (an action mask)."""
    return (_example(policy, batch), *extra_inputs(policy, batch).values())


# ---- conversion and its failures -------------------------------------------------------------------

_OP = re.compile(r"(?:Lowering not found|not supported|unsupported)[^:]*:\s*(?:torch\.ops\.)?([\w.]+)", re.I)


def _failing_layer(net: nn.Module, example: torch.Tensor, message: str) -> str | None:
    """Which layer of ``net`` holds the op named in a converter error: "'mlp.1' (Erfinv)"."""
    m = _OP.search(message)
    if m is None:
        return None
    op = m.group(1).removeprefix("aten.")
    base = op.split(".")[0]
    try:
        with _quiet():
            program = torch.export.export(net, (example,))
            graphs = [program.graph, program.run_decompositions().graph]
    except Exception as e:  # torch.export itself failed: nothing to match against
        reraise_interrupt(e)
        return None
    for graph in graphs:
        for node in graph.nodes:
            target = str(node.target).removeprefix("aten.")
            if node.op == "call_function" and (target == op or target.split(".")[0] == base):
                stack = list(node.meta.get("nn_module_stack", {}).values())
                if stack and stack[-1][0]:
                    path, cls = stack[-1]
                    return f"{path!r} ({str(getattr(cls, '__name__', cls)).rsplit('.', 1)[-1]})"
                return f"{node.name!r} (in the policy's own forward)"
    return None


def _convert(
    name: str,
    policy: Policy,
    path: Path,
    module: nn.Module | None = None,
    quant_config: Any = None,
) -> Path:
    """litert_torch.convert with a batch-1 signature, written to ``path``; one-line errors naming the layer."""
    litert_torch = _litert_torch(name)
    if policy.source_model is not None:
        raise InputError(f"{name} converts a torch module, and this policy is an imported ONNX graph",
                         "export it to onnx-fp32, onnx-fp16 or onnx-int8")  # fmt: skip
    example = _example(policy)
    try:
        with _quiet(), torch.no_grad():
            model = litert_torch.convert(module or policy.net, _args(policy), quant_config=quant_config)
            model.export(str(path))
    except Exception as e:  # the converter raises many types; name the layer the user can act on
        reraise_interrupt(e)
        text = str(e).strip()
        first = text.splitlines()[0][:200] if text else type(e).__name__
        layer = _failing_layer(policy.net, example, text)
        where = f"layer {layer}: " if layer else ""
        raise InputError(
            f"TFLite conversion failed: {where}{first}",
            "LiteRT cannot convert that op; replace the layer, or export to ONNX only (--to onnx-...)",
        ) from None
    return path


# ---- what the converted file says ------------------------------------------------------------------


def _layer_name(tensor_name: str) -> str:
    """'...Sequential_mlp/torch.nn.modules.linear.Linear_2;1' -> 'mlp.2' (the module path)."""
    parts = tensor_name.split(";")[0].split("/")[1:]
    attrs = [p.rsplit(".", 1)[-1].split("_", 1)[1] for p in parts if "_" in p.rsplit(".", 1)[-1]]
    return ".".join(attrs) if attrs and len(attrs) == len(parts) else tensor_name


def read_back(path: Path, layer_names: list[str] | None = None) -> ReadBack:
    """I/O and quantization parameters as the converted file states them (via the LiteRT interpreter).

    Compute ops are labelled with ``layer_names`` (module paths, graph order) when the counts match,
    else from the converter's tensor names."""
    from ai_edge_litert.interpreter import Interpreter

    with _quiet():
        interp = Interpreter(model_path=str(path), num_threads=1)
    tensors = {d["index"]: d for d in interp.get_tensor_details()}
    ops = interp._get_ops_details()  # the only API that lists a model's ops and their tensors
    compute = [op for op in ops if op["op_name"] in COMPUTE_OPS]
    if layer_names is None or len(layer_names) != len(compute):
        layer_names = [_layer_name(tensors[op["outputs"][0]]["name"]) for op in compute]
    layers = tuple(
        Layer.of(
            label,
            op["op_name"],
            Tensor.parse(tensors[op["inputs"][0]]),
            Tensor.parse(tensors[op["inputs"][1]]),
        )
        for op, label in zip(compute, layer_names, strict=True)
    )
    return ReadBack(
        inputs=tuple(Tensor.parse(d) for d in interp.get_input_details()),
        outputs=tuple(Tensor.parse(d) for d in interp.get_output_details()),
        ops=tuple(Counter(op["op_name"] for op in ops if op["op_name"] != "DELEGATE").items()),
        layers=layers,
    )


# ---- fp32 / fp16 -----------------------------------------------------------------------------------


@register("tflite-fp32", requires=TFLITE)
def _export_fp32(ctx: ExportContext, path: Path) -> ExportedModel:
    _convert("tflite-fp32", ctx.policy, path)
    read = read_back(path, compute_layers(ctx.policy))
    quant = {"scheme": "none", "ops": read.ops_dict()}
    return ExportedModel(path, "tflite", "fp32", quant, read.io(), _toolchain())


@register("tflite-fp16", requires=TFLITE)
def _export_fp16(ctx: ExportContext, path: Path) -> ExportedModel:
    _litert_torch("tflite-fp16")  # the install command if missing; progress output off
    from litert_torch.generative.quantize.quant_recipes import full_fp16_recipe

    _convert("tflite-fp16", ctx.policy, path, quant_config=full_fp16_recipe())
    read = read_back(path, compute_layers(ctx.policy))
    quant = {
        "scheme": "fp16 weights (dequantized at load), float32 compute and I/O",
        "ops": read.ops_dict(),
        "layers": read.layers_json(),
    }
    return ExportedModel(
        path,
        "tflite",
        "fp16",
        quant,
        read.io(),
        _toolchain(quantizer=f"ai-edge-quantizer {_version('ai-edge-quantizer')}"),
    )


# ---- int8 ------------------------------------------------------------------------------------------


def _activation_type(cfg: ExportConfig) -> dict[str, str]:
    """The manifest's record: LiteRT's integer kernels take int8 activations whatever the config asks;
    activation_type (U8S8) is an ONNX Runtime option, so it is ignored here rather than refused, and one
    config can export a bundle with both formats."""
    out = {"activation_type": "S8S8"}
    if cfg.activation_type != "S8S8":
        out["activation_type_requested"] = f"{cfg.activation_type}: not applicable to TFLite (ONNX only)"
    return out


def _observer(method: str, percentile: float) -> Any:
    from torchao.quantization.pt2e.observer import HistogramObserver, MinMaxObserver

    if method == "minmax":
        return MinMaxObserver
    if method == "entropy":  # torchao's histogram observer: L2-error range search, closest to entropy
        return HistogramObserver

    class PercentileObserver(HistogramObserver):
        """Range clipped to the central ``percentile`` % of the calibration histogram."""

        def _non_linear_param_search(self) -> tuple[torch.Tensor, torch.Tensor]:
            cdf = torch.cumsum(self.histogram, 0) / torch.sum(self.histogram).clamp(min=1)
            tail = (1.0 - percentile / 100.0) / 2.0
            width = (self.max_val - self.min_val) / self.bins
            lo = int(torch.searchsorted(cdf, torch.tensor(tail)).item())
            hi = int(torch.searchsorted(cdf, torch.tensor(1.0 - tail)).item())
            return self.min_val + width * lo, self.min_val + width * min(hi + 1, self.bins)

    return PercentileObserver


def _quantizer(ctx: ExportContext, float_layers: list[str], per_channel: bool) -> Any:
    from litert_torch.quantize.pt2e_quantizer import PT2EQuantizer
    from litert_torch.quantize.pt2e_quantizer_utils import QuantizationConfig, propagate_annotation
    from torchao.quantization.pt2e.observer import MinMaxObserver, PerChannelMinMaxObserver
    from torchao.quantization.pt2e.quantizer import FixedQParamsQuantizationSpec, QuantizationSpec

    cfg = ctx.config
    act = QuantizationSpec(
        dtype=torch.int8,
        quant_min=-128,
        quant_max=127,
        qscheme=torch.per_tensor_affine,
        is_dynamic=False,
        observer_or_fake_quant_ctr=_observer(cfg.calibration_method, cfg.percentile).with_args(eps=2**-12),
    )
    weight_observer = PerChannelMinMaxObserver if per_channel else MinMaxObserver
    weight = QuantizationSpec(
        dtype=torch.int8,
        quant_min=-127,
        quant_max=127,
        qscheme=torch.per_channel_symmetric if per_channel else torch.per_tensor_symmetric,
        ch_axis=0,
        is_dynamic=False,
        observer_or_fake_quant_ctr=weight_observer.with_args(eps=2**-12),
    )
    fixed = FixedQParamsQuantizationSpec(  # TFLite's fixed ranges for logistic / softmax outputs
        dtype=torch.int8,
        scale=1 / 256,
        zero_point=-128,
        quant_min=-128,
        quant_max=127,
        qscheme=torch.per_tensor_affine,
    )
    config = QuantizationConfig(act, act, weight, None, fixed, False, False)
    skip = set(float_layers)

    def quantize_node(node: torch.fx.Node) -> bool:
        # the innermost module that ran the op; the policy's own forward ('': uint8 scaling, obs
        # normalization, the action head) and the layers kept in float stay float. Nodes without a
        # module stack (weights, the input) go with the op that uses them.
        stack = list(node.meta.get("nn_module_stack", {}).values())
        if not stack:
            return True
        owner = str(stack[-1][0])
        return owner != "" and owner not in skip

    class LayerQuantizer(PT2EQuantizer):  # type: ignore[misc]
        """litert-torch's static int8 quantizer with a layer filter of ours (its module-name filter
        does not match torch 2.13's module stack keys)."""

        def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            self._annotate_all_static_patterns(model, self.global_config, quantize_node)
            propagate_annotation(model)
            return model

    return LayerQuantizer().set_global(config)


def _calibrated(ctx: ExportContext, quantizer: Any) -> nn.Module:
    """prepare_pt2e -> run the calibration observations -> convert_pt2e (Q/DQ graph for the converter)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    assert ctx.calibration is not None
    batch = torch.export.Dim("batch", min=1, max=65536)
    with _quiet():
        program = torch.export.export(
            ctx.policy.net, _args(ctx.policy, 2), dynamic_shapes=dynamic_shapes(ctx.policy, batch)
        )
        prepared = prepare_pt2e(program.module(), quantizer)
        dtype = _example(ctx.policy).dtype  # float64 observations (MuJoCo) are fed as float32
        with torch.no_grad():
            for i in range(0, len(ctx.calibration), CALIBRATION_BATCH):
                chunk = np.ascontiguousarray(ctx.calibration[i : i + CALIBRATION_BATCH])
                extras = list(_args(ctx.policy, len(chunk))[1:])
                if ctx.calibration_state:  # a recurrent policy's recorded states, [layers, batch, hidden]
                    k = len(extras) - len(ctx.calibration_state)
                    extras[k:] = [torch.as_tensor(np.swapaxes(st[i : i + CALIBRATION_BATCH], 0, 1).copy())
                                  for st in ctx.calibration_state]  # fmt: skip
                prepared(torch.as_tensor(chunk).to(dtype), *extras)
        return convert_pt2e(prepared, fold_quantize=False)


def _module_path(node: torch.fx.Node) -> str:
    stack = list(node.meta.get("nn_module_stack", {}).values())
    return str(stack[-1][0]) if stack else ""


def _learned_ranges(
    ctx: ExportContext, quantizer: Any, ranges: dict[str, tuple[float, float] | None]
) -> tuple[nn.Module, dict[str, list[float]]]:
    """prepare_pt2e -> fix every activation observer to a range learned in QAT -> convert_pt2e.

    No observation is calibrated on: one forward pass on a zero observation fills the weight observers
    (weights are data-independent), then each activation observer's min/max is overwritten. A layer's
    input takes that layer's learned range. A hidden layer's output, which TFLite also quantizes but QAT
    left float, is the input of a monotonic activation whose output is the next layer's input: its range
    is that learned range mapped back (atanh for Tanh; for ReLU the fused output is the next input).
    Any other observed tensor has no learned range and is refused (export with --calibration).
    """
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    layer_ops = {torch.ops.aten.linear.default, torch.ops.aten.conv2d.default}
    with _quiet():
        program = torch.export.export(ctx.policy.net, _args(ctx.policy, 1))
        prepared = prepare_pt2e(program.module(), quantizer)
        with torch.no_grad():
            prepared(*_args(ctx.policy, 1))
    observers = {
        n.name: n
        for n in prepared.graph.nodes
        if n.op == "call_module" and "activation_post_process" in n.target
    }
    fixed: dict[str, list[float]] = {}

    def layer_range(node: torch.fx.Node) -> tuple[float, float] | None:
        return ranges.get(_module_path(node)) if node.target in layer_ops else None

    for obs in observers.values():
        users = list(obs.users)
        src = obs.args[0]
        if isinstance(src, torch.fx.Node) and src.op == "get_attr":
            continue  # a weight observer: filled from the weights by the forward pass above
        rng = next((r for u in users if u.args and u.args[0] is obs for r in [layer_range(u)] if r), None)
        if rng is None and len(users) == 1 and users[0].target == torch.ops.aten.tanh.default:
            act = users[0]  # its output goes to the next layer, observed or (next layer float) not
            after = [o for o in observers.values() if o.args[0] is act] or [act]
            nxt = [u for o in after for u in o.users if u.args and u.args[0] is o]
            learned = layer_range(nxt[0]) if len(nxt) == 1 else None
            if learned is not None:
                lim = 1.0 - 2.0**-12  # atanh(+-1) is infinite; tanh saturates long before in float32
                rng = (
                    float(np.arctanh(np.clip(learned[0], -lim, lim))),
                    float(np.arctanh(np.clip(learned[1], -lim, lim))),
                )
        if rng is None:
            raise InputError(
                f"no range learned in QAT for the TFLite tensor {src}",
                "re-export with --calibration FILE.npz to calibrate instead of using the learned ranges",
            )
        mod = getattr(prepared, obs.target)
        mod.min_val.fill_(min(rng[0], 0.0))
        mod.max_val.fill_(max(rng[1], 0.0))
        fixed[str(src)] = [mod.min_val.item(), mod.max_val.item()]
    with _quiet():
        return convert_pt2e(prepared, fold_quantize=False), fixed


def _export_int8_learned_ranges(ctx: ExportContext, path: Path) -> ExportedModel:
    """An 8-bit QAT policy: int8 weights from its n-bit grid, activation ranges learned in training.

    The output layer stays float: its output was never quantized in training, so no range was learned
    (an explicit ``float_layers`` may keep more layers float, not that one int8).
    """
    plain, learned = ctx.quantizable, ctx.learned_ranges
    names = compute_layers(plain)
    requested = ctx.config.float_layers
    int8_layers, float_layers = quantized_layers(plain, False, names[-1:] if requested is None else requested)
    if names[-1] not in float_layers:
        raise InputError(
            f"the output layer {names[-1]!r} must stay float in a TFLite export with QAT learned ranges "
            "(TFLite quantizes a layer's output, and training learned no range for it)",
            f"add {names[-1]!r} to float_layers, or export to onnx-int8",
        )
    _litert_torch("tflite-int8")
    from litert_torch.quantize.quant_config import QuantConfig

    qat = ctx.qat.to_dict() if ctx.qat else {}
    ctx = replace(ctx, policy=plain)
    ranges = dict(zip(names, learned, strict=True))
    # QAT's own weight grid: per-tensor for dense layers, per-channel for convolutions; any other
    # granularity would round the trained weights a second time
    per_channel = plain.arch.model == "nature_cnn"
    quantizer = _quantizer(ctx, float_layers, per_channel=per_channel)
    try:
        module, fixed = _learned_ranges(ctx, quantizer, ranges)
    except InputError:
        raise
    except Exception as e:
        reraise_interrupt(e)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise InputError(
            f"TFLite int8 with learned ranges failed: {first}", "re-export with --calibration FILE.npz"
        ) from None
    _convert("tflite-int8", plain, path, module=module, quant_config=QuantConfig(pt2e_quantizer=quantizer))
    read = read_back(path, names)
    quant = {
        "scheme": "static int8 (PT2E): int8 weights, int8 activations, integer kernels",
        "ranges": "learned in quantization-aware training (no calibration)",
        "range_sources": {
            "layer inputs": "QAT EMA ranges (act_lo, act_hi)",
            "hidden pre-activations": "atanh of the next layer's learned range (Tanh) / fused ReLU output",
            "weights": "the QAT n-bit grid (max |w| of the effective weights, QAT's granularity)",
        },
        "fixed_activation_ranges": fixed,
        "qat": qat,
        "per_channel": per_channel,
        "calibration_samples": 0,
        "requested_int8_layers": int8_layers,
        "float_nodes": float_layers,
        **_activation_type(ctx.config),
        **read.quantization(),
    }
    return _pt2e_int8(path, quant, read)


@register("tflite-int8", calibrated=True, requires=TFLITE)
def _export_int8(ctx: ExportContext, path: Path) -> ExportedModel:
    if ctx.policy.source_model is not None:
        raise InputError("tflite-int8 converts a torch module, and this policy is an imported ONNX graph",
                         "export it to onnx-fp32, onnx-fp16 or onnx-int8")  # fmt: skip
    if ctx.qat and ctx.qat.learned_int8_ranges:
        return _export_int8_learned_ranges(ctx, path)
    # fewer QAT bits: the n-bit weights are exported on an int8 grid, activations calibrated
    ctx = replace(ctx, policy=ctx.quantizable)
    cfg = ctx.config
    int8_layers, float_layers = quantized_layers(ctx.policy, cfg.float_io_layers, cfg.float_layers)
    if ctx.calibration is None or len(ctx.calibration) == 0:
        raise InputError("int8 export needs calibration observations", "pass --calibration FILE.npz")
    _litert_torch("tflite-int8")  # the install command if missing; progress output off
    from litert_torch.quantize.quant_config import QuantConfig

    per_channel = True if cfg.per_channel is None else cfg.per_channel
    quantizer = _quantizer(ctx, float_layers, per_channel)
    try:
        module = _calibrated(ctx, quantizer)
    except Exception as e:  # torch.export / PT2E preparation: same one-line report as the converter
        reraise_interrupt(e)
        layer = _failing_layer(ctx.policy.net, _example(ctx.policy), str(e))
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise InputError(
            f"TFLite int8 calibration failed: {f'layer {layer}: ' if layer else ''}{first}",
            "export to ONNX only (--to onnx-...), or replace that layer",
        ) from None
    _convert(
        "tflite-int8", ctx.policy, path, module=module, quant_config=QuantConfig(pt2e_quantizer=quantizer)
    )
    read = read_back(path, compute_layers(ctx.policy))
    quant = {
        "scheme": "static int8 (PT2E): int8 weights, int8 activations, integer kernels",
        "calibration_method": cfg.calibration_method,
        "activation_observer": _observer(cfg.calibration_method, cfg.percentile).__name__,
        "percentile": cfg.percentile if cfg.calibration_method == "percentile" else None,
        "per_channel": per_channel,
        "calibration_samples": int(len(ctx.calibration)),
        "requested_int8_layers": int8_layers,
        "float_nodes": float_layers,
        **_activation_type(cfg),
        **read.quantization(),
    }
    return _pt2e_int8(path, quant, read)


def _pt2e_int8(path: Path, quant: JSONObject, read: ReadBack) -> ExportedModel:
    """An int8 model quantized by torchao's PT2E flow (calibrated or with learned ranges), as read back."""
    return ExportedModel(
        path,
        "tflite",
        "int8",
        quant,
        read.io(),
        _toolchain(quantizer=f"torchao {_version('torchao')} (PT2E)"),
    )
