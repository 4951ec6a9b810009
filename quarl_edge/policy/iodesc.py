"""The I/O description (``--io io.yaml``) of a policy from another framework: what its weights do not say.

```yaml
observation: {size: 48}                 # checked against the network's input
action: {size: 12, low: -1.0, high: 1.0} # bounds: the action is clipped to them in the graph
activation: elu                         # of the hidden layers (rsl_rl's default)
env: Pendulum-v1                        # a gymnasium id, only when the env runs here
control_hz: 50                          # the robot's control rate (recorded in the manifest)
recurrent: {inputs: [h_in, c_in], outputs: [h_out, c_out]}   # an ONNX policy's state names
```

Every field is optional. Read with yaml's safe loader; each value checked where it is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quarl_edge.policy.registry import env_config
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.spec import EnvConfig, SpaceSpec

EXTERNAL = "external"
"""the env family of a policy whose environment cannot run here (Isaac Sim, a robot)"""
_KEYS = ("observation", "action", "activation", "env", "control_hz", "recurrent", "onnx", "normalization")
_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class IoDescription:
    path: str | None = None
    obs_size: int | None = None
    act_size: int | None = None
    low: float | None = None
    high: float | None = None
    activation: str | None = None
    env: EnvConfig | None = None
    control_hz: float | None = None
    state_inputs: tuple[str, ...] = ()
    state_outputs: tuple[str, ...] = ()
    names: dict[str, str] = field(default_factory=dict)
    """an ONNX policy's observation / action tensor names (``onnx: {observation: obs, action: actions}``)"""

    def check_dims(self, obs: int, act: int) -> None:
        where = self.path or "io.yaml"
        if self.obs_size is not None and self.obs_size != obs:
            raise InputError(f"{where} says observation size {self.obs_size}, the network takes {obs}",
                             "fix observation.size in the io.yaml")  # fmt: skip
        if self.act_size is not None and self.act_size != act:
            raise InputError(f"{where} says action size {self.act_size}, the network returns {act}",
                             "fix action.size in the io.yaml")  # fmt: skip

    def head(self) -> str:
        return "clip" if self.low is not None and self.high is not None else "identity"

    def action_space(self, size: int) -> SpaceSpec:
        low = "-inf" if self.low is None else self.low
        high = "inf" if self.high is None else self.high
        return SpaceSpec("box", (size,), "float32", low, high)


def external_env(name: str) -> EnvConfig:
    return EnvConfig(id=f"{EXTERNAL}/{name}", family=EXTERNAL)


def _number(v: Any, where: str, fix: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise InputError(f"{where} is not a finite number ({str(v)[:40]!r})", fix)
    return float(v)


def _size(v: Any, where: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 1 << 20:
        raise InputError(f"{where} is not a size ({str(v)[:40]!r})", f"e.g. {where.rsplit('.', 1)[-1]}: 12")
    return v


def _names(v: Any, where: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if not isinstance(v, list) or not all(isinstance(x, str) and 0 < len(x) <= 128 for x in v) or len(v) > 8:
        raise InputError(
            f"{where} is not a list of tensor names", f"e.g. {where.rsplit('.', 1)[-1]}: [h_in, c_in]"
        )
    return tuple(v)


def read_io(path: Path | None, env_id: str | None = None) -> IoDescription:
    """The io.yaml at ``path`` (None: an empty description); ``env_id`` (--env) overrides its env."""
    env = env_config(env_id) if env_id else None
    if path is None:
        return IoDescription(env=env)
    import yaml

    fix = "see docs/policies.md for the io.yaml fields"
    where = str(path)
    if not path.is_file():
        raise InputError(f"I/O description {where!r} does not exist", "pass --io io.yaml")
    if path.stat().st_size > _MAX_BYTES:
        raise InputError(f"{where!r} is too large to be an I/O description", fix)
    try:
        data = yaml.safe_load(path.read_text(errors="replace")) or {}
    except yaml.YAMLError as e:
        raise InputError(f"{where!r} is not readable YAML ({str(e).splitlines()[0][:120]})", fix) from None
    if not isinstance(data, dict):
        raise InputError(f"{where!r} is not a mapping of fields", fix)
    unknown = [str(k) for k in data if k not in _KEYS]
    if unknown:
        raise InputError(
            f"{where!r} has the unknown field {unknown[0][:40]!r}", f"known fields: {', '.join(_KEYS)}"
        )
    obs, act = data.get("observation") or {}, data.get("action") or {}
    rec, onnx = data.get("recurrent") or {}, data.get("onnx") or {}
    for name, block in (("observation", obs), ("action", act), ("recurrent", rec), ("onnx", onnx)):
        if not isinstance(block, dict):
            raise InputError(f"{where!r}: {name} is not a mapping", fix)
    low = None if act.get("low") is None else _number(act["low"], f"{where}: action.low", fix)
    high = None if act.get("high") is None else _number(act["high"], f"{where}: action.high", fix)
    if (low is None) != (high is None) or (low is not None and high is not None and not low < high):
        raise InputError(f"{where!r}: action.low and action.high must both be given, low < high", fix)
    activation = data.get("activation")
    if activation is not None and activation not in ("elu", "relu", "tanh", "leaky_relu"):
        raise InputError(f"{where!r}: activation {str(activation)[:20]!r} is not supported",
                         "use elu, relu, tanh or leaky_relu")  # fmt: skip
    hz = None if data.get("control_hz") is None else _number(data["control_hz"], f"{where}: control_hz", fix)
    if env is None and data.get("env") is not None:
        if not isinstance(data["env"], str) or not data["env"]:
            raise InputError(f"{where!r}: env is not an environment id", fix)
        env = env_config(data["env"])
    names = {k: str(onnx[k]) for k in ("observation", "action") if isinstance(onnx.get(k), str)}
    return IoDescription(
        path=where, obs_size=_size(obs.get("size"), "observation.size"), act_size=_size(act.get("size"), "action.size"),
        low=low, high=high, activation=activation, env=env, control_hz=hz,
        state_inputs=_names(rec.get("inputs"), "recurrent.inputs"), state_outputs=_names(rec.get("outputs"), "recurrent.outputs"),
        names=names,
    )  # fmt: skip
