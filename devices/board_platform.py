"""The platform a board's wheels must fit (machine, Python, glibc) and its $HOME, read from the board itself.

`devices setup` chooses wheels for what the board is, not for what its profile expects (a profile's
``arch`` is checked by `devices check`); ``--arch`` / ``--python-version`` / ``--glibc`` override a fact.
One command, run by the Python the venv is made from, answers all of it; its output is untrusted and
checked field by field.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass

from quarl_edge.devices.profiles import parse_home
from quarl_edge.runtimes.errors import InputError, QuarlError

_PROBE = (
    "import json, os, platform, struct, sys; print(json.dumps({'home': os.environ.get('HOME', ''), "
    "'machine': platform.machine(), 'bits': 8 * struct.calcsize('P'), "
    "'python': '%d.%d' % sys.version_info[:2], 'libc': list(platform.libc_ver())}))"
)
# A 32-bit userland on a 64-bit kernel (Raspberry Pi OS 32-bit on a Pi 4): `uname -m` says aarch64,
# but only armv7l wheels load in its Python.
_ABI32 = {"aarch64": "armv7l", "armv8l": "armv7l", "x86_64": "i686"}


@dataclass(frozen=True)
class BoardPlatform:
    arch: str
    """the machine its wheels are built for (`uname -m`, or armv7l / i686 under a 32-bit Python)"""
    python_version: str
    """e.g. 3.11"""
    glibc: str | None
    """e.g. 2.36; None: another libc (musl), for which manylinux wheels do not load"""
    home: str
    """its $HOME, absolute"""

    def flags(self) -> list[str]:
        """The same facts as `devices wheelhouse` flags (for a command to run on another host)."""
        return ["--arch", self.arch, "--python-version", self.python_version, "--glibc", self.glibc or "?"]

    def shown(self) -> str:
        return f"{self.arch}, Python {self.python_version}, " + (
            f"glibc {self.glibc}" if self.glibc else "not glibc"
        )


def probe_command(python: str = "python3") -> str:
    return shlex.join([python, "-c", _PROBE])


def parse_probe(stdout: str, exit_status: int | None, device: str, python: str = "python3") -> BoardPlatform:
    """The probe's answer, each field checked (it comes from the device)."""
    if exit_status != 0:
        raise QuarlError(f"{device} has no working {python} (exit code {exit_status})",
                         "install Python 3 there: sudo apt-get install python3 python3-venv")  # fmt: skip
    try:
        data = json.loads((stdout.strip().splitlines() or ["null"])[-1])
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise QuarlError(f"{device}: {python} printed no platform facts", "check the board's Python")
    machine, bits, python_version = data.get("machine"), data.get("bits"), data.get("python")
    libc = data.get("libc")
    libc = libc if isinstance(libc, list) else []
    if not isinstance(machine, str) or not re.fullmatch(r"[a-z0-9_]{1,32}", machine):
        raise QuarlError(f"{device} reports the machine {str(machine)[:40]!r}", "check `uname -m` there")
    if not isinstance(python_version, str) or not re.fullmatch(r"3\.\d{1,3}", python_version):
        raise QuarlError(f"{device}: {python} is {str(python_version)[:20]!r}, not Python 3",
                         "install Python 3 there: sudo apt-get install python3 python3-venv")  # fmt: skip
    arch = _ABI32.get(machine, machine) if bits == 32 else machine
    name, version = (libc + ["", ""])[:2]
    glibc = (
        version
        if name == "glibc" and isinstance(version, str) and re.fullmatch(r"\d+\.\d+", version)
        else None
    )
    return BoardPlatform(arch, python_version, glibc, parse_home(str(data.get("home") or ""), 0, device))


def chosen(board: BoardPlatform, arch: str | None, python_version: str | None, glibc: str | None,
           device: str) -> BoardPlatform:  # fmt: skip
    """The board's facts with the flags given applied; a board without glibc needs ``--glibc`` said."""
    plat = BoardPlatform(arch or board.arch, python_version or board.python_version, glibc or board.glibc,
                         board.home)  # fmt: skip
    if plat.glibc is None:
        raise InputError(f"{device} does not run glibc (musl?): manylinux wheels do not load there",
                         "use a glibc OS on the board (Raspberry Pi OS, Debian, Ubuntu), or build its venv by hand")  # fmt: skip
    return plat
