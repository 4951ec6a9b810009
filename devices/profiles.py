"""Device profiles: what a board is (arch, CPU, cores, python, runtime) and how to reach it (SSH).

Three layers, later ones win field by field:

1. built-in profiles, ``devices/profiles/<name>.toml`` (rpi4, rpi5, rpi3b, jetson-orin-nano, local);
2. the user's files: ``$XDG_CONFIG_HOME/quarl-edge/devices.d/*.toml`` (written by tools, e.g. the
   emulator's ``rpi4-emu``) and then ``$XDG_CONFIG_HOME/quarl-edge/devices.toml`` (hand edits), one
   TOML table per device: ``[rpi4]`` overrides the built-in rpi4, ``[lab-pi]`` with ``extends = "rpi4"``
   defines a new device on top of one;
3. command-line flags (``--host/--user/--port/--identity``).

Fields left unset (``user``, ``port``, ``identity``, ``known_hosts``) fall back to ``~/.ssh/config`` and
then to OpenSSH's defaults; ``host`` defaults to the profile name, so a ``Host rpi4`` block in
``~/.ssh/config`` is all a board needs. Remote paths (``python``, ``cache_dir``) starting with ``~/``, or
relative, are under the board's own ``$HOME`` (asked once per connection), whatever folder its SSH
sessions start in. No password field exists: authentication is by key only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from importlib.resources import files
from pathlib import Path
from typing import Any

import tomllib

from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.fsutil import atomic_write_text
from quarl_edge.runtimes.schema import JSONObject

PROFILE_DIR = Path(str(files("quarl_edge.devices").joinpath("profiles")))
TRANSPORTS = ("local", "ssh")
RUNTIMES = ("onnxruntime", "ai_edge_litert", "tflite_runtime")  # import names, as `runtimes info` lists them
USER_FILE = "devices.toml"
DROP_IN_DIR = "devices.d"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "str": lambda v: isinstance(v, str) and len(v) <= 4096,
    "int": _is_int,
    "float": lambda v: (_is_int(v) or isinstance(v, float)) and v == v and abs(v) != float("inf"),
    "bool": lambda v: isinstance(v, bool),
    "str | None": lambda v: v is None or (isinstance(v, str) and len(v) <= 4096),
    "int | None": lambda v: v is None or _is_int(v),
}
_TYPE_WORDS = {"str": "a string", "int": "an integer", "float": "a finite number", "bool": "true or false",
               "str | None": "a string", "int | None": "an integer"}  # fmt: skip


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    """profile name, e.g. rpi4"""
    transport: str = "ssh"
    """local (a child process of this Python) or ssh"""
    description: str = ""
    arch: str = ""
    """expected `uname -m`: aarch64, armv7l, x86_64"""
    cpu: str = ""
    """CPU as sold, e.g. "Cortex-A72 @ 1.8 GHz" (the device's own /proc/cpuinfo is reported by check/bench)"""
    cores: int = 0
    default_threads: int = 1
    """runtime threads when --threads is not given"""
    python: str = "python3"
    """the device's Python (a venv with numpy + a runtime + gymnasium); ~/ is the remote home"""
    preferred_runtime: str = "onnxruntime"
    """import name of the runtime this board should use: onnxruntime, ai_edge_litert or tflite_runtime"""
    host: str | None = None
    """address or ~/.ssh/config Host alias; default: the profile name"""
    user: str | None = None
    """default: ~/.ssh/config User, else the local user name"""
    port: int | None = None
    """default: ~/.ssh/config Port, else 22"""
    identity: str | None = None
    """private key file (must be 0600); when set, only this key is offered"""
    known_hosts: str | None = None
    """known_hosts file pinning the device's host key; default: ~/.ssh/config / ~/.ssh/known_hosts"""
    cache_dir: str = "~/.cache/quarl-edge"
    """remote cache of runner zipapps and bundles (keyed by sha256); ~/ is the remote home"""
    connect_timeout: float = 10.0
    """seconds for TCP connect + SSH handshake + authentication"""
    command_timeout: float = 900.0
    """seconds a remote command may stay silent (a runner prints a line per episode)"""
    keepalive_interval: float = 15.0
    """seconds between SSH keepalives; the link counts as dropped after keepalive_count_max misses"""
    keepalive_count_max: int = 3
    emulated: bool = False
    """an emulated board (qemu): its latency is not board latency, and reports say so"""
    extends: str | None = None
    """(user files) start from this profile's fields"""
    source: tuple[str, ...] = ()
    """files (and flags) this profile was read from, most specific last"""
    flags: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    """command-line overrides applied, to repeat them in suggested commands"""

    def __post_init__(self) -> None:
        where = self.source[-1] if self.source else "device profile"
        for f in fields(self):  # a TOML value of the wrong type is named here, not met later as a crash
            value, ok = getattr(self, f.name), _TYPE_CHECKS.get(str(f.type))
            if ok is not None and not ok(value):
                raise InputError(
                    f"device {str(self.name)[:64]!r}: {f.name} = {str(value)[:40]!r} is not {_TYPE_WORDS[str(f.type)]} ({where})",
                    "fix the TOML file",
                )
        if not _NAME.match(self.name):
            raise InputError(f"device name {self.name!r} is not a simple name", "use letters, digits, . _ -")
        if self.transport not in TRANSPORTS:
            raise InputError(
                f"device {self.name!r}: unknown transport {self.transport!r} ({where})",
                f"known transports: {', '.join(TRANSPORTS)}",
            )
        if self.preferred_runtime not in RUNTIMES:
            raise InputError(
                f"device {self.name!r}: unknown preferred_runtime {self.preferred_runtime!r} ({where})",
                f"known runtimes: {', '.join(RUNTIMES)}",
            )
        if self.port is not None and not 0 < self.port < 65536:
            raise InputError(f"device {self.name!r}: port {self.port} is out of range", "use 1..65535")
        if self.default_threads < 1 or self.default_threads > 1024:
            raise InputError(f"device {self.name!r}: default_threads must be 1..1024 ({where})", "fix it")
        for name in ("connect_timeout", "command_timeout", "keepalive_interval"):
            if not getattr(self, name) > 0:
                raise InputError(f"device {self.name!r}: {name} must be > 0 ({where})", "fix it")
        if self.keepalive_count_max < 1:
            raise InputError(f"device {self.name!r}: keepalive_count_max must be >= 1 ({where})", "fix it")

    @property
    def ssh_host(self) -> str:
        return self.host or self.name

    def cli_ref(self) -> str:
        """How to name this device on the command line, flags included (for suggested commands)."""
        import shlex

        return shlex.join([self.name, *(x for k, v in self.flags for x in (f"--{k}", v))])

    def to_dict(self) -> JSONObject:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "flags"}
        out["source"] = list(self.source)
        return out


