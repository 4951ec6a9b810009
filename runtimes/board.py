"""The board's side of its bundle cache: receive a bundle, verify a cached copy, name it for ``deploy``,
and remove what cut uploads left. Standard library only (runs before numpy is there).

The host streams a bundle to ``python runner.pyz receive --dest CACHE/bundles/KEY ...`` over one SSH
command; the stream (``stream_bundle``) is a magic line, then per file a JSON header line
``{"path": REL, "size": N}`` and N bytes, then ``{"end": N_FILES}``. The board writes it into a
temporary folder ``.KEY.PID.XXXXXXXX.tmp`` beside the final name (its PID in the name, so a later run
can tell a killed receiver's leftover from a running one's), checks every path and recomputes every
sha256 there, against the manifest the host named by its sha256, and only then renames it into place.
A cut stream, a hang-up or a refused bundle removes the temporary folder; a receiver killed outright
leaves it to the next session's ``clean_cache``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from .bundlepath import entries, rel_path, safe_name, sha256_of
from .errors import InputError, IntegrityError, QuarlError
from .fsutil import STALE_AFTER_S, pid_running, temp_prefix
from .manifest import (
    bundle_files,
    check_plain,
    parse_manifest,
    read_manifest_bytes,
    verify_files,
)
from .schema import JSONObject
from .signing import SIGNATURE_NAME, check_signature

COMPLETE = ".complete"
"""written last into a cached bundle: the folder is whole and verified"""
MAGIC = b"quarl-edge/bundle-stream 1\n"
MAX_HEADER = 4096
MAX_FILES = 300
MAX_FILE_BYTES = 1 << 34
_CHUNK = 1 << 20
_TEMP = re.compile(r"\.(?P<name>.+)\.(?P<pid>\d+)\.[a-z0-9_]{8}\.tmp")
"""fsutil.temp_prefix's names (and the shell uploads' ``.NAME.$$.XXXXXXXX.tmp``)"""
_OLD_TEMP = re.compile(r"\.?.+\.[0-9a-f]{8}\.tmp")
"""the temporary names of earlier versions, without a PID"""
FIX = "upload it again (bench or deploy does); if it happens again, re-export the bundle on the host"


def stream_bundle(files: list[tuple[str, bytes]]) -> bytes:
    """The host's side of the protocol: the stream ``receive`` reads."""
    parts = [MAGIC]
    for rel, data in files:
        parts += [json.dumps({"path": rel, "size": len(data)}).encode() + b"\n", data]
    parts.append(json.dumps({"end": len(files)}).encode() + b"\n")
    return b"".join(parts)


def verify_cached(bundle: Path, manifest_sha256: str, signature_sha256: str | None = None) -> JSONObject:
    """Check a bundle on the board against the host's: its manifest.json has ``manifest_sha256``, every
    path it names is plain, every file's sha256 is recomputed, nothing else is there, and (when given)
    its manifest.sig has ``signature_sha256``. Returns what was checked."""
    data = read_manifest_bytes(bundle)
    actual = hashlib.sha256(data).hexdigest()
    if actual != manifest_sha256:
        raise IntegrityError(
            f"the board's manifest.json in {str(bundle)!r} is {actual[:12]}, the host sent {manifest_sha256[:12]}",
            FIX,
        )
    manifest = parse_manifest(data, bundle)
    check_plain(bundle)
    signed_by = check_signature(bundle, data)  # when this board trusts keys, only their signatures pass
    verify_files(bundle, manifest)
    named = set(bundle_files(manifest))
    allowed = named | {COMPLETE} | {f.rsplit("/", i)[0] for f in named for i in range(1, f.count("/") + 1)}
    if signature_sha256 is not None:
        allowed.add(SIGNATURE_NAME)
        got = sha256_of(bundle, SIGNATURE_NAME) if (bundle / SIGNATURE_NAME).exists() else "none"
        if got != signature_sha256:
            raise IntegrityError(f"the board's manifest.sig in {str(bundle)!r} is not the host's", FIX)
    extra = next((e for e in entries(bundle) if e not in allowed), None)
    if extra is not None:
        raise IntegrityError(
            f"the board's copy {str(bundle)!r} holds {extra!r}, which its manifest does not name", FIX
        )
    return {"manifest_sha256": actual, "files": len(named), "signed_by": signed_by}


class _HungUp(Exception):
    pass


def _raise(signum: int, _frame: Any) -> None:
    raise _HungUp(f"signal {signum}")


