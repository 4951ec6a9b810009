"""Hashing and atomic writes: an artifact is either complete or absent, never half-written."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_CHUNK = 1 << 20
STALE_AFTER_S = 3 * 3600
"""a temporary name older than this is a leftover, whoever made it (a run is minutes, not hours)"""
_DEAD_GRACE_S = 60
"""a temporary name of a process that no longer runs is a leftover once it is this old: the grace
covers a writer in another PID namespace (a container) that shares the folder"""


def temp_prefix(name: str) -> str:
    """The temporary name's start for ``name``: ``.NAME.PID.`` (mkstemp adds 8 characters and .tmp),
    so the next run can tell a killed writer's leftover from a running one's (clean_leftovers)."""
    return f".{name}.{os.getpid()}."


def sha256_file(path: str | os.PathLike[str]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=temp_prefix(path.name), suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; artifacts are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n")


def finite_json(obj: Any) -> Any:
    """``obj`` with every NaN/inf (not JSON) as None, through dicts, lists and tuples: what the device's
    runner sends and the CLI prints is strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


@contextlib.contextmanager
def atomic_directory(final: str | os.PathLike[str], *, overwrite: bool = True) -> Iterator[Path]:
    """Build a directory under a temporary name beside ``final`` and rename it into place on success.

    On any exception the temporary directory is removed and ``final`` is left as it was.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(final.name), suffix=".tmp", dir=final.parent))
    try:
        os.chmod(tmp, 0o755)
        yield tmp
        if final.exists():
            if not overwrite:
                raise FileExistsError(final)
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


_RANDOM = "[a-z0-9_]{8}"  # what tempfile adds to a prefix


def pid_running(pid: int) -> bool:
    """Whether process ``pid`` may still be at work: True for our own, another user's or a non-PID (not
    ours to judge); False when it is gone or a zombie (a killed process whose parent died with the session
    waits as a zombie until init reaps it)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _stale(path: Path, pid: str | None, now: float) -> bool:
    """Ours (same user), and left by a run that is over: its process is gone, or it is hours old."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    if st.st_uid != os.getuid() or stat.S_ISLNK(st.st_mode) or pid == str(os.getpid()):
        return False
    age = now - st.st_mtime
    if age > STALE_AFTER_S:
        return True
    return pid is not None and age > _DEAD_GRACE_S and not pid_running(int(pid))


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def clean_leftovers(final: str | os.PathLike[str]) -> list[Path]:
    """Remove what killed runs of our atomic writers left beside ``final``; returns what was removed.

    Only names these writers make are touched: ``.NAME.PID.XXXXXXXX.tmp`` (and ``.NAME.XXXXXXXX.tmp``
    of earlier versions), a file or folder being built, and ``.NAME.old-PID``, the replaced folder of
    a run killed between its two renames (removed only when NAME exists again: otherwise it is the one
    complete copy). Each must belong to this user and be stale (_stale).
    """
    final = Path(final)
    if not final.parent.is_dir():
        return []
    name = re.escape(final.name)
    tmp = re.compile(rf"\.{name}\.(?:(\d+)\.)?{_RANDOM}\.tmp")
    old = re.compile(rf"\.{name}\.old-(\d+)")
    now, removed = time.time(), []
    for entry in final.parent.iterdir():
        m = tmp.fullmatch(entry.name)
        o = None if m else old.fullmatch(entry.name)
        if m and _stale(entry, m.group(1), now) or o and final.exists() and _stale(entry, o.group(1), now):
            _remove(entry)
            removed.append(entry)
    return removed


def clean_temp_dirs(prefix: str) -> list[Path]:
    """Remove this user's stale ``PREFIX-PID-XXXXXXXX`` / ``PREFIX-XXXXXXXX`` folders in the system temp
    folder (tempfile.mkdtemp(prefix=temp_dir_prefix(PREFIX)) makes them); returns what was removed."""
    pattern = re.compile(rf"{re.escape(prefix)}-(?:(\d+)-)?{_RANDOM}")
    now, removed = time.time(), []
    for entry in Path(tempfile.gettempdir()).iterdir():
        m = pattern.fullmatch(entry.name)
        if m and entry.is_dir() and _stale(entry, m.group(1), now):
            _remove(entry)
            removed.append(entry)
    return removed


def temp_dir_prefix(prefix: str) -> str:
    return f"{prefix}-{os.getpid()}-"
