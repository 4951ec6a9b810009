"""ONNX Runtime adapter (CPU execution provider by default, explicit thread count) and its session
options (``OrtOptions``: graph optimization level, providers, session config entries)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from .adapters import register
from .errors import InputError, IntegrityError, MissingDependencyError

GRAPH_OPTIMIZATION_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",
    "all": "ORT_ENABLE_ALL",
}
OPTIONS_FIX = "see docs/runtime.md (session options)"


@dataclass(frozen=True)
class OrtOptions:
    """ONNX Runtime session options for ``load_policy(..., session_options=...)``. The thread count is
    ``load_policy``'s ``threads`` (bounded by the device's cores), not an option here."""

    graph_optimization_level: str = "all"
    """``disable``, ``basic``, ``extended``, ``layout`` or ``all`` (ORT's ``GraphOptimizationLevel``)"""
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    """execution providers in order of preference; each must be one this onnxruntime has"""
    config: Mapping[str, str] = field(default_factory=dict)
    """session config entries passed as given (``SessionOptions.add_session_config_entry``), e.g.
    ``{"session.intra_op.allow_spinning": "0"}``: ORT's own keys, not checked by quarl-edge"""

    def __post_init__(self) -> None:
        if self.graph_optimization_level not in GRAPH_OPTIMIZATION_LEVELS:
            raise InputError(f"graph_optimization_level {str(self.graph_optimization_level)[:40]!r} is not one of "
                             f"{', '.join(GRAPH_OPTIMIZATION_LEVELS)}", "e.g. graph_optimization_level='all'")  # fmt: skip
        providers = self.providers
        if isinstance(providers, str) or not isinstance(providers, tuple | list) or not providers or not all(
            isinstance(p, str) and 0 < len(p) <= 64 for p in providers
        ):  # fmt: skip
            raise InputError("providers is not a non-empty list of provider names",
                             "e.g. providers=('CPUExecutionProvider',)")  # fmt: skip
        object.__setattr__(self, "providers", tuple(providers))
        config = self.config
        if not isinstance(config, Mapping) or len(config) > 64 or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 256 and len(v) <= 256 for k, v in config.items()
        ):  # fmt: skip
            raise InputError("session config is not a mapping of at most 64 string keys to string values",
                             "e.g. config={'session.intra_op.allow_spinning': '0'}")  # fmt: skip
        object.__setattr__(self, "config", dict(config))

    @classmethod
    def of(cls, options: OrtOptions | Mapping[str, Any] | None) -> OrtOptions | None:
        """``options`` as OrtOptions: a dict of its fields is accepted; an unknown key is refused."""
        if options is None or isinstance(options, OrtOptions):
            return options
        if not isinstance(options, Mapping):
            raise InputError(f"session_options of type {type(options).__name__} is not OrtOptions or a dict",
                             "e.g. session_options=OrtOptions(graph_optimization_level='basic') or "
                             "session_options={'graph_optimization_level': 'basic'}")  # fmt: skip
        known = [f.name for f in fields(cls)]
        unknown = [str(k)[:40] for k in options if k not in known]
        if unknown:
            raise InputError(f"unknown session option {unknown[0]!r}", f"known: {', '.join(known)}")
        return cls(**options)


_ORT_TYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(uint8)": np.uint8,
    "tensor(int8)": np.int8,
    "tensor(int64)": np.int64,
    "tensor(double)": np.float64,
}


def precise_int8(opts: object) -> None:
    """Exact int8 products on x86 CPUs without VNNI (AVX2, AVX-512 without VNNI, SSE4.1): ORT's fast u8s8
    kernels there sum pairs of products into int16 and saturate. ORT applies the option only on such
    CPUs (a no-op on VNNI x86 and on ARM). Measured on an AVX2-only EPYC, zoo Pong DQN int8 vs torch fp32
    on 400 recorded frames: 0.825 action agreement without it, 0.920 with it -- the figure a VNNI host
    gives without it -- at 1,995 vs 1,942 us per call."""
    opts.add_session_config_entry("session.x64quantprecision", "1")  # type: ignore[attr-defined]


class OnnxSession:
    format = "onnx"

    def __init__(self, path: Path, threads: int = 1, options: OrtOptions | None = None) -> None:
        options = options or OrtOptions()
        try:
            import onnxruntime as ort
        except ImportError:
            raise MissingDependencyError(
                "onnxruntime is not installed", "install it with: pip install onnxruntime"
            ) from None
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        level = getattr(
            ort.GraphOptimizationLevel, GRAPH_OPTIMIZATION_LEVELS[options.graph_optimization_level], None
        )
        if level is None:
            raise InputError(f"onnxruntime {ort.__version__} has no graph optimization level "
                             f"{options.graph_optimization_level!r}", "use 'all', 'extended', 'basic' or 'disable'")  # fmt: skip
        opts.graph_optimization_level = level
        opts.log_severity_level = 3
        precise_int8(opts)
        for key, value in options.config.items():
            opts.add_session_config_entry(key, value)
        available = ort.get_available_providers()
        missing = [p for p in options.providers if p not in available]
        if missing:
            raise InputError(f"onnxruntime {ort.__version__} here has no provider {missing[0][:64]!r}",
                             f"providers it has: {', '.join(available)}")  # fmt: skip
        try:
            # from the bytes, not the path: with no model path ORT cannot follow external-data references
            # to files the manifest does not hash, so a model runs only what was verified
            self._sess = ort.InferenceSession(path.read_bytes(), opts, providers=list(options.providers))
        except Exception as e:  # ORT raises its own pybind exception types for bad files
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise IntegrityError(
                f"{path.name!r} is not a loadable ONNX model ({first[:200]})", "re-export the bundle"
            ) from None
        inp = self._sess.get_inputs()[0]
        self._input_name = inp.name
        self._output_name = self._sess.get_outputs()[0].name
        self._inputs = [
            (i.name, np.dtype(_ORT_TYPES.get(i.type, np.float32))) for i in self._sess.get_inputs()
        ]
        self._outputs = [o.name for o in self._sess.get_outputs()]
        self.input_shape = tuple(d if isinstance(d, int) else None for d in inp.shape)
        self.input_dtype = np.dtype(_ORT_TYPES.get(inp.type, np.float32))
        self.runtime = f"onnxruntime {ort.__version__}"

    def run(self, obs: np.ndarray) -> np.ndarray:
        feed = {self._input_name: np.ascontiguousarray(obs, dtype=self.input_dtype)}
        return self._sess.run([self._output_name], feed)[0]

    def run_io(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        if len(inputs) != len(self._inputs):
            raise InputError(f"the model takes {len(self._inputs)} inputs, {len(inputs)} were given",
                             "re-export the bundle")  # fmt: skip
        feed = {n: np.ascontiguousarray(x, dtype=t) for (n, t), x in zip(self._inputs, inputs, strict=True)}
        return list(self._sess.run(self._outputs, feed))


@register("onnx")
def _open(path: Path, threads: int, options: Any = None) -> OnnxSession:
    return OnnxSession(path, threads, options)
