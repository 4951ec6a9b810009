"""`quarl-edge deploy`: the torch-free runtime and a bundle's chosen model on a board (quarl_edge.deploy)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from quarl_edge.cli._options import HostOpt, IdentityOpt, JsonOpt, PortOpt, UserOpt, overrides
from quarl_edge.cli._output import handle_errors, info, print_json


def register(app: typer.Typer) -> None:
    app.command("deploy")(handle_errors(deploy))


def deploy(
    bundle: Annotated[Path, typer.Option("--bundle", help="bundle folder (e.g. a tune's DIR/bundle)")],
    device: Annotated[str, typer.Option("--device", help="an SSH board's profile name")],
    model: Annotated[
        str | None, typer.Option("--model", help="default: tune's choice, or the only model")
    ] = None,
    name: Annotated[
        str | None,
        typer.Option("--name", help="the stable name on the board (default: the policy's name)"),
    ] = None,
    as_json: JsonOpt = False,
    host: HostOpt = None,
    user: UserOpt = None,
    port: PortOpt = None,
    identity: IdentityOpt = None,
) -> None:
    """Put the runtime (no torch) and the bundle on the board, check it loads and acts there."""
    from quarl_edge.deploy import deploy as run

    d = run(bundle, device, model, overrides(host, user, port, identity), log=info, name=name)
    if as_json:
        print_json({"device": d.device, "model": d.model, "path": d.path, "python": d.python,
                    "check": d.check, "was": d.was, "now": d.now, "usage": d.usage()[0]})  # fmt: skip
        return
    info(f"deployed {d.model} to {d.device}:{d.path} ({d.change()}); runtime {d.check.get('runtime')}; "
         "torch not imported there")  # fmt: skip
    for line in d.usage():
        info(line)
