"""``quarl-edge devices setup NAME``: a venv with the runtime's wheels on a board that has no internet.

The wheels fit the board's own platform (machine, Python, glibc: asked there, devices/board_platform.py).
The host downloads them (devices/wheelhouse.py) or takes them from a wheelhouse folder carried from a host
with internet (``devices wheelhouse DIR``, then ``devices setup NAME --wheelhouse DIR``), uploads them over
SSH and runs :func:`quarl_edge.devices.wheelhouse.setup_commands` there, every path under the board's $HOME. The remote side is a two-method protocol:
devices/ssh.py's connection normally, :class:`OpenSSH` (the system's ``ssh``/``scp``, as strict about
host keys) where asyncssh, which devices/ssh.py needs, is not installed.
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from quarl_edge.devices import profiles, wheelhouse
from quarl_edge.devices.board_platform import BoardPlatform, chosen, parse_probe, probe_command
from quarl_edge.devices.wheelhouse import DEVICE_VENV, DEVICE_WHEELS
from quarl_edge.runtimes.errors import InputError, MissingDependencyError, QuarlError


class RemoteShell(Protocol):
    def run(self, command: str, *, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run one shell command line on the device (arguments already quoted)."""
        ...

    def put(self, files: list[Path], remote_dir: str, *, timeout: float) -> None:
        """Copy local files into an existing remote folder."""
        ...


class SetupError(QuarlError):
    """A remote step of `devices setup` failed."""


@dataclass(frozen=True)
class OpenSSH:
    """The system OpenSSH client, never asking questions: key auth only, unknown or changed host keys refused."""

    host: str
    user: str = ""
    port: int = 22
    identity: str | None = None
    known_hosts: str | None = None
    connect_timeout: int = 15

    def options(self) -> list[str]:
        opts = [
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"ConnectTimeout={self.connect_timeout}",
        ]
        opts += ["-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"]
        if self.identity:
            opts += ["-i", self.identity, "-o", "IdentitiesOnly=yes"]
        if self.known_hosts:
            opts += ["-o", f"UserKnownHostsFile={self.known_hosts}"]
        return opts

    def target(self) -> str:
        """``user@host`` (``host`` alone lets ~/.ssh/config choose the user)."""
        if self.host.startswith("-") or (self.user or "").startswith("-"):
            raise InputError(
                f"device host {self.host!r} / user {self.user!r} cannot start with '-'", "fix the profile"
            )
        return f"{self.user}@{self.host}" if self.user else self.host

    def run(self, command: str, *, timeout: float) -> subprocess.CompletedProcess[str]:
        argv = ["ssh", *self.options(), "-p", str(self.port), self.target(), "--", command]
        try:
            return subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            raise SetupError(
                f"`{command[:60]}` on {self.host} took over {timeout:.0f} s", "check the device"
            ) from None

    def put(self, files: list[Path], remote_dir: str, *, timeout: float) -> None:
        # scp (SFTP protocol): the remote name is not passed through a shell
        argv = ["scp", "-q", *self.options(), "-P", str(self.port), *map(str, files)]
        argv.append(f"{self.target()}:{remote_dir}/")
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise SetupError(
                f"upload to {self.host} failed ({_last_line(proc.stderr)})",
                "check the device's disk and SSH access",
            )


def setup(
    shell: RemoteShell,
    wheels: list[Path],
    *,
    python: str = "python3",
    venv: str = DEVICE_VENV,
    wheel_dir: str = DEVICE_WHEELS,
    packages: tuple[str, ...] = wheelhouse.RUNTIME_PACKAGES,
    timeout: float = 1800,
    home: str | None = None,
) -> str:
    """Upload ``wheels`` and build the venv on the device; returns the venv's python (absolute).
    A relative ``venv`` / ``wheel_dir`` (or one starting with ``~/``) is under the board's $HOME
    (``home``, else asked)."""
    if not wheels:
        raise InputError("no wheels to install", "download a wheelhouse first")
    if not (venv.startswith("/") and wheel_dir.startswith("/")):
        home = home or board_home(shell)
        venv, wheel_dir = profiles.remote_path(venv, home), profiles.remote_path(wheel_dir, home)
    commands = wheelhouse.setup_commands(
        python, [w.name for w in wheels], venv=venv, wheel_dir=wheel_dir, packages=packages
    )
    _check(shell.run(commands[0], timeout=60), commands[0])  # mkdir -p for the upload
    shell.put(wheels, wheel_dir, timeout=timeout)
    for cmd in commands[1:]:
        _check(shell.run(cmd, timeout=timeout), cmd)
    return f"{venv}/bin/python"


def board_home(shell: RemoteShell, device: str = "the device") -> str:
    r = shell.run(profiles.HOME_COMMAND, timeout=60)
    return profiles.parse_home(r.stdout, r.returncode, device)


