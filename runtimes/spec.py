"""PolicySpec: what a policy expects and produces, as plain JSON-able data.

It travels inside checkpoints and bundle manifests so the device side can rebuild the environment and
feed the model without the trainer's code. Everything here is numpy-free and torch-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from .errors import InputError

SCHEMA_VERSION = 1

SpaceKind = Literal["box", "discrete"]


@dataclass(frozen=True)
class SpaceSpec:
    """A gymnasium Box or Discrete space. Box bounds are a scalar when uniform, else a flat list."""

    kind: SpaceKind
    shape: tuple[int, ...]
    dtype: str
    low: float | str | list[float | str] | None = None  # "inf"/"-inf" for unbounded dimensions
    high: float | str | list[float | str] | None = None
    n: int | None = None

    @property
    def is_discrete(self) -> bool:
        return self.kind == "discrete"

    @property
    def is_image(self) -> bool:
        return self.kind == "box" and self.dtype == "uint8" and len(self.shape) == 3

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpaceSpec:
        try:
            kind = d["kind"]
            if kind not in ("box", "discrete"):
                raise InputError(
                    f"unsupported space kind {kind!r}", "only Box and Discrete spaces are supported"
                )
            return cls(
                kind=kind,
                shape=tuple(int(s) for s in d["shape"]),
                dtype=str(d["dtype"]),
                low=d.get("low"),
                high=d.get("high"),
                n=None if d.get("n") is None else int(d["n"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(f"malformed space description ({e})", "re-export the policy") from None


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "family": self.family,
            "make_kwargs": dict(self.make_kwargs),
            "wrappers": [{"name": w.name, "kwargs": dict(w.kwargs)} for w in self.wrappers],
            "imports": list(self.imports),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EnvConfig:
        try:
            return cls(
                id=str(d["id"]),
                make_kwargs=dict(d.get("make_kwargs", {})),
                wrappers=tuple(
                    WrapperConfig(str(w["name"]), dict(w.get("kwargs", {}))) for w in d.get("wrappers", [])
                ),
                family=str(d.get("family", "gym")),
                imports=tuple(d.get("imports", [])),
            )
        except (KeyError, TypeError) as e:
            raise InputError(f"malformed environment description ({e})", "re-export the policy") from None


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

    def to_dict(self) -> dict[str, Any]:
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
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PolicySpec:
        try:
            version = int(d.get("schema_version", 0))
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
                graph_steps=tuple(d.get("graph_steps", [])),
                source=str(d.get("source", "")),
                train=dict(d.get("train", {})),
                schema_version=version,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise InputError(
                f"malformed policy spec (missing or bad field {e})", "re-export the policy"
            ) from None
