"""An ONNX graph (fp32, or int8 QDQ as exporters/onnx.py writes it) -> a C program (runtimes/cprogram.py).

Works on the graph, not on the torch module, so what the C runs is what ONNX Runtime runs, and an ONNX
policy from elsewhere goes the same way. The int8 path follows ONNX Runtime's fused QDQ kernels:

- ``Q(x)`` -> int8 by ``saturate(round_half_even(x / scale) + zero_point)`` (MLAS: divide, clamp, round);
- ``DQ(q) -> Gemm(., DQ(W int8), DQ(b int32))`` -> an int32 dot product of the int8 values, plus the
  int32 bias with the input's zero point folded in (``b - zp_x * sum_i W[j, i]``), then, when the
  Gemm's only consumer is a ``Q``, requantized in float as MLAS does (``acc * (s_x * s_w / s_y)``,
  clamped, rounded half to even), else dequantized (``acc * s_x * s_w``);
- uint8 activations (U8S8) run as int8 values ``u - 128`` with the zero point shifted by 128: the
  same numbers, one code path;
- weights quantized without quantized activations (a ``DQ`` weight feeding a float Gemm) are
  dequantized here and run in float, as ONNX Runtime runs them.

Anything else is refused with one line naming the op and the formats that run it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from quarl_edge.runtimes.cprogram import Buffer, Op, Program
from quarl_edge.runtimes.errors import InputError

OTHER_FORMATS = "onnx-fp32, onnx-fp16, onnx-int8, tflite-fp32, tflite-fp16, tflite-int8"
SUPPORTED = (
    "Gemm, MatMul(+Add), Relu, Tanh, Sigmoid, Sigmoid*x (SiLU), Elu, LeakyRelu, Clip, Max/Min, "
    "Add/Sub/Mul/Div by constants, ArgMax, QuantizeLinear/DequantizeLinear"
)
_UNARY = {"Relu": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid", "Elu": "elu", "LeakyRelu": "leaky_relu"}
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div", "Max": "max", "Min": "min"}
_ALIASES = ("Identity", "Flatten", "Reshape", "Squeeze", "Unsqueeze")
_FOLD = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
    "Max": np.maximum,
    "Min": np.minimum,
    "Sqrt": np.sqrt,
    "Neg": np.negative,
    "Reciprocal": np.reciprocal,
}


def unsupported(op: str, target: str) -> InputError:
    return InputError(
        f"the policy's graph uses {op}, which {target} does not support (C export covers MLP policies: {SUPPORTED})",
        f"export it to one of: {OTHER_FORMATS}",
    )


@dataclass(frozen=True)
class _QBuf:
    buf: int
    scale: float
    zp: int


@dataclass(frozen=True)
class _DQView:
    """A DequantizeLinear of an int8 buffer: its float values, materialized only if a float op reads them."""

    q: int
    scale: float
    zp: int


@dataclass(frozen=True)
class _QConst:
    values: np.ndarray  # int8 / int32, as stored
    scale: np.ndarray  # float32, scalar or per channel
    zp: np.ndarray
    axis: int

    def dequantized(self) -> np.ndarray:
        s, z = self.scale, self.zp.astype(np.int64)
        if s.size > 1:
            shape = [1] * self.values.ndim
            shape[self.axis] = s.size
            s, z = s.reshape(shape), z.reshape(shape)
        return ((self.values.astype(np.int64) - z).astype(np.float32) * s).astype(np.float32)


@dataclass
class _Builder:
    target: str
    buffers: list[Buffer] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    values: dict[str, Any] = field(default_factory=dict)
    """ONNX value name -> np.ndarray (a constant), _QConst, int (a float buffer), _QBuf, _DQView"""
    floats: dict[int, int] = field(default_factory=dict)
    """int8 buffer -> the float buffer of its dequantized values, once materialized"""

    def buffer(self, kind: str, size: int) -> int:
        self.buffers.append(Buffer(kind, int(size)))
        return len(self.buffers) - 1

    def array(self, prefix: str, a: np.ndarray) -> str:
        name = f"qe_{prefix}{len(self.arrays)}"
        self.arrays[name] = np.ascontiguousarray(a)
        return name

    def float_buf(self, name: str, node: Any) -> int:
        v = self.values.get(name)
        if isinstance(v, int):
            return v
        if isinstance(v, _DQView):
            key = (v.q, v.scale, v.zp)
            if key not in self.floats:  # type: ignore[comparison-overlap]
                y = self.buffer("f32", self.buffers[v.q].size)
                self.ops.append(Op("dequantize", v.q, y, scale=v.scale, zp=v.zp))
                self.floats[key] = y  # type: ignore[index]
            return self.floats[key]  # type: ignore[index]
        what = "a constant" if isinstance(v, np.ndarray | _QConst) else "an int8 tensor"
        raise InputError(
            f"{node.op_type} node {node.name!r} reads {what} where C export expects computed float values",
            f"export it to one of: {OTHER_FORMATS}",
        )


def _attrs(node: Any) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _scalar(a: Any, what: str) -> float | int:
    if not isinstance(a, np.ndarray) or a.size != 1:
        raise InputError(f"{what} is not a constant scalar", f"export it to one of: {OTHER_FORMATS}")
    return a.reshape(()).item()  # type: ignore[no-any-return]


def _width(shape: Iterable[Any]) -> int | None:
    dims = list(shape)
    if len(dims) == 2 and isinstance(dims[1], int) and dims[1] > 0:
        return dims[1]
    return None


def from_onnx(path: Path, target: str, name: str, header: str) -> Program:
    """The C program of the ONNX model at ``path`` (InputError naming an op it cannot run)."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    g = model.graph
    consts = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    known = {"Constant", "QuantizeLinear", "DequantizeLinear", "Gemm", "MatMul", "Clip", "Cast", "ArgMax",
             *_UNARY, *_BINARY, *_ALIASES, *_FOLD}  # fmt: skip
    odd = next((n for n in g.node if n.op_type not in known or n.domain not in ("", "ai.onnx")), None)
    if odd is not None:  # named first: a CNN is refused for its Conv, not for its image input
        raise unsupported(
            odd.op_type if odd.domain in ("", "ai.onnx") else f"{odd.domain}.{odd.op_type}", target
        )
    inputs = [i for i in g.input if i.name not in consts]
    if len(inputs) != 1 or len(g.output) != 1:
        raise InputError(
            f"the graph has {len(inputs)} inputs and {len(g.output)} outputs; C export takes one of each",
            f"export it to one of: {OTHER_FORMATS}",
        )
    inp = inputs[0].type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else None for d in inp.shape.dim]
    if inp.elem_type != onnx.TensorProto.FLOAT or len(dims) != 2 or not dims[1]:
        raise InputError(
            f"the graph's input is not a batch of float vectors (shape {dims}); C export takes vector observations",
            f"export it to one of: {OTHER_FORMATS}",
        )
    b = _Builder(target)
    b.values.update(consts)
    b.values[inputs[0].name] = b.buffer("f32", dims[1])
    consumers: dict[str, list[Any]] = {}
    for node in g.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)
    out_name = g.output[0].name
    skip: set[int] = set()
    discrete: int | None = None
    for k, node in enumerate(g.node):
        if k in skip:
            continue
        op = node.op_type
        if node.domain not in ("", "ai.onnx"):
            raise unsupported(f"{node.domain}.{op}", target)
        ins = list(node.input)
        if op == "Constant":
            b.values[node.output[0]] = numpy_helper.to_array(_attrs(node)["value"])
        elif (
            all(b.values.get(i) is not None and isinstance(b.values[i], np.ndarray) for i in ins if i)
            and op in _FOLD
        ):
            args = [b.values[i].astype(np.float32) for i in ins if i]
            b.values[node.output[0]] = np.asarray(_FOLD[op](*args), np.float32)
        elif op == "QuantizeLinear":
            _quantize(b, node)
        elif op == "DequantizeLinear":
            _dequantize(b, node)
        elif op in ("Gemm", "MatMul"):
            fused = _dense(b, node, g.node, k, consumers, out_name)
            skip.update(fused)
        elif op in _UNARY:
            _unary(b, node, g.node, k, consumers, skip)
        elif op == "Clip":
            x = b.float_buf(ins[0], node)
            lo = _scalar(b.values.get(ins[1]), "Clip min") if len(ins) > 1 and ins[1] else None
            hi = _scalar(b.values.get(ins[2]), "Clip max") if len(ins) > 2 and ins[2] else None
            y = b.buffer("f32", b.buffers[x].size)
            b.ops.append(Op("clip", x, y, lo=_f32(lo), hi=_f32(hi)))
            b.values[node.output[0]] = y
        elif op in _BINARY:
            _binary(b, node)
        elif op in _ALIASES or (op == "Cast" and _attrs(node).get("to") == onnx.TensorProto.FLOAT):
            src = b.values.get(ins[0])
            if not isinstance(src, int | _DQView):
                raise unsupported(op, target)
            b.values[node.output[0]] = src
        elif op == "ArgMax":
            a = _attrs(node)
            if a.get("axis", 0) not in (1, -1) or a.get("select_last_index", 0) or node.output[0] != out_name:
                raise unsupported("ArgMax other than the last op over the action values", target)
            discrete = b.float_buf(ins[0], node)
            b.values[node.output[0]] = discrete
        else:
            raise unsupported(op, target)
    if discrete is None:
        out = b.values.get(out_name)
        if not isinstance(out, int | _DQView):
            raise unsupported("an output that is not computed float values", target)
        discrete_out, output = False, b.float_buf(out_name, g.node[-1])
    else:
        discrete_out, output = True, discrete
    ops, buffers, arrays = _prune(b, output)
    return Program(
        name=name,
        precision=target.rsplit("-", 1)[-1],
        header=header,
        obs_name=_safe(inputs[0].name),
        action_name=_safe(out_name),
        discrete=discrete_out,
        buffers=buffers,
        ops=ops,
        output=output,
        arrays=arrays,
        source=_safe(path.name),
    )


