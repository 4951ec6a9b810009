"""A policy as a C program's data: the buffers, the ops that run over them in order, and the constant
arrays (weights, biases, scales). exporters/c.py builds one from an ONNX graph; runtimes/csource.py
writes it as C and reads it back.

Everything here is validated where it is made and where it is read (a bundle's C file is untrusted):
names of one safe alphabet, sizes in range, every op's buffers and arrays of the kind and size it
needs, every number finite. The C writer relies on that: whatever passes here renders to the same
fixed kernels with other numbers, never to other code.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import InputError
from .schema import JSONObject

PROGRAM_VERSION = 1
MAX_BUFFER = 1 << 16
"""elements of one activation buffer (a layer width); the buffers live on the C stack"""
MAX_STACK_BYTES = 1 << 20
MAX_ARRAY = 1 << 24
"""elements of one constant array (a 4096 x 4096 layer)"""
MAX_OPS = 1024
NAME = re.compile(r"[A-Za-z0-9_.+-]{1,64}\Z")
"""policy, file and I/O names: they go into C string literals and comments, so no quote, backslash,
'*', '/', '?' or space can reach them"""
ARRAY_NAME = re.compile(r"qe_[a-z][a-z0-9]{0,39}\Z")
"""the C file adds arrays of its own named NAME_u (runtimes/csource.py derived)"""

KINDS = {"f32": 4, "i8": 1}
UNARY = ("relu", "tanh", "sigmoid", "silu", "elu", "leaky_relu", "clip")
BINARY = ("add", "sub", "mul", "div", "rsub", "rdiv", "max", "min")
"""y = x op c, and rsub/rdiv: y = c - x, c / x, with c a constant array of size 1 or the buffer's"""
OPS = ("dense_f32", "dense_i8", "quantize", "dequantize", *UNARY, *BINARY)
FIX = "re-export the model with `quarl-edge export --to c-fp32,c-int8`"


@dataclass(frozen=True)
class Buffer:
    kind: str
    """f32 (float) or i8 (int8 quantized values)"""
    size: int


@dataclass(frozen=True)
class Op:
    """One step of the program: ``y = op(x)`` over buffers, with its constants.

    dense_f32: w f32 [in, out] (transposed: the inner loop runs over outputs, so it vectorizes without
    reassociating sums), b f32 [out]. dense_i8: w i8 [out, in], b i32 [out] (the bias with the input's
    zero point folded in), s f32 [out] (the output multiplier: input scale x weight scale / output
    scale for an i8 output, input scale x weight scale for an f32 one), zp the output's zero point.
    quantize / dequantize: scale, zp. elu / leaky_relu: alpha. clip: lo, hi (None: unbounded).
    """

    op: str
    x: int
    y: int
    w: str | None = None
    b: str | None = None
    s: str | None = None
    c: str | None = None
    scale: float | None = None
    zp: int | None = None
    alpha: float | None = None
    lo: float | None = None
    hi: float | None = None

    def to_dict(self) -> JSONObject:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass(frozen=True)
class Program:
    name: str
    """the policy's name (a C string in the header)"""
    precision: str
    """fp32 or int8"""
    header: str
    """the header's file name, which the C file includes"""
    obs_name: str
    action_name: str
    discrete: bool
    """the action is the argmax of the output buffer (an int), else the output buffer itself"""
    buffers: tuple[Buffer, ...]
    """buffer 0 is the observation (read only)"""
    ops: tuple[Op, ...]
    output: int
    arrays: Mapping[str, np.ndarray] = field(repr=False)
    source: str = ""
    """what it was generated from, e.g. ``policy.int8.onnx`` (a comment)"""

    def __post_init__(self) -> None:
        validate(self)

    @property
    def obs_size(self) -> int:
        return self.buffers[0].size

    @property
    def action_size(self) -> int:
        """the number of actions for a discrete policy, the action's length for a continuous one"""
        return self.buffers[self.output].size

    def meta(self) -> JSONObject:
        """Everything but the arrays' values, as JSON data."""
        return {
            "version": PROGRAM_VERSION,
            "name": self.name,
            "precision": self.precision,
            "header": self.header,
            "source": self.source,
            "obs_name": self.obs_name,
            "action_name": self.action_name,
            "discrete": self.discrete,
            "buffers": [[b.kind, b.size] for b in self.buffers],
            "ops": [o.to_dict() for o in self.ops],
            "output": self.output,
            "arrays": {k: [_dtype_name(v), list(v.shape)] for k, v in self.arrays.items()},
        }


_DTYPES = {"f32": np.float32, "i8": np.int8, "i32": np.int32}


