"""The one Markdown table writer: every cell, header included, escaped (text.md_cell), so a name read from
a bundle, a device or a file stays inside its cell and renders as text."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from quarl_edge.text import md_cell


def markdown_table(columns: Sequence[object], rows: Iterable[Sequence[object]]) -> list[str]:
    """The table's lines: header, separator, one line per row."""

    def line(cells: Sequence[object]) -> str:
        return "| " + " | ".join(md_cell(c) for c in cells) + " |"

    return [line(columns), "|" + "---|" * len(columns), *(line(r) for r in rows)]
