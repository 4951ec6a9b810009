"""What a path inside a bundle may be, and reading a bundle's files without following a link.

A bundle is a folder of plain files, read on the host and copied to boards, where every relative path
of its manifest becomes a path in the board's cache. So each path the manifest names is a plain
relative path: segments of one safe alphabet (the names our exporters write: ``policy.int8.onnx``,
``policy.onnx-int8-minmax-float-out.onnx``, ``trace.npz``; letters, digits, ``. _ -``: nothing a shell
globs, splits or expands), none empty, ``.`` or ``..``, none starting with ``.`` or ``-``, no backslash, no control or non-ASCII character (a fullwidth or one-dot-leader
"..", U+FF0E U+FF0E or U+2025, is refused with the rest), bounded in length and depth. Names that become
paths or command words on a board (model names, the name ``deploy`` gives a bundle) use the same
alphabet.

And no file or folder inside a bundle is a symlink: each file is opened one segment at a time with
``O_NOFOLLOW`` from the bundle's own folder, so a link planted at any segment is refused rather than
followed (checking ``resolve()`` would follow it on the host and miss what the same path means on a
board, where the link is an ordinary folder). The bundle folder itself may be a link (``deploy`` names
the board's cached copy so).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
from pathlib import Path

from .errors import InputError, IntegrityError

SAFE_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
SAFE_CHARS = "A-Z a-z 0-9 . _ -"
# quarl-edge 0.1's tune named models `...-float[mlp.0,out]` (brackets glob in a shell): such a bundle is
# refused with the command that makes it again, never read under a looser rule
_OLD_SEGMENT = re.compile(r"[A-Za-z0-9_,+\[\]][A-Za-z0-9._,+\[\]-]*")
_OLD_FIX = "an older quarl-edge named tune's models so; export the bundle again (quarl-edge export), or run quarl-edge tune again"
MAX_NAME = 128
"""characters of a model name or of one path segment"""
MAX_PATH = 255
MAX_DEPTH = 8
MAX_ENTRIES = 10_000
"""files and folders in a bundle: ours hold a manifest, a few models and a trace"""
_CHUNK = 1 << 20


def _shown(v: object) -> str:
    return ascii(v)[:80]  # ascii(): a control character or a confusable prints as its escape


def safe_name(v: object, what: str, fix: str, max_len: int = MAX_NAME) -> str:
    """``v`` when it is a name of the safe alphabet, not starting with ``.`` or ``-``; else InputError."""
    if not isinstance(v, str) or not 0 < len(v) <= max_len or not SAFE_SEGMENT.fullmatch(v):
        if isinstance(v, str) and len(v) <= max_len and _OLD_SEGMENT.fullmatch(v):
            raise InputError(f"{what} {_shown(v)} has [ ] , or + (not safe in a shell)", _OLD_FIX)
        raise InputError(
            f"{what} {_shown(v)} is not a safe name ({SAFE_CHARS}; not starting with . or -; "
            f"at most {max_len} characters)",
            fix,
        )
    return v


def rel_path(v: object, what: str, fix: str) -> str:
    """``v`` when it is a plain relative path of safe segments joined by ``/``; else InputError."""
    if not isinstance(v, str) or not 0 < len(v) <= MAX_PATH:
        raise InputError(f"{what} {_shown(v)} is not a path of 1 to {MAX_PATH} characters", fix)
    parts = v.split("/")
    if len(parts) > MAX_DEPTH:
        raise InputError(f"{what} {_shown(v)} is more than {MAX_DEPTH} folders deep", fix)
    for i, seg in enumerate(parts):
        why = _segment_problem(seg, i)
        if why and len(seg) <= MAX_NAME and _OLD_SEGMENT.fullmatch(seg):
            raise InputError(f"{what} {_shown(v)} has [ ] , or + (not safe in a shell)", _OLD_FIX)
        if why:
            raise InputError(f"{what} {_shown(v)} {why}: not a plain path inside the bundle", fix)
    return v


def _segment_problem(seg: str, index: int) -> str | None:
    if len(seg) <= MAX_NAME and SAFE_SEGMENT.fullmatch(seg):
        return None
    if not seg:
        return "is absolute" if index == 0 else "has an empty segment"
    if seg in (".", ".."):
        return f"has a {seg!r} segment"
    if "\\" in seg:
        return "has a backslash"
    return f"has a segment {_shown(seg)} outside the safe alphabet ({SAFE_CHARS}; not starting with . or -; at most {MAX_NAME} characters)"


def _link_error(bundle: Path, rel: str) -> IntegrityError:
    return IntegrityError(
        f"bundle {str(bundle)!r}: {rel!r} is a symlink or lies under one (a bundle is plain files)",
        "re-export the bundle; never copy it with links kept",
    )


def open_file(bundle: Path, rel: str) -> int:
    """A read-only descriptor of the regular file ``bundle/rel``, every segment opened with
    O_NOFOLLOW. FileNotFoundError when it is missing; IntegrityError for a link or a non-file."""
    rel_path(rel, "bundle file", "re-export the bundle")
    parts = rel.split("/")
    fd = os.open(bundle, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for seg in parts[:-1]:
            try:
                nxt = os.open(seg, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _link_error(bundle, rel) from None
                raise
            os.close(fd)
            fd = nxt
        try:
            leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise _link_error(bundle, rel) from None
            raise
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(leaf).st_mode):
        os.close(leaf)
        raise IntegrityError(f"bundle {str(bundle)!r}: {rel!r} is not a regular file", "re-export the bundle")
    return leaf


def read_file(bundle: Path, rel: str, max_bytes: int) -> bytes:
    """The bytes of ``bundle/rel`` (see open_file); InputError when larger than ``max_bytes``."""
    fd = open_file(bundle, rel)
    with os.fdopen(fd, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise InputError(f"bundle file {rel!r} is larger than {max_bytes} bytes", "re-export the bundle")
    return data


def sha256_of(bundle: Path, rel: str) -> str:
    """The sha256 of ``bundle/rel``, read through open_file (never through a link)."""
    h = hashlib.sha256()
    with os.fdopen(open_file(bundle, rel), "rb") as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def entries(bundle: Path) -> list[str]:
    """Every file and folder under ``bundle`` (relative, ``/``-joined), never entering a link.
    IntegrityError at the first symlink found; InputError for more than MAX_ENTRIES."""
    out: list[str] = []
    stack = [""]
    while stack:
        prefix = stack.pop()
        with os.scandir(bundle / prefix if prefix else bundle) as it:
            for e in it:
                rel = f"{prefix}{e.name}"
                if e.is_symlink():
                    raise _link_error(bundle, rel)
                out.append(rel)
                if len(out) > MAX_ENTRIES:
                    raise InputError(
                        f"{str(bundle)!r} holds more than {MAX_ENTRIES} entries: not a bundle",
                        "pass the bundle folder `quarl-edge export` wrote",
                    )
                if e.is_dir(follow_symlinks=False):
                    stack.append(f"{rel}/")
    return sorted(out)
