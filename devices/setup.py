"""``quarl-edge devices setup NAME``: a venv with the runtime's wheels on a board that has no internet.

The host downloads the device's wheels (devices/wheelhouse.py), uploads them over SSH and runs
:func:`quarl_edge.devices.wheelhouse.setup_commands` there. The remote side is a two-method protocol:
devices/ssh.py's connection normally, :class:`OpenSSH` (the system's ``ssh``/``scp``, as strict about
host keys) where asyncssh, which devices/ssh.py needs, is not installed.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from quarl_edge.devices import wheelhouse
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
) -> str:
    """Upload ``wheels`` and build the venv on the device; returns the venv's python (device path)."""
    if not wheels:
        raise InputError("no wheels to install", "download a wheelhouse first")
    commands = wheelhouse.setup_commands(
        python, [w.name for w in wheels], venv=venv, wheel_dir=wheel_dir, packages=packages
    )
    _check(shell.run(commands[0], timeout=60), commands[0])  # mkdir -p for the upload
    shell.put(wheels, wheel_dir, timeout=timeout)
    for cmd in commands[1:]:
        _check(shell.run(cmd, timeout=timeout), cmd)
    return f"{venv}/bin/python"


@dataclass(frozen=True)
class SetupResult:
    device: str
    python: str
    """the device venv's python"""
    wheels: tuple[Path, ...]
    packages: tuple[str, ...]

    def versions(self) -> dict[str, str]:
        return wheelhouse.wheel_versions(list(self.wheels))

    def shown(self) -> str:
        """'numpy 2.1, onnxruntime 1.20, ...': each installed package with its version."""
        v = self.versions()
        names = [wheelhouse.requirement_name(p) for p in self.packages]
        return ", ".join(f"{n} {v.get(wheelhouse.canonical(n), '?')}" for n in names)


def setup_device(
    name: str,
    wheelhouse_dir: Path | None = None,
    arch: str = "aarch64",
    python_version: str = "3.11",
    packages: tuple[str, ...] = (),
    log: Any = print,
) -> SetupResult:
    """`devices setup NAME`: wheels for the device (given in ``wheelhouse_dir``, else downloaded into it),
    uploaded, and a venv built from them on the device."""
    wh = wheelhouse
    spec = wh.WheelhouseSpec(  # cryptography: the board can check signed bundles (devices trust-key)
        arch=arch, python_version=python_version, packages=wh.RUNTIME_PACKAGES + (SIGNING_PACKAGE,) + packages
    )
    # left out where the board has no wheel for it, or a carried wheelhouse lacks it: the board then
    # gets its runtimes and cannot require signatures
    optional = wh.OPTIONAL_PACKAGES | {SIGNING_PACKAGE}
    pins: list[wh.Pin] | None = None
    with open_device(name) as (shell, venv):  # a bad name fails before any download
        given = wh.resolve(spec, wheelhouse_dir, download_missing=False)
        if given:  # carried to an offline host: install what is there, import what it provides
            have = wh.wheel_versions(given)
            spec = wh.WheelhouseSpec(arch=arch, python_version=python_version, packages=tuple(
                p for p in spec.packages if wh.canonical(wh.requirement_name(p)) in have or p not in optional
            ))  # fmt: skip
        else:  # the host's versions where the device has wheels for them, else the newest that do
            spec, pins = wh.platform_pinned(spec, optional=optional)
            for p in pins:
                if p.version != p.host:
                    log(f"{p.name}: {p.version or 'left out'} ({p.reason})")
        wheels = given or wh.download(spec, wheelhouse_dir, pins=pins)
        log(f"uploading {len(wheels)} wheels to {name} and building the venv {venv} there")
        python = setup(shell, wheels, venv=venv, packages=spec.packages)
    return SetupResult(name, python, tuple(wheels), spec.packages)


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
    """A connected remote shell to device ``name`` and the venv its profile's ``python`` lives in.

    The SSH transport of devices/ssh.py (asyncssh: strict host keys, ~/.ssh/config, keepalives);
    without asyncssh, the system's OpenSSH client with the same strictness.
    """
    from quarl_edge.devices import profiles

    profile = profiles.load_profile(name)
    if profile.transport != "ssh":
        raise InputError(f"device {name!r} is reached by {profile.transport!r}, not SSH", "set it up by hand")
    venv = venv_of(profiles.remote_path(profile.python))
    try:
        from quarl_edge.devices.ssh import SSHConnection

        conn = SSHConnection(profile)
    except MissingDependencyError:
        identity, known_hosts = (
            profiles.local_path(profile.identity),
            profiles.local_path(profile.known_hosts),
        )
        yield (
            OpenSSH(
                host=profile.ssh_host,
                user=profile.user or "",
                port=profile.port or 22,
                identity=str(identity) if identity else None,
                known_hosts=str(known_hosts) if known_hosts else None,
                connect_timeout=int(profile.connect_timeout),
            ),
            venv,
        )
        return
    with conn:
        yield _ConnectionShell(conn), venv


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


