"""`quarl-edge devices list|show|check|setup|wheelhouse|trust|trust-key`: device profiles, the SSH link to
them, the board's venv (from its own facts, or from a wheelhouse carried offline), and the signing keys a
board trusts."""

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
    """`devices list|show|check|setup|wheelhouse|trust|trust-key`, plus `devices emulate` (cli/emulate.py)."""
    from quarl_edge.cli import emulate

    for name, command in (("list", list_devices), ("show", show), ("check", check), ("setup", setup),
                          ("wheelhouse", wheelhouse), ("trust", trust), ("trust-key", trust_key)):  # fmt: skip
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


PackageOpt = Annotated[
    list[str] | None, typer.Option("--package", help="extra requirement (repeatable), e.g. ale-py")
]
BundlePackagesOpt = Annotated[
    Path | None, typer.Option("--bundle", help="also install what this bundle's env needs (e.g. ale-py)")
]


def _packages(package: list[str] | None, bundle: Path | None) -> tuple[str, ...]:
    from quarl_edge.devices.preflight import bundle_packages

    return tuple(dict.fromkeys((*(package or ()), *(bundle_packages(bundle) if bundle else ()))))


def setup(
    name: NameArg,
    wheelhouse: Annotated[
        Path | None,
        typer.Option("--wheelhouse", help="wheels for the board, e.g. from `devices wheelhouse` on a host with "
                     "internet (used as given); empty or missing: downloaded into it"),
    ] = None,
    arch: Annotated[str | None, typer.Option("--arch", help="override the board's machine (default: asked there)")] = None,
    python_version: Annotated[
        str | None, typer.Option("--python-version", help="override the board's Python (default: asked there)")
    ] = None,
    glibc: Annotated[str | None, typer.Option("--glibc", help="override the board's glibc (default: asked there)")] = None,
    package: PackageOpt = None,
    bundle: BundlePackagesOpt = None,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """Create a venv on the board with the runtime's wheels for its own platform (no internet needed there)."""
    from quarl_edge.devices.setup import setup_device

    result = setup_device(
        name, wheelhouse, arch, python_version, _packages(package, bundle), log=info, glibc=glibc
    )
    if as_json:
        print_json({"device": name, "python": result.python, "wheels": [w.name for w in result.wheels],
                    "versions": result.versions()})  # fmt: skip
        return
    info(f"{name}: {result.shown()} import in {result.python}; next: quarl-edge devices check {name}")


def wheelhouse(
    folder: Annotated[Path, typer.Argument(help="a new (or empty) folder to carry to the host that reaches the board")],
    arch: Annotated[str, typer.Option("--arch", help="the board's machine: aarch64, armv7l, x86_64")],
    python_version: Annotated[str, typer.Option("--python-version", help="the board's Python, e.g. 3.11")],
    glibc: Annotated[str, typer.Option("--glibc", help="the board's glibc, e.g. 2.36")],
    package: PackageOpt = None,
    bundle: BundlePackagesOpt = None,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """On a host with internet: download the wheels `devices setup --wheelhouse` installs on a board
    (its facts as `devices setup` prints them) into a folder to carry to a host without internet."""
    from quarl_edge.devices.board_platform import BoardPlatform
    from quarl_edge.devices.setup import build_wheelhouse

    plat = BoardPlatform(arch, python_version, glibc, home="/")
    built = build_wheelhouse(folder, plat, _packages(package, bundle))
    if as_json:
        print_json({"folder": str(built.folder), "wheels": [w.name for w in built.wheels],
                    "pins": [p.__dict__ for p in built.pins]})  # fmt: skip
        return
    for p in built.pins:
        if p.version != p.host:
            info(f"{p.name}: {p.version or 'left out'} ({p.reason})")
    info(f"{len(built.wheels)} wheels for {plat.shown()} in {built.folder}")
    info(f"next: carry {built.folder} to the host that reaches the board, then there: "
         f"quarl-edge devices setup NAME --wheelhouse {built.folder}")  # fmt: skip


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
    from quarl_edge.devices.trust import trust_key as run

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
