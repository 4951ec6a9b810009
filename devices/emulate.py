"""An emulated Raspberry Pi 4: arm64 Debian under qemu-user, its sshd alone in a network namespace.

``up`` builds the rootfs once (cached under ``$XDG_CACHE_HOME/quarl-edge/emulate/<board>/``, rebuilt
only when the recipe changes), mounts proc (with a Pi 4 cpuinfo), sys and dev into it, creates the
namespace and veth pair, starts the rootfs's own sshd inside the namespace with a per-board host key
and client key, pins that host key in a known_hosts file and writes the device entry (``rpi4-emu``) to
the user devices file. ``down`` undoes all of it by recorded PID, mount point and name. Latency measured
here is qemu's, not a Pi's: the device entry says ``emulated = true`` and so do the reports.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from quarl_edge.devices import hostsys, netns, profiles, rootfs, wheelhouse
from quarl_edge.devices.hostsys import EmulatorError
from quarl_edge.devices.netns import Link
from quarl_edge.devices.rootfs import RootfsRecipe
from quarl_edge.devices.wheelhouse import WheelhouseSpec
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.fsutil import atomic_write_json, atomic_write_text
from quarl_edge.runtimes.schema import JSONObject

Log = Callable[[str], None]
_SSH_DIR = "etc/ssh/quarl-edge"  # inside the rootfs: sshd_config, host key, authorized_keys
_START_TIMEOUT = 90.0  # sshd under qemu-user: a few seconds; a loaded CI host: more
_LOCK_WAIT = 1800.0  # another `up` may be building the rootfs (minutes)
RUN_DIR = Path("/run/quarl-edge")  # tmpfs: gone at reboot, like the namespaces it describes


@dataclass(frozen=True)
class EmulatedBoard:
    name: str
    """Board name on the command line (``emulate rpi4 up``)."""
    device: str
    """Device entry written to the user devices file."""
    profile: str
    """The real board's profile this one stands in for."""
    description: str
    link: Link
    port: int = 22
    cores: int = 4
    arch: str = "aarch64"
    cpu: str = "Cortex-A72"
    qemu_cpu: str = "cortex-a72"
    """qemu's CPU model (``QEMU_CPU``) for every process of the board: the board's own core, so runtimes see
    its instruction set (HWCAPs). qemu-user's default, ``max``, offers dot-product, i8mm and SVE, which a
    Pi 4 lacks: XNNPACK then picks other int8 kernels (measured: CartPole tflite-int8 agreed with fp32 on
    89.6% of the trace under ``max``, 99.2% under ``cortex-a72`` and with LiteRT's reference kernels)."""
    recipe: RootfsRecipe = field(default_factory=RootfsRecipe)


BOARDS: dict[str, EmulatedBoard] = {
    "rpi4": EmulatedBoard(
        name="rpi4",
        device="rpi4-emu",
        profile="rpi4",
        description="emulated Raspberry Pi 4 (arm64 Debian bookworm under qemu-user; latency is qemu's, not a Pi's)",
        link=Link(namespace="qe-rpi4", host_if="qe-rpi4-h", device_if="qe-rpi4-d", subnet="10.231.4.0/30"),
    ),
}


def board(name: str) -> EmulatedBoard:
    if name not in BOARDS:
        raise InputError(f"no emulated board {name!r}", f"known boards: {', '.join(sorted(BOARDS))}")
    return BOARDS[name]


@dataclass(frozen=True)
class Paths:
    """Everything a board keeps on the host, under ``$XDG_CACHE_HOME/quarl-edge/emulate/<board>/``."""

    root: Path
    rootfs: Path
    build_stamp: Path
    """recipe hash, venv wheel hash, build time: decides what `up` rebuilds"""
    state: Path
    """host-wide, like the namespace: which rootfs runs, sshd PID, mount points, rate (what `down` undoes)"""
    lock: Path
    """host-wide: one `up`/`down` of a board at a time, whichever cache it builds in"""
    log: Path
    sshd_log: Path
    cpuinfo: Path
    identity: Path
    known_hosts: Path

    @classmethod
    def of(cls, b: EmulatedBoard) -> Paths:
        r = wheelhouse.cache_dir() / "emulate" / b.name
        return cls(
            root=r,
            rootfs=r / "rootfs",
            build_stamp=r / "build.json",
            state=RUN_DIR / f"{b.name}.json",
            lock=RUN_DIR / f"{b.name}.lock",
            log=r / "emulate.log",
            sshd_log=r / "sshd.log",
            cpuinfo=r / "cpuinfo",
            identity=r / "id_ed25519",
            known_hosts=r / "known_hosts",
        )


