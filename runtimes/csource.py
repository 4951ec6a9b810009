"""A C program (runtimes/cprogram.py) as C99 source: one ``.c`` and one ``.h``, and the ``.c`` read back.

The ``.c`` carries its program's metadata on one comment line and its arrays as C initializers, so
``read_source`` recovers the program from the file alone; ``check_source`` then renders it again and
accepts the file only when it is byte for byte what this writer writes. A bundle's C file is code the
device compiles and runs: that check is what lets it trust the file as data (docs/c.md, trust).

Kernels are written for the auto-vectorizer (checked in the assembly on x86-64 and aarch64, docs/c.md):
restrict pointers, fixed trip counts once inlined, float layers as ``y += x[i] * W[i, :]`` (a loop over
outputs: no reassociated float sums, so no -ffast-math), int8 layers as int32 dot products.
"""

from __future__ import annotations

import json
import re

import numpy as np

from .cprogram import BINARY, FIX, Op, Program, from_meta
from .errors import InputError

META = "// quarl-edge-program: "
PER_LINE = 12
MAX_SOURCE_BYTES = 256 << 20
_CTYPE = {"f32": "float", "i8": "int8_t", "i32": "int32_t"}
_DT = {np.dtype(np.float32): "f32", np.dtype(np.int8): "i8", np.dtype(np.int32): "i32"}
ROUND_MAGIC = "12582912.0f"
"""1.5 * 2**23: adding and subtracting it rounds a float of magnitude below 2**22 to the nearest
integer, ties to even (the current rounding mode, as onnxruntime's cvtps2dq / fcvtns), and vectorizes
where lrintf would not"""


def cfloat(v: float) -> str:
    """A float32 as a C literal that reads back to the same float32 (9 significant digits)."""
    s = format(float(np.float32(v)), ".9g")
    if "e" not in s and "." not in s and "n" not in s:
        s += ".0"
    return s + "f"


def _values(a: np.ndarray) -> str:
    flat = a.reshape(-1)
    items = [cfloat(v) for v in flat.tolist()] if a.dtype == np.float32 else [str(v) for v in flat.tolist()]
    lines = [", ".join(items[i : i + PER_LINE]) for i in range(0, len(items), PER_LINE)]
    return ",\n".join("    " + line for line in lines)


# ---- the kernels: each is emitted only when the program uses it ------------------------------------

