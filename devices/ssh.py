"""SSH to a device with asyncssh, driven from synchronous code.

- Host keys are checked strictly, always: an unknown key is refused with its fingerprint and the
  command that trusts it (``quarl-edge devices trust NAME --fingerprint SHA256:...``, which re-checks
  the fingerprint); a changed key is refused, whatever the configuration says.
- Authentication is by key only (a profile's ``identity``, else ~/.ssh/config, ssh-agent and the
  default keys); passwords and keyboard-interactive are never tried, nothing secret is stored.
- ~/.ssh/config applies (Host aliases, HostName, User, Port, IdentityFile, UserKnownHostsFile, ...);
  profile fields and flags win over it.
- Connect timeout (TCP + handshake + authentication), per-command timeouts, and keepalives that
  detect a dead link.

Commands are strings for the remote POSIX shell: build them with :func:`sh` (``shlex.quote`` on
every word), never by formatting user data into a command line.

The asyncssh event loop runs in a private thread, so callers (bench's transport iterator, the CLI)
stay synchronous and keepalives run while the caller is busy.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import socket
import stat
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from quarl_edge.devices.profiles import DeviceProfile
from quarl_edge.runtimes.errors import InputError, MissingDependencyError, QuarlError

T = TypeVar("T")
DEFAULT_KNOWN_HOSTS = ("~/.ssh/known_hosts", "/etc/ssh/ssh_known_hosts")


class SSHError(QuarlError):
    """The device cannot be reached, refused us, or the link failed."""


class HostKeyError(SSHError):
    """The device's host key is unknown or has changed: the connection is refused."""


class LinkLost(SSHError):
    """The connection dropped while a command was running."""


def sh(*words: str | os.PathLike[str]) -> str:
    """One shell command line, every word quoted."""
    return shlex.join(os.fspath(w) for w in words)


def _asyncssh() -> Any:
    try:
        import asyncssh
    except ImportError:
        raise MissingDependencyError(
            "the SSH transport needs asyncssh, which is not installed", "pip install 'quarl-edge[device]'"
        ) from None
    return asyncssh


@dataclass
class Completed:
    exit_status: int | None
    stdout: str
    stderr: str


class _LoopThread:
    """An asyncio loop in a daemon thread; ``call`` runs a coroutine there and waits for it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="quarl-edge-ssh", daemon=True)
        self.thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        fut = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except BaseException:
            fut.cancel()
            raise

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)
        self.loop.close()


def _where(profile: DeviceProfile, host: str, port: int) -> str:
    return f"{profile.name} ({host}:{port})"


def check_identity(path: Path) -> None:
    """Refuse a missing key file, or one others can read (as OpenSSH does)."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        raise InputError(f"identity file {str(path)!r} does not exist", "fix identity / --identity") from None
    if mode & 0o077:
        raise InputError(
            f"identity file {str(path)!r} is accessible by others (mode {mode:04o})",
            f"chmod 600 {shlex.quote(str(path))}",
        )