@dataclass
class Status:
    board: str
    device: str
    built: bool
    running: bool
    emulated: bool = True
    pid: int | None = None
    address: str | None = None
    port: int | None = None
    user: str = "root"
    namespace: str | None = None
    rate: str | None = None
    python: str | None = None
    rootfs: str = ""
    rootfs_size_bytes: int | None = None
    identity: str | None = None
    known_hosts: str | None = None
    devices_file: str | None = None
    build_seconds: float | None = None
    start_seconds: float | None = None
    recipe: str = ""
    runtimes: dict[str, str | None] = field(default_factory=dict)
    """version of each runtime package in the board's venv (None: left out, no wheel for aarch64)"""

    def to_dict(self) -> JSONObject:
        return asdict(self)

    def rows(self) -> list[tuple[str, str]]:
        """What `devices emulate BOARD status` prints, field by field."""
        size = f"{self.rootfs_size_bytes / 2**20:.0f} MiB" if self.rootfs_size_bytes else "-"
        runtimes = ", ".join(f"{k} {v or '(left out: no wheel)'}" for k, v in self.runtimes.items())
        rows = [("device", self.device), ("built", "yes" if self.built else "no"),
                ("running", f"yes (pid {self.pid})" if self.running else "no"),
                ("address", f"{self.address}:{self.port} in namespace {self.namespace}"),
                ("link rate", self.rate or "unshaped"), ("rootfs", f"{self.rootfs} ({size})"),
                ("runtimes", runtimes or "-"), ("emulated", "true (qemu-user: latency is not the board's)")]  # fmt: skip
        if self.build_seconds is not None:
            rows.append(("last build", f"{self.build_seconds:.0f} s"))
        if self.start_seconds is not None:
            rows.append(("start", f"{self.start_seconds:.1f} s"))
        return rows

    def ssh_command(self) -> str:
        return shlex.join(
            ["ssh", "-i", str(self.identity), "-o", f"UserKnownHostsFile={self.known_hosts}"]
            + ["-o", "StrictHostKeyChecking=yes", "-p", str(self.port), f"{self.user}@{self.address}"]
        )


# ---- public verbs -------------------------------------------------------------------------------


def up(
    name: str, *, mirror: str | None = None, rate: str | None = None, rebuild: bool = False, log: Log = print
) -> Status:
    """Build (when the recipe changed) and start the board; idempotent when it already runs."""
    b = board(name)
    rate = netns.parse_rate(rate) if rate else None
    mirror = rootfs.check_mirror(mirror) if mirror else None
    hostsys.require_root("emulate up")
    paths = Paths.of(b)
    with _locked(paths, log):
        state = _read_json(paths.state)
        if state and _running(b, state) and state.get("rootfs") != str(paths.rootfs):
            raise InputError(
                f"{b.device} is already running from {state.get('rootfs')} (pid {state.get('pid')})",
                f"stop it first: quarl-edge devices emulate {b.name} down",
            )
        if state and _running(b, state) and not rebuild:
            if rate and rate != state.get("rate"):
                netns.shape(b.link, rate, log=paths.log)
                state["rate"] = rate
                atomic_write_json(paths.state, state)
            log(f"{b.device} is already running (pid {state['pid']})")
            return status(name)
        _teardown(b, paths, state, log=log)  # leftovers of a crashed board
        tools = [
            "debootstrap",
            "qemu-aarch64-static",
            "update-binfmts",
            "ip",
            "ssh-keygen",
            "nsenter",
            "chroot",
        ]
        hostsys.ensure_tools(tools + (["tc"] if rate else []), log=paths.log)
        hostsys.ensure_binfmt(b.arch, log=paths.log)
        t0 = time.monotonic()
        built_now = _ensure_built(b, paths, mirror=mirror, rebuild=rebuild, log=log)
        build_s = time.monotonic() - t0 if built_now else None
        t1 = time.monotonic()
        _start(b, paths, rate=rate, log=log)
        state = _read_json(paths.state) or {}
        state["start_seconds"] = round(time.monotonic() - t1, 2)
        atomic_write_json(paths.state, state)
    st = status(name)
    st.build_seconds = round(build_s, 1) if build_s is not None else st.build_seconds
    return st


