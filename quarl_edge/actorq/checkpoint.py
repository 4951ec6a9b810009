"""ActorQ learner checkpoints: plain files, no pickle, each replaced atomically (temp name, then rename).

``checkpoint/`` holds
- ``model.npz``: every tensor of the learner — each network's state dict under ``<name>/<key>`` and each
  optimizer's per-parameter state under ``<name>/state/<param index>/<key>`` (Adam: step, exp_avg,
  exp_avg_sq);
- ``model.json``: the index — format and version, the sha256 of model.npz, per part its tensor keys, and
  for optimizers their param_groups and any non-tensor state;
- ``replay.npz``: the learner's replay buffer (its filled rows);
- ``state.json``: env steps, learner updates, broadcast version and the learning curve. Written last:
  a checkpoint is complete once state.json names its step.

Loading reads the npz with ``allow_pickle=False`` and puts every tensor back bit for bit.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from quarl_edge import typed
from quarl_edge.actorq.result import LOG_VERSION, CurvePoint, RuntimeChoice
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.fsutil import atomic_write_bytes, atomic_write_json, sha256_bytes
from quarl_edge.runtimes.schema import JSONObject
from quarl_edge.typed import build, fields_json, integer, obj, opt_number, optional, tuple_of

STATE_FIX = "delete the checkpoint folder to start the run afresh"
FORMAT = "quarl-edge/actorq-learner"
FORMAT_VERSION = 1
Part = nn.Module | torch.optim.Optimizer
"""what a learner checkpoints: its networks and its optimizers, by name"""


@dataclass(frozen=True)
class LearnerState:
    """``state.json``: how far the run got and with which settings, checked when read (a damaged checkpoint
    is one line). Written last: a checkpoint is complete once its state names its step."""

    global_step: int
    """environment steps so far"""
    updates: int
    """learner updates so far"""
    version_broadcast: int
    """the newest broadcast's version"""
    curve: tuple[CurvePoint, ...] = ()
    args: Mapping[str, object] | None = None
    """the run's settings as its log.json has them (a resume may not change what it learns); None: written
    before they were kept"""
    actor_runtime: RuntimeChoice | None = None
    """what ``--actor-runtime auto`` chose: a resumed run keeps it"""
    wall_s: float | None = None
    """wall seconds of the run so far (None: written before it was kept; the curve's last time stands in)"""
    version: int = LOG_VERSION

    def __post_init__(self) -> None:
        for k in ("global_step", "updates", "version_broadcast", "version"):
            integer(getattr(self, k), k)
        opt_number(self.wall_s, "wall_s", lo=0)

    @property
    def wall_before(self) -> float:
        """The wall seconds a resumed run's curve continues from."""
        return self.wall_s if self.wall_s is not None else (self.curve[-1].wall_s if self.curve else 0.0)

    def to_dict(self) -> dict[str, object]:
        return fields_json(self)

    @classmethod
    def from_dict(cls, v: object, name: str) -> LearnerState:
        return build(cls, v, name, {"curve": tuple_of(CurvePoint.from_dict), "args": optional(obj),
                                    "actor_runtime": optional(RuntimeChoice.from_dict)})  # fmt: skip


