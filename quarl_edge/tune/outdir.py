"""tune's ``--out`` folder: checked before anything is written, and held by one tune at a time.

The check is the one rule every writer follows (quarl_edge.outputs ``claim``), applied to the folder and to
each thing tune puts in it: ``tune.json`` (a report of ours), ``tune.md`` (our title), ``tune.png`` (our
plot), ``bundle/`` (a bundle of ours) and ``.cache/`` (tune's cache: tagged with a CACHEDIR.TAG of ours, or
holding a state.json of ours). Any other name in the folder, or one of those names holding something
that is not ours, is refused in one line before the policy is loaded.

The lock is an OS lock (``fcntl.flock``) on ``.cache/lock``: it goes with the process that holds it, so a
killed tune never leaves the folder locked; a second tune into the same folder is refused at once.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Iterator
from pathlib import Path

from quarl_edge.bench.report import REPORT
from quarl_edge.common.figures import is_matplotlib_png
from quarl_edge.outputs import BUNDLE, Kind, claim, json_format
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.fsutil import atomic_write_text
from quarl_edge.tune.cache import STATE_FORMAT
from quarl_edge.tune.config import TuneConfig
from quarl_edge.tune.report import TUNE_MARKDOWN

CACHE, LOCK, STATE, TAG = ".cache", "lock", "state.json", "CACHEDIR.TAG"
CACHE_TAG = ("Signature: 8a477f597d28d172789f06886806bc55\n"
             "# This file is a cache directory tag created by quarl-edge tune.\n"
             "# For information about cache directory tags see https://bford.info/cachedir/\n")  # fmt: skip
"""the standard cache-directory tag (backup tools skip the folder), with our own second line"""
OUTPUTS = ("tune.json", "tune.md", "tune.png", "bundle", CACHE)


def _tagged(path: Path) -> bool:
    tag = path / TAG
    try:
        if not tag.is_file() or tag.is_symlink():
            return False
        with tag.open("rb") as f:
            return f.read(len(CACHE_TAG) + 1) == CACHE_TAG.encode()
    except OSError:
        return False


def is_tune_cache(path: Path) -> bool:
    """A cache folder tune made: our tag in it, or (made before the tag) a state.json of ours."""
    return _tagged(path) or json_format(path / STATE) == STATE_FORMAT


def _leftover(name: str) -> bool:
    """What our atomic writers leave beside an output when killed (runtimes.fsutil cleans them)."""
    outputs = "|".join(re.escape(o) for o in OUTPUTS)
    return (
        re.fullmatch(rf"\.(?:{outputs})\.(?:\d+\.)?[a-z0-9_]{{8}}\.tmp|\.(?:{outputs})\.old-\d+", name)
        is not None
    )


def _entries(path: Path) -> set[str]:
    return {*OUTPUTS, *(e.name for e in path.iterdir() if _leftover(e.name))}


TUNE_FOLDER = Kind("tune folder", True, Path.is_dir, _entries)
TUNE_CACHE = Kind("tune cache", True, is_tune_cache)
TUNE_PLOT = Kind("tune plot", False, is_matplotlib_png)


def check_out(cfg: TuneConfig) -> None:
    """Refuse (InputError, one line) an ``--out`` that tune may not write, before anything is written."""
    inputs = [
        ("policy", cfg.policy),
        ("calibration file", cfg.calibration),
        ("VecNormalize file", cfg.vecnormalize),
    ]
    claim(cfg.out, TUNE_FOLDER, inputs)
    out = cfg.out
    for path, kind, name in ((out / "tune.json", REPORT, None), (out / "tune.md", TUNE_MARKDOWN, None),
                             (out / "tune.png", TUNE_PLOT, None), (out / "bundle", BUNDLE, "the tuned bundle"),
                             (out / CACHE, TUNE_CACHE, None)):  # fmt: skip
        claim(path, kind, name=name or f"{path.name!r} in --out {str(out)!r}")


@contextlib.contextmanager
def locked(out: Path) -> Iterator[Path]:
    """Hold ``out`` for this tune (yields its cache folder); another tune holding it is one InputError."""
    cache = out / CACHE
    cache.mkdir(parents=True, exist_ok=True)
    if not _tagged(cache):
        atomic_write_text(cache / TAG, CACHE_TAG)
    try:
        fd = os.open(cache / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as e:  # a link or a folder in its place
        raise InputError(f"cannot lock {str(cache / LOCK)!r} ({e.strerror})",
                         "remove it (tune makes it again), or pass another --out") from None  # fmt: skip
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            raise InputError(
                f"another tune is writing to --out {str(out)!r}"
                + (f" (pid {holder})" if holder.isdigit() else ""),
                "wait for it to finish, or pass another --out",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield cache
    finally:
        os.close(fd)
