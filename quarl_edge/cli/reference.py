"""docs/usage.md's reference of every command and option, made from the CLI itself so the two cannot drift.

``python -m quarl_edge.cli.reference docs/usage.md`` rewrites the block between the two markers below;
tests/test_docs_usage.py fails when the block differs from what the CLI says (and names this command).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BEGIN = (
    "<!-- reference: made by `python -m quarl_edge.cli.reference docs/usage.md` from the CLI; do not edit -->"
)
END = "<!-- end of reference -->"


def commands(group: Any, path: tuple[str, ...] = ("quarl-edge",)) -> Iterator[tuple[str, Any]]:
    """Every leaf command of the app (``quarl-edge devices setup``, ...), in the order `--help` lists them."""
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from commands(cmd, (*path, name))
        else:
            yield " ".join((*path, name)), cmd


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _default(p: Any) -> str:
    """The default the CLI shows, when it has one worth saying (not "not given", not a flag's off)."""
    if isinstance(p.show_default, str):
        return p.show_default
    if p.default is None or p.default is False or p.default == () or p.is_flag and p.default is True:
        return ""
    return str(p.default)


def _name(p: Any) -> str:
    if p.param_type_name == "argument":
        return f"`{p.name.upper()}`"
    return " / ".join(f"`{n}`" for n in [*p.opts, *p.secondary_opts])


def reference(app: Any) -> str:
    """The Markdown block: one table per command, one row per argument and option (``--help`` left out)."""
    import typer.main

    out = [BEGIN, ""]
    for path, cmd in commands(typer.main.get_command(app)):
        summary = _cell((cmd.help or "").strip().split("\n\n")[0])
        out += [f"### `{path}`", "", summary, "", "| argument / option | what |", "|---|---|"]
        for p in cmd.params:
            if "--help" in getattr(p, "opts", ()):
                continue
            what = _cell(p.help or "")
            notes = [
                x
                for x in ("required" if p.required else "", f"default: {_default(p)}" if _default(p) else "")
                if x
            ]
            if notes:
                what += f" ({'; '.join(notes)})" if what else "; ".join(notes)
            out.append(f"| {_name(p)} | {_cell(what)} |")
        out.append("")
    return "\n".join([*out, END])


def replaced(doc: str, block: str) -> str:
    """``doc`` with its reference block replaced by ``block`` (appended when it has none)."""
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        return head + block + rest.split(END, 1)[1]
    return doc.rstrip("\n") + "\n\n" + block + "\n"


def main(argv: list[str]) -> int:
    from quarl_edge.cli import app

    if len(argv) != 1:
        print("usage: python -m quarl_edge.cli.reference docs/usage.md", file=sys.stderr)
        return 2
    from quarl_edge.runtimes.fsutil import atomic_write_text

    path = Path(argv[0])
    atomic_write_text(path, replaced(path.read_text(), reference(app)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
