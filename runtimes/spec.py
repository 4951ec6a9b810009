"""PolicySpec: what a policy expects and produces, as plain JSON-able data.

It travels inside checkpoints and bundle manifests so the device side can rebuild the environment and
feed the model without the trainer's code. Everything here is numpy-free and torch-free.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from . import schema
from .errors import InputError
from .schema import JSONObject

FIX = "re-export the policy"

SCHEMA_VERSION = 1

SpaceKind = Literal["box", "discrete", "multi_discrete", "multi_binary"]
SPACE_KINDS = ("box", "discrete", "multi_discrete", "multi_binary")


def _is_bound(x: Any) -> bool:
    """A Box bound as stored: a number, or the text of one ("inf", "-inf"); never NaN."""
    if isinstance(x, bool) or not isinstance(x, int | float | str):
        return False
    try:
        return not math.isnan(float(x))
    except (ValueError, OverflowError):
        return False


@dataclass(frozen=True)
class SpaceSpec:
    """A gymnasium Box, Discrete, MultiDiscrete or MultiBinary space. Box bounds are a scalar when
    uniform, else a flat list."""

    kind: SpaceKind
    shape: tuple[int, ...]
    dtype: str
    low: float | str | list[float | str] | None = None  # "inf"/"-inf" for unbounded dimensions
    high: float | str | list[float | str] | None = None
    n: int | None = None
    nvec: tuple[int, ...] | None = None
    """MultiDiscrete: the number of choices of each component (flattened)"""

    @property
    def is_discrete(self) -> bool:
        return self.kind == "discrete"

    @property
    def is_integer(self) -> bool:
        """Actions are integers compared exactly, per component (Discrete, MultiDiscrete, MultiBinary)."""
        return self.kind != "box"

    @property
    def logits(self) -> int:
        """The network outputs an integer action space takes (one per choice of every component)."""
        if self.kind == "discrete":
            return int(self.n or 0)
        if self.kind == "multi_discrete":
            return int(sum(self.nvec or ()))
        return int(math.prod(self.shape))

    @property
    def is_image(self) -> bool:
        return self.kind == "box" and self.dtype == "uint8" and len(self.shape) == 3

    def to_dict(self) -> JSONObject:
        d = asdict(self)
        d["shape"] = list(self.shape)
        if self.nvec is None:
            del d["nvec"]
        else:
            d["nvec"] = list(self.nvec)
        return d

    @classmethod
    def from_dict(cls, d: JSONObject) -> SpaceSpec:
        d = schema.obj(d, "space description", FIX)
        try:
            kind = d["kind"]
            if kind not in SPACE_KINDS:
                raise InputError(f"unsupported space kind {str(kind)[:40]!r}",
                                 f"supported: {', '.join(SPACE_KINDS)}")  # fmt: skip
            dims = schema.shape(d["shape"], "space shape", FIX)
            n = None if d.get("n") is None else schema.integer(d["n"], "space n", FIX, 1, schema.MAX_ELEMENTS)
            if kind == "discrete" and n is None:
                raise InputError("a discrete space without n (its number of actions)", FIX)
            size = math.prod(dims)
            nvec = None
            if kind == "multi_discrete":
                raw = d.get("nvec")
                if not isinstance(raw, list) or len(raw) > 4096:
                    raise InputError("a MultiDiscrete space without nvec (a list of choice counts)", FIX)
                nvec = tuple(schema.integer(v, "space nvec", FIX, 1, 65_536) for v in raw)
                if math.prod(dims) != len(nvec):
                    raise InputError("a MultiDiscrete space whose nvec does not fit its shape", FIX)
            for bound in ("low", "high"):
                v = d.get(bound)
                items = v if isinstance(v, list) else [v]
                if v is not None and (len(items) not in (1, size) or not all(map(_is_bound, items))):
                    raise InputError(
                        f"space {bound} is not a number or a list of {size} numbers ('inf'/'-inf' allowed)",
                        FIX,
                    )
            return cls(kind=kind, shape=dims, dtype=schema.text(d["dtype"], "space dtype", FIX, 16),
                       low=d.get("low"), high=d.get("high"), n=n, nvec=nvec)  # fmt: skip
        except schema.MALFORMED as e:
            raise InputError(
                f"malformed space description ({type(e).__name__}: {str(e)[:120]})", FIX
            ) from None


@dataclass(frozen=True)
class WrapperConfig:
    """One gymnasium wrapper applied after ``gymnasium.make``; names are resolved in runtimes.envs."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EnvConfig:
    """How to build the environment: ``gymnasium.make(id, **make_kwargs)`` then the wrappers in order.

    Frame preprocessing that cannot live in the graph (Atari frames, frame stacking) is described here
    and implemented once in runtimes.envs, shared by host and device.
    """

    id: str
    make_kwargs: dict[str, Any] = field(default_factory=dict)
    wrappers: tuple[WrapperConfig, ...] = ()
    family: str = "gym"
    imports: tuple[str, ...] = ()

    def to_dict(self) -> JSONObject:
        return {
            "id": self.id,
            "family": self.family,
            "make_kwargs": dict(self.make_kwargs),
            "wrappers": [{"name": w.name, "kwargs": dict(w.kwargs)} for w in self.wrappers],
            "imports": list(self.imports),
        }

    @classmethod
    def from_dict(cls, d: JSONObject) -> EnvConfig:
        d = schema.obj(d, "environment description", FIX)
        try:
            wrappers = d.get("wrappers", [])
            if not isinstance(wrappers, list) or len(wrappers) > 64:
                raise InputError("environment wrappers is not a list of at most 64", FIX)
            return cls(
                id=schema.text(d["id"], "environment id", FIX, 256),
                make_kwargs=dict(schema.obj(d.get("make_kwargs", {}), "environment make_kwargs", FIX)),
                wrappers=tuple(
                    WrapperConfig(
                        schema.text(w["name"], "wrapper name", FIX, 64),
                        dict(schema.obj(w.get("kwargs", {}), "wrapper kwargs", FIX)),
                    )
                    for w in (schema.obj(w, "wrapper", FIX) for w in wrappers)
                ),  # fmt: skip
                family=schema.text(d.get("family", "gym"), "environment family", FIX, 32),
                imports=schema.strings(d.get("imports", []), "environment imports", FIX, 16),
            )
        except schema.MALFORMED as e:
            raise InputError(
                f"malformed environment description ({type(e).__name__}: {str(e)[:120]})", FIX
            ) from None


