"""The importer registry: one importer per source format, each turning a path into the same Policy
(PolicySpec + torch module), and the one place that decides which importer reads a path.

Importers register by name from their own module (checkpoint_source.py, zoo_folder.py, sb3_zip.py,
rsl_rl.py); adding a format means adding one module and naming it in BUILTIN below.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from quarl_edge.runtimes.errors import InputError

if TYPE_CHECKING:
    from quarl_edge.policy.net import Policy


@dataclass(frozen=True)
class LoadOptions:
    """What the user said about a policy beyond its path (each None: found from the policy itself)."""

    env_id: str | None = None
    algo: str | None = None
    vecnormalize: Path | None = None
    io: Path | None = None
    """an I/O description (io.yaml) for a policy from another framework"""
    env_hint: str | None = None
    """an env id found beside the policy (a calibration file's metadata, an RL Zoo folder's config),
    used when the policy itself does not say"""
    env_hint_from: str = ""
    """where env_hint was found, for `quarl-edge inspect` (e.g. "calibration file metadata")"""


@dataclass(frozen=True)
class Source:
    name: str
    description: str
    detect: Callable[[Path], bool]
    """whether this importer reads ``path`` (cheap: names and headers, no weights)"""
    load: Callable[[Path, LoadOptions], Policy]


SOURCES: dict[str, Source] = {}
BUILTIN = (
    "quarl_edge.policy.checkpoint_source",
    "quarl_edge.policy.zoo_folder",
    "quarl_edge.policy.sb3_zip",
    "quarl_edge.policy.rsl_rl",
    "quarl_edge.policy.onnx_source",
)
"""importer modules, in detection order (a folder of ours before an RL Zoo folder; sb3-contrib before
SB3, which takes any other zip to report what is wrong with it)"""


def register(source: Source) -> Source:
    SOURCES[source.name] = source
    return source


def sources() -> list[Source]:
    for module in BUILTIN:
        importlib.import_module(module)
    return [SOURCES[n] for n in SOURCES]


def detect(path: Path) -> Source:
    """The importer that reads ``path``; an InputError naming the formats when none does."""
    found = next((s for s in sources() if s.detect(path)), None)
    if found is not None:
        return found
    if not path.exists():
        raise InputError(f"policy {str(path)!r} does not exist", "pass a checkpoint folder or an SB3 .zip")
    raise InputError(
        f"{str(path)!r} is not a policy quarl-edge can read",
        "pass one of: " + "; ".join(s.description for s in sources()),
    )
