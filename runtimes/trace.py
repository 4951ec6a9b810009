"""Recorded rollouts (calibration data and replay traces): one .npz of plain arrays, no pickle.

Arrays: ``obs`` [N, *obs_shape], ``actions`` [N, *act_shape], ``rewards`` [N], ``dones`` [N] (episode
ended after this step), ``episode_ids`` [N], ``seeds`` [E], and where the env has them ``action_masks``
[N, logits] (the allowed actions at each step, an input of a masked policy); ``meta`` is a JSON string and
``content_sha256`` hashes every array (name, dtype, shape, bytes) so a load can prove the content is
what was recorded, whatever the zip container looks like.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError, IntegrityError
from .fsutil import atomic_write_bytes

TRACE_FORMAT = "quarl-edge/trace"
TRACE_VERSION = 1
_ARRAYS = ("obs", "actions", "rewards", "dones", "episode_ids", "seeds")
OPTIONAL = ("action_masks",)
"""per-step arrays only some traces have; hashed when present (older traces hash as before)"""


@dataclass(frozen=True)
class Trace:
    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    dones: np.ndarray
    episode_ids: np.ndarray
    seeds: np.ndarray
    meta: dict[str, Any]
    sha256: str
    action_masks: np.ndarray | None = None

    @property
    def samples(self) -> int:
        return int(self.obs.shape[0])

    @property
    def episodes(self) -> int:
        return int(self.seeds.shape[0])

    def episode_returns(self) -> np.ndarray:
        ids = self.episode_ids.astype(np.int64)
        return np.bincount(ids, weights=self.rewards.astype(np.float64), minlength=self.episodes)

    def subsample_index(self, max_samples: int, seed: int = 0) -> np.ndarray:
        """The rows ``subsample`` keeps, in order."""
        if self.samples <= max_samples:
            return np.arange(self.samples)
        return np.sort(np.random.default_rng(seed).choice(self.samples, size=max_samples, replace=False))

    def episode_starts(self) -> np.ndarray:
        """True at each row that starts an episode (a recurrent policy's state is zeroed there)."""
        ids = self.episode_ids
        return np.r_[True, ids[1:] != ids[:-1]] if len(ids) else np.zeros(0, bool)

    def head(self, max_samples: int) -> Trace:
        """The first whole episodes, at most ``max_samples`` steps (the first episode cut there if it is
        longer): for a recurrent policy, whose replay needs every step of an episode in order."""
        if self.samples <= max_samples:
            return self
        ends = np.flatnonzero(np.r_[self.episode_starts()[1:], True])
        k = int(ends[ends < max_samples].max()) + 1 if (ends < max_samples).any() else max_samples
        arrays = {n: getattr(self, n)[:k] for n in ("obs", "actions", "rewards", "dones", "episode_ids")}
        ids = np.unique(arrays["episode_ids"])
        meta = dict(self.meta, head_of=self.sha256, head_size=k)
        masks = None if self.action_masks is None else self.action_masks[:k]
        return make_trace(seeds=self.seeds[: int(ids.max()) + 1], meta=meta, action_masks=masks, **arrays)

    def subsample(self, max_samples: int, seed: int = 0) -> Trace:
        """An evenly spread subset of at most ``max_samples`` steps (for bundles and replays)."""
        if self.samples <= max_samples:
            return self
        idx = self.subsample_index(max_samples, seed)
        arrays = {k: getattr(self, k)[idx] for k in ("obs", "actions", "rewards", "dones", "episode_ids")}
        meta = dict(self.meta, subsampled_from=self.sha256, subsample_size=int(max_samples))
        masks = None if self.action_masks is None else self.action_masks[idx]
        return make_trace(seeds=self.seeds, meta=meta, action_masks=masks, **arrays)


def content_hash(arrays: dict[str, np.ndarray], meta_json: str) -> str:
    h = hashlib.sha256()
    for name in _ARRAYS + tuple(k for k in OPTIONAL if k in arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    h.update(meta_json.encode())
    return h.hexdigest()


def make_trace(
    *,
    obs: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    dones: np.ndarray,
    episode_ids: np.ndarray,
    seeds: np.ndarray,
    meta: dict[str, Any],
    action_masks: np.ndarray | None = None,
) -> Trace:
    arrays = {
        "obs": np.asarray(obs),
        "actions": np.asarray(actions),
        "rewards": np.asarray(rewards, dtype=np.float32),
        "dones": np.asarray(dones, dtype=bool),
        "episode_ids": np.asarray(episode_ids, dtype=np.int32),
        "seeds": np.asarray(seeds, dtype=np.int64),
    }
    if action_masks is not None:
        arrays["action_masks"] = np.asarray(action_masks, dtype=np.float32)
    n = arrays["obs"].shape[0]
    for k in ("actions", "rewards", "dones", "episode_ids", *(k for k in OPTIONAL if k in arrays)):
        if arrays[k].shape[0] != n:
            raise InputError(f"trace arrays disagree in length ({k}: {arrays[k].shape[0]} vs obs: {n})")
    meta = dict(meta, format=TRACE_FORMAT, version=TRACE_VERSION, samples=int(n))
    meta_json = json.dumps(meta, sort_keys=True)
    return Trace(meta=meta, sha256=content_hash(arrays, meta_json), **arrays)  # type: ignore[arg-type]


def save_trace(trace: Trace, path: str | Path) -> Path:
    path = Path(path)
    if path.suffix != ".npz":
        raise InputError(f"trace file {str(path)!r} must end in .npz", "pick an output name like calib.npz")
    meta_json = json.dumps(trace.meta, sort_keys=True)
    buf = io.BytesIO()
    np.savez_compressed(
        buf,
        **{k: getattr(trace, k) for k in _ARRAYS},
        **{k: getattr(trace, k) for k in OPTIONAL if getattr(trace, k) is not None},
        meta=np.array(meta_json),
        content_sha256=np.array(trace.sha256),
    )
    atomic_write_bytes(path, buf.getvalue())
    return path


def check_arrays(arrays: dict[str, np.ndarray], where: str) -> None:
    """Numbers, one row per step in every per-step array, at least one step: before anything uses them."""
    fix = "re-record it with `quarl-edge record`"
    for name, a in arrays.items():
        if a.dtype.kind not in "biuf":
            raise InputError(f"trace {where!r}: {name} holds {a.dtype} values, not numbers", fix)
    obs = arrays["obs"]
    if obs.ndim < 1 or obs.shape[0] == 0:
        raise InputError(f"trace {where!r} has no recorded steps", fix)
    if obs.ndim > 9:
        raise InputError(f"trace {where!r}: observations of {obs.ndim - 1} dimensions", fix)
    for name in ("actions", "rewards", "dones", "episode_ids", *(k for k in OPTIONAL if k in arrays)):
        a = arrays[name]
        if a.ndim < 1 or a.shape[0] != obs.shape[0]:
            raise InputError(
                f"trace {where!r}: {name} has {a.shape[:1] or 'no'} rows for {obs.shape[0]} steps", fix
            )
    if arrays["seeds"].ndim != 1:
        raise InputError(f"trace {where!r}: seeds is not a list", fix)
    ids = arrays["episode_ids"]
    if ids.ndim != 1:  # one index per step: episode boundaries (a recurrent replay's resets) are read from it
        raise InputError(
            f"trace {where!r}: episode_ids has shape {list(ids.shape)}, not one index per step", fix
        )
    if ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() >= max(len(arrays["seeds"]), 1):
        raise InputError(
            f"trace {where!r}: episode_ids are not indices of its {len(arrays['seeds'])} episodes", fix
        )


def check_fits(trace: Trace, spec: Any, where: str | Path) -> None:
    """Refuse a trace recorded on another environment or observation shape than the policy ``spec``'s
    (a PolicySpec), before any model sees one of its observations."""
    want, got = tuple(spec.observation_space.shape), tuple(trace.obs.shape[1:])
    env_id = trace.meta.get("env_id")
    if got != want:
        raise InputError(
            f"trace {str(where)!r} has observations of shape {list(got)} (env {env_id}), "
            f"the policy expects {list(want)} ({spec.env.id})",
            f"record one for this policy with `quarl-edge record --policy ... --out {Path(where).name}`",
        )
    if env_id and env_id != spec.env.id:
        raise InputError(
            f"trace {str(where)!r} was recorded on {env_id}, the policy runs on {spec.env.id}",
            "record one on the policy's own environment with `quarl-edge record`",
        )


def load_trace(path: str | Path) -> Trace:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"trace file {str(path)!r} does not exist", "record one with `quarl-edge record`")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in _ARRAYS}
            arrays.update({k: z[k] for k in OPTIONAL if k in z.files})
            meta_json = str(z["meta"][()])
            stored = str(z["content_sha256"][()])
    except (KeyError, ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise IntegrityError(
            f"{str(path)!r} is not a readable quarl-edge trace ({type(e).__name__}: {e})",
            "re-record it with `quarl-edge record`",
        ) from None
    actual = content_hash(arrays, meta_json)
    if actual != stored:
        raise IntegrityError(
            f"trace {str(path)!r} content hash mismatch (stored {stored[:12]}, actual {actual[:12]})",
            "the file was modified or damaged; re-record it with `quarl-edge record`",
        )
    try:
        meta = json.loads(meta_json)
    except ValueError:
        meta = None
    if not isinstance(meta, dict) or meta.get("format") != TRACE_FORMAT:
        raise IntegrityError(
            f"{str(path)!r} is not a quarl-edge trace", "record one with `quarl-edge record`"
        )
    check_arrays(arrays, str(path))
    return Trace(meta=meta, sha256=stored, **arrays)


OBSERVATIONS_FIX = ("record one with `quarl-edge record`, or (where the env cannot run) save the observations with "
                    "np.savez(path, obs=OBS[N, ...], episode_ids=IDS[N])")  # fmt: skip


def load_observations(path: str | Path) -> Trace:
    """A recorded trace, or a plain ``.npz`` of observations a robot logged (``obs`` [N, ...], optional
    ``episode_ids`` [N] or ``dones`` [N]; no pickle): where the environment cannot run here, these stand
    in for rollouts (calibration, action agreement, latency). Rewards are not recorded in it: the
    trace's meta says so, and nothing reads its zero rewards as returns."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"observation file {str(path)!r} does not exist", OBSERVATIONS_FIX)
    try:
        with np.load(path, allow_pickle=False) as z:
            if "content_sha256" in z.files:
                is_trace = True
            else:
                is_trace = False
                if "obs" not in z.files:
                    raise InputError(f"{str(path)!r} has no 'obs' array", OBSERVATIONS_FIX)
                obs = z["obs"]
                ids = z["episode_ids"] if "episode_ids" in z.files else None
                dones = z["dones"] if "dones" in z.files else None
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise IntegrityError(
            f"{str(path)!r} is not a readable .npz ({type(e).__name__}: {str(e).split('. ')[0][:120]})",
            OBSERVATIONS_FIX,  # numpy's own advice, to load a pickle "unsafely", is not ours to give
        ) from None
    if is_trace:
        return load_trace(path)
    n = int(obs.shape[0]) if obs.ndim else 0
    if ids is None and dones is not None:
        d = np.asarray(dones, bool).reshape(-1)
        ids = np.r_[0, np.cumsum(d[:-1])] if len(d) == n else None
    if ids is None:
        ids = np.zeros(n, np.int64)
    ids = np.asarray(ids)
    arrays = {"obs": obs, "actions": np.zeros(n, np.float32), "rewards": np.zeros(n, np.float32),
              "dones": np.r_[ids[1:] != ids[:-1], True] if n else np.zeros(0, bool), "episode_ids": ids,
              "seeds": np.arange(int(ids.max()) + 1 if n else 0)}  # fmt: skip
    check_arrays(arrays, str(path))
    meta = {"source": "recorded observations", "file": path.name, "rewards": "not recorded", "env_id": None}
    return make_trace(meta=meta, **arrays)