def _safe(s: str) -> str:
    out = "".join(c if c.isascii() and (c.isalnum() or c in "_.+-") else "_" for c in s)[:64]
    return out or "x"


def _f32(v: float | int | None) -> float | None:
    return None if v is None else float(np.float32(v))


def _qparams(b: _Builder, node: Any) -> tuple[np.ndarray, np.ndarray, bool]:
    """(scale, zero point as int64, unsigned) of a Q/DQ node, each a constant."""
    ins = list(node.input)
    scale = b.values.get(ins[1])
    zp = b.values.get(ins[2]) if len(ins) > 2 and ins[2] else np.zeros((), np.int8)
    if not isinstance(scale, np.ndarray) or not isinstance(zp, np.ndarray):
        raise unsupported(f"{node.op_type} with computed scales", b.target)
    if zp.dtype not in (np.int8, np.uint8, np.int32):
        raise unsupported(f"{node.op_type} to {zp.dtype}", b.target)
    return scale.astype(np.float32), zp.astype(np.int64), zp.dtype == np.uint8


def _quantize(b: _Builder, node: Any) -> None:
    scale, zp, unsigned = _qparams(b, node)
    if scale.size != 1 or zp.dtype == np.int32:
        raise unsupported("QuantizeLinear per channel", b.target)
    x = b.float_buf(node.input[0], node)
    z = int(zp.reshape(())) - (128 if unsigned else 0)
    y = b.buffer("i8", b.buffers[x].size)
    s = float(scale.reshape(()))
    b.ops.append(Op("quantize", x, y, scale=s, zp=z))
    b.values[node.output[0]] = _QBuf(y, s, z)


