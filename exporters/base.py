"""Exporter registry and the typed export configuration (each default defined once, here)."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from quarl_edge.policy.net import Policy
from quarl_edge.quant.config import QATConfig
from quarl_edge.runtimes.errors import InputError, MissingDependencyError

CALIBRATION_METHODS = ("minmax", "percentile", "entropy")
ACTIVATION_TYPES = ("S8S8", "U8S8")
"""ONNX int8 activations x weights: int8 x int8, or uint8 x int8 (onnxruntime QuantType.QUInt8 activations)"""


@dataclass(frozen=True)
class ExportConfig:
    calibration_method: str = "minmax"
    """activation range estimator for int8: minmax, percentile or entropy"""
    percentile: float = 99.999
    """percentile used by the percentile method"""
    per_channel: bool | None = None
    """per-channel weight scales; None: ONNX on for convolutional models, off for MLPs; TFLite on"""
    max_calibration_samples: int = 2000
    """calibration observations used at most (evenly subsampled)"""
    opset: int = 18
    float_io_layers: bool = True
    """keep the output layer (and, for vector observations, the input layer) in float; see quantized_layers"""
    float_layers: tuple[str, ...] | None = None
    """module paths of the compute layers kept in float in int8 and int4 exports, as compute_layers lists
    them ("mlp.0", "out"; "cnn.0", "cnn_fc.0"); () quantizes every layer. None: each exporter's default
    (int8: float_io_layers decides; int4 and QAT learned ranges: their fixed choice). An explicit tuple
    overrides float_io_layers; unknown names are refused by quantized_layers before calibration"""
    c_prebuilt: tuple[str, ...] = ()
    """machines (aarch64, x86_64, armv7l) to cross-compile a C model's shared object for, shipped in the
    bundle for boards without a C compiler (exporters/c.py)"""
    activation_type: str = "S8S8"
    """ONNX int8/int4 activation type: S8S8 (int8 activations) or U8S8 (uint8 activations, int8 weights).
    TFLite ignores it (its integer kernels take int8 activations; its manifest says so)"""

    def __post_init__(self) -> None:
        if self.calibration_method not in CALIBRATION_METHODS:
            raise InputError(
                f"unknown calibration method {self.calibration_method!r}",
                f"choose one of: {', '.join(CALIBRATION_METHODS)}",
            )
        if not 50.0 < self.percentile <= 100.0:
            raise InputError(f"--percentile must be in (50, 100] (got {self.percentile})", "e.g. 99.999")
        if self.max_calibration_samples < 1:
            raise InputError("--max-calibration-samples must be at least 1", "e.g. 2000")
        if self.activation_type not in ACTIVATION_TYPES:
            raise InputError(
                f"unknown activation type {self.activation_type!r}",
                f"choose one of: {', '.join(ACTIVATION_TYPES)}",
            )
        machines = (self.c_prebuilt,) if isinstance(self.c_prebuilt, str) else tuple(self.c_prebuilt)
        from quarl_edge.runtimes.ccompiler import ZIG_TARGETS

        odd = next((m for m in machines if m not in ZIG_TARGETS), None)
        if odd is not None:
            raise InputError(f"no prebuilt C objects for machine {str(odd)[:32]!r}",
                             f"choose among: {', '.join(ZIG_TARGETS)}")  # fmt: skip
        object.__setattr__(self, "c_prebuilt", tuple(dict.fromkeys(machines)))
        if self.float_layers is not None:
            if isinstance(self.float_layers, str):  # "out" would otherwise read as ("o", "u", "t")
                raise InputError(
                    f"float_layers must be a tuple of layer names, not the string {self.float_layers!r}",
                    f"pass ({self.float_layers!r},)",
                )
            names = tuple(self.float_layers)  # a list is accepted; the frozen config keeps a tuple
            bad = next((n for n in names if not isinstance(n, str) or not n), None)
            if bad is not None:
                raise InputError(
                    f"float_layers holds {bad!r}, not a layer name", "pass module paths, e.g. 'out'"
                )
            twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
            if twice is not None:
                raise InputError(f"float_layers names {twice!r} twice", "name each layer once")
            object.__setattr__(self, "float_layers", names)


def extra_inputs(policy: Policy, batch: int) -> dict[str, torch.Tensor]:
    """The graph's inputs after the observation, in order, as example tensors of ``batch`` rows: the
    action mask of a masked policy (all allowed; the mask acts after the output layer, so calibrating
    with every action allowed sees the same activations as any mask), then the recurrent state
    ([layers, batch, hidden], zeros)."""
    out: dict[str, torch.Tensor] = {}
    if policy.arch.action_mask:
        out["action_mask"] = torch.ones((batch, policy.spec.action_space.logits), dtype=torch.float32)
    for st, zeros in zip(policy.spec.state, policy.zero_state(batch), strict=True):
        out[st.input] = zeros
    return out


def output_names(policy: Policy, action: str) -> list[str]:
    """The graph's outputs in order: the action, then the recurrent state after the step."""
    return [action, *(st.output for st in policy.spec.state)]