def down(name: str, *, log: Log = print) -> Status:
    """Stop sshd and everything else inside the board, unmount, delete the veth and the namespace."""
    b = board(name)
    hostsys.require_root("emulate down")
    paths = Paths.of(b)
    with _locked(paths, log):
        _teardown(b, paths, _read_json(paths.state), log=log)
    return status(name)


def status(name: str) -> Status:
    """The board as this cache built it, and as it runs on this host (possibly from another cache)."""
    b = board(name)
    paths = Paths.of(b)
    stamp = _read_json(paths.build_stamp) or {}
    state = _read_json(paths.state) or {}
    built = paths.rootfs.is_dir() and stamp.get("base") == b.recipe.key() and bool(stamp.get("venv"))
    running = bool(state) and _running(b, state)
    here = Path(state["cache"]) if running and state.get("cache") else paths.root
    return Status(
        board=b.name,
        device=b.device,
        built=built,
        running=running,
        pid=state.get("pid") if running else None,
        address=b.link.device_address,
        port=b.port,
        namespace=b.link.namespace,
        rate=state.get("rate") if running else None,
        python=stamp.get("python"),
        rootfs=str(state["rootfs"]) if running else str(paths.rootfs),
        rootfs_size_bytes=rootfs.size_bytes(paths.rootfs) if paths.rootfs.is_dir() else None,
        identity=str(here / paths.identity.name),
        known_hosts=str(here / paths.known_hosts.name),
        devices_file=str(profiles.config_dir() / profiles.DROP_IN_DIR / f"{b.device}.toml"),
        build_seconds=stamp.get("build_seconds"),
        start_seconds=state.get("start_seconds") if running else None,
        recipe=b.recipe.key(),
        runtimes={str(p["name"]): p.get("version") for p in stamp.get("pins") or [] if isinstance(p, dict)},
    )


# ---- build --------------------------------------------------------------------------------------


def _ensure_built(b: EmulatedBoard, paths: Paths, *, mirror: str | None, rebuild: bool, log: Log) -> bool:
    stamp = _read_json(paths.build_stamp) or {}
    built = False
    t0 = time.monotonic()
    if rebuild or stamp.get("base") != b.recipe.key() or not paths.rootfs.is_dir():
        mirror = mirror or rootfs.host_mirror(b.recipe.suite)
        log(
            f"building the {b.name} rootfs: debootstrap {b.recipe.suite} {b.recipe.debian_arch} from {mirror} (a few minutes; log: {paths.log})"
        )
        rootfs.build_base(b.recipe, paths.rootfs, mirror, log=paths.log)
        stamp = {
            "schema": 1,
            "base": b.recipe.key(),
            "recipe": asdict(b.recipe),
            "mirror": mirror,
            "venv": None,
        }
        atomic_write_json(paths.build_stamp, stamp)
        built = True
    # the host's versions where they have aarch64 wheels, else the newest that do (cached: no network here)
    spec, pins = wheelhouse.platform_pinned(WheelhouseSpec(arch=b.arch))
    wheels = wheelhouse.download(spec, pins=pins)
    if stamp.get("venv") != wheelhouse.content_hash(wheels):
        log(
            f"installing {len(wheels)} {b.arch} wheels offline into the rootfs venv ({', '.join(spec.packages)})"
        )
        for p in pins:
            if p.version != p.host:
                log(f"  {p.name}: {p.version or 'not installed'} ({p.reason})")
        _write_cpuinfo(b, paths)
        stamp["python"] = rootfs.install_venv(
            paths.rootfs, wheels, paths.cpuinfo, packages=spec.packages, log=paths.log
        )
        stamp["venv"] = wheelhouse.content_hash(wheels)
        stamp["wheels"] = [w.name for w in wheels]
        stamp["pins"] = [asdict(p) for p in pins]
        built = True
    if built:
        stamp["build_seconds"] = round(time.monotonic() - t0, 1)
        atomic_write_json(paths.build_stamp, stamp)
    return built


def _write_cpuinfo(b: EmulatedBoard, paths: Paths) -> None:
    paths.root.mkdir(parents=True, exist_ok=True)
    atomic_write_text(paths.cpuinfo, rootfs.pi4_cpuinfo(b.cores))


