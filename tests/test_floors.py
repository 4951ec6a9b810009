"""The house's floors, held by parsing the package's imports (as tests/test_runtimes_no_torch.py holds the
device boundary): data flows one way, so a lower floor never imports a higher one, and no module imports
another that imports it back, not even for its types, nor from inside a function to dodge the circle.

- nothing in policy/, quant/, exporters/, runtimes/ imports train/ (the trainer is the top of its flow)
- tune/ and actorq/ import nothing of study/ (the studies sit above them)
- only cli/ imports cli/ (a stage prints through what it is given: demo.py's Printer)
- common/ imports only the standard library, runtimes/, text.py and outputs.py (and matplotlib or Ray
  inside the functions that need them)
- no circle among our modules: module-level imports, TYPE_CHECKING ones and function-level ones together
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the package-dir mapping of pyproject.toml: the role folders install under quarl_edge
FOLDERS = {"quarl_edge": ROOT / "quarl_edge", "quarl_edge.exporters": ROOT / "exporters",
           "quarl_edge.runtimes": ROOT / "runtimes", "quarl_edge.devices": ROOT / "devices"}  # fmt: skip


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if pkg == "quarl_edge" and parts[0] in ("exporters", "runtimes", "devices"):
                continue  # not there; listed for completeness of the mapping
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join([pkg, *parts])] = path
    return mods


MODULES = _modules()


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    """the module of ours it names (a name imported from a package that is a module counts as that module)"""
    kind: str
    """module (at import time), typing (inside `if TYPE_CHECKING:`) or function (inside a function)"""
    line: int


def _resolve(name: str) -> str | None:
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str) -> Iterator[Import]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST, kind: str) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            here = kind
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                here = "function"
            elif (
                isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test) and kind == "module"
            ):
                yield from (i for c in child.body for i in visit(ast.Module([c], []), "typing"))
                yield from (i for c in child.orelse for i in visit(ast.Module([c], []), kind))
                continue
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join([*up, base] if base else up)
                names = [f"{base}.{a.name}" for a in child.names]
            else:
                yield from visit(child, here)
                continue
            for name in names:
                target = _resolve(name) if name.startswith("quarl_edge") else None
                if target is not None and target != module:
                    yield Import(module, target, here, child.lineno)

    yield from visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)), "module")


IMPORTS = [i for m in sorted(MODULES) for i in _imports(m)]


def _floor(module: str) -> str:
    """quarl_edge.policy.net -> policy; quarl_edge.demo -> demo; quarl_edge -> ''."""
    return module.split(".")[1] if "." in module else ""


def _crossing(lower: str, upper: str) -> list[str]:
    return [f"{i.source}:{i.line} imports {i.target} ({i.kind})" for i in IMPORTS
            if _floor(i.source) == lower and _floor(i.target) == upper]  # fmt: skip


def test_the_parser_sees_the_package() -> None:
    assert {"quarl_edge.runtimes.runner", "quarl_edge.bench.run", "quarl_edge.common.markdown"} <= set(
        MODULES
    )
    kinds = {i.kind for i in IMPORTS}
    assert kinds == {"module", "typing", "function"}, kinds  # each kind is found (and so checked below)


@pytest.mark.parametrize("floor", ["policy", "quant", "exporters", "runtimes"])
def test_nothing_below_the_trainer_imports_train(floor: str) -> None:
    assert _crossing(floor, "train") == []


@pytest.mark.parametrize("floor", ["tune", "actorq"])
def test_tune_and_actorq_import_no_study(floor: str) -> None:
    assert _crossing(floor, "study") == []


def test_only_the_cli_imports_the_cli() -> None:
    outside = [f"{i.source}:{i.line} imports {i.target}" for i in IMPORTS
               if _floor(i.target) == "cli" and _floor(i.source) != "cli"]  # fmt: skip
    assert outside == []


def test_common_stands_on_the_standard_library_and_the_device_side() -> None:
    ours = {"runtimes", "text", "outputs", "common"}
    wrong = [f"{i.source}:{i.line} imports {i.target}" for i in IMPORTS
             if _floor(i.source) == "common" and _floor(i.target) not in ours]  # fmt: skip
    assert wrong == []
    lazy = {"matplotlib", "ray"}  # heavy and optional: only inside the function that draws or starts Ray
    for path in (ROOT / "quarl_edge" / "common").glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:  # module level only
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []  # fmt: skip
            for name in names:
                root = name.split(".")[0]
                assert root in sys.stdlib_module_names or root == "quarl_edge", f"{path.name}: import {name}"
                assert root not in lazy


def _cycles(kinds: set[str]) -> list[list[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in IMPORTS:
        if i.kind in kinds:
            graph[i.source].add(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:  # Tarjan: every strongly connected set of two or more modules is a circle
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def test_no_import_circle_not_even_for_types_or_inside_a_function() -> None:
    assert _cycles({"module", "typing"}) == []
    # a function-level import may defer a heavy package (torch, Ray, matplotlib), never close a circle
    assert _cycles({"module", "typing", "function"}) == []


def test_every_transport_a_profile_may_name_is_registered() -> None:
    from quarl_edge.bench.transport import TRANSPORTS
    from quarl_edge.devices.profiles import TRANSPORTS as PROFILE_TRANSPORTS

    assert set(TRANSPORTS) == set(PROFILE_TRANSPORTS)