def _dtype_name(a: np.ndarray) -> str:
    return next(k for k, t in _DTYPES.items() if a.dtype == t)


def _bad(what: str) -> InputError:
    return InputError(f"C program: {what}", FIX)


def _name(v: Any, what: str, pattern: re.Pattern[str] = NAME) -> str:
    if not isinstance(v, str) or not pattern.match(v):
        raise _bad(f"{what} {str(v)[:40]!r} is not a name of letters, digits and _.+-")
    return v


def _int(v: Any, what: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise _bad(f"{what} is not an integer in [{lo}, {hi}] ({str(v)[:24]})")
    return v


def _float(v: Any, what: str, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(float(v)):
        raise _bad(f"{what} is not a finite number ({str(v)[:24]})")
    f = float(np.float32(v))
    if f != float(v) or not math.isfinite(f) or (positive and not f > 0):
        raise _bad(f"{what} {v!r} is not a {'positive ' if positive else ''}float32")
    return f


def validate(p: Program) -> None:
    _name(p.name, "policy name")
    _name(p.obs_name, "observation name")
    _name(p.action_name, "action name")
    if not isinstance(p.header, str) or not NAME.match(p.header) or not p.header.endswith(".h"):
        raise _bad(f"header name {str(p.header)[:40]!r} is not a file name ending in .h")
    if p.source:
        _name(p.source, "source")
    if p.precision not in ("fp32", "int8"):
        raise _bad(f"precision {str(p.precision)[:16]!r} is not fp32 or int8")
    if not isinstance(p.discrete, bool):
        raise _bad("discrete is not true or false")
    if not isinstance(p.buffers, tuple) or not 2 <= len(p.buffers) <= MAX_OPS + 1:
        raise _bad("buffers is not a list of 2 or more")
    for i, b in enumerate(p.buffers):
        if not isinstance(b, Buffer) or b.kind not in KINDS:
            raise _bad(f"buffer {i} is not of kind f32 or i8")
        _int(b.size, f"buffer {i}'s size", 1, MAX_BUFFER)
    if p.buffers[0].kind != "f32":
        raise _bad("the observation buffer is not f32")
    if sum(KINDS[b.kind] * b.size for b in p.buffers[1:]) > MAX_STACK_BYTES:
        raise _bad(f"the buffers take more than {MAX_STACK_BYTES} bytes of stack")
    _int(p.output, "output buffer", 0, len(p.buffers) - 1)
    if p.buffers[p.output].kind != "f32":
        raise _bad("the output buffer is not f32")
    if not isinstance(p.arrays, Mapping) or len(p.arrays) > 4 * MAX_OPS:
        raise _bad("arrays is not a mapping")
    for k, a in p.arrays.items():
        _name(k, "array name", ARRAY_NAME)
        if not isinstance(a, np.ndarray) or a.dtype not in [np.dtype(t) for t in _DTYPES.values()]:
            raise _bad(f"array {k} is not a float32, int8 or int32 array")
        if not 1 <= a.size <= MAX_ARRAY or a.ndim not in (1, 2):
            raise _bad(f"array {k} has {a.size} elements in {a.ndim} dimensions")
        if a.dtype == np.float32 and not np.all(np.isfinite(a)):
            raise _bad(f"array {k} holds NaN or inf")
    if not isinstance(p.ops, tuple) or not 1 <= len(p.ops) <= MAX_OPS:
        raise _bad(f"ops is not a list of 1 to {MAX_OPS}")
    written = {0}
    for i, op in enumerate(p.ops):
        _op(p, i, op, written)
    if p.output not in written:
        raise _bad("no op writes the output buffer")


def _op(p: Program, i: int, op: Op, written: set[int]) -> None:
    where = f"op {i}"
    if not isinstance(op, Op) or op.op not in OPS:
        raise _bad(f"{where} is not one of: {', '.join(OPS)}")
    where = f"op {i} ({op.op})"
    x = _int(op.x, f"{where} x", 0, len(p.buffers) - 1)
    y = _int(op.y, f"{where} y", 1, len(p.buffers) - 1)
    if x not in written:
        raise _bad(f"{where} reads buffer {x} before any op writes it")
    bx, by = p.buffers[x], p.buffers[y]
    used: dict[str, str | int | float | None] = {  # the array names and numbers the op reads
        "w": None,
        "b": None,
        "s": None,
        "c": None,
        "scale": None,
        "zp": None,
        "alpha": None,
    }

    def arr(key: str, dtype: str, shape: tuple[int, ...]) -> None:
        name = getattr(op, key)
        a = p.arrays.get(name) if isinstance(name, str) else None
        if a is None or a.dtype != _DTYPES[dtype] or tuple(a.shape) != shape:
            raise _bad(f"{where} {key} is not a {dtype} array of shape {list(shape)}")
        used[key] = name

    if op.op == "dense_f32":
        _kinds(where, bx, by, "f32", "f32")
        arr("w", "f32", (bx.size, by.size))
        arr("b", "f32", (by.size,))
    elif op.op == "dense_i8":
        _kinds(where, bx, by, "i8", by.kind)
        arr("w", "i8", (by.size, bx.size))
        arr("b", "i32", (by.size,))
        arr("s", "f32", (by.size,))
        if by.kind == "i8":
            used["zp"] = _int(op.zp, f"{where} zp", -128, 127)
        w, b = p.arrays[str(op.w)].astype(np.int64), p.arrays[str(op.b)].astype(np.int64)
        if np.any(np.abs(b) + 255 * np.abs(w).sum(axis=1) >= 2**31):
            raise _bad(f"{where}'s int32 accumulator could overflow")
        if x == y:
            raise _bad(f"{where} writes the buffer it reads")
    elif op.op in ("quantize", "dequantize"):
        _kinds(where, bx, by, *(("f32", "i8") if op.op == "quantize" else ("i8", "f32")))
        if bx.size != by.size:
            raise _bad(f"{where} maps {bx.size} values to {by.size}")
        used["scale"] = _float(op.scale, f"{where} scale", positive=True)
        used["zp"] = _int(op.zp, f"{where} zp", -128, 127)
    else:
        _kinds(where, bx, by, "f32", "f32")
        if bx.size != by.size:
            raise _bad(f"{where} maps {bx.size} values to {by.size}")
        if op.op in ("elu", "leaky_relu"):
            used["alpha"] = _float(op.alpha, f"{where} alpha")
        if op.op == "clip":
            lo = None if op.lo is None else _float(op.lo, f"{where} lo")
            hi = None if op.hi is None else _float(op.hi, f"{where} hi")
            if lo is not None and hi is not None and lo > hi:
                raise _bad(f"{where} lo {lo} is above hi {hi}")
        elif op.lo is not None or op.hi is not None:
            raise _bad(f"{where} has lo/hi")
        if op.op in BINARY:
            name = op.c
            a = p.arrays.get(name) if isinstance(name, str) else None
            if a is None or a.dtype != np.float32 or a.ndim != 1 or a.size not in (1, by.size):
                raise _bad(f"{where} c is not a float32 array of 1 or {by.size} values")
            used["c"] = name
    for key, value in used.items():
        if value is None and getattr(op, key) is not None:
            raise _bad(f"{where} has a {key} it does not use")
    written.add(y)


def _kinds(where: str, bx: Buffer, by: Buffer, kx: str, ky: str) -> None:
    if bx.kind != kx or by.kind != ky:
        raise _bad(f"{where} maps a {bx.kind} buffer to a {by.kind} one, not {kx} to {ky}")


def from_meta(meta: Any, arrays: Mapping[str, np.ndarray]) -> Program:
    """The program a C file's metadata line describes, with the arrays read from the same file."""
    if not isinstance(meta, dict) or meta.get("version") != PROGRAM_VERSION:
        raise _bad(f"metadata is not a version-{PROGRAM_VERSION} program")
    try:
        declared = meta["arrays"]
        if not isinstance(declared, dict) or set(declared) != set(arrays):
            raise _bad("the arrays declared and the arrays defined differ")
        shaped = {}
        for k, (dtype, shape) in declared.items():
            a = arrays[k]
            if dtype not in _DTYPES or a.dtype != _DTYPES[dtype]:
                raise _bad(f"array {str(k)[:40]} is declared {str(dtype)[:8]} but defined {a.dtype}")
            if not isinstance(shape, list) or not 1 <= len(shape) <= 2 or math.prod(shape) != a.size:
                raise _bad(f"array {str(k)[:40]}'s shape does not fit its {a.size} values")
            shaped[k] = a.reshape([_int(s, "array dimension", 1, MAX_ARRAY) for s in shape])
        buffers = tuple(Buffer(str(k), s) for k, s in meta["buffers"])
        ops = tuple(Op(**o) for o in meta["ops"])
        return Program(
            name=meta["name"],
            precision=meta["precision"],
            header=meta["header"],
            obs_name=meta["obs_name"],
            action_name=meta["action_name"],
            discrete=meta["discrete"],
            buffers=buffers,
            ops=ops,
            output=meta["output"],
            arrays=shaped,
            source=meta["source"],
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise _bad(f"malformed metadata ({type(e).__name__}: {str(e)[:80]})") from None
