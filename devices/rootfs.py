"""The emulated board's root filesystem: an arm64 Debian built with debootstrap and run by qemu-user.

Build: ``debootstrap --arch=arm64 --foreign`` downloads and unpacks on the host, the second stage runs
the arm64 maintainer scripts through qemu-user (binfmt), then the runtime wheels, downloaded on the host,
are installed offline into a venv with the same commands ``quarl-edge devices setup`` runs on a board.
The Debian mirror comes from the host's apt configuration unless given.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from quarl_edge.devices import hostsys
from quarl_edge.devices.wheelhouse import RUNTIME_PACKAGES, setup_commands
from quarl_edge.runtimes.errors import InputError

APT_SOURCES_LIST = Path("/etc/apt/sources.list")
APT_SOURCES_DIR = Path("/etc/apt/sources.list.d")
DEVICE_VENV = "/opt/quarl-edge/venv"
_DEVICE_WHEELS = "/opt/quarl-edge/wheels"
CHROOT_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LC_ALL": "C",
    "LANG": "C",
    "DEBIAN_FRONTEND": "noninteractive",
    "HOME": "/root",
}


@dataclass(frozen=True)
class RootfsRecipe:
    """What goes into the base rootfs; its hash decides when a cached rootfs is rebuilt."""

    suite: str = "bookworm"
    """Debian release (bookworm ships Python 3.11)."""
    debian_arch: str = "arm64"
    """Debian's name for the architecture."""
    variant: str = "minbase"
    """debootstrap variant: essential packages and apt only."""
    packages: tuple[str, ...] = (
        "python3",
        "python3-venv",
        "openssh-server",
        "gcc",
        "g++",
        "libc6-dev",
        "make",
        "cmake",
    )
    """Added to the base system (the runner's python, the venv module, sshd + sftp-server for scp) and the C
    toolchain a Raspberry Pi OS has (the ``c`` runtime's gcc; cmake, make and g++ for ``deploy --emit c``
    folders). debootstrap resolves Depends only, never Recommends: libc6-dev (gcc only recommends it) is
    named, the rest of what a Pi OS image adds is not."""
    revision: int = 1
    """Bump when the build steps change in a way the fields above do not show."""

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


# ---- mirror from the host's apt configuration ----------------------------------------------------


@dataclass(frozen=True)
class AptSource:
    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...] = ()
    types: tuple[str, ...] = ("deb",)
    origin: str = ""
    options: dict[str, str] = field(default_factory=dict, compare=False)


def parse_one_line(text: str, origin: str = "") -> list[AptSource]:
    """``deb [opt=val ...] URI SUITE [COMPONENT...]`` lines (sources.list and *.list)."""
    out = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        kind, _, rest = line.partition(" ")
        if kind not in ("deb", "deb-src"):
            continue
        options: dict[str, str] = {}
        rest = rest.strip()
        if rest.startswith("["):
            opts, _, rest = rest[1:].partition("]")
            for o in opts.split():
                k, _, v = o.partition("=")
                options[k] = v
        parts = rest.split()
        if len(parts) >= 2:
            out.append(AptSource(parts[0], (parts[1],), tuple(parts[2:]), (kind,), origin, options))
    return out


def parse_deb822(text: str, origin: str = "") -> list[AptSource]:
    """deb822 stanzas (``*.sources``): ``Types:``, ``URIs:``, ``Suites:``, ``Components:``, ``Enabled:``."""
    out = []
    stanzas: list[dict[str, str]] = [{}]
    key = ""
    for raw in text.splitlines():
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if stanzas[-1]:
                stanzas.append({})
            continue
        if raw[0] in " \t" and key:  # continuation of a multi-line field
            stanzas[-1][key] += " " + raw.strip()
            continue
        key, _, value = raw.partition(":")
        key = key.strip().lower()
        stanzas[-1][key] = value.strip()
    for st in stanzas:
        if not st.get("uris") or st.get("enabled", "yes").lower() == "no":
            continue
        types = tuple(st.get("types", "deb").split())
        for uri in st["uris"].split():
            out.append(
                AptSource(
                    uri,
                    tuple(st.get("suites", "").split()),
                    tuple(st.get("components", "").split()),
                    types,
                    origin,
                )
            )
    return out


