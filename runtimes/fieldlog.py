"""A field log on disk: what a deployed policy was given and did, written by runtimes.telemetry.

    LOG_DIR/
      log.json                    the header: format, version, the bundle (its manifest's sha256), the
                                  model (name, sha256), the shapes of what is logged
      <session>-<seq>.npz         chunks, closed one at a time: step, t_ns, obs, actions, act_ns, flags,
                                  meta (JSON) and content_sha256 over all of them

A chunk is written to a temporary name, fsynced and renamed, so a chunk under its own name is complete;
its content hash proves it is what the logger wrote. A process killed with SIGKILL leaves at most a
temporary file (the chunk being written, ignored here) and loses the records not yet in a chunk. ``obs``
holds model inputs: the observation, or for a frame-stacked policy the stack the model saw, so that every
record can be replayed and used as calibration data on its own.

Device side and host side: numpy only. Everything read is validated here, where it is read.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import io
import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError, IntegrityError
from .schema import JSONObject

LOG_FORMAT = "quarl-edge/field-log"
LOG_VERSION = 1
HEADER_NAME = "log.json"
CHUNK_RE = re.compile(r"(\d{8}T\d{6}\.\d{6}Z-[0-9a-f]{8})-(\d{6})\.npz")
"""SESSION-SEQ.npz; a session is named by its start (UTC, to the microsecond) and 8 random hex digits, so
names sort in the order the chunks were written"""
ARRAYS = ("step", "t_ns", "obs", "actions", "act_ns", "flags")
FLAG_OUT_OF_RANGE, FLAG_NONFINITE, FLAG_CLIPPED, FLAG_FP32 = 1, 2, 4, 8
"""per record: outside the calibration range; NaN/inf (held); clipped to the range; answered by fp32"""
MAX_HEADER_BYTES = 1 << 20
NOT_OURS_FIX = "pass a folder written by load_policy(..., log_dir=...) (it holds log.json)"


def _sha(text: Any) -> bool:
    return isinstance(text, str) and re.fullmatch(r"[0-9a-f]{64}", text) is not None


def _shape(v: Any) -> tuple[int, ...] | None:
    if not isinstance(v, list) or len(v) > 8:
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 < d < 1 << 24 for d in v):
        return None
    return tuple(v)


@dataclass(frozen=True)
class LogHeader:
    """What a field log is of: one model of one bundle."""

    manifest_sha256: str
    """the bundle's manifest.json sha256 (it names every file of the bundle)"""
    policy: str
    env_id: str
    model: str
    model_sha256: str
    precision: str
    obs_shape: tuple[int, ...]
    """of a logged observation: the model input (after the policy's frame stack)"""
    obs_dtype: str
    action_shape: tuple[int, ...]
    discrete_actions: int | None
    created: str
    format: str = LOG_FORMAT
    version: int = LOG_VERSION

    def __post_init__(self) -> None:
        if self.format != LOG_FORMAT or self.version != LOG_VERSION:
            raise ValueError(f"not a {LOG_FORMAT} v{LOG_VERSION} header")
        if not (_sha(self.manifest_sha256) and _sha(self.model_sha256)):
            raise ValueError("manifest_sha256 and model_sha256 must be sha256 hex digests")
        for name in ("policy", "env_id", "model", "precision", "obs_dtype", "created"):
            v = getattr(self, name)
            if not isinstance(v, str) or not 0 < len(v) <= 200:
                raise ValueError(f"{name} must be a short string")
        if np.dtype(self.obs_dtype).kind not in "biuf":
            raise ValueError(f"obs_dtype {self.obs_dtype!r} is not a number type")
        d = self.discrete_actions
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 1):
            raise ValueError("discrete_actions must be None or a count >= 1")

    def to_dict(self) -> JSONObject:
        d = asdict(self)
        d["obs_shape"], d["action_shape"] = list(self.obs_shape), list(self.action_shape)
        return {"format": d.pop("format"), "version": d.pop("version"), **d}

    @classmethod
    def from_dict(cls, d: Any) -> LogHeader:
        if not isinstance(d, dict):
            raise ValueError("the header is not a JSON object")
        obs, act = _shape(d.get("obs_shape")), _shape(d.get("action_shape") or [1])
        if obs is None or act is None:
            raise ValueError("obs_shape / action_shape are not lists of sizes")
        fields = {k: d.get(k) for k in ("manifest_sha256", "policy", "env_id", "model", "model_sha256",
                                        "precision", "obs_dtype", "discrete_actions", "created", "format", "version")}  # fmt: skip
        action_shape = () if d.get("action_shape") == [] else act
        return cls(obs_shape=obs, action_shape=action_shape, **fields)  # type: ignore[arg-type]

    def same_bundle(self, other: LogHeader) -> bool:
        return (self.manifest_sha256, self.model, self.model_sha256) == (
            other.manifest_sha256, other.model, other.model_sha256)  # fmt: skip

    def describe(self) -> str:
        return f"{self.policy}/{self.model} of the bundle with manifest sha256 {self.manifest_sha256[:12]}"


