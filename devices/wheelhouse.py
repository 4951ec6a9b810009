"""Offline installs for boards: download the device's wheels on the host, install them there without a network.

Boards often have no internet (and pip inside a qemu chroot cannot verify TLS), so the host downloads
binary wheels for the device's platform (``pip download --only-binary=:all: --platform ...``) into a
wheelhouse folder; the device then installs them with ``pip install --no-index``. The emulated Pi 4
build and ``quarl-edge devices setup`` share this code and the exact same remote commands.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from quarl_edge.runtimes.errors import InputError, MissingDependencyError
from quarl_edge.runtimes.fsutil import atomic_directory, atomic_write_json

# What the device runner imports (runtimes/: numpy, a runtime per model format, gymnasium for closed-loop
# episodes): onnxruntime for .onnx, LiteRT for .tflite.
RUNTIME_PACKAGES: tuple[str, ...] = ("numpy", "onnxruntime", "gymnasium", "ai-edge-litert")
# Left out of a device's wheelhouse (and said so in its pins) when no version has a wheel for the device's
# platform: the board then runs the ONNX models only, instead of getting no venv at all.
OPTIONAL_PACKAGES: frozenset[str] = frozenset({"ai-edge-litert"})
# Where `setup` puts things on a device, relative to the login directory unless absolute (the built-in
# profiles' `python = "~/.local/share/quarl-edge/venv/bin/python"` and `cache_dir = "~/.cache/quarl-edge"`).
DEVICE_VENV = ".local/share/quarl-edge/venv"
DEVICE_WHEELS = ".cache/quarl-edge/wheels"
_GLIBC = re.compile(r"^\d+\.\d+$")


@dataclass(frozen=True)
class WheelhouseSpec:
    """The device platform the wheels are for, and what to install."""

    arch: str = "aarch64"
    """Machine as `uname -m` prints it (aarch64, armv7l, x86_64)."""
    python_version: str = "3.11"
    """The device's python3 (Debian bookworm ships 3.11)."""
    glibc: str = "2.36"
    """The device's glibc; manylinux wheels up to this version are accepted (bookworm: 2.36)."""
    packages: tuple[str, ...] = field(default=RUNTIME_PACKAGES)
    """Requirements as pip reads them (names, optionally with version specifiers)."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"3\.\d+", self.python_version):
            raise InputError(f"python version {self.python_version!r} is not like 3.11", "pass e.g. 3.11")
        if not _GLIBC.fullmatch(self.glibc):
            raise InputError(f"glibc version {self.glibc!r} is not like 2.36", "pass e.g. 2.36")
        if not re.fullmatch(r"[a-z0-9_]+", self.arch):
            raise InputError(f"architecture {self.arch!r} is not a machine name", "use e.g. aarch64")
        for p in self.packages:
            if not p or p.startswith("-"):
                raise InputError(f"package {p!r} is not a requirement", "pass a name like onnxruntime")

    def platform_tags(self) -> list[str]:
        """Every manylinux tag a device with this glibc accepts (pip does not expand manylinux_2_X)."""
        major, minor = (int(x) for x in self.glibc.split("."))
        tags = [f"manylinux_{major}_{m}_{self.arch}" for m in range(minor, 16, -1)]
        if (major, minor) >= (2, 17):
            tags.append(f"manylinux2014_{self.arch}")
        return tags

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def host_pinned(packages: tuple[str, ...]) -> tuple[str, ...]:
    """Pin each package to the host's installed version: drift then measures ARM kernels, not versions."""
    from importlib import metadata

    out = []
    for p in packages:
        try:
            out.append(f"{p}=={metadata.version(p)}")
        except metadata.PackageNotFoundError:
            out.append(p)
    return tuple(out)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "quarl-edge"


def default_dir(spec: WheelhouseSpec) -> Path:
    py = spec.python_version.replace(".", "")
    return cache_dir() / "wheelhouse" / f"{spec.arch}-cp{py}-{spec.key()}"


def _platform_args(spec: WheelhouseSpec) -> list[str]:
    py = spec.python_version.replace(".", "")
    args = ["--only-binary=:all:"]
    for tag in spec.platform_tags():
        args += ["--platform", tag]
    return [*args, "--python-version", spec.python_version, "--implementation", "cp", "--abi", f"cp{py}"]


def download_command(spec: WheelhouseSpec, dest: Path) -> list[str]:
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", *_platform_args(spec)]
    return [*cmd, "--dest", str(dest), *spec.packages]


# ---- pinning for the device's platform --------------------------------------------------------------


@dataclass(frozen=True)
class Pin:
    """How one requested package was pinned for the device (kept in wheelhouse.json and the board's stamp)."""

    name: str
    version: str | None
    """installed on the device; None: left out (optional, no wheel for the platform)"""
    host: str | None
    """the host's installed version, if any"""
    reason: str


