"""Safe outputs: the one check every writer makes of its target before it writes (``claim``).

- A target that exists is replaced only when it is the writer's own kind of artifact (a bundle folder
  is recognised by its manifest, a checkpoint by its policy.json, a report by its format field, a trace
  by being a trace); an empty folder counts as absent. Anything else is refused.
- A folder artifact that also holds entries none of our writers put there (a user's notes in a
  bundle) is refused too: replacing the folder would delete them.
- A target equal to, inside, or holding one of the command's inputs (the policy, the calibration
  file, the bundle being benched) is refused, and so is one inside another bundle or checkpoint.
- A symbolic link is refused: replacing it would replace the link, not what it points to.
- Leftovers of the same writer's killed runs beside the target are removed (runtimes.fsutil).

Refusals are InputError (one line, exit 2) and come before anything is written or removed.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from quarl_edge.policy import format as checkpoint_format
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.fsutil import clean_leftovers
from quarl_edge.runtimes.manifest import BUNDLE_FORMAT, MANIFEST_NAME
from quarl_edge.runtimes.signing import SIGNATURE_NAME
from quarl_edge.runtimes.trace import TRACE_FORMAT

_MAX_SNIFF_BYTES = 64 * 2**20  # more than any JSON file of ours; a bigger file is not one


def json_format(path: Path) -> Any:
    """The ``format`` field of the JSON object in ``path``; None when it is not one (never raises)."""
    try:
        if not path.is_file() or path.stat().st_size > _MAX_SNIFF_BYTES:
            return None
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return data.get("format") if isinstance(data, dict) else None


def text_starts_with(prefix: str | tuple[str, ...]) -> Callable[[Path], bool]:
    """A recogniser for a text file of ours by its first line (a Markdown report's title; any of several)."""
    prefixes = [p.encode() for p in ((prefix,) if isinstance(prefix, str) else prefix)]

    def recognise(path: Path) -> bool:
        try:
            with path.open("rb") as f:
                head = f.read(max(map(len, prefixes)))
        except OSError:
            return False
        return any(head.startswith(p) for p in prefixes)

    return recognise


def is_bundle(path: Path) -> bool:
    return path.is_dir() and json_format(path / MANIFEST_NAME) == BUNDLE_FORMAT


def is_checkpoint(path: Path) -> bool:
    return (
        path.is_dir()
        and json_format(path / checkpoint_format.META_FILE) == checkpoint_format.CHECKPOINT_FORMAT
    )


def is_trace(path: Path) -> bool:
    """A .npz of ours: its ``meta`` names the trace format (the content hash is not checked: a
    damaged trace of ours is still ours to replace)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"][()]))
    except (OSError, ValueError, KeyError, RecursionError, zipfile.BadZipFile, EOFError):
        return False
    return isinstance(meta, dict) and meta.get("format") == TRACE_FORMAT


def _bundle_entries(path: Path) -> set[str]:
    """manifest.json and every file its manifest names (read without verifying: it is being replaced)."""
    names = {MANIFEST_NAME, SIGNATURE_NAME, "trace.npz"}
    try:
        data = json.loads((path / MANIFEST_NAME).read_bytes())
        for m in data.get("models") or []:
            names.add(str(Path(str(m["file"])).parts[0]))
            for f in m.get("files") or []:  # a C model's header, its prebuilt shared objects
                names.add(str(Path(str(f["file"])).parts[0]))
        if isinstance(data.get("trace"), dict):
            names.add(str(Path(str(data["trace"]["file"])).parts[0]))
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
        pass
    return names


@dataclass(frozen=True)
class Kind:
    """One kind of artifact a writer makes: how to recognise an existing one, and what it holds."""

    what: str
    """its name in messages: "bundle", "bench report", ..."""
    folder: bool
    recognise: Callable[[Path], bool]
    entries: Callable[[Path], Collection[str]] | None = field(default=None, compare=False)
    """folder kinds: the names our writers put in an existing one of them"""


BUNDLE = Kind("bundle", True, is_bundle, _bundle_entries)
CHECKPOINT = Kind("checkpoint", True, is_checkpoint, lambda _p: checkpoint_format.ENTRIES)
TRACE = Kind("trace", False, is_trace)
CONTAINERS = (BUNDLE, CHECKPOINT)
"""artifacts nothing else may be written into: the bundle's hashes, the trainer's state"""


def _relation(target: Path, other: Path) -> str | None:
    if target == other:
        return "is"
    if other in target.parents:
        return "is inside"
    if target in other.parents:
        return "holds"
    return None


def _describe_existing(target: Path, kind: Kind) -> str:
    if target.is_dir() and not kind.folder:
        return "is a folder"
    if not target.is_dir() and kind.folder:
        return "is a file"
    return f"is not a quarl-edge {kind.what}"


def claim(
    target: Path,
    kind: Kind,
    inputs: Iterable[tuple[str, Path | None]] = (),
    flag: str = "--out",
    name: str | None = None,
) -> Path:
    """Check that ``target`` may be (re)written as ``kind`` by a command reading ``inputs`` (pairs of
    a label and a path, e.g. ("policy", Path("runs/x"))); then remove the leftovers of killed runs
    beside it. Returns ``target``; raises InputError before anything changes.

    ``flag`` is the option that chose the target, ``name`` how messages call it (default: the flag
    and the path; e.g. "the report's Markdown 'r.md'" for a file written beside --out)."""
    shown = name or f"{flag} {str(target)!r}"
    another = f"pass another {flag}"
    if target.is_symlink():
        raise InputError(f"{shown} is a symbolic link", f"pass the path it points to, or {another}")
    real = target.resolve()
    for label, path in inputs:
        if path is None:
            continue
        rel = _relation(real, path.resolve())
        if rel is not None:
            why = (
                "quarl-edge never writes into its inputs"
                if rel == "is inside"
                else "writing there would destroy it"
            )
            raise InputError(
                f"{shown} {rel} the {label} {str(path)!r} this command reads", f"{why}; {another}"
            )
    for parent in real.parents:
        for container in CONTAINERS:
            if container.recognise(parent):
                raise InputError(
                    f"{shown} is inside the {container.what} {str(parent)!r}",
                    f"writing into it would change what its sha256s and files describe; {another}",
                )
    empty_folder = kind.folder and target.is_dir() and not any(target.iterdir())
    if target.exists() and not empty_folder:
        if not kind.recognise(target):
            raise InputError(
                f"{shown} exists and {_describe_existing(target, kind)}: quarl-edge replaces only a {kind.what} it wrote",
                f"{another} (a new path), or move it away first",
            )
        if kind.entries is not None:
            own = kind.entries(target)
            foreign = sorted(e.name for e in target.iterdir() if e.name not in own)
            if foreign:
                raise InputError(
                    f"{shown} is a {kind.what} that also holds {foreign[0]!r}, which quarl-edge did not write "
                    "there (replacing the folder would delete it)",
                    f"move it out first, or {another}",
                )
    clean_leftovers(target)
    return target