class SSHConnection:
    """One SSH connection to the device of ``profile``. Use as a context manager."""

    def __init__(self, profile: DeviceProfile) -> None:
        if profile.transport != "ssh":
            raise InputError(f"device {profile.name!r} is not reached over SSH", "pick an SSH device profile")
        self.profile = profile
        self._asyncssh = _asyncssh()
        self._loop: _LoopThread | None = None
        self._conn: Any = None
        self.host = profile.ssh_host
        self.port = profile.port or 22
        self.connect_s: float | None = None
        self.last = Completed(None, "", "")
        """outcome of the last :meth:`stream`"""

    # -- connection ---------------------------------------------------------------------------------

    def __enter__(self) -> SSHConnection:
        self.connect()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self) -> None:
        if self._conn is not None:
            return
        self._loop = _LoopThread()
        t0 = time.perf_counter()
        try:
            self._conn = self._loop.call(self._connect())
        except BaseException:
            self.close()
            raise
        self.connect_s = time.perf_counter() - t0

    def close(self) -> None:
        if self._loop is None:
            return
        if self._conn is not None:
            conn, self._conn = self._conn, None
            with contextlib.suppress(Exception):  # closing a dead link: nothing left to tidy
                self._loop.call(_close(conn))
        self._loop.close()
        self._loop = None

    async def _options(self, **extra: Any) -> Any:
        """asyncssh options: profile + flags over ~/.ssh/config, our own host-key and auth policy."""
        a = self._asyncssh
        p = self.profile
        kw: dict[str, Any] = dict(
            connect_timeout=p.connect_timeout,
            keepalive_interval=p.keepalive_interval,
            keepalive_count_max=p.keepalive_count_max,
            password_auth=False,
            kbdint_auth=False,
            host_based_auth=False,
            gss_auth=False,
        )
        if p.user:
            kw["username"] = p.user
        if p.identity:
            key = Path(p.identity).expanduser()
            check_identity(key)
            kw["client_keys"] = [str(key)]
            kw["agent_path"] = None  # the profile names its key: offer that one only
        kw.update(extra)
        try:
            # config=() (not omitted) makes asyncssh read ~/.ssh/config for this host
            opts = await a.SSHClientConnectionOptions.construct(
                config=(), host=p.ssh_host, port=p.port or (), **kw
            )
        except (a.KeyImportError, a.KeyEncryptionError) as e:
            raise InputError(
                f"cannot use identity {p.identity!r} ({e})",
                "a passphrase-protected key must be loaded into ssh-agent (ssh-add KEY); quarl-edge never asks for passphrases",
            ) from None
        except ValueError as e:
            raise InputError(
                f"cannot set up SSH to {p.name} ({e})", "check the profile and ~/.ssh/config"
            ) from None
        self.host, self.port = opts.host, opts.port
        return opts

    def known_hosts_files(self, opts: Any) -> list[Path]:
        """Where the device's key is looked up: the profile's file, else ~/.ssh/config's, else OpenSSH's."""
        if self.profile.known_hosts:
            return [Path(self.profile.known_hosts).expanduser()]
        configured = opts.known_hosts if isinstance(opts.known_hosts, list) else []
        # "UserKnownHostsFile none" would turn checking off in asyncssh: strict means the defaults instead
        return [Path(f).expanduser() for f in (configured or DEFAULT_KNOWN_HOSTS)]

    def _known_hosts(self, opts: Any) -> Any:
        text = "".join(f.read_text() + "\n" for f in self.known_hosts_files(opts) if f.is_file())
        return self._asyncssh.import_known_hosts(text)

    async def _connect(self) -> Any:
        a = self._asyncssh
        base = await self._options()
        known = self._known_hosts(base)
        opts = await self._options(known_hosts=known)
        try:
            return await a.connect(self.profile.ssh_host, self.profile.port or (), options=opts)
        except a.HostKeyNotVerifiable:
            raise await self._host_key_error(base, known) from None
        except a.PermissionDenied:
            keys = self.profile.identity or "ssh-agent / ~/.ssh/config / ~/.ssh/id_*"
            raise SSHError(
                f"{_where(self.profile, self.host, self.port)} refused key authentication for user "
                f"{opts.username!r} (keys tried: {keys})",
                f"add the public key to the device's ~/.ssh/authorized_keys (ssh-copy-id -i KEY.pub -p {self.port} "
                f"{opts.username}@{self.host}) or pass --identity / --user",
            ) from None
        except (asyncio.TimeoutError, TimeoutError):
            raise SSHError(
                f"cannot reach {_where(self.profile, self.host, self.port)}: no answer within "
                f"{self.profile.connect_timeout:g} s (connect timeout)",
                "check that the device is on and the address is right (--host/--port), or raise connect_timeout",
            ) from None
        except ConnectionRefusedError:
            raise SSHError(
                f"cannot reach {_where(self.profile, self.host, self.port)}: connection refused",
                "is sshd running on the device, on that port? check --host/--port",
            ) from None
        except socket.gaierror as e:
            raise SSHError(
                f"cannot resolve host {self.host!r} of device {self.profile.name} ({e.strerror})",
                f"set host in the [{self.profile.name}] table of ~/.config/quarl-edge/devices.toml, "
                f"add `Host {self.profile.name}` to ~/.ssh/config, or pass --host",
            ) from None
        except OSError as e:
            raise SSHError(
                f"cannot reach {_where(self.profile, self.host, self.port)}: {e.strerror or e}",
                "check the network and --host/--port",
            ) from None
        except a.Error as e:
            raise SSHError(
                f"SSH to {_where(self.profile, self.host, self.port)} failed: {e.reason or type(e).__name__}",
                "check the device's sshd and ~/.ssh/config",
            ) from None

    # -- host keys ----------------------------------------------------------------------------------

    def _pattern(self) -> str:
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    def _trusted(self, known: Any) -> list[Any]:
        addrs = {""}
        with contextlib.suppress(OSError):
            addrs |= {
                str(ai[4][0]) for ai in socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
            }
        keys: dict[bytes, Any] = {}
        for addr in sorted(addrs):
            found = self._asyncssh.match_known_hosts(
                known, self.host, addr, None if self.port == 22 else self.port
            )
            for k in found[0]:
                keys[k.public_data] = k
        return list(keys.values())

    async def _server_key(self, opts: Any, algs: list[str] | None = None) -> Any:
        a = self._asyncssh
        try:
            return await a.get_server_host_key(
                self.profile.ssh_host, self.profile.port or (), options=opts, server_host_key_algs=algs or ()
            )
        except (a.Error, OSError, asyncio.TimeoutError, TimeoutError) as e:
            if algs:  # the device no longer offers the key type we pinned: it changed
                return None
            raise SSHError(
                f"cannot read the host key of {_where(self.profile, self.host, self.port)} ({e})",
                "check the address and the device's sshd",
            ) from None

    async def _host_key_error(self, opts: Any, known: Any) -> HostKeyError:
        trusted = self._trusted(known)
        files = ", ".join(str(f) for f in self.known_hosts_files(opts))
        if not trusted:
            key = await self._server_key(opts)
            fp = key.get_fingerprint("sha256")
            return HostKeyError(
                f"unknown host key for {_where(self.profile, self.host, self.port)}: "
                f"{key.get_algorithm()} {fp} (not in {files}); refused",
                f"if that is the device's key (on the device: ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub), "
                f"trust it with: quarl-edge devices trust {self.profile.cli_ref()} --fingerprint {fp}",
            )
        key = await self._server_key(opts, sorted({k.get_algorithm() for k in trusted}))
        now = (
            f"{key.get_algorithm()} {key.get_fingerprint('sha256')}"
            if key is not None
            else "another key type"
        )
        was = ", ".join(sorted(k.get_fingerprint("sha256") for k in trusted))
        target = self.known_hosts_files(opts)[0]
        return HostKeyError(
            f"the host key of {_where(self.profile, self.host, self.port)} has CHANGED: it is now {now}, "
            f"{files} pins {was}; refused (this can be a man-in-the-middle attack)",
            f"only if the device was reinstalled: ssh-keygen -R {shlex.quote(self._pattern())} -f "
            f"{shlex.quote(str(target))}, then trust the new key",
        )

    def trust(self, fingerprint: str) -> tuple[Path, str]:
        """Pin the device's host key after checking it has ``fingerprint``; returns (file, line)."""
        loop = _LoopThread()
        try:
            return loop.call(self._trust(fingerprint))
        finally:
            loop.close()

    async def _trust(self, fingerprint: str) -> tuple[Path, str]:
        want = fingerprint if fingerprint.startswith("SHA256:") else f"SHA256:{fingerprint}"
        opts = await self._options()
        known = self._known_hosts(opts)
        trusted = self._trusted(known)
        key = await self._server_key(opts)
        fp = key.get_fingerprint("sha256")
        if fp != want:
            raise HostKeyError(
                f"{_where(self.profile, self.host, self.port)} presents {key.get_algorithm()} {fp}, "
                f"not {want}; nothing trusted",
                "compare with the device's own `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub`",
            )
        target = self.known_hosts_files(opts)[0]
        if any(k.public_data == key.public_data for k in trusted):
            return target, ""
        if trusted:
            raise await self._host_key_error(opts, known)
        line = f"{self._pattern()} {key.export_public_key().decode().strip()}\n"
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(line)
        return target, line.strip()

    # -- commands -----------------------------------------------------------------------------------

    def _need(self) -> tuple[_LoopThread, Any]:
        if self._conn is None or self._loop is None:
            raise SSHError(f"not connected to {self.profile.name}", "connect first")
        return self._loop, self._conn

    def run(
        self, command: str, *, timeout: float | None = None, stdin: bytes | Path | None = None
    ) -> Completed:
        """Run ``command`` (built with :func:`sh`) and wait; stdin from bytes or a local file."""
        loop, conn = self._need()
        return loop.call(self._run(conn, command, timeout or self.profile.command_timeout, stdin))

    async def _run(self, conn: Any, command: str, timeout: float, stdin: bytes | Path | None) -> Completed:
        a = self._asyncssh
        kw: dict[str, Any] = {"encoding": None, "timeout": timeout, "check": False}
        if isinstance(stdin, Path):
            kw["stdin"] = str(stdin)
        else:
            kw["input"] = stdin if stdin is not None else b""
        try:
            r = await conn.run(command, **kw)
        except a.TimeoutError:
            raise SSHError(
                f"a command on {self.profile.name} did not finish within {timeout:g} s",
                "raise command_timeout",
            ) from None
        except (a.ConnectionLost, a.DisconnectError, a.ChannelOpenError, ConnectionError) as e:
            raise LinkLost(f"the SSH link to {self.profile.name} dropped ({_reason(e)})") from None
        if r.exit_status is None and r.exit_signal is None:
            raise LinkLost(f"the SSH link to {self.profile.name} dropped (no exit status)")
        return Completed(r.exit_status, _text(r.stdout), _text(r.stderr))

    def stream(self, command: str, *, idle_timeout: float | None = None) -> Iterator[str]:
        """Run ``command`` and yield its stdout lines as they come; then ``self.last`` has the outcome.

        Raises :class:`LinkLost` when the connection drops, :class:`SSHError` when no line arrives
        within ``idle_timeout`` (default: the profile's command_timeout).
        """
        loop, conn = self._need()
        limit = idle_timeout or self.profile.command_timeout
        proc, err_task = loop.call(self._start(conn, command))
        try:
            while True:
                line = loop.call(self._readline(proc, limit))
                if not line:
                    break
                yield line
            self.last = loop.call(self._finish(proc, err_task))
        finally:
            with contextlib.suppress(Exception):  # the link may be gone already
                loop.call(_settle(proc, err_task))

    def session(self, command: str, *, idle_timeout: float | None = None) -> Session:
        """Run ``command`` with a writable stdin: send lines, read lines (``bench --env-on-host``)."""
        loop, conn = self._need()
        proc, err_task = loop.call(self._start(conn, command, interactive=True))
        return Session(self, loop, proc, err_task, idle_timeout or self.profile.command_timeout)

    async def _start(
        self, conn: Any, command: str, interactive: bool = False
    ) -> tuple[Any, asyncio.Task[Any]]:
        a = self._asyncssh
        try:
            stdin = a.PIPE if interactive else a.DEVNULL
            proc = await conn.create_process(command, stdin=stdin, encoding="utf-8", errors="replace")
        except (a.ConnectionLost, a.DisconnectError, a.ChannelOpenError, ConnectionError) as e:
            raise LinkLost(f"the SSH link to {self.profile.name} dropped ({_reason(e)})") from None
        # drain stderr concurrently: an unread stderr fills the channel window and stalls stdout
        return proc, asyncio.ensure_future(proc.stderr.read())

    async def _readline(self, proc: Any, limit: float) -> str:
        a = self._asyncssh
        try:
            return await asyncio.wait_for(proc.stdout.readline(), limit)
        except (asyncio.TimeoutError, TimeoutError):
            raise SSHError(
                f"the command on {self.profile.name} was silent for {limit:g} s", "raise command_timeout"
            ) from None
        except (a.ConnectionLost, a.DisconnectError, ConnectionError, BrokenPipeError) as e:
            raise LinkLost(f"the SSH link to {self.profile.name} dropped ({_reason(e)})") from None

    async def _finish(self, proc: Any, err_task: asyncio.Task[Any]) -> Completed:
        a = self._asyncssh
        try:
            await asyncio.wait_for(proc.wait_closed(), self.profile.command_timeout)
            err = await err_task
        except (a.ConnectionLost, a.DisconnectError, ConnectionError) as e:
            raise LinkLost(f"the SSH link to {self.profile.name} dropped ({_reason(e)})") from None
        if proc.exit_status is None and proc.exit_signal is None:
            raise LinkLost(f"the SSH link to {self.profile.name} dropped (no exit status)")
        status = proc.exit_status if proc.exit_status is not None else -1
        return Completed(status, "", _text(err))