def canonical(name: str) -> str:
    """PEP 503 normalized project name (ai_edge_litert, AI-Edge-LiteRT -> ai-edge-litert)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement.strip(), maxsplit=1)[0]


def _host_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def dry_run_command(spec: WheelhouseSpec, requirements: list[str], target: Path, report: Path,
                    *, deps: bool = True) -> list[str]:  # fmt: skip
    """pip's resolver for the device's platform, without downloading the wheels (``--dry-run --report``)."""
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    cmd += ["--disable-pip-version-check", *_platform_args(spec), "--target", str(target)]
    cmd += ["--report", str(report), *([] if deps else ["--no-deps"])]
    return [*cmd, "--", *requirements]


def _dry_run(spec: WheelhouseSpec, requirements: list[str], *, deps: bool = True) -> dict[str, str] | str:
    """{canonical name: version} pip would install on the device, or pip's first error line."""
    with tempfile.TemporaryDirectory(prefix="qe-pins-") as tmp:
        report = Path(tmp) / "report.json"
        cmd = dry_run_command(spec, requirements, Path(tmp) / "target", report, deps=deps)
        proc = subprocess.run(cmd, capture_output=True, text=True)
        errors = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("ERROR")]
        if proc.returncode != 0 or not report.is_file():
            return (errors or proc.stderr.strip().splitlines() or [f"pip exit code {proc.returncode}"])[0]
        data = json.loads(report.read_text())
    return {canonical(i["metadata"]["name"]): str(i["metadata"]["version"]) for i in data.get("install", [])}


def platform_pinned(
    spec: WheelhouseSpec,
    *,
    optional: frozenset[str] = OPTIONAL_PACKAGES,
    host_versions: dict[str, str | None] | None = None,
    refresh: bool = False,
) -> tuple[WheelhouseSpec, list[Pin]]:
    """``spec`` with every package pinned to the version the device gets, and why.

    The host's installed version when it has a wheel for the device's platform (drift then measures the
    device's kernels, not a version change); else the newest version that has one and resolves together
    with the other pins; a package in ``optional`` with no wheel at all is left out. A requirement that
    already has a specifier is resolved as given. pip decides, for the device's platform tags
    (``pip install --dry-run --report``, no wheel downloaded). The answer is cached per platform,
    requirements and host versions, so a cached board starts without the network. ``host_versions``:
    the versions to prefer (default: those installed in this Python).
    """
    names = [requirement_name(r) for r in spec.packages]
    host = {n: (host_versions or {}).get(n) if host_versions is not None else _host_version(n) for n in names}
    cache = _pins_cache(spec, host, optional)
    if not refresh and cache.is_file():
        with contextlib.suppress(ValueError, KeyError, TypeError):  # damaged: resolved again
            data = json.loads(cache.read_text())
            pins = [Pin(**p) for p in data["pins"]]
            return _pinned_spec(spec, pins), pins
    wanted = {
        n: (f"{n}=={host[n]}" if host[n] and r == n else r) for n, r in zip(names, spec.packages, strict=True)
    }
    plat = f"{spec.arch} cp{spec.python_version.replace('.', '')} (glibc {spec.glibc})"
    reasons: dict[str, str] = {n: "host version" if wanted[n] != r else "as requested" for n, r in zip(names, spec.packages, strict=True)}  # fmt: skip
    resolved = _dry_run(spec, list(wanted.values()))
    if isinstance(resolved, str):
        for n in names:  # which host pins have no wheel for the device (each alone, without dependencies)
            if wanted[n] == f"{n}=={host[n]}" and isinstance(_dry_run(spec, [wanted[n]], deps=False), str):
                wanted[n] = n
                reasons[n] = f"the host's {host[n]} has no wheel for {plat}; newest with one"
        for n in names:  # a package no version of which installs there
            if canonical(n) in {canonical(o) for o in optional} and isinstance(_dry_run(spec, [wanted[n]], deps=False), str):  # fmt: skip
                del wanted[n]
                reasons[n] = f"left out: no version has a wheel for {plat}"
        resolved = _dry_run(spec, list(wanted.values()))
        if isinstance(resolved, str):
            raise MissingDependencyError(
                f"no set of {spec.arch} wheels for Python {spec.python_version} fits {' '.join(wanted.values())} ({resolved})",
                "check the host's network or package index, or pass --wheelhouse DIR with the wheels",
            )
    pins = [Pin(n, resolved.get(canonical(n)) if n in wanted else None, host[n], reasons[n]) for n in names]
    cache.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(
        cache, {"schema": 1, "spec": asdict(spec), "host": host, "pins": [asdict(p) for p in pins]}
    )
    return _pinned_spec(spec, pins), pins


