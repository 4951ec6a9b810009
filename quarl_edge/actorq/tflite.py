"""The actors' policy MLP as a TFLite (LiteRT) flatbuffer, written straight from the learner's weights.

Why not litert-torch, as exporters/tflite.py does for bundles: a conversion takes seconds, and the
learner re-quantizes every ``broadcast_every`` updates. The MLP is a fixed chain of FULLY_CONNECTED
ops, so the flatbuffer is built here from numpy with the schema that ai-edge-litert ships (a few ms).

- fp32: FULLY_CONNECTED (+ fused RELU) on float32 weights.
- fp16: float16 weights, DEQUANTIZE'd to float32 at load (TFLite's usual fp16-weight model).
- int8: full integer. QUANTIZE the float observation to int8, every FULLY_CONNECTED on int8 weights
  (symmetric, per output channel) and int8 activations (affine, per tensor, min/max of the layer's
  output over the calibration observations, always including 0), int32 biases at input scale x weight
  scale, DEQUANTIZE after the last layer. Integer kernels for every layer (XNNPACK's QS8/QC8).
A continuous actor ends in float TANH, MUL by the action half-range, ADD of its centre.

Measured here (1 thread, batch 1, benchmarks/actorq_inference.py) LiteRT int8 is the fastest actor path
at every size tried, where ONNX Runtime's QDQ int8 is slower than its fp32 below ~1000-wide layers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Layers = list[tuple[np.ndarray, np.ndarray]]
INT8_MIN, INT8_MAX = -128, 127


def _range(a: np.ndarray) -> tuple[float, int]:
    """Scale and zero point of an affine int8 tensor covering ``a``'s min/max and 0."""
    lo, hi = min(float(a.min()), 0.0), max(float(a.max()), 0.0)
    scale = max(hi - lo, 1e-8) / (INT8_MAX - INT8_MIN)
    return scale, int(np.clip(round(INT8_MIN - lo / scale), INT8_MIN, INT8_MAX))


def activations(layers: Layers, obs: np.ndarray) -> list[np.ndarray]:
    """The float input and every layer's output (ReLU applied between layers) over ``obs``."""
    out = [np.asarray(obs, np.float32)]
    for i, (w, b) in enumerate(layers):
        h = out[-1] @ w.T + b
        out.append(np.maximum(h, 0.0) if i < len(layers) - 1 else h)
    return out


class _Graph:
    """A single-subgraph TFLite model under construction (the schema's object API)."""

    def __init__(self) -> None:
        from ai_edge_litert import schema_py_generated as s

        self.s = s
        self.buffers: list[Any] = [s.BufferT()]  # buffer 0: the empty one, for tensors without data
        self.tensors: list[Any] = []
        self.ops: list[Any] = []
        self.codes: list[Any] = []
        self._code: dict[int, int] = {}

    def quant(self, scale: Any, zero_point: Any, dim: int = 0) -> Any:
        q = self.s.QuantizationParametersT()
        q.scale = [float(x) for x in np.atleast_1d(scale)]
        q.zeroPoint = [int(x) for x in np.atleast_1d(zero_point)]
        q.quantizedDimension = dim
        return q

    def tensor(self, shape: list[int], ttype: int, name: str, data: np.ndarray | None = None,
               quant: Any = None) -> int:  # fmt: skip
        buffer = 0
        if data is not None:
            b = self.s.BufferT()
            b.data = np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8)
            self.buffers.append(b)
            buffer = len(self.buffers) - 1
        t = self.s.TensorT()
        t.shape, t.type, t.buffer, t.name, t.quantization = list(shape), ttype, buffer, name, quant
        self.tensors.append(t)
        return len(self.tensors) - 1

    def op(self, code: int, inputs: list[int], outputs: list[int], options: Any = None) -> None:
        if code not in self._code:
            c = self.s.OperatorCodeT()
            c.builtinCode, c.deprecatedBuiltinCode, c.version = code, min(code, 127), 1
            self._code[code] = len(self.codes)
            self.codes.append(c)
        o = self.s.OperatorT()
        o.opcodeIndex, o.inputs, o.outputs = self._code[code], inputs, outputs
        if options is not None:
            o.builtinOptionsType = getattr(self.s.BuiltinOptions, type(options).__name__[:-1])
            o.builtinOptions = options
        self.ops.append(o)

    def finish(self, inputs: list[int], outputs: list[int], name: str) -> bytes:
        import flatbuffers

        sg = self.s.SubGraphT()
        sg.tensors, sg.inputs, sg.outputs, sg.operators, sg.name = (
            self.tensors,
            inputs,
            outputs,
            self.ops,
            "main",
        )
        m = self.s.ModelT()
        m.version, m.operatorCodes, m.subgraphs, m.buffers = 3, self.codes, [sg], self.buffers
        m.description = f"quarl-edge actorq {name}"
        b = flatbuffers.Builder(1024)
        b.Finish(m.Pack(b), file_identifier=b"TFL3")
        return bytes(b.Output())


