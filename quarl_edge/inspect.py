"""`quarl-edge inspect POLICY`: what an importer detected in a policy and what an export will make of
it, before any export (source format, algorithm, spaces, layers, recurrent state, normalization, masks)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from torch import nn

from quarl_edge.exporters.base import quantized_layers
from quarl_edge.policy.algos import LAYOUTS
from quarl_edge.policy.importers import detect
from quarl_edge.policy.load import load_policy
from quarl_edge.policy.net import Policy
from quarl_edge.runtimes.envs import DICT_OBS
from quarl_edge.runtimes.modelio import KEY_KINDS
from quarl_edge.runtimes.schema import JSONObject
from quarl_edge.runtimes.spec import SpaceSpec, WrapperConfig
from quarl_edge.typed import integer, opt_text, text


def _shape(v: tuple[int, ...], name: str) -> None:
    for i, d in enumerate(v):
        integer(d, f"{name}[{i}]")


@dataclass(frozen=True)
class ObservationKey:
    """One entry of a Dict observation, in the order the entries are flattened."""

    key: str
    shape: tuple[int, ...]
    dtype: str | None
    kind: str
    """vector, image_hwc or image_chw"""

    def __post_init__(self) -> None:
        text(self.key, "observation key")
        _shape(self.shape, f"observation key {self.key!r} shape")
        opt_text(self.dtype, f"observation key {self.key!r} dtype")
        if self.kind not in KEY_KINDS:
            raise ValueError(f"observation key {self.key!r}: kind {str(self.kind)[:40]!r} is not one of "
                             f"{', '.join(KEY_KINDS)}")  # fmt: skip

    def to_dict(self) -> JSONObject:
        return {"key": self.key, "shape": list(self.shape), "dtype": self.dtype, "kind": self.kind}


@dataclass(frozen=True)
class RecurrentState:
    """A recurrent state carried between steps: the graph's input, the output that feeds it next step."""

    name: str
    output: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        text(self.name, "recurrent state name")
        text(self.output, f"recurrent state {self.name!r} output")
        _shape(self.shape, f"recurrent state {self.name!r} shape")

    def to_dict(self) -> JSONObject:
        return {"name": self.name, "output": self.output, "shape": list(self.shape)}


@dataclass(frozen=True)
class Layer:
    name: str
    """module path, as `export --float-layers` and tune's per-layer search name it"""
    kind: str
    shape: tuple[int, ...]
    """weight shape (out, in) / (out, in, kh, kw)"""
    int8_by_default: bool
    """quantized by a default int8 export (the first and last layers of a vector policy stay float)"""


@dataclass(frozen=True)
class Inspection:
    path: str
    source: str
    """the importer that read it (checkpoint, sb3, sb3-contrib, rl-zoo-folder, rsl_rl, onnx)"""
    algo: str
    library: str | None
    env_id: str
    env_from: str | None
    """where the env id was found (--env, file name, args.yml, calibration file metadata, the checkpoint)"""
    observation_space: SpaceSpec
    """what the model takes (a Dict observation flattened, see observation_keys)"""
    observation_keys: tuple[ObservationKey, ...]
    """a Dict observation's entries, in the order they are flattened; () otherwise"""
    action_space: SpaceSpec
    model: str
    layers: tuple[Layer, ...]
    activation: str
    head: str
    normalization: str | None
    """observation normalization baked into the graph (VecNormalize / empirical normalizer statistics)"""
    scale_uint8: bool
    recurrent_state: tuple[RecurrentState, ...]
    """the recurrent state carried between steps (name, shape); () for a feed-forward policy"""
    action_mask: bool
    graph_steps: tuple[str, ...]
    """what the exported graph does around the network, in order: raw observation in, env action out"""

    def to_dict(self) -> JSONObject:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["observation_space"] = _space(self.observation_space)
        d["observation_keys"] = tuple(k.to_dict() for k in self.observation_keys)
        d["action_space"] = _space(self.action_space)
        d["layers"] = [asdict(layer) for layer in self.layers]
        d["recurrent_state"] = tuple(st.to_dict() for st in self.recurrent_state)
        return d


