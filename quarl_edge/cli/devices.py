"""`quarl-edge devices list|show|check|trust|trust-key`: device profiles, the SSH link to them, and the
signing keys a board trusts."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
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
    """`devices list|show|check|trust|trust-key`, plus `devices emulate` and `devices setup` (cli/emulate.py)."""
    from quarl_edge.cli import emulate

    for name, command in (("list", list_devices), ("show", show), ("check", check), ("trust", trust),
                          ("trust-key", trust_key)):  # fmt: skip
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
    from quarl_edge.devices.check import check_device
    from quarl_edge.devices.profiles import load_profile

    p = load_profile(name, overrides(host, user, port, identity))
    result = check_device(p)
    if as_json:
        harness = None if result.timings is None else {"transport": p.transport, **asdict(result.timings)}
        print_json({"device": result.facts, "harness": harness, "problems": list(result.problems)})
    else:
        emu = " (emulated)" if p.emulated else ""
        table(f"device {p.name}{emu}: {_target(p)}", ["fact", "value"], result.rows())
        if h := result.timings:
            info(
                f"connect {h.connect_s or 0:.3f} s, device info {h.info_s or 0:.3f} s, uploaded {h.uploaded_bytes} bytes"
            )
    for msg in result.problems:
        info(f"{p.name}: {msg}", label="FAIL", style="bold red")
    if result.problems:
        hint = f"quarl-edge devices setup {p.name}" if p.transport == "ssh" else "pip install onnxruntime"
        info(f"next: {hint}")
        raise typer.Exit(1)


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


def trust_key(
    name: NameArg,
    public_key: Annotated[Path, typer.Argument(help="KEY.pub of `ssh-keygen -t ed25519 -N '' -f KEY` (never the private key)")],
    host: HostOpt = None,
    user: UserOpt = None,
    port: PortOpt = None,
    identity: IdentityOpt = None,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """Make a board accept only bundles signed by trusted keys, and trust this one (adds `cryptography` there if needed)."""
    from quarl_edge.devices.setup import trust_key as run

    t = run(name, public_key, overrides(host, user, port, identity), log=info)
    if as_json:
        print_json({"device": t.device, "fingerprint": t.fingerprint, "path": t.path, "trusted": list(t.keys),
                    "added": t.added, "installed": t.installed})  # fmt: skip
        return
    if t.installed:
        info(f"{t.device}: installed cryptography {t.installed} to check signatures")
    was = "added" if t.added else "was already there"
    info(f"{t.device}: {t.fingerprint} {was}; the board now accepts only bundles signed by one of its "
         f"{len(t.keys)} trusted key(s) ({t.path})")  # fmt: skip
    info("next: quarl-edge export ... --sign KEY, then quarl-edge deploy --bundle B --device " + t.device)