# ---- start / stop -------------------------------------------------------------------------------


def _start(b: EmulatedBoard, paths: Paths, *, rate: str | None, log: Log) -> None:
    stamp = _read_json(paths.build_stamp) or {}
    _write_cpuinfo(b, paths)
    host_key = _prepare_ssh(b, paths)
    state: JSONObject = {
        "schema": 1,
        "board": b.name,
        "rootfs": str(paths.rootfs),
        "cache": str(paths.root),
    }
    state |= {"pid": None, "mounts": [], "rate": rate}
    atomic_write_json(paths.state, state)  # from here on, `down` knows what to undo
    try:
        state["mounts"] = rootfs.mount_system(paths.rootfs, paths.cpuinfo, log=paths.log)
        atomic_write_json(paths.state, state)
        netns.create(b.link, rate=rate, log=paths.log)
        (paths.rootfs / "run/sshd").mkdir(mode=0o755, parents=True, exist_ok=True)
        with paths.sshd_log.open("ab") as out:
            proc = subprocess.Popen(
                [
                    hostsys.tool_path("nsenter"),
                    f"--net=/run/netns/{b.link.namespace}",
                    "chroot",
                    str(paths.rootfs),
                    "/usr/sbin/sshd",
                    "-D",
                    "-e",
                    "-f",
                    f"/{_SSH_DIR}/sshd_config",
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives the CLI; stopped by PID at `down`
                env={**os.environ, **rootfs.CHROOT_ENV, "QEMU_CPU": b.qemu_cpu},
            )
        state["pid"] = proc.pid  # nsenter and chroot exec, so this is sshd's own PID
        atomic_write_json(paths.state, state)
        _wait_listening(b, paths, proc.pid)
    except BaseException:
        _teardown(b, paths, state, log=log)
        raise
    atomic_write_text(paths.known_hosts, f"{_known_host(b)} {host_key}\n")
    write_entry(
        DeviceEntry(
            name=b.device,
            host=b.link.device_address,
            port=b.port,
            user="root",
            identity=str(paths.identity),
            known_hosts=str(paths.known_hosts),
            python=stamp.get("python") or f"{rootfs.DEVICE_VENV}/bin/python",
            arch=b.arch,
            cpu=f"{b.cpu} (emulated by qemu-aarch64)",
            cores=b.cores,
            extends=b.profile,
            description=b.description,
        )
    )
    log(
        f"{b.device} is up: sshd pid {state['pid']} at {b.link.device_address}:{b.port} (namespace {b.link.namespace})"
    )


def _known_host(b: EmulatedBoard) -> str:
    return b.link.device_address if b.port == 22 else f"[{b.link.device_address}]:{b.port}"


def _prepare_ssh(b: EmulatedBoard, paths: Paths) -> str:
    """Client key (host side), host key + authorized_keys + sshd_config (rootfs); returns the host public key."""
    ssh_dir = paths.rootfs / _SSH_DIR
    ssh_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    host_key = ssh_dir / "ssh_host_ed25519_key"
    for key, comment in (
        (paths.identity, f"quarl-edge {b.device} client"),
        (host_key, f"quarl-edge {b.device} host"),
    ):
        if not key.is_file():
            hostsys.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(key)],
                log=paths.log,
                step="ssh-keygen",
            )
        key.chmod(0o600)
    authorized = ssh_dir / "authorized_keys"
    atomic_write_text(authorized, paths.identity.with_suffix(".pub").read_text())
    authorized.chmod(0o600)
    atomic_write_text(ssh_dir / "sshd_config", sshd_config(b))
    pub = host_key.with_suffix(".pub").read_text().split()
    return f"{pub[0]} {pub[1]}"


def sshd_config(b: EmulatedBoard) -> str:
    d = f"/{_SSH_DIR}"
    return "\n".join(
        [
            "# written by quarl-edge devices emulate; regenerated at every `up`",
            f"Port {b.port}",
            f"ListenAddress {b.link.device_address}",
            f"HostKey {d}/ssh_host_ed25519_key",
            f"AuthorizedKeysFile {d}/authorized_keys",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "UseDNS no",
            "PrintMotd no",
            "PidFile none",
            "MaxStartups 30:30:60",
            "ClientAliveInterval 15",
            f"SetEnv QEMU_CPU={b.qemu_cpu}",  # every session's processes: qemu emulates the board's core
            "Subsystem sftp /usr/lib/openssh/sftp-server",
            "",
        ]
    )