def _space(s: SpaceSpec) -> JSONObject:
    return {k: v for k, v in s.to_dict().items() if v is not None}


def _keys(wrappers: tuple[WrapperConfig, ...]) -> tuple[ObservationKey, ...]:
    w = next((w for w in wrappers if w.name == DICT_OBS), None)
    if w is None:
        return ()
    n = len(w.kwargs["keys"])
    kinds, dtypes = w.kwargs.get("kinds") or ["vector"] * n, w.kwargs.get("dtypes") or [None] * n
    return tuple(
        ObservationKey(k, tuple(sh), dt, kind)
        for k, sh, dt, kind in zip(w.kwargs["keys"], w.kwargs["shapes"], dtypes, kinds, strict=True)
    )


def inspect_policy(path: str | Path, **kwargs: Any) -> Inspection:
    """Load ``path`` as ``export`` would (``kwargs``: load_policy's env_id, algo, vecnormalize, io,
    calibration) and describe it."""
    path = Path(path)
    source = detect(path).name
    policy: Policy = load_policy(path, **kwargs)
    arch, spec = policy.arch, policy.spec
    int8, _ = quantized_layers(policy, float_io_layers=True)
    layers = tuple(
        Layer(name, type(m).__name__, tuple(int(d) for d in m.weight.shape), name in int8)
        for name, m in policy.net.named_modules()
        if isinstance(m, nn.Linear | nn.Conv2d)
    )
    norm = None
    if arch.obs_norm:
        norm = (
            f"observation normalization (clip {arch.norm_clip:g}, eps {arch.norm_eps:g}) baked into the graph"
        )
    layout = LAYOUTS.get(spec.algo)
    return Inspection(
        path=str(path),
        source=source,
        algo=spec.algo,
        library=spec.train.get("library") if isinstance(spec.train.get("library"), str) else None,
        env_id=spec.env.id,
        env_from=str(spec.train.get("env_from") or ("the checkpoint" if source == "checkpoint" else ""))
        or None,
        observation_space=spec.observation_space,
        observation_keys=_keys(spec.env.wrappers),
        action_space=spec.action_space,
        model=arch.model,
        layers=layers,
        activation=arch.activation,
        head=arch.head,
        normalization=norm,
        scale_uint8=arch.scale_uint8,
        recurrent_state=tuple(RecurrentState(st.input, st.output, tuple(st.shape)) for st in spec.state),
        action_mask=bool(layout and layout.mask),
        graph_steps=tuple(spec.graph_steps),
    )


def lines(ins: Inspection) -> list[tuple[str, str]]:
    """(field, value) rows for the terminal."""

    def space(s: SpaceSpec) -> str:
        if s.kind == "discrete":
            return f"Discrete({s.n})"
        return f"{s.kind.capitalize()}{list(s.shape)} {s.dtype}".strip()

    layers = ", ".join(
        f"{la.name} {list(la.shape)}{'' if la.int8_by_default else ' (float)'}" for la in ins.layers
    )
    state = ", ".join(f"{s.name} {list(s.shape)}" for s in ins.recurrent_state) or "none (feed-forward)"
    return [
        ("source", ins.source),
        ("algorithm", ins.algo + (f" ({ins.library})" if ins.library else "")),
        ("environment", ins.env_id + (f" (from {ins.env_from})" if ins.env_from else "")),
        (
            "observation",
            space(ins.observation_space)
            + (
                " <- dict "
                + ", ".join(
                    f"{k.key} {list(k.shape)}" + (f" {k.dtype} {k.kind}" if k.kind != "vector" else "")
                    for k in ins.observation_keys
                )
                if ins.observation_keys
                else ""
            ),
        ),
        ("action", space(ins.action_space)),
        ("model", f"{ins.model}, {ins.activation}, head {ins.head}"),
        ("layers", layers),
        (
            "normalization",
            ins.normalization or ("uint8 frames / 255 in the graph" if ins.scale_uint8 else "none"),
        ),
        ("recurrent state", state),
        ("action mask", "an input at every step" if ins.action_mask else "none"),
        ("exported graph", " -> ".join(["observation", *ins.graph_steps, "action"])),
    ]