@dataclass(frozen=True)
class SetupResult:
    device: str
    python: str
    """the device venv's python"""
    wheels: tuple[Path, ...]
    packages: tuple[str, ...]
    platform: BoardPlatform | None = None
    """what the wheels were chosen for (the board's facts, flags applied)"""

    def versions(self) -> dict[str, str]:
        return wheelhouse.wheel_versions(list(self.wheels))

    def shown(self) -> str:
        """'numpy 2.1, onnxruntime 1.20, ...': each installed package with its version."""
        v = self.versions()
        names = [wheelhouse.requirement_name(p) for p in self.packages]
        return ", ".join(f"{n} {v.get(wheelhouse.canonical(n), '?')}" for n in names)


SIGNING_PACKAGE = "cryptography"
"""what the board needs to check signatures (runtimes/signing.py); aarch64 / armv7 wheels exist"""


def board_spec(plat: BoardPlatform, packages: tuple[str, ...] = ()) -> wheelhouse.WheelhouseSpec:
    """What a board of ``plat`` gets: the runtimes, cryptography (signed bundles), and ``packages``."""
    return wheelhouse.WheelhouseSpec(arch=plat.arch, python_version=plat.python_version,
                                     glibc=plat.glibc or "2.17",
                                     packages=(*wheelhouse.RUNTIME_PACKAGES, SIGNING_PACKAGE, *packages))  # fmt: skip


# left out where the board has no wheel for it, or a carried wheelhouse lacks it: the board then gets
# its runtimes and cannot require signatures
OPTIONAL = wheelhouse.OPTIONAL_PACKAGES | {SIGNING_PACKAGE}


def offline_route(device: str, plat: BoardPlatform, packages: tuple[str, ...]) -> str:
    """The fix for a host without internet: the exact commands of docs/devices.md's offline route."""
    extra = " ".join(f"--package {shlex.quote(p)}" for p in packages)
    build = shlex.join(["quarl-edge", "devices", "wheelhouse", "DIR", *plat.flags()])
    return (f"on a host with internet run `{build}{' ' + extra if extra else ''}`, carry DIR here, then "
            f"`quarl-edge devices setup {device} --wheelhouse DIR`")  # fmt: skip


def setup_device(
    name: str,
    wheelhouse_dir: Path | None = None,
    arch: str | None = None,
    python_version: str | None = None,
    packages: tuple[str, ...] = (),
    log: Any = print,
    glibc: str | None = None,
) -> SetupResult:
    """`devices setup NAME`: a venv on the device from wheels for its own platform (its machine, Python
    and glibc, asked there; ``arch`` / ``python_version`` / ``glibc`` override): those of
    ``wheelhouse_dir`` when it holds any (carried from a host with internet), else downloaded here
    (into ``wheelhouse_dir`` when given); uploaded, installed offline there, and imported."""
    wh = wheelhouse
    with open_device(name) as (shell, venv):  # a bad name fails before any download
        board = parse_probe_run(shell, name)
        plat = chosen(board, arch, python_version, glibc, name)
        flags = [
            f for f, v in (("--arch", arch), ("--python-version", python_version), ("--glibc", glibc)) if v
        ]
        log(f"{name}: {plat.shown()} (" + (f"the board's, with {', '.join(flags)}" if flags else "read from the board") + ")")  # fmt: skip
        expected = profiles.load_profile(name).arch
        if expected and expected != board.arch and not arch:
            log(f"{name}: its profile says arch = {expected!r}; the wheels are for what it is, {board.arch}")
        spec = board_spec(plat, packages)
        fix = offline_route(name, plat, packages)
        pins: list[wh.Pin] | None = None
        carried = wh.resolve(spec, wheelhouse_dir, download_missing=False)
        if carried:  # from a host with internet: the wheels that fit this board, all it needs there
            required = tuple(p for p in spec.packages if p not in OPTIONAL)
            carried = wh.for_platform(carried, spec, required, f"rebuild it: {fix}")
            have = wh.wheel_versions(carried)
            spec = wh.WheelhouseSpec(arch=spec.arch, python_version=spec.python_version, glibc=spec.glibc,
                                     packages=tuple(p for p in spec.packages
                                                    if wh.canonical(wh.requirement_name(p)) in have))  # fmt: skip
        else:  # the host's versions where the device has wheels for them, else the newest that do
            if wheelhouse_dir is not None:
                _ours_or_empty(wheelhouse_dir)
            try:
                spec, pins = wh.platform_pinned(spec, optional=OPTIONAL)
            except MissingDependencyError as e:
                raise MissingDependencyError(e.problem, fix) from None
            for p in pins:
                if p.version != p.host:
                    log(f"{p.name}: {p.version or 'left out'} ({p.reason})")
        try:
            wheels = carried or wh.download(spec, wheelhouse_dir, pins=pins)
        except MissingDependencyError as e:
            raise MissingDependencyError(e.problem, fix) from None
        log(f"uploading {len(wheels)} wheels to {name} and building the venv {venv} there")
        python = setup(shell, wheels, venv=venv, packages=spec.packages, home=board.home)
    return SetupResult(name, python, tuple(wheels), spec.packages, plat)


