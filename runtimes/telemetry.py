"""Field telemetry (opt-in): ``load_policy(bundle, log_dir=DIR, log_every=N)`` records every N-th act() call
(the model input, the action, act()'s time and the out-of-range / NaN flags) into a field log
(runtimes.fieldlog) that ``quarl-edge field pull`` / ``field report`` read on the host.

The control loop never waits for the disk: act() appends to an in-memory chunk (a few hundred ns), and a
writer thread writes each closed chunk (full, or older than FLUSH_S) atomically and rotates the oldest
chunks out when the folder would pass its size cap. When the writer falls behind, chunks are dropped and
counted, never queued without bound. When writing fails (a full disk), logging stops with one warning
(``FieldLogWarning``) and the control loop goes on; every chunk closed before stays as it was.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import math
import os
import queue
import re
import secrets
import threading
import time
import warnings
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError
from .fieldlog import CHUNK_RE, FLAG_NONFINITE, HEADER_NAME, LogHeader, chunk_bytes, read_header
from .fsutil import atomic_write_bytes, atomic_write_json, clean_leftovers

LOG_EVERY = 1
"""record every act() call by default"""
LOG_MAX_BYTES = 256 * 2**20
"""the folder's size cap by default: the oldest chunks are removed past it"""
MIN_MAX_BYTES = 64 * 2**10
CHUNK_BYTES = 2**20
"""a chunk closes at about this many bytes of records (at most MAX_CHUNK_RECORDS records)"""
MAX_CHUNK_RECORDS = 4096
FLUSH_S = 10.0
"""a chunk also closes when its first record is this old: a kill -9 loses at most this much"""
QUEUE_CHUNKS = 4
"""closed chunks waiting for the writer; past that, chunks are dropped (counted), never the loop slowed"""
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS)
"""write errors of the disk itself (full, over quota, failing): logging stops, the loop goes on"""
_TMP_RE = re.compile(r"\.(.+\.npz)\.\d+\.[a-z0-9_]{8}\.tmp")


def _ignore(*_args: Any) -> None:
    return None


class FieldLogWarning(UserWarning):
    """Field logging stopped (e.g. the disk is full); the policy goes on acting."""


@dataclass(frozen=True)
class LogStats:
    """The field log of a policy, so far (``policy.log_stats``)."""

    dir: str
    session: str
    records: int
    """records taken (every log_every-th act() call)"""
    chunks: int
    """chunks this session wrote"""
    bytes: int
    """the chunks in the folder now (this and earlier sessions)"""
    rotated: int
    """chunks removed, oldest first, to stay under the size cap"""
    dropped: int
    """records lost because the writer fell behind, or after logging stopped"""
    failed: str | None
    """why logging stopped (None: it did not)"""