def dynamic_shapes(policy: Policy, batch: Any) -> tuple[Any, ...]:
    """torch.export's dynamic_shapes for PolicyNet.forward(obs, *extra): the batch axis of the
    observation, and of each extra input in a tuple (the state's is axis 1: [layers, batch, hidden])."""
    axes = {st.input: st.batch_axis for st in policy.spec.state}
    extra = tuple({axes.get(n, 0): batch} for n in extra_inputs(policy, 1))
    return ({0: batch}, extra) if extra else ({0: batch},)


def compute_layers(policy: Policy) -> list[str]:
    """Module paths of the Linear / Conv2d layers, in the order the exported graphs run them."""
    return [n for n, m in policy.net.named_modules() if isinstance(m, (nn.Linear, nn.Conv2d))]


def quantized_layers(
    policy: Policy, float_io_layers: bool, float_layers: Sequence[str] | None = None
) -> tuple[list[str], list[str]]:
    """(quantized layers, float layers) by module path, in graph order; exporters call it first, before
    any calibration, so an unknown name in ``float_layers`` costs nothing.

    An explicit ``float_layers`` is taken as it is. Otherwise, with ``float_io_layers`` the output layer
    stays in float, and for vector observations the first layer too. Why: a raw vector observation is
    quantized per tensor, so its small-range dimensions lose their resolution (Pendulum: cos/sin in
    [-1, 1] share one int8 scale with a velocity in [-8, 8]); for the shipped Pendulum SAC that alone made
    the ONNX int8 actions differ from fp32 by 26% of the action range on the recorded trace, 1.7% with
    the first and last layers in float. Image inputs (uint8/255) are exactly representable in int8, so a
    CNN's first convolution stays int8. These layers are a small share of the compute. A vector policy
    whose first layer is float keeps float32 input in TFLite; with it int8, the input tensor is int8.
    """
    layers = compute_layers(policy)
    if float_layers is not None:
        unknown = [n for n in float_layers if n not in layers]
        if unknown:
            raise InputError(
                f"unknown layer {unknown[0]!r} in float_layers",
                f"the policy's compute layers are: {', '.join(layers)}",
            )
        keep = [n for n in layers if n in float_layers]
    else:
        keep = []
        if float_io_layers and layers:
            keep.append(layers[-1])
            if not policy.spec.observation_space.is_image and len(layers) > 1:
                keep.insert(0, layers[0])
    return [n for n in layers if n not in keep], keep


@dataclass(frozen=True)
class ExtraFile:
    """A file an exporter wrote beside the model's own (a C header, a prebuilt shared object)."""

    path: Path
    role: str
    """``header`` or ``shared-object`` (runtimes.manifest.FILE_ROLES)"""
    machine: str | None = None
    built_by: str | None = None


@dataclass
class ExportedModel:
    """What an exporter produced; the bundle writer adds name, sha256 and size."""

    file: Path
    format: str
    precision: str
    quantization: dict[str, Any] = field(default_factory=dict)
    io: dict[str, Any] = field(default_factory=dict)
    toolchain: dict[str, str] = field(default_factory=dict)
    """converter, quantizer and the runtime that read the parameters back, with versions"""
    files: list[ExtraFile] = field(default_factory=list)
    """the model's other files, in the same folder as ``file`` (the manifest hashes each)"""


