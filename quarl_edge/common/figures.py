"""Figures: matplotlib on its Agg backend, imported on first use (it costs ~0.5 s and is not needed to
bench or gate), and the one rule for writing a PNG: a file of that name is replaced only when it is a
matplotlib figure (a user's image of the same name is refused in one line, quarl_edge.outputs.claim),
and the new file appears atomically."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from quarl_edge.outputs import Kind, claim
from quarl_edge.runtimes.fsutil import atomic_write_bytes


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def is_matplotlib_png(path: Path) -> bool:
    """A PNG that matplotlib wrote (its tEXt chunk names the software)."""
    try:
        with path.open("rb") as f:
            head = f.read(512)
    except OSError:
        return False
    return head.startswith(b"\x89PNG") and b"Matplotlib" in head


FIGURE = Kind("matplotlib figure", False, is_matplotlib_png)


def save_png(fig: Any, path: Path, *, owner: str = "the study", dpi: int = 120, tight: bool = True) -> Path:
    """Write ``fig`` to ``path`` (claimed first: only a figure may be replaced) and close it. ``owner``
    names the writer in a refusal ("the study's 'ptq_int8_drift.png' exists and is not ...")."""
    try:
        claim(path, FIGURE, name=f"{owner}'s {path.name!r}")
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight" if tight else None)
    finally:
        pyplot().close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path