FIELDS = tuple(f.name for f in fields(DeviceProfile) if f.name not in ("name", "source", "flags"))


@dataclass(frozen=True)
class ProfileOverrides:
    """Profile fields given on the command line (``--host/--user/--port/--identity``), or by a caller
    that knows better than the profile (the emulator's ``python``); None: not given, the profile's stands."""

    host: str | None = None
    user: str | None = None
    port: int | None = None
    identity: str | None = None
    python: str | None = None

    def __post_init__(self) -> None:
        for f in fields(self):  # the range of a port is the profile's to check, with the device named
            value = getattr(self, f.name)
            if not _TYPE_CHECKS[str(f.type)](value):
                word = _TYPE_WORDS[str(f.type)]
                raise InputError(f"device override {f.name} = {str(value)[:40]!r} is not {word}",
                                 f"give {f.name} as {word} (or None: the profile's)")  # fmt: skip

    def given(self) -> dict[str, str | int]:
        """The fields that were given, in the order flags are shown."""
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}


_INT = ("cores", "default_threads", "port", "keepalive_count_max")
_FLOAT = ("connect_timeout", "command_timeout", "keepalive_interval")
_BOOL = ("emulated",)
_FORBIDDEN = {
    "password": "passwords are never stored: use a key (ssh-keygen; ssh-copy-id -i KEY.pub USER@HOST)",
    "passphrase": "key passphrases are never stored: load the key into ssh-agent (ssh-add KEY)",
}