@contextlib.contextmanager
def _hang_up_raises() -> Iterator[None]:
    """SIGHUP / SIGTERM (the SSH session going away) unwind like an error, so the temp folder goes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, _raise) for s in (signal.SIGHUP, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _copy_exact(stream: IO[bytes], n: int, out: IO[bytes], rel: str) -> None:
    got = 0
    while got < n:
        block = stream.read(min(_CHUNK, n - got))
        if not block:
            raise IntegrityError(f"the upload was cut: {got} of {n} bytes of {rel!r} arrived", FIX)
        got += len(block)
        out.write(block)


def _header(stream: IO[bytes]) -> JSONObject:
    line = stream.readline(MAX_HEADER)
    if not line.endswith(b"\n"):
        raise IntegrityError("the upload was cut (or is not a bundle stream) between two files", FIX)
    try:
        h = json.loads(line)
    except ValueError:
        raise IntegrityError("a bundle stream header is not JSON", FIX) from None
    if not isinstance(h, dict):
        raise IntegrityError("a bundle stream header is not an object", FIX)
    return h


def _receive_into(tmp: Path, stream: IO[bytes]) -> list[str]:
    if stream.read(len(MAGIC)) != MAGIC:
        raise IntegrityError("what arrived is not a quarl-edge bundle stream", FIX)
    received: list[str] = []
    while True:
        h = _header(stream)
        if "end" in h:
            if h["end"] != len(received):
                raise IntegrityError(f"the stream names {h['end']!r} files, {len(received)} arrived", FIX)
            return received
        rel = rel_path(h.get("path"), "uploaded file", FIX)
        size = h.get("size")
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_FILE_BYTES:
            raise IntegrityError(f"uploaded file {rel!r} has no valid size", FIX)
        if rel in received or len(received) >= MAX_FILES:
            raise IntegrityError(f"uploaded file {rel!r} comes twice or past {MAX_FILES} files", FIX)
        # the path is plain and the folder is ours and new: no link can be on the way
        target = tmp / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "xb") as out:
            _copy_exact(stream, size, out, rel)
        received.append(rel)


def receive(final: Path, stream: IO[bytes], manifest_sha256: str,
            signature_sha256: str | None = None) -> JSONObject:  # fmt: skip
    """Receive a bundle stream into ``final`` (a folder named by the bundle's key), verified before it
    is renamed into place. A complete copy already there is kept (another session uploaded it)."""
    safe_name(final.name, "cache entry", "report a bug")
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=temp_prefix(final.name), suffix=".tmp", dir=final.parent))
    try:
        with _hang_up_raises():
            received = _receive_into(tmp, stream)
            checked = verify_cached(tmp, manifest_sha256, signature_sha256)
            (tmp / COMPLETE).write_text(time.strftime("%Y-%m-%dT%H:%M:%S%z\n"))
            os.chmod(tmp, 0o755)
            if (final / COMPLETE).exists():
                shutil.rmtree(tmp)
                return {**checked, "received": len(received), "kept": "existing"}
            if final.exists() or final.is_symlink():  # an incomplete copy of an earlier version
                _remove(final)
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / COMPLETE).exists():
                    raise
                shutil.rmtree(tmp)  # another session finished the same upload first
                return {**checked, "received": len(received), "kept": "existing"}
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {**checked, "received": len(received), "kept": "uploaded"}


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def clean_folder(folder: Path, started: float) -> list[str]:
    """Remove this user's temporary entries in ``folder`` left by a session that is over: a PID-named
    one whose process is gone and that is older than ``started`` (this run's start), or one of an
    earlier version's names older than fsutil.STALE_AFTER_S. A link is removed as a link, never
    followed. Returns the names removed."""
    removed: list[str] = []
    if folder.is_symlink() or not folder.is_dir():
        return removed
    now = time.time()
    for e in folder.iterdir():
        m = _TEMP.fullmatch(e.name)
        if not m and not _OLD_TEMP.fullmatch(e.name):
            continue
        try:
            st = e.lstat()
        except FileNotFoundError:
            continue
        if st.st_uid != os.getuid():
            continue
        if m is not None:  # its writer's PID decides: gone, and the entry older than this run
            over = st.st_mtime < started and not pid_running(int(m.group("pid")))
        else:  # an earlier version's name, without a PID: only hours of age tell
            over = now - st.st_mtime > STALE_AFTER_S
        if over:
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(e, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    e.unlink()
            removed.append(e.name)
    return removed


def clean_cache(cache: Path, started: float) -> list[str]:
    """clean_folder over the cache's folders (runner, traces, bundles, wheels/*): what killed uploads left."""
    folders = [cache, *(cache / d for d in ("runner", "traces", "bundles", "wheels"))]
    wheels = cache / "wheels"
    if wheels.is_dir() and not wheels.is_symlink():
        folders += [d for d in wheels.iterdir() if d.is_dir() and not d.is_symlink()]
    return [f"{f.name}/{n}" for f in folders for n in clean_folder(f, started)]


def name_bundle(bundle: Path, root: Path, name: str, manifest_sha256: str,
                signature_sha256: str | None = None) -> JSONObject:  # fmt: skip
    """Point ``root/name`` at the cached ``bundle`` (deploy's stable name), after verifying the cached
    copy: a new link under a temporary name, renamed over the old link (atomic: a reader sees the old
    bundle or the new one). A real file or folder at the name is refused, never written into.
    Returns the link's path and the manifest sha256 it pointed at before (None: a new name)."""
    safe_name(name, "bundle name", "pass --name with letters, digits, '.', '_', '-'")
    started = time.time()
    checked = verify_cached(bundle, manifest_sha256, signature_sha256)
    root.mkdir(parents=True, exist_ok=True)
    link = root / name
    was = None
    if link.is_symlink():
        with contextlib.suppress(OSError, QuarlError):
            was = hashlib.sha256(read_manifest_bytes(link)).hexdigest()
    elif os.path.lexists(link):
        kind = "folder" if link.is_dir() else "file"
        raise InputError(
            f"{str(link)!r} is a real {kind}, not a name deploy made; refused (nothing written into it)",
            "move it away on the board, or deploy under another name with --name",
        )
    tmp = root / f"{temp_prefix(name)}{os.urandom(4).hex()}.tmp"
    os.symlink(str(bundle), tmp)
    try:
        os.replace(tmp, link)  # rename(2) replaces the link itself, never what it points to
    except OSError as e:  # it became a folder meanwhile
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise InputError(f"cannot name {str(link)!r} ({e.strerror})", "move it away on the board") from None
    clean_folder(root, started)
    return {**checked, "path": str(link), "was": was, "now": manifest_sha256}
