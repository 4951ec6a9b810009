"""`quarl-edge devices emulate BOARD up|down|status` (a thin command)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer
from rich.text import Text

from quarl_edge.cli._options import JsonOpt
from quarl_edge.cli._output import handle_errors, info, out, print_json
from quarl_edge.text import clean


class Action(str, Enum):
    up = "up"
    down = "down"
    status = "status"


def register(devices_app: typer.Typer) -> None:
    """Add the `emulate` command to the `devices` sub-app."""
    devices_app.command("emulate")(handle_errors(emulate))


def emulate(
    board: Annotated[str, typer.Argument(help="board to emulate: rpi4")],
    action: Annotated[Action, typer.Argument(help="up: build once and start; down: stop; status")],
    mirror: Annotated[
        str | None, typer.Option("--mirror", help="Debian mirror URL (default: the host's apt sources)")
    ] = None,
    rate: Annotated[str | None, typer.Option("--rate", help="shape the link with tbf, e.g. 20mbit")] = None,
    rebuild: Annotated[bool, typer.Option("--rebuild", help="build the rootfs again even if cached")] = False,
    as_json: JsonOpt = False,
) -> None:
    """An emulated board (arm64 Debian under qemu-user, sshd in its own network namespace); needs root.

    Latency measured on it is qemu's, not the board's: its device entry and reports say `emulated: true`.
    """
    from quarl_edge.devices import emulate as emu

    if action is Action.up:
        st = emu.up(board, mirror=mirror, rate=rate, rebuild=rebuild, log=info)
    elif action is Action.down:
        st = emu.down(board, log=info)
    else:
        st = emu.status(board)
    if as_json:
        print_json(st.to_dict())
        return
    rows = st.rows()
    width = max(len(k) for k, _ in rows)
    out.print(Text(f"emulated {clean(st.board)}", style="bold"), highlight=False)
    for k, v in rows:  # values come from the emulator's state files: plain text
        out.print(Text(clean(f"  {k:<{width}}  {v}")), highlight=False, soft_wrap=True)
    if st.running:
        info(f"next: quarl-edge bench --bundle BUNDLE --device {st.device}   (or: {st.ssh_command()})")
    elif action is not Action.down:
        info(f"next: quarl-edge devices emulate {st.board} up")