def config_dir() -> Path:
    """``$XDG_CONFIG_HOME/quarl-edge`` (default ``~/.config/quarl-edge``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "quarl-edge"


def user_files() -> list[Path]:
    """User files in the order they apply: drop-ins (sorted), then devices.toml."""
    d = config_dir()
    return [*sorted((d / DROP_IN_DIR).glob("*.toml")), d / USER_FILE]


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"{str(path)!r} is not valid TOML ({e})", "fix the file") from None


def _check_table(name: str, data: Any, path: Path) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InputError(
            f"{str(path)!r}: [{name}] must be a table of fields", "e.g. [rpi4] host = '10.0.0.2'"
        )
    for key in data:
        if key in _FORBIDDEN:
            raise InputError(f"{str(path)!r}: [{name}] has a {key!r} field", _FORBIDDEN[key])
        if key not in FIELDS:
            raise InputError(
                f"{str(path)!r}: [{name}] has an unknown field {key!r}", f"known fields: {', '.join(FIELDS)}"
            )
        value = data[key]
        if key in _BOOL:
            ok, want = isinstance(value, bool), "true or false"
        elif key in _INT:
            ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
        elif key in _FLOAT:
            ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        else:
            ok, want = isinstance(value, str), "a string"
        if not ok:
            raise InputError(f"{str(path)!r}: [{name}] {key} = {value!r} must be {want}", "fix the file")
    return dict(data)


def _raw_profiles() -> dict[str, list[tuple[Path, dict[str, Any]]]]:
    """Every layer of every profile, least specific first."""
    layers: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    for path in sorted(PROFILE_DIR.glob("*.toml")):
        layers.setdefault(path.stem, []).append((path, _check_table(path.stem, _read_toml(path), path)))
    for path in user_files():
        if not path.is_file():
            continue
        for name, table in _read_toml(path).items():
            layers.setdefault(name, []).append((path, _check_table(name, table, path)))
    return layers


def available() -> list[str]:
    return sorted(_raw_profiles())


def _resolve(name: str, layers: dict[str, list[tuple[Path, dict[str, Any]]]], seen: tuple[str, ...]) -> dict:
    """Fields of ``name``: its base (``extends``, if any layer names one), then each layer in order."""
    if name not in layers:
        raise InputError(f"unknown device {name!r}", f"known devices: {', '.join(sorted(layers))}")
    if name in seen:
        raise InputError(
            f"device profiles extend each other in a loop: {' -> '.join((*seen, name))}", "fix it"
        )
    own: dict[str, Any] = {}
    for _, table in layers[name]:
        own.update(table)
    base = own.get("extends")
    merged = (
        {k: v for k, v in _resolve(str(base), layers, (*seen, name)).items() if k != "source"} if base else {}
    )
    merged.update(own)
    merged["source"] = tuple(str(path) for path, _ in layers[name])
    return merged


def load_profile(name: str, overrides: ProfileOverrides | None = None) -> DeviceProfile:
    """The profile ``name`` with user files and ``overrides`` (flags; fields left None are ignored) applied."""
    data = _resolve(name, _raw_profiles(), ())
    try:
        profile = DeviceProfile(name=name, **data)
    except TypeError as e:  # a wrong type in a TOML file, e.g. port = "22"
        raise InputError(f"device {name!r}: malformed profile ({e})", "fix the TOML file") from None
    return with_overrides(profile, overrides or ProfileOverrides())


def with_overrides(profile: DeviceProfile, overrides: ProfileOverrides) -> DeviceProfile:
    o = overrides
    if o.identity is not None:
        o = replace(o, identity=str(Path(o.identity).expanduser()))
    given = o.given()
    if not given:
        return profile
    flags = (*profile.flags, *((k, str(v)) for k, v in given.items()))
    return replace(
        profile,
        host=profile.host if o.host is None else o.host,
        user=profile.user if o.user is None else o.user,
        port=profile.port if o.port is None else o.port,
        identity=profile.identity if o.identity is None else o.identity,
        python=profile.python if o.python is None else o.python,
        flags=flags,
        source=(*profile.source, "command-line flags"),
    )


def local_path(path: str | None) -> Path | None:
    """A path of this machine from a profile field (``~`` expanded)."""
    return Path(path).expanduser() if path else None


def remote_path(path: str, home: str) -> str:
    """A profile's remote path (``python``, ``cache_dir``) as an absolute path on the board.

    ``~`` and ``~/x`` are under the board's own ``$HOME`` (asked once per connection: :func:`parse_home`),
    and so is a relative path; never the folder an SSH session happens to start in, which a board's
    ``sshd_config`` or the user's login can set elsewhere."""
    if path == "~" or path.startswith("~/"):
        rest = path[2:].strip("/")
    elif path.startswith("~"):
        raise InputError(f"remote path {path[:80]!r}: only ~/ (the board's $HOME) is understood",
                         "write it as ~/... or as an absolute path")  # fmt: skip
    elif path.startswith("/"):
        return path
    else:
        rest = path.removeprefix("./").strip("/")
    return f"{home.rstrip('/')}/{rest}" if rest else home


