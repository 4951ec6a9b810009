"""The deployable variants tune searches: format x precision x int8 calibration x layers kept in float x
runtime options that change speed (ONNX activation type, per-channel weights), and, measured on the
device, x thread count. Each is one model of the candidates bundle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quarl_edge.runtimes import schema
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.schema import JSONObject
from quarl_edge.tune.config import KINDS

if TYPE_CHECKING:
    from quarl_edge.bundle import Variant

FORMATS = ("onnx", "tflite", "c")
PRECISIONS = ("fp32", "fp16", "int8")
ACTIVATIONS = ("S8S8", "U8S8")
IMPORTED_FORMATS = ("onnx",)
IMPORTED = (
    "an imported ONNX graph (--io): ONNX candidates only (TFLite converts a torch module, and the C "
    "generator is held to the graphs quarl-edge's torch export writes, docs/c.md); no per-layer splits "
    "(ONNX Runtime quantizes every op of a foreign graph it can: there are no layers to keep float); no "
    "per-channel int8 (a DequantizeLinear axis needs opset 13, and Isaac Lab exports opset 11)"
)
"""what tune leaves out for a policy imported as an ONNX graph (policy/onnx_source.py), and why: the
exporters refuse it, would make the default model under another name, or (per-channel weights on an
opset-11 graph) write a graph ONNX Runtime cannot load"""
__all__ = ["KINDS", "Candidate", "grid"]


@dataclass(frozen=True)
class Candidate:
    """An export variant; ``float_layers`` None is the exporter's default split (first/last layer float)."""

    format: str
    precision: str
    method: str = "minmax"
    float_layers: tuple[str, ...] | None = None
    activation: str = "S8S8"
    """ONNX int8 activation type (S8S8 or U8S8); TFLite's integer kernels take int8"""
    per_channel: bool | None = None
    """per-channel weight scales; None: the exporter's default for the model"""
    origin: str = ""
    """how the variant came about (the per-layer search says which layers it kept in float and why)"""

    @property
    def target(self) -> str:
        return f"{self.format}-{self.precision}"

    @property
    def name(self) -> str:
        """The model's name and file stem, safe in shells and file systems (letters, digits, ``. _ -``:
        nothing a shell globs or splits): ``onnx-int8-minmax-u8s8``, ``tflite-int8-minmax-float-mlp.0``.
        The layers kept in float come last, each after a ``-`` (module paths have none), ``-float-none``
        for every layer int8."""
        if self.precision != "int8":
            return self.target
        act = "-u8s8" if self.activation == "U8S8" else ""
        pc = {None: "", True: "-per-channel", False: "-per-tensor"}[self.per_channel]
        layers = "" if self.float_layers is None else "-float-" + ("-".join(self.float_layers) or "none")
        return f"{self.target}-{self.method}{act}{pc}{layers}"

    @property
    def kind(self) -> str:
        if self.precision != "int8":
            return self.precision
        if self.float_layers is not None:
            return "int8-layers"
        return "int8-default" if self.activation == "S8S8" and self.per_channel is None else "int8-options"

    def variant(self) -> Variant:
        # imported here: the exporters pull in torch, and `gate` reads tune.json's candidates without it
        from quarl_edge.bundle import Variant
        from quarl_edge.exporters.base import ExportConfig

        cfg = ExportConfig(calibration_method=self.method, float_layers=self.float_layers,
                           activation_type=self.activation, per_channel=self.per_channel)  # fmt: skip
        return Variant(self.name, self.target, cfg)

    def to_dict(self) -> JSONObject:
        int8 = self.precision == "int8"
        return {"name": self.name, "format": self.format, "precision": self.precision,
                "calibration": self.method if int8 else None,
                "float_layers": list(self.float_layers) if self.float_layers is not None else "default",
                "activation": self.activation if int8 and self.format == "onnx" else None,
                "per_channel": self.per_channel if int8 else None, "kind": self.kind,
                "origin": self.origin}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "candidate") -> Candidate:
        """The candidate a row of tune.json (or tune's cache) describes, each field checked; its stored
        ``name`` must be the one these settings give (a name that says one model and settings that
        make another is refused)."""
        fix = "re-run `quarl-edge tune`"
        fmt, precision = (
            schema.text(d["format"], f"{where} format", fix, 16),
            schema.text(d["precision"], f"{where} precision", fix, 16),
        )
        layers = d.get("float_layers", "default")
        activation = d.get("activation") or "S8S8"
        per_channel = d.get("per_channel")
        if fmt not in FORMATS or precision not in PRECISIONS or activation not in ACTIVATIONS \
                or not (per_channel is None or isinstance(per_channel, bool)):  # fmt: skip
            raise InputError(f"{where} has an unknown format, precision, activation or per_channel", fix)
        c = cls(fmt, precision, schema.text(d.get("calibration") or "minmax", f"{where} calibration", fix, 32),
                None if layers == "default" else schema.strings(layers, f"{where} float_layers", fix),
                activation, per_channel, schema.text(d.get("origin") or "", f"{where} origin", fix))  # fmt: skip
        if d.get("name") is not None and d["name"] != c.name:
            raise InputError(
                f"{where} is named {str(d['name'])[:80]!r} but its settings make {c.name!r}", fix
            )
        return c


def grid(formats: tuple[str, ...], cnn: bool, imported: bool = False) -> list[Candidate]:
    """fp32 and fp16 of each format, int8 of each with every calibration method (default float layers),
    and the runtime options that change an int8 model's kernels: ONNX uint8 activations (U8S8, what ORT
    prefers on x86 without VNNI) and the other weight granularity (per-channel for an MLP, per-tensor for
    a CNN; TFLite per-tensor; not for an ``imported`` ONNX graph: IMPORTED says why); C (exporters/c.py)
    fp32 and int8 for an MLP. The first is the reference every other is compared with."""
    from quarl_edge.exporters.base import CALIBRATION_METHODS  # torch: see Candidate.variant

    out = []
    for fmt in formats:
        if fmt == "c":  # MLPs only; c-int8 is onnx-int8's graph, so one calibration method is enough
            out += [] if cnn else [Candidate(fmt, "fp32"), Candidate(fmt, "int8")]
            continue
        out += [Candidate(fmt, "fp32"), Candidate(fmt, "fp16")]
        out += [Candidate(fmt, "int8", m) for m in CALIBRATION_METHODS]
        if fmt == "onnx":
            out.append(Candidate(fmt, "int8", activation="U8S8"))
            out += [] if imported else [Candidate(fmt, "int8", per_channel=not cnn)]
        else:
            out.append(Candidate(fmt, "int8", per_channel=False))
    return out