_KERNELS = {
    "dense_f32": """\
/* y = b + x W, W stored [in][out]: the inner loop runs over outputs (vectorized across them), so each
 * output's sum keeps the input order, never reassociated (no -ffast-math needed). */
static void qe_dense_f32(const float *restrict x, const float *restrict w, const float *restrict b,
                         float *restrict y, int n_in, int n_out)
{
    for (int j = 0; j < n_out; ++j) y[j] = b[j];
    for (int i = 0; i < n_in; ++i) {
        const float xi = x[i];
        const float *restrict wi = w + (size_t)i * (size_t)n_out;
        for (int j = 0; j < n_out; ++j) y[j] += xi * wi[j];
    }
}
""",
    "dense_i8": """\
/* acc = b + W x in int32 (exact: any order gives the same sum). The inner loop is written in the form
 * each target's vectorizer turns into its dot-product instruction: uint8 x int8 (x + 128, bias bu =
 * b - 128 sum(W)) -> vpdpbusd where AVX-512 VNNI / AVX-VNNI are enabled, int16 x int8 -> pmaddwd on
 * other x86, int8 x int8 -> sdot on ARM with +dotprod (smull/smlal without). */
#if defined(__AVX512VNNI__) || defined(__AVXVNNI__)
#define QE_DOT_U8 1
#elif defined(__x86_64__) || defined(__i386__)
#define QE_DOT_S16 1
#endif
static void qe_dot_i8(const int8_t *restrict x, const int8_t *restrict w, const int32_t *restrict b,
                      const int32_t *restrict bu, int16_t *restrict scratch, int32_t *restrict acc,
                      int n_in, int n_out)
{
#if defined(QE_DOT_U8)
    uint8_t *restrict u = (uint8_t *)scratch;
    for (int i = 0; i < n_in; ++i) u[i] = (uint8_t)((int32_t)x[i] + 128);
    for (int j = 0; j < n_out; ++j) {
        const int8_t *restrict wj = w + (size_t)j * (size_t)n_in;
        int32_t a = 0;
        for (int i = 0; i < n_in; ++i) a += (int32_t)u[i] * (int32_t)wj[i];
        acc[j] = a + bu[j];
    }
    (void)b;
#elif defined(QE_DOT_S16)
    for (int i = 0; i < n_in; ++i) scratch[i] = x[i];
    for (int j = 0; j < n_out; ++j) {
        const int8_t *restrict wj = w + (size_t)j * (size_t)n_in;
        int32_t a = 0;
        for (int i = 0; i < n_in; ++i) a += (int32_t)scratch[i] * (int32_t)wj[i];
        acc[j] = a + b[j];
    }
    (void)bu;
#else
    for (int j = 0; j < n_out; ++j) {
        const int8_t *restrict wj = w + (size_t)j * (size_t)n_in;
        int32_t a = 0;
        for (int i = 0; i < n_in; ++i) a += (int32_t)x[i] * (int32_t)wj[i];
        acc[j] = a + b[j];
    }
    (void)bu;
    (void)scratch;
#endif
}
""",
    "dense_i8_i8": """\
static void qe_requantize(const int32_t *restrict acc, const float *restrict s, int8_t *restrict y,
                          int n, int zp)
{
    const float lo = (float)(-128 - zp), hi = (float)(127 - zp);
    for (int j = 0; j < n; ++j) {
        float v = (float)acc[j] * s[j];
        v = v > lo ? v : lo;
        v = v < hi ? v : hi;
        y[j] = (int8_t)((int32_t)((v + QE_ROUND) - QE_ROUND) + zp);
    }
}
""",
    "dense_i8_f32": """\
static void qe_dequantize_acc(const int32_t *restrict acc, const float *restrict s, float *restrict y, int n)
{
    for (int j = 0; j < n; ++j) y[j] = (float)acc[j] * s[j];
}
""",
    "quantize": """\
static void qe_quantize(const float *restrict x, int8_t *restrict q, int n, float scale, int zp)
{
    const float lo = (float)(-128 - zp), hi = (float)(127 - zp);
    for (int i = 0; i < n; ++i) {
        float v = x[i] / scale;
        v = v > lo ? v : lo; /* NaN -> lo, as onnxruntime's max(v, lo) */
        v = v < hi ? v : hi;
        q[i] = (int8_t)((int32_t)((v + QE_ROUND) - QE_ROUND) + zp);
    }
}
""",
    "dequantize": """\
static void qe_dequantize(const int8_t *restrict q, float *restrict y, int n, float scale, int zp)
{
    for (int i = 0; i < n; ++i) y[i] = (float)((int32_t)q[i] - zp) * scale;
}
""",
    "tanh": """\
/* tanh as onnxruntime's MLAS computes it (Eigen's rational approximation on [-9, 9]): a vectorizable
 * loop, within a few float32 ulps of tanhf, and the same rounding boundaries as the int8 reference. */
static void qe_tanh(const float *x, float *y, int n)
{
    for (int i = 0; i < n; ++i) {
        float v = x[i];
        v = v > -9.0f ? v : -9.0f;
        v = v < 9.0f ? v : 9.0f;
        const float v2 = v * v;
        float p = v2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
        p = p * v2 + -8.60467152213735e-11f;
        p = p * v2 + 5.12229709037114e-08f;
        p = p * v2 + 1.48572235717979e-05f;
        p = p * v2 + 6.37261928875436e-04f;
        p = p * v2 + 4.89352455891786e-03f;
        p = p * v;
        float q = v2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
        q = q * v2 + 2.26843463243900e-03f;
        q = q * v2 + 4.89352518554385e-03f;
        y[i] = p / q;
    }
}
""",
    "relu": """\
static void qe_relu(const float *x, float *y, int n)
{
    for (int i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}
""",
    "sigmoid": """\
static void qe_sigmoid(const float *x, float *y, int n)
{
    for (int i = 0; i < n; ++i) y[i] = 1.0f / (1.0f + expf(-x[i]));
}
""",
    "silu": """\
static void qe_silu(const float *x, float *y, int n)
{
    for (int i = 0; i < n; ++i) y[i] = x[i] / (1.0f + expf(-x[i]));
}
""",
    "elu": """\
static void qe_elu(const float *x, float *y, int n, float alpha)
{
    for (int i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : alpha * expm1f(x[i]);
}
""",
    "leaky_relu": """\
static void qe_leaky_relu(const float *x, float *y, int n, float alpha)
{
    for (int i = 0; i < n; ++i) y[i] = x[i] >= 0.0f ? x[i] : alpha * x[i];
}
""",
    "clip": """\
static void qe_clip(const float *x, float *y, int n, float lo, float hi)
{
    for (int i = 0; i < n; ++i) {
        const float v = x[i] > lo ? x[i] : lo;
        y[i] = v < hi ? v : hi;
    }
}
""",
    "argmax": """\
static int qe_argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return best;
}
""",
}
_BINARY_EXPR = {
    "add": "x[i] + c[{k}]",
    "sub": "x[i] - c[{k}]",
    "mul": "x[i] * c[{k}]",
    "div": "x[i] / c[{k}]",
    "rsub": "c[{k}] - x[i]",
    "rdiv": "c[{k}] / x[i]",
    "max": "x[i] > c[{k}] ? x[i] : c[{k}]",
    "min": "x[i] < c[{k}] ? x[i] : c[{k}]",
}
for _op, _expr in _BINARY_EXPR.items():
    for _suffix, _k in (("", "i"), ("1", "0")):
        _KERNELS[f"{_op}{_suffix}"] = (
            f"static void qe_{_op}{_suffix}(const float *x, const float *restrict c, float *y, int n)\n"
            f"{{\n    for (int i = 0; i < n; ++i) y[i] = {_expr.format(k=_k)};\n}}\n"
        )