def mlp_tflite(
    layers: Layers,
    precision: str,
    squash: tuple[np.ndarray, np.ndarray] | None = None,
    calib_obs: np.ndarray | None = None,
) -> bytes:
    """The MLP (ReLU between layers; tanh * scale + bias with ``squash``) at ``precision`` as a TFLite
    flatbuffer: float32 observation [1, n_obs] in, float32 output [1, n_out] out. int8 needs
    ``calib_obs``."""
    g = _Graph()
    s, T = g.s, g.s.TensorType
    n_in, n_out = layers[0][0].shape[1], layers[-1][0].shape[0]
    x = first = g.tensor([1, n_in], T.FLOAT32, "obs")
    in_scale = 1.0
    if precision == "int8":
        if calib_obs is None or len(calib_obs) == 0:
            raise ValueError("an int8 TFLite actor needs calibration observations")
        acts = activations(layers, calib_obs)
        in_scale, zp = _range(acts[0])
        xq = g.tensor([1, n_in], T.INT8, "obs_int8", quant=g.quant(in_scale, zp))
        g.op(s.BuiltinOperator.QUANTIZE, [x], [xq])
        x = xq
    for i, (w, b) in enumerate(layers):
        fc = s.FullyConnectedOptionsT()
        if i < len(layers) - 1:
            fc.fusedActivationFunction = s.ActivationFunctionType.RELU
        if precision == "int8":
            w_scale = np.maximum(np.abs(w).max(axis=1), 1e-8) / INT8_MAX  # per output channel
            zeros = np.zeros(len(w_scale), np.int64)
            wq = np.clip(np.round(w / w_scale[:, None]), -INT8_MAX, INT8_MAX).astype(np.int8)
            wt = g.tensor(list(w.shape), T.INT8, f"w{i}", wq, g.quant(w_scale, zeros))
            b_scale = in_scale * w_scale
            bt = g.tensor(list(b.shape), T.INT32, f"b{i}", np.round(b / b_scale).astype(np.int32),
                          g.quant(b_scale, zeros))  # fmt: skip
            in_scale, zp = _range(acts[i + 1])
            y = g.tensor([1, w.shape[0]], T.INT8, f"h{i}", quant=g.quant(in_scale, zp))
        elif precision == "fp16":
            w16 = g.tensor(list(w.shape), T.FLOAT16, f"w{i}_fp16", w.astype(np.float16))
            b16 = g.tensor(list(b.shape), T.FLOAT16, f"b{i}_fp16", b.astype(np.float16))
            wt, bt = g.tensor(list(w.shape), T.FLOAT32, f"w{i}"), g.tensor(list(b.shape), T.FLOAT32, f"b{i}")
            g.op(s.BuiltinOperator.DEQUANTIZE, [w16], [wt])
            g.op(s.BuiltinOperator.DEQUANTIZE, [b16], [bt])
            y = g.tensor([1, w.shape[0]], T.FLOAT32, f"h{i}")
        else:
            wt = g.tensor(list(w.shape), T.FLOAT32, f"w{i}", w.astype(np.float32))
            bt = g.tensor(list(b.shape), T.FLOAT32, f"b{i}", b.astype(np.float32))
            y = g.tensor([1, w.shape[0]], T.FLOAT32, f"h{i}")
        g.op(s.BuiltinOperator.FULLY_CONNECTED, [x, wt, bt], [y], fc)
        x = y
    if precision == "int8":
        y = g.tensor([1, n_out], T.FLOAT32, "out")
        g.op(s.BuiltinOperator.DEQUANTIZE, [x], [y])
        x = y
    if squash is not None:
        scale = g.tensor([n_out], T.FLOAT32, "act_scale", np.asarray(squash[0], np.float32).reshape(-1))
        bias = g.tensor([n_out], T.FLOAT32, "act_bias", np.asarray(squash[1], np.float32).reshape(-1))
        t, m, a = (g.tensor([1, n_out], T.FLOAT32, n) for n in ("tanh", "scaled", "action"))
        g.op(s.BuiltinOperator.TANH, [x], [t])
        g.op(s.BuiltinOperator.MUL, [t, scale], [m], s.MulOptionsT())
        g.op(s.BuiltinOperator.ADD, [m, bias], [a], s.AddOptionsT())
        x = a
    return g.finish([first], [x], "actor" if squash is not None else "qnet")


def graph_name(model: bytes) -> str:
    """``qnet`` or ``actor``: what a TFLite payload holds (the last word of its description)."""
    from ai_edge_litert import schema_py_generated as s

    description = s.Model.GetRootAs(model, 0).Description() or b""
    return description.decode().rsplit(" ", 1)[-1]


def int8_evidence(model: bytes) -> dict[str, int]:
    """broadcast.int8_evidence of a TFLite payload: QUANTIZE/DEQUANTIZE ops, FULLY_CONNECTED weights
    stored as int8 and as float (fp16 weights count as float)."""
    from ai_edge_litert import schema_py_generated as s

    m = s.ModelT.InitFromPackedBuf(bytearray(model), 0)
    g = m.subgraphs[0]
    names = {v: k for k, v in vars(s.BuiltinOperator).items() if not k.startswith("_")}
    ops = [(names[m.operatorCodes[o.opcodeIndex].builtinCode], o) for o in g.operators]
    weights = [g.tensors[o.inputs[1]].type for name, o in ops if name == "FULLY_CONNECTED"]
    return {
        "quantize": sum(name == "QUANTIZE" for name, _ in ops),
        "dequantize": sum(
            name == "DEQUANTIZE" for name, o in ops if g.tensors[o.inputs[0]].type == s.TensorType.INT8
        ),
        "int8_weights": sum(t == s.TensorType.INT8 for t in weights),
        "float_weights": sum(t == s.TensorType.FLOAT32 for t in weights),
    }