def _dequantize(b: _Builder, node: Any) -> None:
    src = b.values.get(node.input[0])
    scale, zp, unsigned = _qparams(b, node)
    if isinstance(src, np.ndarray):
        axis = int(_attrs(node).get("axis", 1))
        b.values[node.output[0]] = _QConst(src, scale.reshape(-1), zp.reshape(-1), axis % max(src.ndim, 1))
    elif isinstance(src, _QBuf) and scale.size == 1:
        z = int(zp.reshape(())) - (128 if unsigned else 0)
        b.values[node.output[0]] = _DQView(src.buf, float(scale.reshape(())), z)
    else:
        raise unsupported("DequantizeLinear of a computed tensor per channel", b.target)


def _dense(
    b: _Builder, node: Any, nodes: Any, k: int, consumers: dict[str, list[Any]], out_name: str
) -> set[int]:
    """Gemm, or MatMul with a following Add of a constant bias; returns the node indexes it fused."""
    a = _attrs(node)
    fused: set[int] = set()
    ins = list(node.input)
    out = node.output[0]
    if node.op_type == "Gemm":
        if a.get("transA", 0):
            raise unsupported("Gemm with transA", b.target)
        trans_b, alpha, beta = bool(a.get("transB", 0)), float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
        bias_name = ins[2] if len(ins) > 2 and ins[2] else None
    else:
        trans_b, alpha, beta, bias_name = False, 1.0, 1.0, None
    w = b.values.get(ins[1])
    x_val = b.values.get(ins[0])
    int8 = isinstance(w, _QConst) and isinstance(x_val, _DQView) and w.values.dtype == np.int8
    # a float MatMul takes the Add of a constant after it as its bias
    if node.op_type == "MatMul" and not int8:
        users = consumers.get(out, [])
        if len(users) == 1 and users[0].op_type == "Add" and out != out_name:
            other = [i for i in users[0].input if i != out]
            if len(other) == 1 and isinstance(b.values.get(other[0]), np.ndarray | _QConst):
                bias_name, out = other[0], users[0].output[0]
                fused.add(list(nodes).index(users[0]))
    bias = b.values.get(bias_name) if bias_name else None
    if int8 and alpha == beta == 1.0:
        assert isinstance(w, _QConst) and isinstance(x_val, _DQView)
        q = _dense_i8(b, node, x_val, w, trans_b, bias, consumers, out, out_name)
        if q is not None:
            fused.add(list(nodes).index(q))
        return fused
    wf = w.dequantized() if isinstance(w, _QConst) else w
    if not isinstance(wf, np.ndarray) or wf.ndim != 2:
        raise unsupported(f"{node.op_type} whose weights are not a constant matrix", b.target)
    wt = (wf.T if trans_b else wf).astype(np.float32) * np.float32(alpha)  # [in, out]
    x = b.float_buf(ins[0], node)
    if wt.shape[0] != b.buffers[x].size:
        raise unsupported(f"{node.op_type} of shape {list(wf.shape)} on {b.buffers[x].size} inputs", b.target)
    n_out = wt.shape[1]
    bf = bias.dequantized() if isinstance(bias, _QConst) else bias
    bvec = (
        np.zeros(n_out, np.float32)
        if bf is None
        else np.broadcast_to(np.asarray(bf, np.float32).reshape(-1), (n_out,))
    )
    y = b.buffer("f32", n_out)
    b.ops.append(
        Op("dense_f32", x, y, w=b.array("w", wt), b=b.array("b", bvec.astype(np.float32) * np.float32(beta)))
    )
    b.values[out] = y
    return fused


