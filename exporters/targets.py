"""The export targets: the built-in exporters loaded into the registry, and target names validated.

Kept apart from base.py (the registry itself), which exporters/onnx.py and exporters/tflite.py import
to register: loading them from base.py would make an import circle.
"""

from __future__ import annotations

from quarl_edge.exporters.base import EXPORTERS, REQUIREMENTS, _importable, missing_dependency
from quarl_edge.runtimes.errors import InputError


def load_builtin() -> None:
    # The modules import their converters lazily, so each registers its targets even when its
    # optional extra is not installed; resolve_targets() then names the install command.
    from quarl_edge.exporters import c, onnx, tflite  # noqa: F401


def resolve_targets(spec: str | list[str]) -> list[str]:
    """Validate export target names and their optional dependencies before any expensive step."""
    load_builtin()
    names = [t.strip() for t in (spec.split(",") if isinstance(spec, str) else spec) if t.strip()]
    if not names:
        raise InputError("no export targets given", f"pass --to with some of: {', '.join(EXPORTERS)}")
    unknown = [n for n in names if n not in EXPORTERS]
    if unknown:
        raise InputError(f"unknown export target {unknown[0]!r}", f"known targets: {', '.join(EXPORTERS)}")
    for name in names:
        req = REQUIREMENTS.get(name)
        missing = [m for m in req.modules if not _importable(m)] if req is not None else []
        if req is not None and missing:
            raise missing_dependency(name, missing[0], req)
    return list(dict.fromkeys(names))
