"""The `quarl-edge` command line: thin commands over the library, one module per command group.

pipeline.py (envs, train, record, export, bench, gate, demo), inspect.py, tune.py, deploy.py, field.py,
actorq.py, devices.py (+ emulate.py), zoo.py and study.py each have ``register(app)``; options shared between
them are in _options.py, and every command prints through _output.py (tables on stdout, logs on stderr,
one-line errors).
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from quarl_edge import __version__, interrupts
from quarl_edge.cli import actorq, deploy, devices, field, inspect, pipeline, study, tune, zoo
from quarl_edge.cli._options import DebugOpt

app = typer.Typer(
    name="quarl-edge",
    help="Quantize RL policies for edge boards and prove, with numbers CI can gate on, that they keep their reward.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        print(f"quarl-edge {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    debug: DebugOpt = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True)] = False,
) -> None:
    if debug:
        os.environ["QUARL_EDGE_DEBUG"] = "1"


for group in (pipeline, inspect, tune, deploy, field, actorq, devices, zoo, study):
    group.register(app)


def main() -> None:
    interrupts.install()
    app()