def _dense_i8(b: _Builder, node: Any, x: _DQView, w: _QConst, trans_b: bool, bias: Any,
              consumers: dict[str, list[Any]], out: str, out_name: str) -> Any:  # fmt: skip
    wq = w.values.T if not trans_b else w.values  # [out, in]
    n_out, n_in = wq.shape
    if n_in != b.buffers[x.q].size:
        raise unsupported(
            f"{node.op_type} of shape {list(w.values.shape)} on {b.buffers[x.q].size} inputs", b.target
        )
    channel_axis = 0 if trans_b else 1
    if np.any(w.zp != 0) or (w.scale.size > 1 and (w.axis != channel_axis or w.scale.size != n_out)):
        raise unsupported(
            f"{node.op_type} with int8 weights that are asymmetric or not per output channel", b.target
        )
    w_scale = np.broadcast_to(w.scale.astype(np.float32), (n_out,))
    x_scale = np.float32(x.scale)
    acc_bias = np.zeros(n_out, np.int64)
    if bias is not None:
        if not isinstance(bias, _QConst) or bias.values.dtype != np.int32 or np.any(bias.zp != 0):
            raise unsupported(f"{node.op_type} whose bias is not int32 in QDQ form", b.target)
        acc_bias = np.broadcast_to(bias.values.astype(np.int64).reshape(-1), (n_out,))
    rowsum = wq.astype(np.int64).sum(axis=1)
    folded = acc_bias - x.zp * rowsum
    if np.any(np.abs(folded) + 128 * np.abs(wq.astype(np.int64)).sum(axis=1) >= 2**31):
        raise unsupported(f"{node.op_type} whose int32 accumulator could overflow", b.target)
    in_scale = (x_scale * w_scale).astype(np.float32)  # onnxruntime: a_scale * b_scale, in float32
    users = consumers.get(out, [])
    q = users[0] if len(users) == 1 and users[0].op_type == "QuantizeLinear" and out != out_name else None
    if q is not None:
        scale, zp, unsigned = _qparams(b, q)
        if scale.size != 1:
            q = None
    if q is not None:
        y_scale = np.float32(scale.reshape(()))
        z = int(zp.reshape(())) - (128 if unsigned else 0)
        y = b.buffer("i8", n_out)
        mult = (in_scale / y_scale).astype(np.float32)
        b.ops.append(Op("dense_i8", x.q, y, w=b.array("w", wq.astype(np.int8)), b=b.array("b", folded.astype(np.int32)),
                        s=b.array("s", mult), zp=z))  # fmt: skip
        b.values[q.output[0]] = _QBuf(y, float(y_scale), z)
        b.values[out] = None  # the float output is never materialized (its only reader is q)
        return q
    y = b.buffer("f32", n_out)
    b.ops.append(Op("dense_i8", x.q, y, w=b.array("w", wq.astype(np.int8)), b=b.array("b", folded.astype(np.int32)),
                    s=b.array("s", in_scale)))  # fmt: skip
    b.values[out] = y
    return None


