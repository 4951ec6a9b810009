"""Host-system plumbing for the emulated board: commands, host packages, binfmt, mounts, processes.

Everything here acts on paths and PIDs the emulator itself created; nothing searches for processes by
name. Root is required (debootstrap, chroot, mount, network namespaces).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from quarl_edge.runtimes.errors import InputError, MissingDependencyError, QuarlError

BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
# Tool -> Debian package that provides it (installed with apt-get when missing).
HOST_TOOLS: dict[str, str] = {
    "debootstrap": "debootstrap",
    "qemu-aarch64-static": "qemu-user-static",
    "update-binfmts": "binfmt-support",
    "ip": "iproute2",
    "tc": "iproute2",
    "ssh-keygen": "openssh-client",
    "nsenter": "util-linux",
    "chroot": "coreutils",
    "mount": "mount",
}


class EmulatorError(QuarlError):
    """A host step of the emulated board failed (the message names the step and the log to read)."""


def tool_path(name: str) -> str:
    """``name`` on PATH, or in the sbin folders a non-login root shell may lack; else ``name`` itself."""
    return shutil.which(name) or shutil.which(name, path="/usr/local/sbin:/usr/sbin:/sbin") or name


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise InputError(
            f"{what} needs root (debootstrap, chroot, mounts and network namespaces)",
            "run it as root, e.g. `sudo quarl-edge devices emulate rpi4 up`",
        )


def run(
    cmd: list[str],
    *,
    log: Path | None = None,
    step: str,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` (an argv, never a shell string); output is appended to ``log`` when given."""
    full_env = {**os.environ, **(env or {})}
    cmd = [tool_path(cmd[0]), *cmd[1:]]
    try:
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("a") as f:
                f.write(f"\n$ {' '.join(cmd)}\n")
                f.flush()
                proc = subprocess.run(
                    cmd, stdout=f, stderr=subprocess.STDOUT, text=True, timeout=timeout, env=full_env
                )
        else:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    except FileNotFoundError:
        raise MissingDependencyError(
            f"{cmd[0]} is not installed", "install it (see `quarl-edge devices emulate --help`)"
        ) from None
    except subprocess.TimeoutExpired:
        raise EmulatorError(f"{step} did not finish within {timeout:.0f} s", _log_hint(log)) from None
    if check and proc.returncode != 0:
        detail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] if log is None else []
        tail = f" ({detail[0]})" if detail else ""
        raise EmulatorError(f"{step} failed with exit code {proc.returncode}{tail}", _log_hint(log))
    return proc


def _log_hint(log: Path | None) -> str:
    return f"see {log}" if log is not None else "run with --debug for the traceback"


def ensure_tools(tools: list[str], *, log: Path | None = None) -> None:
    """Install the Debian packages of missing host tools with apt-get (as root), or say how to."""
    missing = [t for t in tools if tool_path(t) == t]
    if not missing:
        return
    packages = sorted({HOST_TOOLS.get(t, t) for t in missing})
    command = f"apt-get install -y {' '.join(packages)}"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise MissingDependencyError(f"missing host tools: {', '.join(missing)}", f"install them: {command}")
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    proc = run(["apt-get", "install", "-y", "-q", *packages], log=log, step=command, env=env, check=False)
    if proc.returncode != 0:  # stale package lists on a fresh machine
        run(["apt-get", "update", "-q"], log=log, step="apt-get update", env=env)
        run(["apt-get", "install", "-y", "-q", *packages], log=log, step=command, env=env)
    still = [t for t in missing if tool_path(t) == t]
    if still:
        raise MissingDependencyError(
            f"{', '.join(still)} still missing after `{command}`", "install them by hand"
        )


def ensure_binfmt(arch: str = "aarch64", *, log: Path | None = None) -> tuple[Path, str]:
    """Make the kernel run ``arch`` ELF files through qemu-user; returns (interpreter, flags)."""
    if not (BINFMT_DIR / "status").exists():
        run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT_DIR)], log=log, step="mount binfmt_misc")
    entry = BINFMT_DIR / f"qemu-{arch}"
    if not entry.is_file() or not entry.read_text().startswith("enabled"):
        run(
            ["update-binfmts", "--enable", f"qemu-{arch}"],
            log=log,
            step=f"update-binfmts --enable qemu-{arch}",
        )
    if not entry.is_file():
        raise MissingDependencyError(
            f"the kernel has no binfmt handler for {arch}", "install qemu-user-static and binfmt-support"
        )
    fields = dict(line.split(" ", 1) for line in entry.read_text().splitlines()[1:] if " " in line)
    return Path(fields.get("interpreter", f"/usr/bin/qemu-{arch}-static")), fields.get("flags:", "").strip()


# ---- mounts -------------------------------------------------------------------------------------


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) + 1 and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mount_points_under(root: Path) -> list[Path]:
    """Mount points at or below ``root`` in this mount namespace, in mount order."""
    root = root.resolve()
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = Path(_unescape(line.split()[4]))
            if point == root or root in point.parents:
                found.append(point)
    return found


def mount(args: list[str], target: Path, *, log: Path | None = None) -> Path:
    run(["mount", *args, str(target)], log=log, step=f"mount {' '.join(args)} {target}")
    return target


def unmount_all_under(root: Path, *, log: Path | None = None) -> None:
    """Unmount everything at or below ``root``, deepest and newest first; raise if anything stays."""
    for _ in range(3):
        points = mount_points_under(root)
        if not points:
            return
        for point in sorted(reversed(points), key=lambda p: len(p.parts), reverse=True):
            proc = run(["umount", str(point)], log=log, step=f"umount {point}", check=False)
            if proc.returncode != 0:  # still busy: detach now, the kernel frees it when the last user goes
                run(["umount", "-l", str(point)], log=log, step=f"umount -l {point}", check=False)
    left = mount_points_under(root)
    if left:
        raise EmulatorError(f"could not unmount {', '.join(map(str, left))}", _log_hint(log))


def remove_tree(path: Path, *, log: Path | None = None) -> None:
    """Delete a rootfs folder, refusing while anything is mounted inside (a bind of /dev would go too)."""
    if not path.exists():
        return
    unmount_all_under(path, log=log)
    run(["rm", "-rf", "--one-file-system", str(path)], log=log, step=f"remove {path}")


# ---- processes ----------------------------------------------------------------------------------


def pid_alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):  # our own child: reap it if it has exited
        os.waitpid(pid, os.WNOHANG)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is dead for our purposes
    with contextlib.suppress(OSError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
    return True


def pids_rooted_in(root: Path) -> list[int]:
    """PIDs whose root directory is ``root`` (processes chrooted into the emulated board)."""
    root = root.resolve()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if Path(os.readlink(entry / "root")) == root:
                pids.append(int(entry.name))
    return pids


def stop_pids(pids: list[int], *, grace: float = 5.0) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL what is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = [p for p in pids if pid_alive(p)]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        deadline = time.monotonic() + grace
        while live and time.monotonic() < deadline:
            time.sleep(0.05)
            live = [p for p in live if pid_alive(p)]
        if not live:
            return
    if any(pid_alive(p) for p in pids):
        raise EmulatorError(f"processes {pids} did not stop", "stop them by PID and run `down` again")
