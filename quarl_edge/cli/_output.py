"""One output object for the CLI: tables on stdout, logs and errors on stderr, data alone with --json."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from quarl_edge.runtimes.errors import QuarlError

# Not a terminal (CI logs, pipes): rich would wrap tables at 80 columns; logs are wider than that.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
F = TypeVar("F", bound=Callable[..., Any])


def debug_enabled() -> bool:
    return os.environ.get("QUARL_EDGE_DEBUG", "") not in ("", "0")


def print_json(data: Any) -> None:
    from quarl_edge.bench.run import finite_json

    sys.stdout.write(json.dumps(finite_json(data), indent=2) + "\n")


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    t = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*r)
    out.print(t)


@contextmanager
def progress_bar(label: str, total: int) -> Iterator[Callable[[str], None]]:
    """A rich progress bar on stderr (gone when done); yields ``advance(description)``."""
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:  # fmt: skip
        task = bar.add_task(label, total=total)
        yield lambda description: bar.update(task, advance=1, description=description)


def info(msg: str) -> None:
    err.print(msg, highlight=False)


def fail(message: str, code: int = 2) -> None:
    # one line, whatever the terminal width: CI log parsers and `tail -1` read it as a whole
    # escape: a message may hold brackets rich would read as markup ("pip install 'quarl-edge[tflite]'")
    err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def handle_errors(fn: F) -> F:
    """Map domain errors to one stderr line and exit 2 (``--debug`` / QUARL_EDGE_DEBUG=1: traceback)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except QuarlError as e:
            if debug_enabled():
                raise
            fail(str(e), e.exit_code)
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except OSError as e:
            if debug_enabled():
                raise
            fail(f"{e.strerror or e}: {e.filename or ''}".rstrip(": "), 2)
        return None

    return wrapper  # type: ignore[return-value]