def _check_int(value: Any, name: str, low: int, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InputError(f"{name} must be an integer >= {low} (got {str(value)[:24]!r})", f"e.g. {example}")
    return value


def prepare(log_dir: Any, header: LogHeader) -> Path:
    """``log_dir`` as a field log folder of this header's bundle and model: created when absent; an
    existing one must be ours and of the same bundle (a one-line InputError otherwise)."""
    if not isinstance(log_dir, str | os.PathLike):
        raise InputError(f"log_dir must be a folder path (got {type(log_dir).__name__})",
                         "e.g. log_dir='~/.local/share/quarl-edge/field/robot1'")  # fmt: skip
    path = Path(log_dir).expanduser()
    if path.is_symlink() or path.exists() and not path.is_dir():
        raise InputError(f"log_dir {str(path)!r} is not a folder", "pick a new or empty folder")
    if path.is_dir() and any(path.iterdir()):
        if not (path / HEADER_NAME).exists():
            raise InputError(f"log_dir {str(path)!r} holds files that are not a quarl-edge field log",
                             "pick a new or empty folder")  # fmt: skip
        have = read_header(path)
        if not have.same_bundle(header):
            raise InputError(f"log_dir {str(path)!r} holds the field log of {have.describe()}, not of "
                             f"{header.describe()}", "give each bundle and model its own log_dir")  # fmt: skip
        return path
    atomic_write_json(path / HEADER_NAME, header.to_dict())
    return path


@dataclass(frozen=True)
class _Closed:
    """A closed chunk on its way to the writer thread: its records' arrays (``obs`` is the pooled buffer,
    its first ``n`` rows this chunk's) and the records dropped just before it."""

    obs: np.ndarray
    n: int
    actions: np.ndarray
    step: np.ndarray
    t_ns: np.ndarray
    act_ns: np.ndarray
    flags: np.ndarray
    dropped: int

    def __post_init__(self) -> None:
        if not 0 < self.n <= len(self.obs) or self.dropped < 0:
            raise ValueError(
                f"a chunk of {self.n} records ({len(self.obs)} rows, {self.dropped} dropped before)"
            )


class FieldLogger:
    """The records of one policy's act() calls, chunked, written by a thread of its own."""

    def __init__(self, log_dir: Any, header: LogHeader, max_bytes: int = LOG_MAX_BYTES) -> None:
        """Open ``log_dir`` for this header's bundle and model (prepare: a one-line InputError for a folder
        that is not ours or of another bundle). A disk that cannot take even the header stops logging
        here, with the one warning, and the policy acts all the same."""
        self.max_bytes = _check_int(
            max_bytes, "log_max_bytes", MIN_MAX_BYTES, f"log_max_bytes={LOG_MAX_BYTES}"
        )
        self.header = header
        self.failed: str | None = None
        self._warned = False
        try:
            self.dir = prepare(log_dir, header)
        except OSError as e:
            if e.errno not in DISK_ERRORS:
                raise InputError(f"cannot write the field log to {str(log_dir)!r} ({e.strerror or e})",
                                 "pick a folder this user can write") from None  # fmt: skip
            self.dir = Path(os.fspath(log_dir)).expanduser()
            self.failed = f"{e.strerror or type(e).__name__} writing {HEADER_NAME}"
        now = _dt.datetime.now(_dt.timezone.utc)
        self.session = now.strftime("%Y%m%dT%H%M%S.%fZ-") + secrets.token_hex(4)
        obs_bytes = math.prod(header.obs_shape) * np.dtype(header.obs_dtype).itemsize
        per_record = obs_bytes + 4 * math.prod(header.action_shape) + 32
        self.capacity = max(1, min(MAX_CHUNK_RECORDS, min(CHUNK_BYTES, self.max_bytes // 4) // per_record))
        self._discrete = header.discrete_actions is not None
        self._integer = np.dtype(header.obs_dtype).kind in "biu"
        self._flush_ns = int(FLUSH_S * 1e9)
        self.wall_offset_ns = time.time_ns() - time.perf_counter_ns()
        self.records = self.chunks = self.rotated = 0
        self.dropped = 0  # by the loop's thread: queue full, after a failure (the writer counts its own)
        self._lost = 0  # by the writer's thread: chunks it could not write
        self._pending = 0  # dropped since the last chunk queued: recorded in the next chunk's meta
        self._sizes = self._existing_chunks() if self.failed is None else {}
        self._seq = 0
        self._pool: list[np.ndarray] = []
        self._queue: queue.Queue[_Closed | None] = queue.Queue(QUEUE_CHUNKS)
        self._lock = threading.Lock()
        self._open()
        self._thread = threading.Thread(target=self._writer, name="quarl-edge-field-log", daemon=True)
        self._thread.start()
        self._closed = False
        if self.failed is not None:
            self._warn(stacklevel=3)

    def _existing_chunks(self) -> dict[str, int]:
        for (
            p
        ) in self.dir.iterdir():  # what a killed logger was writing: ours, and stale once its process is gone
            m = _TMP_RE.fullmatch(p.name)
            if m:
                clean_leftovers(self.dir / m.group(1))
        return {
            n: (self.dir / n).stat().st_size for n in sorted(os.listdir(self.dir)) if CHUNK_RE.fullmatch(n)
        }

    def _open(self) -> None:
        self._obs = self._pool.pop() if self._pool else np.empty((self.capacity, *self.header.obs_shape),
                                                                 self.header.obs_dtype)  # fmt: skip
        self._actions: Any = array("q") if self._discrete else np.empty(
            (self.capacity, *self.header.action_shape), np.float32)  # fmt: skip
        self._step, self._t, self._lat, self._flags = array("q"), array("q"), array("q"), array("B")
        self._n = 0
        self._opened: int | None = None

    # -- the control loop's side ---------------------------------------------------------------------

    def record(self, step: int, t_ns: int, obs: Any, action: Any, act_ns: int, flags: int) -> None:
        """One act() call (``t_ns`` on the perf_counter clock). Never blocks, never raises for I/O."""
        if self.failed is not None:
            self.dropped += 1
            if not self._warned:
                self._warn()
            return
        i = self._n
        if flags & FLAG_NONFINITE and self._integer:
            obs = 0  # NaN has no integer value: the flag says what the record was
        self._obs[i] = obs
        if self._discrete:
            self._actions.append(action)
        else:
            self._actions[i] = action
        self._step.append(step)
        self._t.append(t_ns + self.wall_offset_ns)
        self._lat.append(act_ns)
        self._flags.append(flags)
        self._n = i + 1
        self.records += 1
        if self._opened is None:
            self._opened = t_ns
        if self._n == self.capacity or t_ns - self._opened > self._flush_ns:
            self._close_chunk()

    def rehearse(self, step: int, t_ns: int, obs: Any, action: Any, act_ns: int, flags: int) -> None:
        """``record``, then taken back: its code and the open chunk's next slot warmed, nothing kept (the
        loop runner's warm-up). Skipped when that record would close the chunk."""
        opened = self._opened
        if (
            self.failed is not None
            or self._n + 1 >= self.capacity
            or opened is None
            or t_ns - opened > self._flush_ns
        ):
            return
        self.record(step, t_ns, obs, action, act_ns, flags)
        self._n -= 1
        self.records -= 1
        for a in (self._step, self._t, self._lat, self._flags):
            a.pop()
        if self._discrete:
            self._actions.pop()

    def _close_chunk(self) -> None:
        n = self._n
        if n == 0:
            return
        chunk = _Closed(
            obs=self._obs, n=n,
            actions=np.frombuffer(self._actions, np.int64) if self._discrete else self._actions[:n],
            step=np.frombuffer(self._step, np.int64), t_ns=np.frombuffer(self._t, np.int64),
            act_ns=np.frombuffer(self._lat, np.int64), flags=np.frombuffer(self._flags, np.uint8),
            dropped=self._pending,
        )  # fmt: skip
        self._open()
        try:
            self._queue.put_nowait(chunk)
            self._pending = 0
        except queue.Full:  # the disk is slower than the loop: drop this chunk, not the loop's pace
            self.dropped += n
            self._pending += n
            self._pool.append(chunk.obs)

    def _warn(self, stacklevel: int = 4) -> None:
        self._warned = True
        warnings.warn(FieldLogWarning(f"field logging to {str(self.dir)!r} stopped: {self.failed}; the policy "
                                      "goes on acting, the chunks written before are kept"), stacklevel=stacklevel)  # fmt: skip

    def close(self) -> None:
        """Write the open chunk and stop the writer (idempotent; also run at exit and when the policy is
        garbage collected)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.record = self.rehearse = _ignore  # type: ignore[method-assign,assignment]  # acting on, unlogged
        if self.failed is None:
            self._close_chunk()
        else:
            self.dropped += self._n
        self._queue.put(None)
        self._thread.join(timeout=60)
        if self.failed is not None and not self._warned:
            self._warn()

    def stats(self) -> LogStats:
        return LogStats(dir=str(self.dir), session=self.session, records=self.records, chunks=self.chunks,
                        bytes=sum(self._sizes.values()), rotated=self.rotated, dropped=self.dropped + self._lost,
                        failed=self.failed)  # fmt: skip

    # -- the writer thread ---------------------------------------------------------------------------

    def _writer(self) -> None:
        while True:
            chunk = self._queue.get()
            if chunk is None:
                return
            try:
                if self.failed is None:
                    self._write(chunk)
                else:
                    self._lost += chunk.n
            except OSError as e:  # a full disk, a removed folder, an I/O error: stop logging, keep acting
                self.failed = f"{e.strerror or type(e).__name__} writing a chunk"
                self._lost += chunk.n
            finally:
                if len(self._pool) < 2:
                    self._pool.append(chunk.obs)

    def _write(self, chunk: _Closed) -> None:
        n = chunk.n
        self._seq += 1
        name = f"{self.session}-{self._seq:06d}.npz"
        step = chunk.step
        arrays = {"step": step, "t_ns": chunk.t_ns, "act_ns": chunk.act_ns, "flags": chunk.flags,
                  "actions": chunk.actions, "obs": chunk.obs[:n]}  # fmt: skip
        meta = {"manifest_sha256": self.header.manifest_sha256, "model": self.header.model,
                "session": self.session, "seq": self._seq, "records": n, "first_step": int(step[0]),
                "last_step": int(step[-1]), "dropped": chunk.dropped}  # fmt: skip
        data = chunk_bytes(arrays, meta)
        self._rotate(len(data))
        atomic_write_bytes(self.dir / name, data)
        self._sizes[name] = len(data)
        self.chunks += 1

    def _rotate(self, incoming: int) -> None:
        """Remove the oldest chunks (ours by name) until ``incoming`` more bytes fit under the cap."""
        while self._sizes and sum(self._sizes.values()) + incoming > self.max_bytes:
            oldest = next(iter(self._sizes))
            with contextlib.suppress(FileNotFoundError):
                (self.dir / oldest).unlink()
            del self._sizes[oldest]
            self.rotated += 1