def _buf(p: Program, i: int) -> str:
    return "obs" if i == 0 else f"t{i}"


def _call(p: Program, op: Op) -> tuple[list[str], list[str]]:
    """(kernels used, C statements) of one op."""
    x, y = _buf(p, op.x), _buf(p, op.y)
    n = p.buffers[op.y].size
    if op.op == "dense_f32":
        return ["dense_f32"], [f"qe_dense_f32({x}, {op.w}, {op.b}, {y}, {p.buffers[op.x].size}, {n});"]
    if op.op == "dense_i8":
        dot = f"qe_dot_i8({x}, {op.w}, {op.b}, {op.b}_u, scratch, acc, {p.buffers[op.x].size}, {n});"
        if p.buffers[op.y].kind == "i8":
            return ["dense_i8", "dense_i8_i8"], [dot, f"qe_requantize(acc, {op.s}, {y}, {n}, {op.zp});"]
        return ["dense_i8", "dense_i8_f32"], [dot, f"qe_dequantize_acc(acc, {op.s}, {y}, {n});"]
    if op.op in ("quantize", "dequantize"):
        return [op.op], [f"qe_{op.op}({x}, {y}, {n}, {cfloat(op.scale or 0.0)}, {op.zp});"]
    if op.op in ("elu", "leaky_relu"):
        return [op.op], [f"qe_{op.op}({x}, {y}, {n}, {cfloat(op.alpha or 0.0)});"]
    if op.op == "clip":
        lo = "-INFINITY" if op.lo is None else cfloat(op.lo)
        hi = "INFINITY" if op.hi is None else cfloat(op.hi)
        return ["clip"], [f"qe_clip({x}, {y}, {n}, {lo}, {hi});"]
    if op.op in BINARY:
        one = "1" if p.arrays[str(op.c)].size == 1 else ""
        return [op.op + one], [f"qe_{op.op}{one}({x}, {op.c}, {y}, {n});"]
    return [op.op], [f"qe_{op.op}({x}, {y}, {n});"]


def _scratch(p: Program) -> tuple[int, int]:
    """(int32 accumulators, int16 scratch values) that the int8 layers need, at most."""
    dense = [o for o in p.ops if o.op == "dense_i8"]
    return max((p.buffers[o.y].size for o in dense), default=0), max(
        (p.buffers[o.x].size for o in dense), default=0
    )


def stack_bytes(p: Program) -> int:
    """What ``qe_policy_act`` keeps on the stack: its buffers, the int32 accumulators and the scratch."""
    acc, scratch = _scratch(p)
    return sum({"f32": 4, "i8": 1}[b.kind] * b.size for b in p.buffers[1:]) + 4 * acc + 2 * scratch


