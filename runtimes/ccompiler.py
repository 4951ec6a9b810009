"""The C compiler that turns a generated policy into a shared object: which one, with which flags, and
the build itself (cached by content, in a folder of ours).

Found in this order: ``$QUARL_EDGE_CC`` (a command; ``none`` never compiles, so only a prebuilt object
can run the model), ``$CC``, ``cc``, ``gcc``, ``clang`` on PATH, then ``python -m ziglang cc`` when the
``ziglang`` package is installed (a whole C toolchain from pip, also for boards without apt). Flags:
``-O3 -std=c99 -ffp-contract=fast``, plus the CPU's int8 features where the compiler is told them:
``-march=armv8.2-a+dotprod`` only where the CPU has the dot product (``asimddp``), AVX-512 VNNI /
AVX2 levels on x86 (docs/c.md).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError, MissingDependencyError

CC_ENV = "QUARL_EDGE_CC"
CACHE_ENV = "QUARL_EDGE_C_CACHE"
BASE_FLAGS = ("-O3", "-std=c99", "-ffp-contract=fast", "-fPIC", "-shared")
BUILD_TIMEOUT_S = 600.0
"""a Pi 3 compiling a 400x300 layer under load, or zig building its libc stubs the first time"""
INSTALL = (
    "install a C compiler (Debian/Raspberry Pi OS: sudo apt-get install gcc; or pip install ziglang, which "
    "`quarl-edge devices setup DEVICE --package ziglang` does on a board), or export with --c-prebuilt ARCH "
    "to ship an object cross-compiled on the host"
)
ZIG_TARGETS = {"aarch64": "aarch64-linux-gnu", "x86_64": "x86_64-linux-gnu", "armv7l": "arm-linux-gnueabihf"}
APT_CROSS = {
    "aarch64": "gcc-aarch64-linux-gnu",
    "x86_64": "gcc-x86-64-linux-gnu",
    "armv7l": "gcc-arm-linux-gnueabihf",
}
CROSS_GCC = {
    "aarch64": "aarch64-linux-gnu-gcc",
    "x86_64": "x86_64-linux-gnu-gcc",
    "armv7l": "arm-linux-gnueabihf-gcc",
}


@dataclass(frozen=True)
class Compiler:
    command: tuple[str, ...]
    kind: str
    """gcc, clang or zig (zig spells CPU features its own way)"""
    version: str
    target: str | None = None
    """the architecture it builds for when it is not this machine's (a cross compiler)"""

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.version}"

    def flags(self, machine: str, features: dict[str, bool] | None) -> tuple[str, ...]:
        """The CPU flags for ``machine`` with ``features`` (runtimes/facts.py names)."""
        f = features or {}
        m = machine.lower()
        if m in ("aarch64", "arm64"):
            ext = [x for x, have in (("dotprod", f.get("asimddp")), ("i8mm", f.get("i8mm"))) if have]
            if self.kind == "zig":
                return ("-mcpu=generic" + "".join("+" + x for x in ext),)
            return ("-march=" + ("armv8.2-a" if ext else "armv8-a") + "".join("+" + x for x in ext),)
        if m in ("x86_64", "amd64"):
            vnni512 = f.get("avx512f") and f.get("avx512_vnni")
            level = "v4" if vnni512 else "v3" if f.get("avx2") else None
            if level is None:
                return ()
            if self.kind == "zig":
                return (
                    f"-mcpu=x86_64_{level}"
                    + ("+avx512vnni" if vnni512 else "+avxvnni" if f.get("avx_vnni") else ""),
                )
            extra = ("-mavx512vnni",) if vnni512 else ("-mavxvnni",) if f.get("avx_vnni") else ()
            return (f"-march=x86-64-{level}", *extra)
        return ()