class Session:
    """An interactive command on the device: ``send`` a line, ``readline`` the next (see SSHConnection.session)."""

    def __init__(
        self, ssh: SSHConnection, loop: _LoopThread, proc: Any, err_task: asyncio.Task[Any], limit: float
    ) -> None:
        self._ssh, self._loop, self._proc, self._err, self._limit = ssh, loop, proc, err_task, limit

    def send(self, line: str) -> None:
        self._loop.call(self._send(line))

    async def _send(self, line: str) -> None:
        a = self._ssh._asyncssh
        try:
            self._proc.stdin.write(line)
            await self._proc.stdin.drain()
        except (a.ConnectionLost, a.DisconnectError, ConnectionError, BrokenPipeError) as e:
            raise LinkLost(f"the SSH link to {self._ssh.profile.name} dropped ({_reason(e)})") from None

    def readline(self) -> str:
        return self._loop.call(self._ssh._readline(self._proc, self._limit))

    def close(self) -> None:
        with contextlib.suppress(Exception):  # the link may be gone already
            self._loop.call(self._end())

    async def _end(self) -> None:
        self._proc.stdin.write_eof()
        await asyncio.wait_for(self._proc.wait_closed(), 30)
        await _settle(self._proc, self._err)


async def _close(conn: Any) -> None:
    conn.close()
    await asyncio.wait_for(conn.wait_closed(), 5)


async def _settle(proc: Any, err_task: asyncio.Task[Any]) -> None:
    """After a stream, finished or not: close the channel, and consume the stderr reader's outcome."""
    if proc.exit_status is None:
        proc.close()
    if not err_task.done():
        err_task.cancel()
    with contextlib.suppress(BaseException):
        await err_task


def _text(data: Any) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else str(data)


def _reason(e: BaseException) -> str:
    return str(getattr(e, "reason", "") or e or type(e).__name__)
