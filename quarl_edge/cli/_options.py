"""Option aliases and small parsers shared by every command group (each defined once, here)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from quarl_edge.devices.profiles import ProfileOverrides
from quarl_edge.quant.config import QATConfig
from quarl_edge.runtimes.errors import InputError

JsonOpt = Annotated[
    bool, typer.Option("--json", help="print the result as JSON on stdout (logs go to stderr)")
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="show tracebacks instead of one-line errors")]
ZooOpt = Annotated[
    Path | None, typer.Option("--zoo", help="a zoo folder of your own (default: the built-in zoo)")
]
AddressOpt = Annotated[str | None, typer.Option("--address", help="Ray cluster address: the jobs run there")]
WorkersOpt = Annotated[
    int | None,
    typer.Option(
        "--workers",
        help="jobs side by side: Ray tasks if Ray is installed, else local processes (default 1: in this process)",
    ),
]
NoRayOpt = Annotated[bool, typer.Option("--no-ray", help="with --workers: local processes, never Ray")]
PolicyOpt = Annotated[Path, typer.Option("--policy", "-p", help="checkpoint folder or SB3 / RL Zoo .zip")]
EnvOpt = Annotated[str | None, typer.Option("--env", help="environment id (for .zip files that do not say)")]
AlgoOpt = Annotated[str | None, typer.Option("--algo", help="algorithm of a .zip when it cannot be inferred")]
VecNormOpt = Annotated[
    Path | None, typer.Option("--vecnormalize", help="SB3 VecNormalize .pkl to bake into the graph")
]
IoOpt = Annotated[
    Path | None,
    typer.Option(
        "--io", help="I/O description (io.yaml) of a policy from another framework (docs/policies.md)"
    ),
]
CalibrationOpt = Annotated[Path | None, typer.Option("--calibration", help="recorded rollouts (.npz)")]
SeedOpt = Annotated[int, typer.Option("--seed", help="random seed (the environment's and the network's)")]
# None: not given, QATConfig's default stands (quant/config.py is light: read here for the help)
QatActivationsOpt = Annotated[
    bool | None,
    typer.Option("--qat-activations/--no-qat-activations",
                 help=f"also fake-quantize activations (default: {'on' if QATConfig.activations else 'off'})"),
]  # fmt: skip
QatScopeOpt = Annotated[
    str | None,
    typer.Option("--qat-scope", help="all: every layer trains fake-quantized; actor: only the exported network's "
                 f"(default {QATConfig.scope})"),
]  # fmt: skip
# Device profile overrides (bench, devices show/check/trust)
DeviceNameArg = Annotated[str, typer.Argument(help="device profile name (see `quarl-edge devices list`)")]
HostOpt = Annotated[str | None, typer.Option("--host", help="device address (overrides the profile)")]
UserOpt = Annotated[str | None, typer.Option("--user", help="SSH user (overrides the profile)")]
PortOpt = Annotated[int | None, typer.Option("--port", help="SSH port (overrides the profile)")]
IdentityOpt = Annotated[
    str | None, typer.Option("--identity", help="private key file, mode 0600 (overrides the profile)")
]


def out_option(help: str) -> Any:
    """The `--out` option of a command that writes (what it writes differs, the flag does not)."""
    return typer.Option("--out", help=help)


def overrides(host: str | None, user: str | None, port: int | None, identity: str | None) -> ProfileOverrides:
    return ProfileOverrides(host=host, user=user, port=port, identity=identity)


def int_list(text: str | None, flag: str, example: str) -> tuple[int, ...] | None:
    """'2,4,8' -> (2, 4, 8); None for no text; a domain error naming ``flag`` for anything else."""
    if not text:
        return None
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError(f"{flag} {text!r} is not a list of integers", f"e.g. {flag} {example}") from None
    if not values:
        raise InputError(f"{flag} {text!r} is empty", f"e.g. {flag} {example}")
    return values


def name_list(text: str | None) -> tuple[str, ...] | None:
    """'a,b' -> ('a', 'b'); None for no text."""
    return tuple(x.strip() for x in text.split(",") if x.strip()) if text else None