def _version(command: list[str]) -> str | None:
    try:
        r = subprocess.run([*command, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0 or not r.stdout.strip():
        return None
    return r.stdout.strip().splitlines()[0][:120]


def _kind(first_line: str) -> str:
    low = first_line.lower()
    return "clang" if "clang" in low else "zig" if "zig" in low else "gcc"


def _short_version(line: str) -> str:
    words = [w for w in line.replace("(", " ").replace(")", " ").split() if w[:1].isdigit() and "." in w]
    return words[-1] if words else "unknown"


def zig_command() -> list[str] | None:
    import importlib.util

    try:
        found = importlib.util.find_spec("ziglang") is not None
    except (ImportError, ValueError):
        found = False
    return [sys.executable, "-m", "ziglang", "cc"] if found else None


def find_compiler() -> Compiler | None:
    """This machine's C compiler (see the module doc), or None."""
    env = os.environ.get(CC_ENV)
    if env is not None:
        if env.strip().lower() == "none":
            return None
        return _probe(shlex.split(env), f"${CC_ENV}")
    candidates: list[list[str]] = []
    if os.environ.get("CC"):
        candidates.append(shlex.split(os.environ["CC"]))
    candidates += [[c] for c in ("cc", "gcc", "clang") if shutil.which(c)]
    zig = zig_command()
    if zig:
        candidates.append(zig)
    for c in candidates:
        found = _probe(c, None)
        if found is not None:
            return found
    return None


def _probe(command: list[str], named_by: str | None) -> Compiler | None:
    if not command:
        return None
    if command[-2:] == ["ziglang", "cc"]:
        try:
            r = subprocess.run([*command[:-1], "version"], capture_output=True, text=True, timeout=60)
            version = r.stdout.strip()[:40] if r.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            version = None
        if version:
            return Compiler(tuple(command), "zig", version)
    else:
        line = _version(command)
        if line is not None:
            return Compiler(tuple(command), _kind(line), _short_version(line))
    if named_by is not None:
        raise MissingDependencyError(f"{named_by} ({' '.join(command)[:80]!r}) is not a working C compiler",
                                     f"set it to one that runs, or unset it; {INSTALL}")  # fmt: skip
    return None


def cross_compiler(arch: str) -> Compiler:
    """A compiler on this host that builds shared objects for ``arch`` (aarch64, x86_64, armv7l):
    ziglang's, else Debian's cross gcc."""
    if arch not in ZIG_TARGETS:
        raise InputError(
            f"no cross compiler for architecture {arch!r}", f"choose one of: {', '.join(ZIG_TARGETS)}"
        )
    zig = zig_command()
    if zig is not None:
        found = _probe(zig, None)
        if found is not None:
            return Compiler((*found.command, "-target", ZIG_TARGETS[arch]), "zig", found.version, arch)
    gcc = CROSS_GCC[arch]
    if shutil.which(gcc):
        found = _probe([gcc], None)
        if found is not None:
            return Compiler(found.command, found.kind, found.version, arch)
    raise MissingDependencyError(
        f"no compiler here builds for {arch}",
        f"pip install ziglang (it builds for any architecture), or apt-get install {APT_CROSS[arch]}",
    )


def cache_root() -> Path:
    """Where built objects are kept: $QUARL_EDGE_C_CACHE, else $XDG_CACHE_HOME/quarl-edge/c (default
    ~/.cache/quarl-edge/c): never inside a bundle."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "quarl-edge" / "c"


def build_key(c_text: str, h_text: str, compiler: Compiler, flags: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for part in (c_text, h_text, " ".join(compiler.command[-3:] if compiler.target else compiler.command[:1]),
                 compiler.name, " ".join(flags), compiler.target or platform.machine()):  # fmt: skip
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def compile_shared(
    c_text: str, h_text: str, header: str, compiler: Compiler, flags: tuple[str, ...], out: Path
) -> None:
    """Build ``c_text`` (including ``header``) into the shared object ``out`` (written atomically);
    InputError with the compiler's first error line when it fails."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".qe-cbuild-", dir=out.parent) as tmp:
        src = Path(tmp) / "policy.c"
        src.write_text(c_text)
        (Path(tmp) / header).write_text(h_text)
        so = Path(tmp) / "policy.so"
        cmd = [*compiler.command, *BASE_FLAGS, *flags, "-o", str(so), str(src), "-lm"]
        env = dict(os.environ)
        if compiler.kind == "zig":  # zig keeps its own build cache; ours is the object itself
            env.setdefault("ZIG_GLOBAL_CACHE_DIR", str(cache_root() / "zig"))
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, cwd=tmp, env=env)
        except subprocess.TimeoutExpired:
            raise InputError(f"{compiler.name} took over {BUILD_TIMEOUT_S:.0f} s to compile the policy",
                             "try again on an idle machine") from None  # fmt: skip
        except OSError as e:
            raise MissingDependencyError(
                f"cannot run {compiler.command[0]!r} ({e.strerror})", INSTALL
            ) from None
        if r.returncode != 0 or not so.is_file():
            first = next(
                (s for s in r.stderr.splitlines() if "error" in s.lower()),
                r.stderr.strip()[:200] or "no output",
            )
            raise InputError(f"{compiler.name} could not compile the policy: {first[:240]}",
                             f"check the compiler ({' '.join(compiler.command)[:80]}); flags {' '.join(flags) or 'none'}")  # fmt: skip
        os.chmod(so, 0o755)
        os.replace(so, out)