class GraphCache:
    """The fp32 ONNX graph exported for each policy net so far, per opset: every ONNX-based target (fp32,
    fp16, each int8 variant, C) starts from it, copied. Keyed by the live net object, which the cache holds
    (so an id is never another object's while it lives): share one only across exports of nets not changed
    in between. export_bundle makes one per bundle; tune shares one across its bundles and probes of the
    policy it loaded. Never across processes or by content: a module's plain attributes (a flag, the order
    of its parts) shape the graph, and no key over weights and repr sees them."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._graphs: dict[tuple[int, int], tuple[object, Path]] = {}

    def get(self, net: object, opset: int, path: Path) -> bool:
        """Copy the cached graph of ``net`` to ``path``; False when there is none."""
        hit = self._graphs.get((id(net), opset))
        if hit is None or hit[0] is not net or not hit[1].is_file():
            return False
        shutil.copyfile(hit[1], path)
        return True

    def put(self, net: object, opset: int, graph: Path) -> None:
        kept = self._folder / f"fp32-graph-{len(self._graphs)}.onnx"
        shutil.copyfile(graph, kept)
        self._graphs[(id(net), opset)] = (net, kept)


@dataclass(frozen=True)
class ExportContext:
    policy: Policy
    """the policy as trained (a QAT policy keeps its fake quantization in float exports)"""
    calibration: np.ndarray | None  # observations, already subsampled
    config: ExportConfig
    workdir: Path
    graphs: GraphCache | None = None
    """fp32 graphs already exported from these nets (None: each export_fp32 exports afresh)"""
    qat: QATConfig | None = None
    """set for a QAT policy: how it was trained to be quantized"""
    plain: Policy | None = None
    """a QAT policy without fake quantization, its weights on the n-bit grid (quarl_edge.quant.deployable)"""
    learned_ranges: tuple[tuple[float, float] | None, ...] = ()
    """a QAT policy's learned input range of each quantized layer, in layer order"""
    calibration_state: tuple[np.ndarray, ...] = ()
    """a recurrent policy's state at each calibration observation ([N, layers, hidden] each, the torch
    policy run over the recorded episodes), so the recurrent layers calibrate on the states they see"""

    @property
    def quantizable(self) -> Policy:
        """What integer exports quantize: the plain copy of a QAT policy, else the policy itself."""
        return self.plain if self.plain is not None else self.policy


Exporter = Callable[[ExportContext, Path], ExportedModel]
EXPORTERS: dict[str, Exporter] = {}
NEEDS_CALIBRATION: set[str] = set()


@dataclass(frozen=True)
class Requirement:
    """Modules an exporter imports when it runs, and the pip extra that installs them."""

    modules: tuple[str, ...]
    extra: str

    def install_command(self) -> str:
        return f"pip install 'quarl-edge[{self.extra}]'"


REQUIREMENTS: dict[str, Requirement] = {}


def register(
    name: str, *, calibrated: bool = False, requires: Requirement | None = None
) -> Callable[[Exporter], Exporter]:
    def deco(fn: Exporter) -> Exporter:
        EXPORTERS[name] = fn
        if calibrated:
            NEEDS_CALIBRATION.add(name)
        if requires is not None:
            REQUIREMENTS[name] = requires
        return fn

    return deco


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that fails to import, or a blocked import
        return False


def missing_dependency(name: str, module: str, requirement: Requirement) -> MissingDependencyError:
    return MissingDependencyError(
        f"export target {name!r} needs the {requirement.extra} extra ({module!r} is not installed)",
        f"install it with: {requirement.install_command()}",
    )


def reraise_interrupt(e: BaseException) -> None:
    """Converters catch and wrap what they call; a Ctrl-C inside them must stay a Ctrl-C (exit 130),
    not read as "the policy uses an op ... cannot export"."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt) or "KeyboardInterrupt" in type(cur).__name__:
            raise KeyboardInterrupt from None
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    if "KeyboardInterrupt" in str(e):
        raise KeyboardInterrupt from None
