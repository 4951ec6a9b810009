"""The device runner as one zipapp: ``quarl_edge/__init__.py`` + ``quarl_edge/runtimes/*.py``, pure Python.

The archive is byte-for-byte reproducible (sorted entries, fixed timestamps and modes, stored without
compression), so its sha256 names it: a device keeps ``runner/<sha256>.pyz`` in its cache and a new
upload happens only when the runner code changed. ``python runner.pyz run|info ...`` is the same CLI as
``python -m quarl_edge.runtimes``; the zip comes first on ``sys.path``, so a quarl_edge installed on the
device (if any) is never what runs.
"""

from __future__ import annotations

import importlib.util
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

from quarl_edge.runtimes.errors import QuarlError
from quarl_edge.runtimes.fsutil import sha256_bytes

MAIN = (
    b'"""quarl-edge device runner (zipapp): python runner.pyz run|info ..."""\n'
    b"import sys\n\nfrom quarl_edge.runtimes.__main__ import main\n\nsys.exit(main())\n"
)
_EPOCH = (1980, 1, 1, 0, 0, 0)


@dataclass(frozen=True)
class Archive:
    """A zip built in memory from this installation: its bytes, their sha256, its entries, its file name."""

    data: bytes
    sha256: str
    files: tuple[str, ...]
    name: str


RunnerZip = Archive


def write_zip(entries: list[tuple[str, bytes]], compression: int = zipfile.ZIP_STORED) -> bytes:
    """``entries`` in the given order, with fixed timestamps and modes: the same bytes on every host."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=compression) as zf:
        for arc, data in entries:
            info = zipfile.ZipInfo(arc, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.create_system = 3  # unix, whatever the host
            info.compress_type = compression
            zf.writestr(info, data)
    return buf.getvalue()


def _sources() -> list[tuple[str, Path]]:
    pkg = importlib.util.find_spec("quarl_edge")
    rt = importlib.util.find_spec("quarl_edge.runtimes")
    if pkg is None or pkg.origin is None or rt is None or not rt.submodule_search_locations:
        raise QuarlError("cannot locate the installed quarl_edge.runtimes package", "reinstall quarl-edge")
    runtimes = Path(next(iter(rt.submodule_search_locations)))
    files = [("quarl_edge/__init__.py", Path(pkg.origin))]
    files += [(f"quarl_edge/runtimes/{p.name}", p) for p in sorted(runtimes.glob("*.py"))]
    return files


def build_runner_zip() -> Archive:
    """The zipapp of the installed runner code (built in memory; a few hundred KiB)."""
    entries = sorted([("__main__.py", MAIN)] + [(arc, src.read_bytes()) for arc, src in _sources()])
    data = write_zip(entries)
    sha = sha256_bytes(data)
    return Archive(data=data, sha256=sha, files=tuple(arc for arc, _ in entries), name=f"{sha}.pyz")