def host_sources(
    sources_list: Path = APT_SOURCES_LIST, sources_dir: Path = APT_SOURCES_DIR
) -> list[AptSource]:
    found: list[AptSource] = []
    if sources_list.is_file():
        found += parse_one_line(sources_list.read_text(errors="replace"), str(sources_list))
    if sources_dir.is_dir():
        for p in sorted(sources_dir.iterdir()):
            if p.suffix == ".list":
                found += parse_one_line(p.read_text(errors="replace"), str(p))
            elif p.suffix == ".sources":
                found += parse_deb822(p.read_text(errors="replace"), str(p))
    return found


def pick_mirror(sources: list[AptSource], suite: str = "bookworm") -> str:
    """The host's Debian archive: a ``deb`` source for ``suite`` itself, else one whose path ends in /debian."""
    usable = [
        s for s in sources if "deb" in s.types and s.uri.split(":", 1)[0] in ("http", "https", "file", "ftp")
    ]
    for s in usable:
        if suite in s.suites:
            return s.uri.rstrip("/")
    for s in usable:
        if s.uri.rstrip("/").endswith("/debian"):
            return s.uri.rstrip("/")
    raise InputError(
        f"no Debian mirror for {suite!r} in the host's apt configuration ({APT_SOURCES_LIST}, {APT_SOURCES_DIR}/)",
        "pass one with --mirror, e.g. --mirror http://deb.debian.org/debian",
    )


def host_mirror(suite: str = "bookworm") -> str:
    return pick_mirror(host_sources(), suite)


def check_mirror(mirror: str) -> str:
    scheme = mirror.split(":", 1)[0]
    if scheme not in ("http", "https", "file", "ftp") or any(c.isspace() for c in mirror):
        raise InputError(
            f"mirror {mirror!r} is not an http(s)/ftp/file URL", "pass e.g. http://deb.debian.org/debian"
        )
    return mirror.rstrip("/")


# ---- /proc/cpuinfo of a Raspberry Pi 4 ----------------------------------------------------------


def pi4_cpuinfo(cores: int = 4) -> str:
    """A Pi 4 (BCM2711, 4x Cortex-A72 r0p3) /proc/cpuinfo in the arm64 kernel's format.

    qemu-user shows the host's x86 /proc/cpuinfo; onnxruntime's CPU detection finds no ARM core in it
    and crashes, so this file is bind-mounted over the chroot's /proc/cpuinfo.
    """
    core = (
        "processor\t: {i}\n"
        "BogoMIPS\t: 108.00\n"
        "Features\t: fp asimd evtstrm crc32 cpuid\n"
        "CPU implementer\t: 0x41\n"
        "CPU architecture: 8\n"
        "CPU variant\t: 0x0\n"
        "CPU part\t: 0xd08\n"
        "CPU revision\t: 3\n\n"
    )
    board = (
        "Hardware\t: BCM2711\n"
        "Revision\t: c03114\n"
        "Serial\t\t: 10000000e5a1c0de\n"
        "Model\t\t: Raspberry Pi 4 Model B Rev 1.4 (emulated: qemu-aarch64, Cortex-A72)\n"
    )
    return "".join(core.format(i=i) for i in range(cores)) + board


# ---- build --------------------------------------------------------------------------------------


def chroot(rootfs: Path, argv: list[str], *, log: Path, step: str, timeout: float | None = None) -> None:
    hostsys.run(["chroot", str(rootfs), *argv], log=log, step=step, timeout=timeout, env=CHROOT_ENV)