def read_state(d: Path) -> LearnerState:
    """Checkpoint ``d``'s state.json, every value checked."""
    where = f"checkpoint {str(d)!r}"
    try:
        data = json.loads((d / "state.json").read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise InputError(f"{where} has no readable state.json ({type(e).__name__})", STATE_FIX) from None
    return typed.load(lambda: LearnerState.from_dict(data, f"{where} state.json"), where, STATE_FIX)


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def flatten(parts: dict[str, Part]) -> tuple[dict[str, np.ndarray], JSONObject]:
    """All tensors of ``parts`` as flat npz arrays, and the JSON index that puts them back."""
    arrays: dict[str, np.ndarray] = {}
    index: JSONObject = {}
    for name, part in parts.items():
        if isinstance(part, nn.Module):
            sd = part.state_dict()
            arrays.update({f"{name}/{k}": _numpy(v) for k, v in sd.items()})
            index[name] = {"kind": "module", "keys": list(sd)}
            continue
        sd = part.state_dict()
        state: JSONObject = {}
        for pid, entries in sd["state"].items():
            tensors = [k for k, v in entries.items() if isinstance(v, torch.Tensor)]
            arrays.update({f"{name}/state/{pid}/{k}": _numpy(entries[k]) for k in tensors})
            scalars = {k: v for k, v in entries.items() if k not in tensors}
            state[str(pid)] = {"tensors": tensors, "scalars": scalars}
        index[name] = {"kind": "optimizer", "param_groups": sd["param_groups"], "state": state}
    return arrays, index


def unflatten(parts: dict[str, Part], index: JSONObject, z: Any, where: Path) -> None:
    """Load ``parts`` in place from the arrays ``z`` (an NpzFile) as described by ``index``."""
    for name, part in parts.items():
        entry = index.get(name)
        if entry is None:
            raise InputError(
                f"checkpoint {where} has no {name!r}", "resume with the --algo it was written with"
            )
        try:
            if isinstance(part, nn.Module):
                part.load_state_dict({k: torch.from_numpy(z[f"{name}/{k}"]) for k in entry["keys"]})
                continue
            state = {
                int(pid): {
                    **s["scalars"],
                    **{k: torch.from_numpy(z[f"{name}/state/{pid}/{k}"]) for k in s["tensors"]},
                }
                for pid, s in entry["state"].items()
            }
            # JSON turned tuples (Adam's betas) into lists: give each value the live group's type back
            groups = [
                {k: tuple(v) if isinstance(live.get(k), tuple) and isinstance(v, list) else v
                 for k, v in saved.items()}
                for saved, live in zip(entry["param_groups"], part.param_groups, strict=False)
            ]  # fmt: skip
            part.load_state_dict({"state": state, "param_groups": groups})
        except (RuntimeError, ValueError, KeyError) as e:
            # torch's "Error(s) in loading state_dict for X:" heads the line that names the mismatch
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()] or [type(e).__name__]
            detail = (lines[1] if len(lines) > 1 and lines[0].endswith(":") else lines[0]).rstrip(".")
            raise InputError(
                f"checkpoint {where} does not fit this learner's {name!r}: {detail}",
                "resume with the --env and --hidden it was written with, or start without --resume",
            ) from None


def save(d: Path, parts: dict[str, Part], replay: dict[str, np.ndarray], state: LearnerState) -> None:
    """Write the checkpoint folder ``d``: model.npz, model.json, replay.npz, then state.json."""
    d.mkdir(parents=True, exist_ok=True)
    arrays, index = flatten(parts)
    model = _npz_bytes(arrays)
    atomic_write_bytes(d / "model.npz", model)
    atomic_write_json(d / "model.json", {"format": FORMAT, "version": FORMAT_VERSION, "tensors": "model.npz",
                                  "sha256": sha256_bytes(model), "parts": index})  # fmt: skip
    atomic_write_bytes(d / "replay.npz", _npz_bytes(replay))
    # last: a checkpoint is complete once state.json names its step
    atomic_write_json(d / "state.json", state.to_dict())


def load(d: Path, parts: dict[str, Part]) -> tuple[LearnerState, dict[str, np.ndarray]]:
    """Restore ``parts`` in place from checkpoint ``d``; returns its state and replay arrays."""
    fix = f"start without --resume, or delete {d}"
    if not (d / "model.json").is_file() or not (d / "model.npz").is_file():
        raise InputError(
            f"checkpoint {d} has no model.json / model.npz (written by an older quarl-edge?)", fix
        )
    index = json.loads((d / "model.json").read_text())
    if index.get("format") != FORMAT or index.get("version") != FORMAT_VERSION:
        raise InputError(
            f"checkpoint {d}: unknown format {index.get('format')!r} version {index.get('version')!r}", fix
        )
    model = (d / "model.npz").read_bytes()
    if sha256_bytes(model) != index.get("sha256"):
        raise InputError(f"checkpoint {d}: model.npz does not match the sha256 in model.json", fix)
    with np.load(io.BytesIO(model), allow_pickle=False) as z:
        unflatten(parts, index["parts"], z, d)
    with np.load(d / "replay.npz", allow_pickle=False) as z:
        replay = {k: z[k] for k in z.files}
    return read_state(d), replay
