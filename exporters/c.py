"""torch -> ONNX -> dependency-free C99: ``c-fp32`` from the fp32 graph, ``c-int8`` from the int8 QDQ
graph that ``onnx-int8`` writes (same calibration, scales, zero points and float layers).

One ``.c`` (the model file) and its ``.h`` per model. The C comes from the ONNX graph
(exporters/c_onnx.py), so the C model computes what ONNX Runtime computes: c-fp32 within float rounding
of onnx-fp32, c-int8 with ONNX Runtime's integer arithmetic (docs/c.md says where it can differ).
Unsupported graphs (a CNN's Conv, ...) are refused from the fp32 graph, before any calibration.
"""

from __future__ import annotations

from dataclasses import replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

from quarl_edge.exporters.base import EXPORTERS, ExportContext, ExportedModel, ExtraFile, register
from quarl_edge.exporters.c_onnx import from_onnx
from quarl_edge.exporters.onnx import export_fp32, graph_io
from quarl_edge.runtimes import ccompiler
from quarl_edge.runtimes.cprogram import Program
from quarl_edge.runtimes.csource import render_c, render_h, stack_bytes
from quarl_edge.runtimes.fsutil import atomic_write_bytes

GENERATOR = "quarl-edge C generator"


def header_path(c_file: Path) -> Path:
    """The header written beside a model's C file (``policy.int8.c`` -> ``policy.int8.h``)."""
    return c_file.with_suffix(".h")


def _write(ctx: ExportContext, program: Program, path: Path) -> list[ExtraFile]:
    """The .c and .h, and a shared object cross-compiled for each machine of ``config.c_prebuilt``
    (``policy.int8.aarch64.so``): the architecture's baseline flags, since the host does not know the
    board's CPU (a board that compiles for itself gets its own features)."""
    header, text = render_h(program), render_c(program)
    atomic_write_bytes(header_path(path), header.encode())
    atomic_write_bytes(path, text.encode())
    files = [ExtraFile(header_path(path), "header")]
    for machine in ctx.config.c_prebuilt:
        compiler = ccompiler.cross_compiler(machine)
        out = path.with_suffix(f".{machine}.so")
        ccompiler.compile_shared(text, header, program.header, compiler, (), out)
        files.append(
            ExtraFile(out, "shared-object", machine, f"{compiler.name} {' '.join(ccompiler.BASE_FLAGS)}")
        )
    return files


def _summary(program: Program) -> dict[str, Any]:
    layers = [o for o in program.ops if o.op in ("dense_f32", "dense_i8")]
    return {
        "ops": [o.op for o in program.ops],
        "int8_layers": sum(o.op == "dense_i8" for o in layers),
        "float_layers": sum(o.op == "dense_f32" for o in layers),
        "stack_bytes": stack_bytes(program),
        "header": program.header,
        "api": "int qe_policy_act(const float *obs)"
        if program.discrete
        else "void qe_policy_act(const float *obs, float *action)",
    }


def _cross_compilers(ctx: ExportContext) -> None:
    """A missing cross compiler is named before any export work."""
    for machine in ctx.config.c_prebuilt:
        ccompiler.cross_compiler(machine)


def _program(ctx: ExportContext, onnx_file: Path, target: str, path: Path) -> Program:
    return from_onnx(onnx_file, target, ctx.policy.spec.name, header_path(path).name)


@register("c-fp32")
def _export_c_fp32(ctx: ExportContext, path: Path) -> ExportedModel:
    _cross_compilers(ctx)
    src = export_fp32(ctx, ctx.workdir / "c-fp32-src.onnx")
    program = _program(ctx, src, "c-fp32", path)
    files = _write(ctx, program, path)
    quant = {"scheme": "none", "c": _summary(program)}
    tools = {"converter": f"torch.onnx dynamo exporter -> {GENERATOR}", "onnx": version("onnx")}
    return ExportedModel(path, "c", "fp32", quant, graph_io(src).to_dict(), tools, files)


@register("c-int8", calibrated=True)
def _export_c_int8(ctx: ExportContext, path: Path) -> ExportedModel:
    # the fp32 graph first: a graph the C generator cannot run is refused before the calibration
    _cross_compilers(ctx)
    plain = replace(ctx, policy=ctx.quantizable)
    _program(plain, export_fp32(plain, ctx.workdir / "c-int8-check.onnx"), "c-int8", path)
    onnx_model = EXPORTERS["onnx-int8"](ctx, ctx.workdir / "c-int8-src.onnx")
    program = _program(ctx, onnx_model.file, "c-int8", path)
    files = _write(ctx, program, path)
    quant = {**onnx_model.quantization, "generated_from": "the onnx-int8 QDQ graph", "c": _summary(program)}
    tools = {
        **onnx_model.toolchain,
        "converter": f"{onnx_model.toolchain.get('converter', 'torch.onnx')} -> {GENERATOR}",
    }
    return ExportedModel(path, "c", "int8", quant, onnx_model.io, tools, files)