def _unary(
    b: _Builder, node: Any, nodes: Any, k: int, consumers: dict[str, list[Any]], skip: set[int]
) -> None:
    op, ins = node.op_type, list(node.input)
    users = consumers.get(node.output[0], [])
    x = b.float_buf(ins[0], node)
    if op == "Sigmoid" and len(users) == 1 and users[0].op_type == "Mul" and ins[0] in users[0].input:
        y = b.buffer("f32", b.buffers[x].size)  # x * sigmoid(x): SiLU / Swish in one pass
        b.ops.append(Op("silu", x, y))
        b.values[users[0].output[0]] = y
        skip.add(list(nodes).index(users[0]))
        return
    a = _attrs(node)
    alpha = {"Elu": a.get("alpha", 1.0), "LeakyRelu": a.get("alpha", 0.01)}.get(op)
    y = b.buffer("f32", b.buffers[x].size)
    b.ops.append(Op(_UNARY[op], x, y, alpha=_f32(alpha)))
    b.values[node.output[0]] = y


def _binary(b: _Builder, node: Any) -> None:
    op, ins = node.op_type, list(node.input)
    if len(ins) != 2:
        raise unsupported(f"{op} of {len(ins)} inputs", b.target)
    va, vb = b.values.get(ins[0]), b.values.get(ins[1])
    const_first = isinstance(va, np.ndarray)
    c, xname = (va, ins[1]) if const_first else (vb, ins[0])
    if not isinstance(c, np.ndarray):
        raise unsupported(f"{op} of two computed tensors", b.target)
    x = b.float_buf(xname, node)
    n = b.buffers[x].size
    cv = np.asarray(c, np.float32)
    if cv.size not in (1, n) or (cv.ndim > 1 and cv.shape[-1] != cv.size):
        raise unsupported(f"{op} by a constant of shape {list(cv.shape)} on {n} values", b.target)
    name = _BINARY[op]
    if const_first and op in ("Sub", "Div"):
        name = "r" + name
    y = b.buffer("f32", n)
    b.ops.append(Op(name, x, y, c=b.array("c", cv.reshape(-1))))
    b.values[node.output[0]] = y


def _prune(b: _Builder, output: int) -> tuple[tuple[Op, ...], tuple[Buffer, ...], dict[str, np.ndarray]]:
    """Drop the ops whose results nothing reads (a Sigmoid fused into SiLU, an unread dequantization) and
    renumber the buffers and arrays that remain, in the order the ops use them."""
    needed = {output}
    kept: list[Op] = []
    for op in reversed(b.ops):
        if op.y in needed:
            kept.append(op)
            needed.add(op.x)
    kept.reverse()
    order = [0]
    for op in kept:
        for i in (op.x, op.y):
            if i not in order:
                order.append(i)
    index = {old: new for new, old in enumerate(order)}
    names: dict[str, str] = {}
    arrays: dict[str, np.ndarray] = {}

    def rename(n: str | None, prefix: str) -> str | None:
        if n is None:
            return None
        if n not in names:
            names[n] = f"qe_{prefix}{len(arrays)}"
            arrays[names[n]] = b.arrays[n]
        return names[n]

    ops = tuple(
        Op(
            o.op,
            index[o.x],
            index[o.y],
            w=rename(o.w, "w"),
            b=rename(o.b, "b"),
            s=rename(o.s, "s"),
            c=rename(o.c, "c"),
            scale=o.scale,
            zp=o.zp,
            alpha=o.alpha,
            lo=o.lo,
            hi=o.hi,
        )  # fmt: skip
        for o in kept
    )
    return ops, tuple(b.buffers[i] for i in order), arrays
