"""What a converted .tflite file states about itself, read back through the LiteRT interpreter
(exporters/tflite.py ``read_back``): its I/O tensors, ops and compute layers, with the quantization of each.

Frozen dataclasses made from the interpreter's detail dicts (``parse``: the edge) and checked when made;
the manifest's ``io`` and ``quantization`` blocks are their JSON (``io()``, ``quantization()``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from quarl_edge.runtimes.schema import JSONObject
from quarl_edge.typed import integer, number, text

INTEGER_DTYPES = ("int8", "uint8")


@dataclass(frozen=True)
class Quantization:
    """A tensor's quantization: one scale and zero point (per tensor), or ``scales`` scales along
    ``axis`` (per channel)."""

    scale: float | None = None
    zero_point: int | None = None
    scales: int | None = None
    axis: int | None = None

    def __post_init__(self) -> None:
        if self.per_channel:
            integer(self.scales, "scales", lo=2)
            integer(self.axis, "axis")
            if self.scale is not None or self.zero_point is not None:
                raise ValueError("a per-channel quantization with a single scale or zero point")
        else:
            number(self.scale, "scale")
            if isinstance(self.zero_point, bool) or not isinstance(self.zero_point, int):
                raise ValueError(f"zero_point is not an integer ({str(self.zero_point)[:40]!r})")

    @property
    def per_channel(self) -> bool:
        return self.scales is not None

    def to_dict(self) -> JSONObject:
        if self.per_channel:
            return {"scales": self.scales, "axis": self.axis}
        return {"scale": self.scale, "zero_point": self.zero_point}

    @classmethod
    def parse(cls, q: dict[str, Any] | None) -> Quantization | None:
        """A detail dict's ``quantization_parameters``; None when it holds no scale (a float tensor)."""
        q = q or {}
        scales = np.asarray(q.get("scales", []))
        if scales.size == 0:
            return None
        zps = np.asarray(q.get("zero_points", []))
        if scales.size == 1:
            return cls(scale=float(scales[0]), zero_point=int(zps[0]) if zps.size else 0)
        return cls(scales=int(scales.size), axis=int(q.get("quantized_dimension", 0)))


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int | None, ...]
    """None: a dimension the file leaves open (the batch)"""
    quantization: Quantization | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):  # the converter may leave a tensor unnamed ("")
            raise ValueError(f"tensor name is not a string ({str(self.name)[:40]!r})")
        text(self.dtype, f"tensor {self.name!r} dtype")
        for i, d in enumerate(self.shape):
            if d is not None:
                integer(d, f"tensor {self.name!r} shape[{i}]")

    def to_dict(self) -> JSONObject:
        d: JSONObject = {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}
        return d if self.quantization is None else {**d, "quantization": self.quantization.to_dict()}

    @classmethod
    def parse(cls, d: dict[str, Any]) -> Tensor:
        """One of the interpreter's tensor details (``get_tensor_details`` and the I/O ones)."""
        shape = d.get("shape_signature", d["shape"])
        return cls(str(d["name"]), np.dtype(d["dtype"]).name, tuple(int(s) if s >= 0 else None for s in shape),
                   Quantization.parse(d.get("quantization_parameters")))  # fmt: skip


@dataclass(frozen=True)
class Layer:
    """A compute op (fully connected, convolution): its weights' type and its input's."""

    layer: str
    """the module path (``mlp.2``) when known, else the converter's tensor name"""
    op: str
    weights: str
    per_channel: bool
    input: str
    input_quantization: Quantization | None = None

    def __post_init__(self) -> None:
        for name in ("layer", "op", "weights", "input"):
            text(getattr(self, name), f"layer {name}")

    @property
    def integer(self) -> bool:
        """Its kernel takes integer input."""
        return self.input in INTEGER_DTYPES

    def to_dict(self) -> JSONObject:
        d: JSONObject = {"layer": self.layer, "op": self.op, "weights": self.weights,
                         "per_channel": self.per_channel, "input": self.input}  # fmt: skip
        if self.input_quantization is not None:
            d["input_quantization"] = self.input_quantization.to_dict()
        return d

    @classmethod
    def of(cls, label: str, op: str, x: Tensor, w: Tensor) -> Layer:
        """The op ``op`` with input ``x`` and weights ``w``."""
        wq = w.quantization
        return cls(label, op, w.dtype, bool(wq and wq.per_channel), x.dtype, x.quantization)


@dataclass(frozen=True)
class ReadBack:
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    ops: tuple[tuple[str, int], ...]
    """every op type of the file and how many times it occurs, in the file's order"""
    layers: tuple[Layer, ...]

    def __post_init__(self) -> None:
        if not self.inputs or not self.outputs:
            raise ValueError("a model without an input or an output")
        for name, count in self.ops:
            text(name, "op name")
            integer(count, f"op {name!r} count", lo=1)

    def ops_dict(self) -> dict[str, int]:
        return dict(self.ops)

    def layers_json(self) -> list[JSONObject]:
        return [la.to_dict() for la in self.layers]

    def io(self) -> JSONObject:
        """The manifest's ``io`` block."""
        return {"inputs": [t.to_dict() for t in self.inputs], "outputs": [t.to_dict() for t in self.outputs]}

    def quantization(self) -> JSONObject:
        """What the manifest's ``quantization`` block of a TFLite model takes from the file."""
        return {
            "ops": self.ops_dict(),
            "layers": self.layers_json(),
            "int8_weight_tensors": sum(la.weights == "int8" for la in self.layers),
            "per_channel_weight_tensors": sum(la.per_channel for la in self.layers),
            "integer_layers": [la.layer for la in self.layers if la.integer],
            "float_layers": [la.layer for la in self.layers if not la.integer],
            "input": self.inputs[0].to_dict(),
            "output": self.outputs[0].to_dict(),
        }
