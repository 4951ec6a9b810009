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
class RunnerZip:
    data: bytes
    sha256: str
    files: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"{self.sha256}.pyz"


def _sources() -> list[tuple[str, Path]]:
    pkg = importlib.util.find_spec("quarl_edge")
    rt = importlib.util.find_spec("quarl_edge.runtimes")
    if pkg is None or pkg.origin is None or rt is None or not rt.submodule_search_locations:
        raise QuarlError("cannot locate the installed quarl_edge.runtimes package", "reinstall quarl-edge")
    runtimes = Path(next(iter(rt.submodule_search_locations)))
    files = [("quarl_edge/__init__.py", Path(pkg.origin))]
    files += [(f"quarl_edge/runtimes/{p.name}", p) for p in sorted(runtimes.glob("*.py"))]
    return files


def build_runner_zip() -> RunnerZip:
    """The zipapp of the installed runner code (built in memory; a few hundred KiB)."""
    buf = io.BytesIO()
    names = []
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        entries = [("__main__.py", MAIN)] + [(arc, src.read_bytes()) for arc, src in _sources()]
        for arc, data in sorted(entries):
            info = zipfile.ZipInfo(arc, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            info.create_system = 3  # unix, whatever the host
            zf.writestr(info, data)
            names.append(arc)
    data = buf.getvalue()
    return RunnerZip(data=data, sha256=sha256_bytes(data), files=tuple(names))
