"""The defaults the CLI's help shows, read from the configs that define them: each default is defined
once, in its config, and a CLI option's own default is None ("not given"), so the config's stands.

A light config is read directly (``default(BenchConfig, "episodes")``). A config whose module imports torch
(record.py, exporters/base.py, train/, actorq/) is read from its source, without importing it
(``source_default``): typer builds every command's help on each run, and importing those modules costs
~4 s. tests/test_cli_defaults.py checks every value read so against the imported config."""

from __future__ import annotations

import ast
import dataclasses
import functools
import importlib.util
from pathlib import Path
from typing import Any

READ: list[tuple[str, str, str]] = []
"""every (module, class, field) source_default has read: what the test compares with the imports"""


def given(**options: object) -> dict[str, Any]:
    """The options the user gave (not None), as a config's keyword arguments: its defaults stand for the rest."""
    return {k: v for k, v in options.items() if v is not None}


def shown(value: Any) -> str:
    """A default as the help text shows it: 2.0 -> "2", (64, 64) -> "64,64", 20000 -> "20000"."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def default(config: type, name: str) -> str:
    """The default of dataclass ``config``'s field ``name``, as shown."""
    return shown(next(f.default for f in dataclasses.fields(config) if f.name == name))


@functools.cache
def _classes(module: str) -> dict[str, ast.ClassDef]:
    spec = importlib.util.find_spec(module)  # imports the parent packages only (their __init__ is empty)
    if spec is None or spec.origin is None:
        raise ImportError(f"no module {module}")
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    return {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}


def source_default(module: str, config: str, name: str) -> str:
    """The literal default (or ``Path(literal)``) of ``config.name`` in ``module``'s source, as shown."""
    for node in _classes(module)[config].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name \
                and node.value is not None:  # fmt: skip
            READ.append((module, config, name))
            value = node.value
            if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "Path":
                value = value.args[0]  # Path("out/study-ptq"): shown as its text
            return shown(ast.literal_eval(value))
    raise LookupError(f"{module}.{config} has no literal default for {name!r}")