def build_base(recipe: RootfsRecipe, rootfs: Path, mirror: str, *, log: Path) -> None:
    """debootstrap both stages into ``rootfs`` (built beside it, renamed into place when complete)."""
    partial = rootfs.with_name(rootfs.name + ".partial")
    hostsys.remove_tree(partial, log=log)
    hostsys.remove_tree(rootfs, log=log)
    interpreter, flags = hostsys.ensure_binfmt("aarch64", log=log)
    hostsys.run(
        [
            "debootstrap",
            f"--arch={recipe.debian_arch}",
            "--foreign",
            f"--variant={recipe.variant}",
            f"--include={','.join(recipe.packages)}",
            recipe.suite,
            str(partial),
            mirror,
        ],
        log=log,
        step="debootstrap (first stage)",
        timeout=1800,
    )
    # Maintainer scripts must not start services: an sshd started now would listen in the host's network.
    policy = partial / "usr/sbin/policy-rc.d"
    policy.write_text("#!/bin/sh\nexit 101\n")
    policy.chmod(0o755)
    if "F" not in flags:  # the kernel opens the interpreter by path inside the chroot
        target = partial / str(interpreter).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(interpreter, target)
    try:
        chroot(
            partial,
            ["/debootstrap/debootstrap", "--second-stage"],
            log=log,
            step="debootstrap (second stage)",
            timeout=3600,
        )
        chroot(partial, ["apt-get", "clean"], log=log, step="apt-get clean")
    finally:
        hostsys.stop_pids(hostsys.pids_rooted_in(partial))
        hostsys.unmount_all_under(partial, log=log)
    for p in (partial / "var/lib/apt/lists").glob("*_*"):
        p.unlink()
    # sshd's host keys are generated per board at `up`, never shared between builds
    for key in (partial / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    partial.rename(rootfs)


def install_venv(
    rootfs: Path,
    wheels: list[Path],
    cpuinfo: Path,
    *,
    packages: tuple[str, ...] = RUNTIME_PACKAGES,
    log: Path,
) -> str:
    """Install ``wheels`` offline into a venv inside the rootfs and import ``packages`` there (under qemu);
    returns the venv's python path (device view)."""
    wheel_dir = rootfs / _DEVICE_WHEELS.lstrip("/")
    hostsys.remove_tree(wheel_dir, log=log)
    wheel_dir.mkdir(parents=True)
    for w in wheels:
        shutil.copy2(w, wheel_dir / w.name)
    commands = setup_commands(
        "/usr/bin/python3",
        [w.name for w in wheels],
        venv=DEVICE_VENV,
        wheel_dir=_DEVICE_WHEELS,
        packages=packages,
    )
    mounts = mount_system(rootfs, cpuinfo, log=log)
    try:
        for cmd in commands:
            chroot(rootfs, ["/bin/sh", "-c", cmd], log=log, step=f"in the rootfs: {cmd[:60]}", timeout=1800)
    finally:
        hostsys.stop_pids(hostsys.pids_rooted_in(rootfs))
        unmount_system(rootfs, mounts, log=log)
    hostsys.remove_tree(wheel_dir, log=log)
    return f"{DEVICE_VENV}/bin/python"


def mount_system(rootfs: Path, cpuinfo: Path, *, log: Path) -> list[str]:
    """proc (with the Pi 4 cpuinfo over it), sys, dev, dev/pts, dev/shm; returns the mount points in order."""
    done: list[Path] = []
    try:
        done.append(hostsys.mount(["-t", "proc", "proc"], rootfs / "proc", log=log))
        done.append(hostsys.mount(["--bind", str(cpuinfo)], rootfs / "proc/cpuinfo", log=log))
        done.append(hostsys.mount(["-t", "sysfs", "sysfs"], rootfs / "sys", log=log))
        done.append(hostsys.mount(["--bind", "/dev"], rootfs / "dev", log=log))
        done.append(hostsys.mount(["--bind", "/dev/pts"], rootfs / "dev/pts", log=log))
        done.append(
            hostsys.mount(["-t", "tmpfs", "-o", "mode=1777,size=256m", "shm"], rootfs / "dev/shm", log=log)
        )
    except BaseException:
        unmount_system(rootfs, [str(p) for p in done], log=log)
        raise
    return [str(p) for p in done]


def unmount_system(rootfs: Path, mounts: list[str], *, log: Path) -> None:
    """Unmount ``mounts`` in reverse order, then anything else still mounted below the rootfs."""
    for point in reversed(mounts):
        if Path(point) in hostsys.mount_points_under(rootfs):
            hostsys.run(["umount", point], log=log, step=f"umount {point}", check=False)
    hostsys.unmount_all_under(rootfs, log=log)


def size_bytes(rootfs: Path) -> int:
    """Disk usage of the rootfs, not crossing into mounted file systems."""
    proc = hostsys.run(["du", "-sx", "--block-size=1", str(rootfs)], step="du", check=False)
    try:
        return int(proc.stdout.split()[0])
    except (IndexError, ValueError):
        return 0
