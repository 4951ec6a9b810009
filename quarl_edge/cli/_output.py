"""One output object for the CLI: tables on stdout, logs and errors on stderr, data alone with --json.

Everything printed here is plain text, never markup: names, paths and messages come from files,
arguments and devices, so each is cleaned of control characters (quarl_edge.text.clean) and shown
literally; our own styling is a separate label (``info(msg, label="FAIL", style="bold red")``).
"""

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
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from quarl_edge.runtimes.errors import QuarlError
from quarl_edge.runtimes.fsutil import finite_json
from quarl_edge.text import clean, markup_safe

# Not a terminal (CI logs, pipes): rich would wrap tables at 80 columns; logs are wider than that.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)
F = TypeVar("F", bound=Callable[..., Any])


def debug_enabled() -> bool:
    return os.environ.get("QUARL_EDGE_DEBUG", "") not in ("", "0")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(finite_json(data), indent=2) + "\n")


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A table on stdout whose every cell is shown whole: on a narrow terminal a long name wraps onto more
    lines (folded inside a word when it must be), never cut to "tflite-int8-mi…"; the other columns
    keep their longest word on one line where the terminal has room for that."""
    t = Table(title=Text(clean(title)), title_justify="left")
    longest = [max((len(w) for text in (c, *(r[i] for r in rows if i < len(r))) for w in clean(text).split()),
                   default=1) for i, c in enumerate(columns)]  # fmt: skip
    # borders and padding take 3 characters a column; the first column keeps 12 for its names
    keep = sum(min(n, 24) for n in longest[1:]) + 3 * len(columns) + 1 + 12 <= out.width
    for i, c in enumerate(columns):
        t.add_column(Text(clean(c)), justify="left" if i == 0 else "right", overflow="fold",
                     min_width=min(longest[i], 24) if keep and i > 0 else None)  # fmt: skip
    for r in rows:
        t.add_row(*(Text(clean(cell)) for cell in r))
    out.print(t)


@contextmanager
def progress_bar(label: str, total: int) -> Iterator[Callable[[str], None]]:
    """A rich progress bar on stderr (gone when done); yields ``advance(description)``."""
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:  # fmt: skip
        task = bar.add_task(label, total=total)
        # the description column is markup ("[bold]{task.description}"): a model name must not be
        yield lambda description: bar.update(task, advance=1, description=markup_safe(description))


@contextmanager
def progress_bars(totals: dict[str, int]) -> Iterator[Callable[[str, str], None]]:
    """One rich progress bar per key (a fleet's devices) on stderr, gone when done; yields
    ``advance(key, description)``, safe to call from several threads."""
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:  # fmt: skip
        tasks = {key: bar.add_task(markup_safe(key), total=total) for key, total in totals.items()}
        yield lambda key, description: bar.update(tasks[key], advance=1, description=markup_safe(description))


def info(msg: str, label: str = "", style: str = "bold") -> None:
    """One log line on stderr: ``msg`` shown literally, after ``label`` in ``style`` when given."""
    line = Text.assemble((label, style), " ", clean(msg)) if label else Text(clean(msg))
    err.print(line, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 2) -> None:
    # one line, whatever the terminal width: CI log parsers and `tail -1` read it as a whole; clean()
    # shows a newline or escape sequence from a file or a device as \n, \x1b, so it stays one line
    err.print(Text.assemble(("error:", "bold red"), " ", clean(message)), highlight=False, soft_wrap=True)
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
            fail(e.cli_text(), e.exit_code)  # the fix in flags where it differs from the Python one
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except OSError as e:
            if debug_enabled():
                raise
            fail(f"{e.strerror or e}: {e.filename or ''}".rstrip(": "), 2)
        return None

    return wrapper  # type: ignore[return-value]
