"""`quarl-edge devices list|show|check|trust`: device profiles and the SSH link to them."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Annotated, Any

import typer

from quarl_edge.cli._options import DeviceNameArg, HostOpt, IdentityOpt, JsonOpt, PortOpt, UserOpt, overrides
from quarl_edge.cli._output import handle_errors, info, print_json, table

devices_app = typer.Typer(
    help="Device profiles (rpi4, rpi5, ...; your own in ~/.config/quarl-edge/devices.toml) and SSH checks.",
    no_args_is_help=True,
)

NameArg = DeviceNameArg


def register(app: typer.Typer) -> None:
    """`devices list|show|check|trust`, plus `devices emulate` and `devices setup` (cli/emulate.py)."""
    from quarl_edge.cli import emulate

    for name, command in (("list", list_devices), ("show", show), ("check", check), ("trust", trust)):
        devices_app.command(name)(handle_errors(command))
    emulate.register(devices_app)
    app.add_typer(devices_app, name="devices")


def _target(p: Any) -> str:
    if p.transport == "local":
        return "this machine"
    user = f"{p.user}@" if p.user else ""
    port = f":{p.port}" if p.port else ""
    return f"{user}{p.ssh_host}{port}"


def list_devices(as_json: JsonOpt = False) -> None:
    """List the device profiles (built-in and your own)."""
    from quarl_edge.devices.profiles import available, load_profile

    profiles = [load_profile(n) for n in available()]
    if as_json:
        print_json([p.to_dict() for p in profiles])
        return
    rows = [
        [
            p.name,
            p.transport,
            p.arch or "-",
            p.cpu or "-",
            _target(p),
            "yes" if p.emulated else "",
            p.description,
        ]
        for p in profiles
    ]
    table("devices", ["name", "transport", "arch", "cpu", "target", "emulated", "description"], rows)
    info("next: quarl-edge devices check NAME (your own entries: ~/.config/quarl-edge/devices.toml)")


def show(
    name: NameArg,
    host: HostOpt = None,
    user: UserOpt = None,
    port: PortOpt = None,
    identity: IdentityOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Every field of a profile, with the files (and flags) it comes from."""
    from quarl_edge.devices.profiles import load_profile

    p = load_profile(name, overrides(host, user, port, identity))
    data = p.to_dict()
    if as_json:
        print_json(data)
        return
    rows = [
        [k, "-" if v in (None, "", ()) else ", ".join(v) if isinstance(v, list) else str(v)]
        for k, v in data.items()
    ]
    table(f"device {p.name}", ["field", "value"], rows)


def check(
    name: NameArg,
    host: HostOpt = None,
    user: UserOpt = None,
    port: PortOpt = None,
    identity: IdentityOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Connect, and print the device's arch, CPU, cores, Python and which runtimes import."""
    from quarl_edge.devices.profiles import load_profile
    from quarl_edge.devices.remote import SSHTransport

    p = load_profile(name, overrides(host, user, port, identity))
    harness: dict[str, Any] = {}
    if p.transport == "local":
        facts = _local_info()
        facts = {"name": p.name, "transport": "local", "emulated": p.emulated, **facts}
    else:
        with SSHTransport(p) as t:
            t.prepare()
            facts, harness = t.device_facts, t.harness
    problems = []
    if p.arch and facts.get("machine") != p.arch:
        problems.append(f"the profile says {p.arch}, the device is {facts.get('machine')}")
    if not (facts.get("runtimes") or {}).get(p.preferred_runtime):
        problems.append(f"the preferred runtime {p.preferred_runtime} does not import on the device")
    if as_json:
        print_json({"device": facts, "harness": harness, "problems": problems})
    else:
        rows = [
            ["machine", str(facts.get("machine"))],
            ["cpu", str(facts.get("cpu_model"))],
            ["board", str(facts.get("board") or "-")],
            ["cores", str(facts.get("cores"))],
            ["python", str(facts.get("python"))],
            ["uname", str(facts.get("uname"))],
        ]
        rows += [[f"import {m}", v if v else "no"] for m, v in (facts.get("runtimes") or {}).items()]
        emu = " (emulated)" if p.emulated else ""
        table(f"device {p.name}{emu}: {_target(p)}", ["fact", "value"], rows)
        if harness:
            info(f"connect {harness['connect_s']:.3f} s, device info {harness['info_s']:.3f} s, "
                 f"uploaded {harness['uploaded_bytes']} bytes")  # fmt: skip
    for msg in problems:
        info(f"[bold red]FAIL[/] {p.name}: {msg}")
    if problems:
        hint = f"quarl-edge devices setup {p.name}" if p.transport == "ssh" else "pip install onnxruntime"
        info(f"next: {hint}")
        raise typer.Exit(1)


def _local_info() -> dict[str, Any]:
    r = subprocess.run(
        [sys.executable, "-m", "quarl_edge.runtimes", "info"], capture_output=True, text=True, timeout=300
    )
    line = next((x for x in r.stdout.splitlines() if x.startswith("{")), None)
    if r.returncode != 0 or line is None:
        from quarl_edge.runtimes.errors import QuarlError

        raise QuarlError(
            f"the local runner does not start ({r.stderr.strip()[-200:]})", "reinstall quarl-edge"
        )
    data: dict[str, Any] = json.loads(line)
    data.pop("event", None)
    return data


def trust(
    name: NameArg,
    fingerprint: Annotated[
        str,
        typer.Option("--fingerprint", help="the host key's SHA256 fingerprint, as the refusal printed it"),
    ],
    host: HostOpt = None,
    user: UserOpt = None,
    port: PortOpt = None,
    identity: IdentityOpt = None,
) -> None:
    """Pin a device's host key in known_hosts, after checking it has the given fingerprint."""
    from quarl_edge.devices.profiles import load_profile
    from quarl_edge.devices.ssh import SSHConnection

    p = load_profile(name, overrides(host, user, port, identity))
    path, line = SSHConnection(p).trust(fingerprint)
    if not line:
        info(f"{p.name}: the key {fingerprint} is already trusted ({path})")
        return
    info(f"{p.name}: trusted {line.split()[1]} {fingerprint} in {path}")
    info(f"next: quarl-edge devices check {p.cli_ref()}")