def parse_home(stdout: str, exit_status: int | None, device: str) -> str:
    """The board's ``$HOME`` from ``printf %s "$HOME"`` run there: absolute and printable, or refused."""
    home = stdout.rstrip("/") or "/"
    if exit_status != 0 or not stdout.startswith("/") or len(home) > 4096 or not home.isprintable():
        raise QuarlError(f"{device} did not tell its home folder ($HOME: {stdout[:80]!r})",
                         "set HOME for the SSH user on the board")  # fmt: skip
    return home


HOME_COMMAND = 'printf %s "$HOME"'
"""the one command that asks a board for its $HOME (parsed by :func:`parse_home`)"""


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    raise InputError(f"cannot write {type(v).__name__} into a device profile", "use str, int, float or bool")


def write_device_entry(
    name: str, entry: dict[str, str | int | float | bool | None], *, comment: str = ""
) -> Path:
    """Write (atomically) ``$XDG_CONFIG_HOME/quarl-edge/devices.d/<name>.toml`` holding ``[name]``.

    For tools that own a device, e.g. the emulator's ``rpi4-emu``::

        write_device_entry("rpi4-emu", {"extends": "rpi4", "host": "10.77.0.2", "port": 22, "user": "root",
                                        "identity": ".../id_ed25519", "known_hosts": ".../known_hosts",
                                        "emulated": True, "python": "/opt/venv/bin/python"})

    A hand-written ``[name]`` in devices.toml still wins field by field.
    """
    if not _NAME.match(name):
        raise InputError(f"device name {name!r} is not a simple name", "use letters, digits, . _ -")
    path = config_dir() / DROP_IN_DIR / f"{name}.toml"
    _check_table(name, entry, path)
    lines = [f"# {line}" for line in comment.splitlines()] + [f'["{name}"]']
    lines += [f"{k} = {_toml_value(v)}" for k, v in entry.items() if v is not None]
    atomic_write_text(path, "\n".join(lines) + "\n")
    try:
        load_profile(name)  # never leave behind an entry that does not load
    except InputError:
        path.unlink()
        raise
    return path


def remove_device_entry(name: str) -> bool:
    """Remove the drop-in written by :func:`write_device_entry`; True when there was one."""
    path = config_dir() / DROP_IN_DIR / f"{name}.toml"
    if path.is_file():
        path.unlink()
        return True
    return False