@dataclass(frozen=True)
class StateSpec:
    """One recurrent state tensor carried between steps: fed as graph input ``input``, read back from
    graph output ``output`` after every step, zeros at every episode start (``policy.reset()``)."""

    input: str
    output: str
    shape: tuple[int, ...]
    """its shape for one environment, the batch axis of size 1 (e.g. [layers, 1, hidden])"""
    batch_axis: int = 1

    def to_dict(self) -> JSONObject:
        return {"input": self.input, "output": self.output, "shape": list(self.shape),
                "batch_axis": self.batch_axis, "reset": "zeros at every episode start"}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Any) -> StateSpec:
        d = schema.obj(d, "policy spec state", FIX)
        shape = schema.shape(d.get("shape"), "policy spec state shape", FIX)
        axis = schema.integer(d.get("batch_axis", 1), "policy spec state batch_axis", FIX, 0, 7)
        if axis >= len(shape) or shape[axis] != 1:
            raise InputError("policy spec state has no batch axis of size 1", FIX)
        return cls(schema.text(d.get("input"), "state input", FIX, 128),
                   schema.text(d.get("output"), "state output", FIX, 128), shape, axis)  # fmt: skip


@dataclass(frozen=True)
class PolicySpec:
    """Spaces, preprocessing and postprocessing of a deterministic policy.

    ``graph_steps`` lists what the model graph itself does around the network, in order, e.g.
    ``["scale_uint8", "nature_cnn", "argmax"]`` or ``["obs_normalize", "mlp", "tanh", "unscale_action"]``;
    the model's input is the raw environment observation and its output the environment action.
    """

    name: str
    algo: str
    model: str
    env: EnvConfig
    observation_space: SpaceSpec
    action_space: SpaceSpec
    graph_steps: tuple[str, ...] = ()
    source: str = "quarl-edge train"
    train: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    state: tuple[StateSpec, ...] = ()
    """the recurrent state the graph takes and returns after the observation (and an action mask)"""

    def to_dict(self) -> JSONObject:
        return {
            "schema_version": self.schema_version,
            "name": self.name,
            "algo": self.algo,
            "model": self.model,
            "env": self.env.to_dict(),
            "observation_space": self.observation_space.to_dict(),
            "action_space": self.action_space.to_dict(),
            "graph_steps": list(self.graph_steps),
            "source": self.source,
            "train": dict(self.train),
            **({"state": [st.to_dict() for st in self.state]} if self.state else {}),
        }

    @classmethod
    def from_dict(cls, d: JSONObject) -> PolicySpec:
        d = schema.obj(d, "policy spec", FIX)
        try:
            version = schema.integer(d.get("schema_version", 0), "policy spec schema_version", FIX, 0)
            if version > SCHEMA_VERSION:
                raise InputError(
                    f"policy spec schema {version} is newer than this quarl-edge understands ({SCHEMA_VERSION})",
                    "upgrade quarl-edge",
                )
            return cls(
                name=str(d["name"]),
                algo=str(d["algo"]),
                model=str(d["model"]),
                env=EnvConfig.from_dict(d["env"]),
                observation_space=SpaceSpec.from_dict(d["observation_space"]),
                action_space=SpaceSpec.from_dict(d["action_space"]),
                graph_steps=schema.strings(d.get("graph_steps", []), "policy spec graph_steps", FIX),
                source=schema.text(d.get("source", ""), "policy spec source", FIX),
                train=dict(schema.obj(d.get("train", {}), "policy spec train", FIX)),
                schema_version=version,
                state=tuple(StateSpec.from_dict(x) for x in _items(d.get("state", []), "policy spec state")),
            )
        except schema.MALFORMED as e:
            raise InputError(
                f"malformed policy spec (missing or bad field: {type(e).__name__}: {str(e)[:120]})", FIX
            ) from None


def _items(v: Any, where: str) -> list[Any]:
    if not isinstance(v, list) or len(v) > 16:
        raise InputError(f"{where} is not a list of at most 16 entries", FIX)
    return v