def derived(p: Program) -> dict[str, np.ndarray]:
    """Arrays the C file holds beside the program's: each int8 layer's bias for uint8 inputs (x + 128),
    ``b - 128 * sum_i W[j, i]``, which the VNNI path adds. read_source skips them; check_source's
    re-rendering holds them to these values."""
    out = {}
    for o in p.ops:
        if o.op == "dense_i8":
            w, b = p.arrays[str(o.w)], p.arrays[str(o.b)]
            out[f"{o.b}_u"] = (b.astype(np.int64) - 128 * w.astype(np.int64).sum(axis=1)).astype(np.int32)
    return out


def _signature(p: Program, batch: bool = False) -> str:
    if batch:
        out = "int *actions" if p.discrete else "float *actions"
        return f"void qe_policy_act_batch(const float *obs, int n, {out})"
    return (
        "int qe_policy_act(const float *obs)"
        if p.discrete
        else "void qe_policy_act(const float *obs, float *action)"
    )


def render_h(p: Program) -> str:
    guard = "QE_POLICY_H"
    kind = (f"#define QE_POLICY_DISCRETE 1\n#define QE_POLICY_N_ACTIONS {p.action_size}\n#define QE_POLICY_ACTION_SIZE 1\n"
            if p.discrete else
            f"#define QE_POLICY_DISCRETE 0\n#define QE_POLICY_ACTION_SIZE {p.action_size}\n")  # fmt: skip
    act = (
        "/* The action index for one observation of QE_POLICY_OBS_SIZE floats. */"
        if p.discrete
        else "/* The action (QE_POLICY_ACTION_SIZE floats) for one observation of QE_POLICY_OBS_SIZE floats. */"
    )
    return f"""\
/* {p.header}: the C API of policy {p.name} ({p.precision}), generated by quarl-edge from {p.source or "its graph"}.
 * C99, no heap, libm only. One model per program or shared object: the function names are fixed
 * (docs/c.md says how to link two). Reentrant: all state is on the caller's stack. */
#ifndef {guard}
#define {guard}

#ifdef __cplusplus
extern "C" {{
#endif

#define QE_POLICY_NAME "{p.name}"
#define QE_POLICY_PRECISION "{p.precision}"
#define QE_POLICY_OBS_NAME "{p.obs_name}"
#define QE_POLICY_ACTION_NAME "{p.action_name}"
#define QE_POLICY_OBS_SIZE {p.obs_size}
{kind}#define QE_POLICY_STACK_BYTES {stack_bytes(p)}

{act}
{_signature(p)};
/* n observations (n * QE_POLICY_OBS_SIZE floats, row after row) -> n actions. */
{_signature(p, batch=True)};
/* Start of an episode. The policy keeps no state (an MLP): nothing to forget, kept for the API. */
void qe_policy_reset(void);

#ifdef __cplusplus
}}
#endif

#endif /* {guard} */
"""


def render_c(p: Program) -> str:
    meta = json.dumps(p.meta(), separators=(",", ":"), allow_nan=False)
    used: list[str] = []
    body: list[str] = []
    for op in p.ops:
        kernels, lines = _call(p, op)
        used += [k for k in kernels if k not in used]
        body += lines
    if p.discrete:
        used.append("argmax")
    decls = [f"{_CTYPE[b.kind]} t{i}[{b.size}];" for i, b in enumerate(p.buffers) if i > 0]
    acc, scratch = _scratch(p)
    if acc:
        decls += [f"int32_t acc[{acc}];", f"int16_t scratch[{scratch}];"]
    arrays = "".join(
        f"static const {_CTYPE[_DT[a.dtype]]} {k}[{a.size}] = {{\n{_values(a)}\n}};\n"
        for k, a in {**p.arrays, **derived(p)}.items()
    )
    out = _buf(p, p.output)
    indent = "\n    "
    if p.discrete:
        act = f"{_signature(p)}\n{{\n    {indent.join(decls)}\n    {indent.join(body)}\n    return qe_argmax({out}, {p.action_size});\n}}\n"
        batch = f"{_signature(p, True)}\n{{\n    for (int k = 0; k < n; ++k) actions[k] = qe_policy_act(obs + (size_t)k * {p.obs_size});\n}}\n"
    else:
        copy = f"for (int i = 0; i < {p.action_size}; ++i) action[i] = {out}[i];"
        act = f"{_signature(p)}\n{{\n    {indent.join(decls)}\n    {indent.join(body)}\n    {copy}\n}}\n"
        batch = f"{_signature(p, True)}\n{{\n    for (int k = 0; k < n; ++k) qe_policy_act(obs + (size_t)k * {p.obs_size}, actions + (size_t)k * {p.action_size});\n}}\n"
    code = "\n".join(_KERNELS[k] for k in used)
    return f"""\
/* policy {p.name} ({p.precision}) as dependency-free C99, generated by quarl-edge from {p.source or "its graph"}.
 * Do not edit: quarl-edge compiles this file only when it is exactly what its generator writes for the
 * program on the next line (docs/c.md). Build: cc -O3 -std=c99 -c {p.header[:-2]}.c (link with -lm). */
{META}{meta}
#include "{p.header}"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define QE_ROUND {ROUND_MAGIC}

{arrays}
{code}
{act}
{batch}
void qe_policy_reset(void)
{{
}}
"""