def header_of(info: Any, obs_dtype: str) -> LogHeader:
    """The header for a loaded policy (its ``PolicyInfo``)."""
    return LogHeader(
        manifest_sha256=info.manifest_sha256, policy=info.policy, env_id=info.env_id, model=info.model,
        model_sha256=info.sha256, precision=info.precision, obs_shape=tuple(info.model_input_shape),
        obs_dtype=obs_dtype, action_shape=() if info.discrete_actions else tuple(info.action_shape),
        discrete_actions=info.discrete_actions,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )  # fmt: skip


def read_header(log_dir: Path) -> LogHeader:
    """The header of the field log in ``log_dir``; a one-line InputError when it is not one of ours."""
    path = Path(log_dir) / HEADER_NAME
    if not Path(log_dir).is_dir():
        raise InputError(f"field log {str(log_dir)!r} is not a folder", NOT_OURS_FIX)
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > MAX_HEADER_BYTES:
            raise InputError(
                f"{str(log_dir)!r} is not a quarl-edge field log (no {HEADER_NAME})", NOT_OURS_FIX
            )
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        raise InputError(f"{str(log_dir)!r} is not a quarl-edge field log ({HEADER_NAME} is not JSON)",
                         NOT_OURS_FIX) from None  # fmt: skip
    if not isinstance(data, dict) or data.get("format") != LOG_FORMAT:
        raise InputError(f"{str(log_dir)!r} is not a quarl-edge field log ({HEADER_NAME} is another "
                         "file's)", NOT_OURS_FIX)  # fmt: skip
    try:
        return LogHeader.from_dict(data)
    except (ValueError, TypeError) as e:
        raise IntegrityError(f"field log {str(log_dir)!r}: {HEADER_NAME} is damaged ({str(e)[:120]})",
                             "pull the log again from the device") from None  # fmt: skip


# ---- chunks --------------------------------------------------------------------------------------------


def content_hash(arrays: dict[str, np.ndarray], meta_json: str) -> str:
    h = hashlib.sha256()
    for name in ARRAYS:
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    h.update(meta_json.encode())
    return h.hexdigest()