# ---- signed bundles: a board that trusts only given keys ---------------------------------------------

SIGNING_PACKAGE = "cryptography"
"""what the board needs to check signatures (runtimes/signing.py); aarch64 / armv7 wheels exist"""
_TRUSTED = (
    "import json, sys; sys.path.insert(0, sys.argv[1]); from quarl_edge.runtimes.signing import trusted_keys; "
    "print(json.dumps(sorted(trusted_keys())))"
)


@dataclass(frozen=True)
class Trusted:
    device: str
    fingerprint: str
    path: str
    """the board's trust file (absolute)"""
    keys: tuple[str, ...]
    """every fingerprint the board now trusts, as the board's own runtime reads the file"""
    added: bool
    installed: str | None
    """the cryptography version installed for it (None: the board had it)"""


def trust_key(
    name: str, public_key: Path, overrides: dict[str, Any] | None = None, log: Any = print
) -> Trusted:
    """`devices trust-key NAME KEY.pub`: add the key to the board's trusted keys (which turns "signed
    bundles only" on there), after making sure the board's Python can check signatures. Only the public
    key is sent: a private key is refused before anything connects."""
    from quarl_edge.devices import profiles
    from quarl_edge.devices.remote import SSHTransport
    from quarl_edge.runtimes.signing import TRUST_FILE, public_key_line

    fp, line = public_key_line(public_key)
    profile = profiles.load_profile(name, overrides)
    if profile.transport != "ssh":
        raise InputError(f"device {name!r} is this machine, not a board over SSH",
                         f"add the key line to ~/{TRUST_FILE} here by hand")  # fmt: skip
    q = shlex.quote
    with SSHTransport(profile) as t:
        t.prepare()  # the runner, the board's facts
        installed = _ensure_signing_package(t, log)
        home = t.home()
        path = f"{home}/{TRUST_FILE}"
        folder = path.rsplit("/", 1)[0]
        entry = f"{line} trusted-by-quarl-edge"
        r = t.ssh.run(f"mkdir -p -- {q(folder)} && touch -- {q(path)} && chmod 600 -- {q(path)} && "
                      f"if grep -qF -- {q(line)} {q(path)}; then echo present; "
                      f"else printf '%s\\n' {q(entry)} >> {q(path)} && echo added; fi")  # fmt: skip
        if r.exit_status != 0:
            raise SetupError(
                f"cannot write {path} on {name} ({_last_line(r.stderr)})", "check the board's disk"
            )
        keys = t.ssh.run(shlex.join([t.python, "-c", _TRUSTED, t.runner_path]))
    try:
        trusted = tuple(json.loads(keys.stdout.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        trusted = ()
    if keys.exit_status != 0 or fp not in trusted:
        raise SetupError(f"{name} does not read {path} back with the key ({_last_line(keys.stderr)})",
                         "check that file on the board: one 'ssh-ed25519 AAAA...' line per key")  # fmt: skip
    return Trusted(name, fp, path, trusted, r.stdout.strip() == "added", installed)


def _ensure_signing_package(t: Any, log: Any) -> str | None:
    """Install cryptography into the profile's venv when its Python lacks it: wheels for the board's
    platform downloaded here, uploaded, pip-installed offline. Returns the version installed (None:
    it was there)."""
    probe = shlex.join([t.python, "-c", f"import {SIGNING_PACKAGE}"])
    if t.ssh.run(probe).exit_status == 0:
        return None
    facts = t.device_facts
    machine, version = str(facts.get("machine") or ""), str(facts.get("python") or "")
    spec = wheelhouse.WheelhouseSpec(arch=machine, python_version=".".join(version.split(".")[:2]),
                                     packages=(SIGNING_PACKAGE,))  # fmt: skip
    spec, pins = wheelhouse.platform_pinned(spec)
    wheels = wheelhouse.download(spec, pins=pins)
    log(f"{t.profile.name}: installing {SIGNING_PACKAGE} ({len(wheels)} wheels) to check signatures there")
    folder = f"{t.cache}/wheels/signing-{spec.key()}"
    for w in wheels:
        t.upload(w.read_bytes(), f"{folder}/{w.name}", f"wheel {w.name}")
    versions = wheelhouse.wheel_versions([w.name for w in wheels])
    pip = [t.python, "-m", "pip", "install", "--no-index", "--no-cache-dir", "--disable-pip-version-check",
           "--find-links", folder, *(f"{n}=={v}" for n, v in versions.items())]  # fmt: skip
    r = t.ssh.run(f"{shlex.join(pip)} && rm -rf -- {shlex.quote(folder)}", timeout=t.profile.command_timeout)
    if r.exit_status != 0 or t.ssh.run(probe).exit_status != 0:
        raise SetupError(f"could not install {SIGNING_PACKAGE} on {t.profile.name} ({_last_line(r.stderr)})",
                         f"install it there: quarl-edge devices setup {t.profile.name}")  # fmt: skip
    return versions.get(SIGNING_PACKAGE)