def _wait_listening(b: EmulatedBoard, paths: Paths, pid: int) -> None:
    deadline = time.monotonic() + _START_TIMEOUT
    while time.monotonic() < deadline:
        if not hostsys.pid_alive(pid):
            tail = (
                paths.sshd_log.read_text(errors="replace").strip().splitlines()[-1:]
                if paths.sshd_log.exists()
                else []
            )
            raise EmulatorError(
                f"sshd in {b.device} exited at start ({' '.join(tail)})", f"see {paths.sshd_log}"
            )
        with (
            contextlib.suppress(OSError),
            socket.create_connection((b.link.device_address, b.port), timeout=1),
        ):
            return
        time.sleep(0.2)
    raise EmulatorError(
        f"sshd in {b.device} did not listen within {_START_TIMEOUT:.0f} s", f"see {paths.sshd_log}"
    )


def _running(b: EmulatedBoard, state: JSONObject) -> bool:
    pid, root = state.get("pid"), state.get("rootfs")
    return (
        isinstance(pid, int)
        and isinstance(root, str)
        and _is_board_process(pid, Path(root))
        and netns.exists(b.link)
    )


def _is_board_process(pid: int, root: Path) -> bool:
    """Alive and chrooted into the board's rootfs (a recycled PID is someone else's: never touch it)."""
    return hostsys.pid_alive(pid) and pid in hostsys.pids_rooted_in(root)


def _teardown(b: EmulatedBoard, paths: Paths, state: JSONObject | None, *, log: Log) -> None:
    """Stop every process of the board, unmount, remove the network; quiet for what is already gone.

    The rootfs is the one the state names (the board may run from another cache); processes are those
    chrooted into it and those inside the board's namespace, all started by `up`.
    """
    root = Path(state["rootfs"]) if state and state.get("rootfs") else paths.rootfs
    pids = set(hostsys.pids_rooted_in(root)) if root.exists() else set()
    if netns.exists(b.link):
        proc = hostsys.run(["ip", "netns", "pids", b.link.namespace], step="ip netns pids", check=False)
        pids |= {int(p) for p in proc.stdout.split() if p.isdigit()}
    if pids:
        hostsys.stop_pids(sorted(pids))
    if root.exists():
        rootfs.unmount_system(root, list((state or {}).get("mounts") or []), log=paths.log)
    netns.destroy(b.link, log=paths.log)
    if state is not None:
        paths.state.unlink(missing_ok=True)
        log(f"{b.device} is down")


# ---- the device entry (a drop-in of the user devices file, read by devices/profiles.py) ------------


@dataclass(frozen=True)
class DeviceEntry:
    """What the SSH transport needs to reach the board; field names are DeviceProfile's."""

    name: str
    host: str
    port: int
    user: str
    identity: str
    known_hosts: str
    python: str
    arch: str
    cpu: str
    cores: int
    extends: str
    description: str
    transport: str = "ssh"
    emulated: bool = True

    def fields(self) -> JSONObject:
        return {k: v for k, v in asdict(self).items() if k != "name"}


def write_entry(entry: DeviceEntry) -> Path:
    """``$XDG_CONFIG_HOME/quarl-edge/devices.d/<name>.toml``; a hand-written table in devices.toml still wins."""
    return profiles.write_device_entry(
        entry.name,
        entry.fields(),
        comment=f"written by `quarl-edge devices emulate` at every `up`; edits here are lost\n{entry.description}",
    )


# ---- small helpers ------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(paths: Paths, log: Log) -> Iterator[None]:
    """The board's host-wide lock; waits (with one message) while another `up`/`down` holds it."""
    paths.lock.parent.mkdir(parents=True, exist_ok=True)
    with paths.lock.open("w") as f:
        deadline = time.monotonic() + _LOCK_WAIT
        told = False
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise InputError(
                        f"another quarl-edge has held {paths.lock} for {_LOCK_WAIT:.0f} s",
                        "wait for it, or stop it",
                    ) from None
                if not told:
                    log(
                        f"waiting for another quarl-edge to finish building or starting the board ({paths.lock})"
                    )
                    told = True
                time.sleep(1)
        yield


def _read_json(path: Path) -> JSONObject | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
