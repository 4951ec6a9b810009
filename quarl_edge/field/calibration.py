"""Field logs as calibration data: ``quarl-edge export --calibration LOGS`` (alone, or beside recorded
rollouts), so that a bundle re-exported on what the robot saw is calibrated for it.

A field log's records are model inputs (runtimes.fieldlog), what a trace's ``obs`` are, so a log becomes a
Trace of its own: one episode per session of the log, rewards unknown (0), the logged actions. Records that
held NaN/inf are left out. Several sources merge into one Trace, each source's episodes after the last.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.fieldlog import FLAG_NONFINITE, load_field_log
from quarl_edge.runtimes.trace import Trace, load_observations, make_trace

FIELD_SOURCE = "field-log"


def field_trace(log_dir: str | Path) -> Trace:
    """The field log in ``log_dir`` as a trace (validated: load_field_log checks every chunk)."""
    log = load_field_log(log_dir)
    keep = ~np.asarray(log.flags & FLAG_NONFINITE, bool)
    if log.obs.dtype.kind == "f":
        keep &= np.isfinite(log.obs.reshape(log.records, -1)).all(axis=1)
    if not keep.any():
        raise InputError(f"field log {str(log_dir)!r} holds no finite records to calibrate on",
                         "run the policy with log_dir= first")  # fmt: skip
    session = log.session[keep]
    dones = np.append(session[1:] != session[:-1], True)
    h = log.header
    meta = {"env_id": h.env_id, "policy": h.policy, "source": FIELD_SOURCE, "log": str(log_dir),
            "manifest_sha256": h.manifest_sha256, "model": h.model, "chunks": len(log.chunks)}  # fmt: skip
    return make_trace(obs=log.obs[keep], actions=log.actions[keep], rewards=np.zeros(int(keep.sum())),
                      dones=dones, episode_ids=session, seeds=np.zeros(len(log.sessions), np.int64),
                      meta=meta)  # fmt: skip


def is_field_log(path: Path) -> bool:
    return path.is_dir()


def calibration_trace(paths: Sequence[Path]) -> Trace:
    """One trace from recorded rollouts (.npz) and field logs (folders), in the order given."""
    if not paths:
        raise InputError("no calibration data given", "pass --calibration FILE.npz or a field log folder")
    traces = [field_trace(p) if is_field_log(p) else load_observations(p) for p in paths]
    if len(traces) == 1:
        return traces[0]
    shapes = {(t.obs.shape[1:], t.obs.dtype.str) for t in traces}
    envs = {str(t.meta["env_id"]) for t in traces if t.meta.get("env_id") is not None}
    if len(shapes) > 1 or len(envs) > 1:
        raise InputError(f"the calibration sources differ in observations or environment ({sorted(envs)})",
                         "merge data of one policy only")  # fmt: skip
    if len({t.actions.shape[1:] for t in traces}) > 1:
        raise InputError("the calibration sources' actions differ in shape", "merge data of one policy only")
    first, offset, ids, seeds = traces[0], 0, [], []
    for t in traces:
        ids.append(t.episode_ids.astype(np.int64) + offset)
        seeds.append(t.seeds)
        offset += t.episodes
    meta = {"env_id": first.meta.get("env_id"), "merged": [{"sha256": t.sha256, "samples": t.samples,
            "source": t.meta.get("source", "rollouts")} for t in traces]}  # fmt: skip
    return make_trace(obs=np.concatenate([t.obs for t in traces]),
                      actions=np.concatenate([t.actions.astype(first.actions.dtype) for t in traces]),
                      rewards=np.concatenate([t.rewards for t in traces]), dones=np.concatenate([t.dones for t in traces]),
                      episode_ids=np.concatenate(ids), seeds=np.concatenate(seeds), meta=meta)  # fmt: skip