def chunk_bytes(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> bytes:
    """One chunk file's bytes (an uncompressed .npz: no CPU spent compressing on the board)."""
    meta_json = json.dumps(meta, sort_keys=True)
    buf = io.BytesIO()
    entries: dict[str, Any] = {k: arrays[k] for k in ARRAYS}
    entries.update(meta=np.array(meta_json), content_sha256=np.array(content_hash(arrays, meta_json)))
    np.savez(buf, **entries)
    return buf.getvalue()


@dataclass(frozen=True)
class Chunk:
    name: str
    session: str
    seq: int
    arrays: dict[str, np.ndarray]
    meta: dict[str, Any]
    sha256: str
    """the content hash stored in the chunk, checked on read"""

    @property
    def records(self) -> int:
        return int(self.arrays["step"].shape[0])


def _bad(path: Path, why: str) -> IntegrityError:
    return IntegrityError(f"field log chunk {str(path)!r} {why}",
                          "pull the log again, or move that chunk out of the folder")  # fmt: skip


def read_chunk(path: Path, header: LogHeader) -> Chunk:
    """One chunk, its content hash and every array checked against ``header``."""
    m = CHUNK_RE.fullmatch(path.name)
    if m is None:
        raise InputError(f"{path.name!r} is not a field log chunk name", "chunks are SESSION-SEQ.npz")
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in ARRAYS}
            meta_json, stored = str(z["meta"][()]), str(z["content_sha256"][()])
    except Exception as e:  # an untrusted zip: zipfile and numpy raise many kinds on damaged ones
        raise _bad(path, f"is not readable ({type(e).__name__})") from None
    if content_hash(arrays, meta_json) != stored:
        raise _bad(path, f"does not match its content hash {stored[:12]} (modified or damaged)")
    try:
        meta = json.loads(meta_json)
    except ValueError:
        meta = None
    if not isinstance(meta, dict) or meta.get("manifest_sha256") != header.manifest_sha256:
        raise _bad(path, "belongs to another bundle than its folder's log.json")
    n = arrays["step"].shape[0]
    want = {"step": (n,), "t_ns": (n,), "act_ns": (n,), "flags": (n,), "obs": (n, *header.obs_shape),
            "actions": (n, *header.action_shape)}  # fmt: skip
    for k, shape in want.items():
        a = arrays[k]
        if a.shape != shape or a.dtype.kind not in ("iu" if k != "obs" and k != "actions" else "biuf"):
            raise _bad(
                path, f"holds {k} of shape {list(a.shape)} ({a.dtype}), the log's header says {list(shape)}"
            )
    if n and (arrays["act_ns"].min() < 0 or arrays["step"].min() < 0 or np.any(np.diff(arrays["step"]) <= 0)
              or arrays["flags"].min() < 0 or arrays["flags"].max() > 15):  # fmt: skip
        raise _bad(path, "holds negative times, steps out of order or unknown flags")
    return Chunk(path.name, m.group(1), int(m.group(2)), arrays, meta, stored)


def chunk_names(log_dir: Path) -> list[str]:
    """The chunks of ``log_dir`` in the order they were written (session start time, then sequence)."""
    return sorted(p.name for p in Path(log_dir).iterdir() if CHUNK_RE.fullmatch(p.name) and p.is_file())


@dataclass(frozen=True)
class FieldLog:
    """A whole field log, read and checked: its chunks' records in order."""

    dir: Path
    header: LogHeader
    chunks: tuple[str, ...]
    sessions: tuple[str, ...]
    step: np.ndarray
    """per record: the act() call's number since the policy was loaded (a session's own count)"""
    session: np.ndarray
    """per record: the index of its session in ``sessions``"""
    t_ns: np.ndarray
    """per record: wall-clock time (ns since the epoch)"""
    obs: np.ndarray
    actions: np.ndarray
    act_ns: np.ndarray
    flags: np.ndarray
    dropped: int
    """records the logger could not keep (its writer fell behind), as the chunks report them"""
    leftovers: int
    """temporary files of a chunk being written when the logger was killed (not read)"""

    @property
    def records(self) -> int:
        return int(self.step.shape[0])


def load_field_log(log_dir: str | Path) -> FieldLog:
    """Read and check every chunk of a field log folder (a one-line error for a folder that is not one,
    or a chunk that is damaged)."""
    log_dir = Path(log_dir)
    header = read_header(log_dir)
    names = chunk_names(log_dir)
    leftovers = sum(1 for p in log_dir.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp"))
    chunks = [read_chunk(log_dir / n, header) for n in names]
    sessions = tuple(dict.fromkeys(c.session for c in chunks))
    index = {s: i for i, s in enumerate(sessions)}

    def cat(key: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        parts = [c.arrays[key] for c in chunks]
        return np.concatenate(parts) if parts else np.zeros((0, *shape), dtype)

    dropped = 0
    for c in chunks:
        d = c.meta.get("dropped", 0)
        dropped += d if isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 else 0
    return FieldLog(
        dir=log_dir, header=header, chunks=tuple(names), sessions=sessions,
        step=cat("step", (), np.int64).astype(np.int64),
        session=np.concatenate([np.full(c.records, index[c.session], np.int32) for c in chunks])
        if chunks else np.zeros(0, np.int32),
        t_ns=cat("t_ns", (), np.int64).astype(np.int64),
        obs=cat("obs", header.obs_shape, np.dtype(header.obs_dtype)),
        actions=cat("actions", header.action_shape, np.float32 if not header.discrete_actions else np.int64),
        act_ns=cat("act_ns", (), np.int64).astype(np.int64),
        flags=cat("flags", (), np.uint8).astype(np.uint8),
        dropped=dropped, leftovers=leftovers,
    )  # fmt: skip


def finite_or(value: Any, default: float) -> float:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else default