# ---- reading a C file back -------------------------------------------------------------------------

_ARRAY = re.compile(r"static const (float|int8_t|int32_t) (qe_[a-z0-9_]+)\[(\d+)\] = \{\n(.*?)\n\};\n", re.S)
_FROM_C = {"float": np.float32, "int8_t": np.int8, "int32_t": np.int32}


def read_source(text: str, what: str) -> Program:
    """The program a generated C file holds (metadata line + arrays), validated; InputError if there
    is none."""
    line = next((s for s in text.splitlines()[:8] if s.startswith(META)), None)
    if line is None:
        raise InputError(f"{what} is not a C file quarl-edge generated (no program metadata)", FIX)
    try:
        meta = json.loads(line[len(META) :])
    except (ValueError, RecursionError):
        raise InputError(f"{what}'s program metadata is not JSON", FIX) from None
    arrays: dict[str, np.ndarray] = {}
    for ctype, name, count, values in _ARRAY.findall(text):
        if name in arrays:
            raise InputError(f"{what} defines the array {name} twice", FIX)
        try:
            tokens = [t.strip() for t in values.replace("\n", "").split(",")]
            if ctype == "float":
                a = np.array([float(t[:-1]) for t in tokens if t.endswith("f")], np.float64)
            else:
                a = np.array([int(t) for t in tokens], np.int64)
        except ValueError:
            raise InputError(f"{what}: array {name} holds something other than numbers", FIX) from None
        if len(a) != len(tokens) or len(a) != int(count):
            raise InputError(f"{what}: array {name} holds {len(tokens)} values, not {count}", FIX)
        arrays[name] = _exact(a, _FROM_C[ctype], name, what)
    return from_meta(meta, {k: v for k, v in arrays.items() if not k.endswith("_u")})


def _exact(a: np.ndarray, dtype: type, name: str, what: str) -> np.ndarray:
    """``a`` as ``dtype``: floats rounded to float32 (check_source's re-rendering then holds each literal
    to the one this writer prints for that float32), integers only when they fit."""
    with np.errstate(over="ignore", invalid="ignore"):
        out: np.ndarray = a.astype(dtype)
    if dtype is np.float32:
        if not np.all(np.isfinite(out)):
            raise InputError(f"{what}: array {name} holds values outside float32's range", FIX)
        return out
    info = np.iinfo(dtype)
    if a.min() < info.min or a.max() > info.max:
        raise InputError(f"{what}: array {name} holds values that are not {np.dtype(dtype).name}", FIX)
    return out


def check_source(text: str, what: str) -> Program:
    """The program of a C file that is exactly what ``render_c`` writes for it (InputError otherwise)."""
    if len(text) > MAX_SOURCE_BYTES:
        raise InputError(f"{what} is larger than {MAX_SOURCE_BYTES >> 20} MiB", FIX)
    program = read_source(text, what)
    if render_c(program) != text:
        raise InputError(
            f"{what} is not what quarl-edge's C generator writes for its own program (edited?)",
            "the runtime compiles only generated C: " + FIX,
        )
    return program
