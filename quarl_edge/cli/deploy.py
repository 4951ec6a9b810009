"""`quarl-edge deploy`: the torch-free runtime and a bundle's chosen model on a board (quarl_edge.deploy)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from quarl_edge.cli._options import HostOpt, IdentityOpt, JsonOpt, PortOpt, UserOpt, overrides
from quarl_edge.cli._output import handle_errors, info, print_json
from quarl_edge.runtimes.errors import InputError


def register(app: typer.Typer) -> None:
    app.command("deploy")(handle_errors(deploy))


def deploy(
    bundle: Annotated[Path, typer.Option("--bundle", help="bundle folder (e.g. a tune's DIR/bundle)")],
    device: Annotated[str | None, typer.Option("--device", help="an SSH board's profile name")] = None,
    emit: Annotated[
        tuple[str, Path] | None,
        typer.Option(
            "--emit",
            help="instead of a board: `--emit c DIR` writes the C model, CMake and C/C++ loops to DIR",
        ),
    ] = None,
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
    """Put the runtime (no torch) and the bundle on the board, check it loads and acts there; or, with
    --emit c DIR, write the bundle's C model as a folder for a C/C++ control loop."""
    if emit is not None:
        _emit(bundle, emit, model, device, as_json)
        return
    if device is None:
        raise InputError("deploy needs --device NAME (a board) or --emit c DIR (a C/C++ folder)",
                         "e.g. quarl-edge deploy --bundle B --device rpi4")  # fmt: skip
    from quarl_edge.deploy import deploy as run

    d = run(bundle, device, model, overrides(host, user, port, identity), log=info, name=name)
    if as_json:
        print_json({"device": d.device, "model": d.model, "path": d.path, "python": d.python,
                    "check": d.check.to_dict(), "was": d.was, "now": d.now, "usage": d.usage()[0],
                    "warnings": list(d.warnings)})  # fmt: skip
        return
    info(f"deployed {d.model} to {d.device}:{d.path} ({d.change()}); runtime {d.check.runtime}; "
         "torch not imported there")  # fmt: skip
    for line in d.usage():
        info(line)


def _emit(bundle: Path, emit: tuple[str, Path], model: str | None, device: str | None, as_json: bool) -> None:
    from quarl_edge.emit_c import emit_c

    kind, out = emit
    if kind != "c":
        raise InputError(f"--emit {kind[:20]!r} is not a known target", "known: c (--emit c DIR)")
    if device is not None:
        raise InputError("--emit c DIR writes a folder on this machine; it takes no --device",
                         "copy DIR to the board, or deploy the bundle with --device alone")  # fmt: skip
    e = emit_c(bundle, out, model)
    if as_json:
        print_json({"out": str(e.out), "model": e.model, "files": list(e.files), "usage": e.usage()})
        return
    info(f"wrote {e.model} as C to {e.out} ({len(e.files)} files; {e.observations} trace observations)")
    for line in e.usage():
        info(line)