def _pinned_spec(spec: WheelhouseSpec, pins: list[Pin]) -> WheelhouseSpec:
    packages = tuple(f"{p.name}=={p.version}" for p in pins if p.version)
    return WheelhouseSpec(
        arch=spec.arch, python_version=spec.python_version, glibc=spec.glibc, packages=packages
    )


def _pins_cache(spec: WheelhouseSpec, host: dict[str, str | None], optional: frozenset[str]) -> Path:
    blob = json.dumps({"spec": asdict(spec), "host": host, "optional": sorted(optional)}, sort_keys=True)
    return cache_dir() / "wheelhouse" / f"pins-{hashlib.sha256(blob.encode()).hexdigest()[:16]}.json"


def wheel_versions(wheels: list[Path] | list[str]) -> dict[str, str]:
    """{canonical project name: version} from wheel file names (what a wheelhouse installs)."""
    out = {}
    for w in wheels:
        m = _WHEEL.fullmatch(Path(w).name)
        if m:
            out[canonical(m.group(1))] = m.group(2)
    return out


def download(
    spec: WheelhouseSpec, dest: Path | None = None, *, refresh: bool = False, pins: list[Pin] | None = None
) -> list[Path]:
    """The wheel files for ``spec`` in ``dest`` (default: a cache folder per spec), downloading once.

    A ``wheelhouse.json`` written last records the spec, the files, every project's version and how the
    requested ones were pinned (``pins``, from :func:`platform_pinned`): a folder without it (an
    interrupted download) is downloaded again.
    """
    dest = dest or default_dir(spec)
    manifest = dest / "wheelhouse.json"
    if not refresh and manifest.is_file():
        try:
            data = json.loads(manifest.read_text())
            files = [dest / n for n in data["wheels"]]
            if data.get("key") == spec.key() and files and all(f.is_file() for f in files):
                return files
        except (ValueError, KeyError, TypeError):
            pass
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_directory(dest) as tmp:
        proc = subprocess.run(download_command(spec, tmp), capture_output=True, text=True)
        if proc.returncode != 0:
            tail = " ".join(proc.stderr.strip().splitlines()[-2:])
            raise MissingDependencyError(
                f"pip could not download {spec.arch} wheels for Python {spec.python_version} ({tail})",
                "check the host's network or package index, or pass --wheelhouse DIR with the wheels",
            )
        names = sorted(p.name for p in tmp.glob("*.whl"))
        _write_manifest(tmp / "wheelhouse.json", spec, names, pins)
    return [dest / n for n in names]


def resolve(spec: WheelhouseSpec, folder: Path | None = None, *, download_missing: bool = True) -> list[Path]:
    """The wheels to install: those already in ``folder`` (``--wheelhouse``, e.g. carried to an offline
    host), else downloaded into ``folder`` or into the cache (``download_missing=False``: else none)."""
    if folder is not None:
        if folder.exists() and not folder.is_dir():
            raise InputError(f"wheelhouse {str(folder)!r} is not a folder", "pass a folder of .whl files")
        wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
        if wheels:
            return wheels
    return download(spec, folder) if download_missing else []


_TAGS = re.compile(r"^[^-]+-[^-]+(?:-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")
_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


def wheel_fits(name: str, spec: WheelhouseSpec) -> str | None:
    """None when the wheel file ``name`` installs on ``spec``'s platform, else why not (a phrase)."""
    m = _TAGS.fullmatch(name)
    if not m:
        return "is not a wheel file name"
    major, minor = (int(x) for x in spec.python_version.split("."))
    glibc = tuple(int(x) for x in spec.glibc.split("."))
    pys, abis = m["py"].split("."), m["abi"].split(".")
    abi3 = "abi3" in abis and any(
        t.startswith("cp3") and t[3:].isdigit() and int(t[3:]) <= minor for t in pys
    )
    if not (abi3 or any(t in (f"cp{major}{minor}", f"py{major}{minor}", f"py{major}") for t in pys)):
        return f"is for {m['py']}, the board has Python {spec.python_version}"

    def fits(plat: str) -> bool:
        if plat == "any" or plat == f"linux_{spec.arch}":
            return True
        head, _, rest = plat.partition(f"_{spec.arch}")
        if rest or not plat.endswith(f"_{spec.arch}"):
            return False
        if head in _LEGACY:
            return _LEGACY[head] <= glibc
        v = re.fullmatch(r"manylinux_(\d+)_(\d+)", head)
        return v is not None and (int(v[1]), int(v[2])) <= glibc

    if not any(fits(t) for t in m["plat"].split(".")):
        return f"is for {m['plat']}, the board is {spec.arch} with glibc {spec.glibc}"
    return None