@dataclass(frozen=True)
class BuiltWheelhouse:
    folder: Path
    wheels: tuple[Path, ...]
    pins: tuple[wheelhouse.Pin, ...]


def build_wheelhouse(dest: Path, plat: BoardPlatform, packages: tuple[str, ...] = ()) -> BuiltWheelhouse:
    """`devices wheelhouse DIR`: on a host with internet, the wheels `devices setup` installs on a board
    of ``plat`` (the same pins), into ``dest`` to carry to a host without internet. ``dest`` is a new
    folder, an empty one, or a wheelhouse of ours (replaced when it was for another platform)."""
    _ours_or_empty(dest)
    spec, pins = wheelhouse.platform_pinned(board_spec(plat, packages), optional=OPTIONAL)
    wheels = wheelhouse.download(spec, dest, pins=pins)
    return BuiltWheelhouse(dest, tuple(wheels), tuple(pins))


def _ours_or_empty(dest: Path) -> None:
    """A download replaces the folder whole: only a new, empty or earlier wheelhouse folder may be it."""
    if dest.exists() and (
        not dest.is_dir() or (any(dest.iterdir()) and not (dest / "wheelhouse.json").is_file())
    ):
        raise InputError(f"{str(dest)!r} exists and is not a wheelhouse of ours (no wheelhouse.json); nothing written",
                         "pass a new or empty folder")  # fmt: skip


def _check(proc: subprocess.CompletedProcess[str], command: str) -> None:
    if proc.returncode != 0:
        raise SetupError(
            f"`{command[:80]}` failed on the device with exit code {proc.returncode} ({_last_line(proc.stderr or proc.stdout)})",
            "is python3-venv installed there? (`sudo apt-get install python3-venv`)",
        )


def _last_line(text: str) -> str:
    lines = [ln for ln in (text or "").strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


@contextlib.contextmanager
def open_device(name: str) -> Iterator[tuple[RemoteShell, str]]:
    """A connected remote shell to device ``name`` and the venv its profile's ``python`` lives in (absolute:
    ``~`` is the board's $HOME, asked there).

    The SSH transport of devices/ssh.py (asyncssh: strict host keys, ~/.ssh/config, keepalives);
    without asyncssh, the system's OpenSSH client with the same strictness.
    """
    profile = profiles.load_profile(name)
    if profile.transport != "ssh":
        raise InputError(f"device {name!r} is reached by {profile.transport!r}, not SSH", "set it up by hand")
    venv = venv_of(profile.python)
    try:
        from quarl_edge.devices.ssh import SSHConnection

        conn = SSHConnection(profile)
    except MissingDependencyError:
        identity, known_hosts = (
            profiles.local_path(profile.identity),
            profiles.local_path(profile.known_hosts),
        )
        shell: RemoteShell = OpenSSH(
            host=profile.ssh_host,
            user=profile.user or "",
            port=profile.port or 22,
            identity=str(identity) if identity else None,
            known_hosts=str(known_hosts) if known_hosts else None,
            connect_timeout=int(profile.connect_timeout),
        )
        yield shell, profiles.remote_path(venv, board_home(shell, name))
        return
    with conn:
        shell = _ConnectionShell(conn)
        yield shell, profiles.remote_path(venv, board_home(shell, name))


def parse_probe_run(shell: RemoteShell, device: str, python: str = "python3") -> BoardPlatform:
    """The board's platform facts and $HOME (devices/board_platform.py), asked through ``shell``."""
    r = shell.run(probe_command(python), timeout=120)
    return parse_probe(r.stdout, r.returncode, device, python)


class _ConnectionShell:
    """:class:`RemoteShell` over a devices/ssh.py connection (uploads through ``cat``, then an atomic rename)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def run(self, command: str, *, timeout: float) -> subprocess.CompletedProcess[str]:
        r = self.conn.run(command, timeout=timeout)
        code = r.exit_status if r.exit_status is not None else -1
        return subprocess.CompletedProcess([command], code, r.stdout, r.stderr)

    def put(self, files: list[Path], remote_dir: str, *, timeout: float) -> None:
        for f in files:
            dest, tmp = f"{remote_dir}/{f.name}", f"{remote_dir}/.{f.name}.tmp"
            q = shlex.quote
            r = self.conn.run(f"cat > {q(tmp)} && mv -f -- {q(tmp)} {q(dest)}", timeout=timeout, stdin=f)
            if r.exit_status != 0:
                raise SetupError(
                    f"upload of {f.name} failed ({_last_line(r.stderr)})", "check the device's disk"
                )


def venv_of(python: str) -> str:
    """``X/bin/python`` -> ``X``; a bare interpreter (``python3``) -> the default venv."""
    for suffix in ("/bin/python", "/bin/python3"):
        if python.endswith(suffix) and len(python) > len(suffix):
            return python[: -len(suffix)]
    return DEVICE_VENV
