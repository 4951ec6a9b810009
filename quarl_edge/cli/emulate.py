"""`quarl-edge devices emulate BOARD up|down|status` and `quarl-edge devices setup NAME` (thin commands)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from quarl_edge.cli._options import JsonOpt
from quarl_edge.cli._output import handle_errors, info, out, print_json


class Action(str, Enum):
    up = "up"
    down = "down"
    status = "status"


def register(devices_app: typer.Typer) -> None:
    """Add the `emulate` and `setup` commands to the `devices` sub-app."""
    devices_app.command("emulate")(handle_errors(emulate))
    devices_app.command("setup")(handle_errors(setup))


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
    size = f"{st.rootfs_size_bytes / 2**20:.0f} MiB" if st.rootfs_size_bytes else "-"
    rows = [
        ["device", st.device],
        ["built", "yes" if st.built else "no"],
        ["running", f"yes (pid {st.pid})" if st.running else "no"],
        ["address", f"{st.address}:{st.port} in namespace {st.namespace}"],
        ["link rate", st.rate or "unshaped"],
        ["rootfs", f"{st.rootfs} ({size})"],
        ["runtimes", ", ".join(f"{k} {v or '(left out: no wheel)'}" for k, v in st.runtimes.items()) or "-"],
        ["emulated", "true (qemu-user: latency is not the board's)"],
    ]
    if st.build_seconds is not None:
        rows.append(["last build", f"{st.build_seconds:.0f} s"])
    if st.start_seconds is not None:
        rows.append(["start", f"{st.start_seconds:.1f} s"])
    width = max(len(k) for k, _ in rows)
    out.print(f"[bold]emulated {st.board}[/]", highlight=False)
    for k, v in rows:
        out.print(f"  {k:<{width}}  {v}", highlight=False, soft_wrap=True)
    if st.running:
        info(f"next: quarl-edge bench --bundle BUNDLE --device {st.device}   (or: {st.ssh_command()})")
    elif action is not Action.down:
        info(f"next: quarl-edge devices emulate {st.board} up")


def setup(
    name: Annotated[str, typer.Argument(help="device name (see `quarl-edge devices list`)")],
    wheelhouse: Annotated[
        Path | None,
        typer.Option(
            "--wheelhouse", help="folder of the device's wheels; empty or missing: downloaded into it"
        ),
    ] = None,
    arch: Annotated[str, typer.Option("--arch", help="the device's `uname -m`")] = "aarch64",
    python_version: Annotated[str, typer.Option("--python-version", help="the device's python3")] = "3.11",
    package: Annotated[
        list[str] | None, typer.Option("--package", help="extra requirement (repeatable), e.g. ale-py")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a venv on the device and install the runtime's wheels, downloaded here (no internet needed there)."""
    from quarl_edge.devices import setup as remote
    from quarl_edge.devices import wheelhouse as wh

    spec = wh.WheelhouseSpec(
        arch=arch, python_version=python_version, packages=wh.RUNTIME_PACKAGES + tuple(package or ())
    )
    pins: list[wh.Pin] | None = None
    with remote.open_device(name) as (shell, venv):  # a bad name fails before any download
        given = wh.resolve(spec, wheelhouse, download_missing=False)
        if given:  # carried to an offline host: install what is there, import what it provides
            have = wh.wheel_versions(given)
            spec = wh.WheelhouseSpec(arch=arch, python_version=python_version, packages=tuple(
                p for p in spec.packages if wh.canonical(wh.requirement_name(p)) in have or p not in wh.OPTIONAL_PACKAGES
            ))  # fmt: skip
        else:  # the host's versions where the device has wheels for them, else the newest that do
            spec, pins = wh.platform_pinned(spec)
            for p in pins:
                if p.version != p.host:
                    info(f"{p.name}: {p.version or 'left out'} ({p.reason})")
        wheels = given or wh.download(spec, wheelhouse, pins=pins)
        info(f"uploading {len(wheels)} wheels to {name} and building the venv {venv} there")
        venv_python = remote.setup(shell, wheels, venv=venv, packages=spec.packages)
    versions = wh.wheel_versions(wheels)
    if as_json:
        print_json(
            {"device": name, "python": venv_python, "wheels": [w.name for w in wheels], "versions": versions}
        )
        return
    shown = ", ".join(
        f"{wh.requirement_name(p)} {versions.get(wh.canonical(wh.requirement_name(p)), '?')}"
        for p in spec.packages
    )
    info(f"{name}: {shown} import in {venv_python}; next: quarl-edge devices check {name}")