def for_platform(wheels: list[Path], spec: WheelhouseSpec, required: tuple[str, ...], fix: str) -> list[Path]:
    """The wheels of a carried wheelhouse that install on ``spec``'s platform (a folder may hold several
    boards' wheels); refused in one line when a ``required`` package has none, or two versions fit."""
    fit: list[Path] = []
    why: dict[str, str] = {}
    for w in wheels:
        reason = wheel_fits(w.name, spec)
        if reason is None:
            fit.append(w)
        else:
            why.setdefault(canonical(w.name.split("-", 1)[0]), f"{w.name} {reason}")
    have: dict[str, str] = {}
    for w in fit:
        n, v = next(iter(wheel_versions([w]).items()), (canonical(w.name.split("-", 1)[0]), "?"))
        if n in have and have[n] != v:
            raise InputError(
                f"the wheelhouse holds {n} {have[n]} and {v}, both for this board", "keep one of them"
            )
        have[n] = v
    for r in required:
        n = canonical(requirement_name(r))
        if n not in have:
            found = f" ({why[n]})" if n in why else ""
            raise InputError(
                f"the wheelhouse has no {n} wheel for {spec.arch} Python {spec.python_version}{found}", fix
            )
    return fit


def _write_manifest(path: Path, spec: WheelhouseSpec, names: list[str], pins: list[Pin] | None) -> None:
    data = {
        "schema": 1,
        "key": spec.key(),
        "spec": asdict(spec),
        "wheels": names,
        "versions": wheel_versions(names),
        "pins": [asdict(p) for p in pins] if pins is not None else None,
    }
    atomic_write_json(path, data)


def content_hash(wheels: list[Path]) -> str:
    """Names and sizes of the wheels: what decides whether an installed venv is stale."""
    h = hashlib.sha256()
    for w in sorted(wheels, key=lambda p: p.name):
        h.update(f"{w.name}:{w.stat().st_size}\n".encode())
    return h.hexdigest()[:16]


def setup_commands(
    python: str,
    wheel_names: list[str],
    *,
    venv: str = DEVICE_VENV,
    wheel_dir: str = DEVICE_WHEELS,
    packages: tuple[str, ...] = RUNTIME_PACKAGES,
) -> list[str]:
    """Shell commands (each one line, every argument quoted) that build the device venv from uploaded wheels.

    ``python`` is the device's system interpreter (``python3``); the wheels are expected in
    ``wheel_dir``. Relative paths are relative to the login directory (the SSH default).
    The imports of ``packages`` are then proven in the new venv, and the uploaded wheels removed.
    """
    if not wheel_names:
        raise InputError("no wheels to install", "download a wheelhouse first")
    # Exact name==version pins from the file names: pip then takes exactly these files from the folder
    # (a file path argument would be parsed as a requirement, and `;` in a path as a marker).
    pins = [_pin(n) for n in wheel_names]
    q = shlex.quote
    vpy = f"{venv}/bin/python"
    modules = ", ".join(_module_name(p) for p in packages)
    return [
        f"mkdir -p {q(wheel_dir)}",
        f"{q(python)} -m venv --clear {q(venv)}",
        " ".join(
            [q(vpy), "-m", "pip", "install", "--no-index", "--no-cache-dir", "--disable-pip-version-check"]
            + ["--find-links", q(wheel_dir), *(q(p) for p in pins)]
        ),
        # the import proof loads onnxruntime without quarl_edge: its telemetry files must be turned off here
        f"ORT_DISABLE_TELEMETRY=1 {q(vpy)} -c {q(f'import {modules}')}",
        f"rm -rf -- {q(wheel_dir)}",  # installed: the wheels would only take the board's SD card
    ]


_WHEEL = re.compile(r"^([A-Za-z0-9_.]+)-([A-Za-z0-9_.!+]+)(-\d[^-]*)?-[^-/]+-[^-/]+-[^-/]+\.whl$")


def _pin(wheel_name: str) -> str:
    m = _WHEEL.fullmatch(wheel_name)
    if not m:
        raise InputError(f"{wheel_name!r} is not a wheel file name", "pass bare *.whl names")
    return f"{m.group(1)}=={m.group(2)}"


def _module_name(requirement: str) -> str:
    name = requirement_name(requirement)
    # distributions whose import name is not their name with '_' for '-'
    known = {"opencv-python-headless": "cv2", "opencv-python": "cv2", "box2d": "Box2D", "dm-control": "dm_control",
             "gymnasium-robotics": "gymnasium_robotics", "pyyaml": "yaml", "pillow": "PIL"}  # fmt: skip
    return known.get(name.lower(), name.replace("-", "_"))
