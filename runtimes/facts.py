"""The device's facts, as the device sees them: CPU, its int8-relevant ISA features, governor, memory,
OS, Python, runtimes and ONNX Runtime's execution providers, and qemu-user emulation when present.

Standard library only (each runtime is imported inside a try), so ``python -m quarl_edge.runtimes info``
runs on a board that has nothing installed yet. Every reader is defensive: a missing or unreadable
file gives None, never a guess. What a device says is data: the host shows it through
``quarl_edge.text`` (here strings are only cut to a sane length).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import platform
import sys
from typing import Any

from .schema import JSONObject

MAX_TEXT = 200

# int8-relevant ISA features, by the names /proc/cpuinfo uses. ARM: asimd (NEON), asimdhp (fp16
# arithmetic), asimddp (SDOT/UDOT dot product: the int8 GEMM kernels' fast path; a Pi 4's Cortex-A72
# lacks it, a Pi 5's Cortex-A76 has it), i8mm (int8 matrix multiply), bf16. x86: avx2, avx512f,
# avx512_vnni / avx_vnni (int8 dot product), amx_tile / amx_int8 (tile matrix multiply).
ARM_FEATURES = ("asimd", "asimdhp", "asimddp", "i8mm", "bf16")
X86_FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8")
# arm64 getauxval bits (linux arch/arm64/include/uapi/asm/hwcap.h): (AT_HWCAP or AT_HWCAP2, bit)
_AT_HWCAP, _AT_HWCAP2 = 16, 26
_ARM64_HWCAPS = {"asimd": (_AT_HWCAP, 1), "asimdhp": (_AT_HWCAP, 10), "asimddp": (_AT_HWCAP, 20),
                 "i8mm": (_AT_HWCAP2, 13), "bf16": (_AT_HWCAP2, 14)}  # fmt: skip

# ARM "CPU part" ids of the cores found on Pi-class boards (/proc/cpuinfo has no model name there)
_ARM_PARTS = {"0xd03": "Cortex-A53", "0xd04": "Cortex-A35", "0xd05": "Cortex-A55", "0xd07": "Cortex-A57",
              "0xd08": "Cortex-A72", "0xd09": "Cortex-A73", "0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76",
              "0xd0c": "Neoverse-N1", "0xd41": "Cortex-A78", "0xd42": "Cortex-A78AE", "0xd4b": "Cortex-A78C"}  # fmt: skip


def _read(path: str, limit: int = 1 << 20) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError:
        return None


def _cut(text: str | None) -> str | None:
    return None if text is None else text.strip()[:MAX_TEXT] or None


def parse_cpuinfo(text: str) -> dict[str, str]:
    """The first value of each /proc/cpuinfo key (keys lower-case)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if ":" in line:
            key, value = line.split(":", 1)
            out.setdefault(key.strip().lower(), value.strip())
    return out


def cpu_model(info: dict[str, str]) -> str:
    """x86's model name, an ARM core's name from its part id, else what the kernel calls the hardware."""
    if info.get("model name"):
        return info["model name"]
    part = _ARM_PARTS.get(info.get("cpu part", "").lower())
    if part:
        return part
    return info.get("hardware") or platform.processor() or platform.machine()


def _family(machine: str) -> str | None:
    m = machine.lower()
    if m in ("aarch64", "arm64") or m.startswith("arm"):
        return "arm"
    if m in ("x86_64", "amd64", "i386", "i686"):
        return "x86"
    return None


def isa_features(info: dict[str, str], machine: str) -> dict[str, bool] | None:
    """The int8-relevant features of ``machine``'s family from a parsed cpuinfo (ARM ``Features``,
    x86 ``flags``); None when the cpuinfo lists none of that family's (it describes another CPU)."""
    family = _family(machine)
    if family is None:
        return None
    flags = set((info.get("features" if family == "arm" else "flags") or "").split())
    if family == "arm" and "neon" in flags:  # 32-bit ARM kernels call NEON neon
        flags.add("asimd")
    if not flags:
        return None
    return {f: f in flags for f in (ARM_FEATURES if family == "arm" else X86_FEATURES)}


def hwcap_features() -> dict[str, bool] | None:
    """arm64 Linux: the features the kernel (or qemu-user, emulating a CPU model) tells this process,
    from getauxval; None elsewhere."""
    if platform.machine() != "aarch64" or platform.system() != "Linux":
        return None
    try:
        getauxval = ctypes.CDLL(None).getauxval
        getauxval.restype, getauxval.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
        words = {_AT_HWCAP: int(getauxval(_AT_HWCAP)), _AT_HWCAP2: int(getauxval(_AT_HWCAP2))}
    except (OSError, AttributeError):
        return None
    if not words[_AT_HWCAP]:
        return None
    return {name: bool(words[at] >> bit & 1) for name, (at, bit) in _ARM64_HWCAPS.items()}


def emulation(machine: str, kernel_arch: str | None) -> JSONObject | None:
    """qemu-user: the kernel's own architecture (/proc/sys/kernel/arch, which qemu does not answer for
    the process as it does uname) is not the one this process runs as; ``qemu_cpu`` is the CPU model
    qemu presents (QEMU_CPU; None: qemu's default)."""
    if kernel_arch is None or _family(kernel_arch) == _family(machine):
        return None
    return {"emulator": "qemu-user", "kernel_arch": kernel_arch, "qemu_cpu": _cut(os.environ.get("QEMU_CPU"))}


def is_emulated() -> bool:
    """Whether this process runs under qemu-user (see ``emulation``)."""
    return emulation(platform.machine(), _cut(_read("/proc/sys/kernel/arch"))) is not None


def _mem_total_mb() -> float | None:
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                return round(int(parts[1]) / 1024, 1)
    return None


def _os_name() -> str | None:
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        for line in (_read(path) or "").splitlines():
            if line.startswith("PRETTY_NAME="):
                return _cut(line.split("=", 1)[1].strip().strip("'\""))
    return None


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _board(info: dict[str, str]) -> str | None:
    """The board's model (Raspberry Pi, Jetson) from the device tree or /proc/cpuinfo, if it says."""
    model = _read("/proc/device-tree/model")
    if model is not None:
        return _cut(model.rstrip("\0\n"))
    model = info.get("model", "")  # x86 has a numeric "model"; a Pi's names the board
    return _cut(model) if model and not model.isdigit() else None


def _runtimes() -> tuple[dict[str, str | None], list[str] | None]:
    versions: dict[str, str | None] = {}
    providers = None
    for mod in ("numpy", "onnxruntime", "ai_edge_litert", "tflite_runtime", "gymnasium"):
        try:
            m = importlib.import_module(mod)
            versions[mod] = _cut(str(getattr(m, "__version__", "installed")))
            if mod == "onnxruntime":
                providers = [_cut(str(p)) or "?" for p in m.get_available_providers()]
        except Exception:  # any import failure means "not usable here"
            versions[mod] = None
    return versions, providers


def device_info() -> JSONObject:
    """Everything `devices check` shows and every bench report's ``device`` holds."""
    machine = platform.machine()
    info = parse_cpuinfo(_read("/proc/cpuinfo") or "")
    hwcaps = hwcap_features()
    features = hwcaps if hwcaps is not None else isa_features(info, machine)
    versions, providers = _runtimes()
    return {
        "uname": " ".join(platform.uname()),
        "machine": machine,
        "python": platform.python_version(),
        "cpu_model": _cut(cpu_model(info)),
        "board": _board(info),
        "cores": _cores(),
        "runtimes": versions,
        "cpu_features": features,
        "cpu_features_source": None
        if features is None
        else "hwcap"
        if hwcaps is not None
        else "/proc/cpuinfo",
        "governor": _cut(_read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")),
        "mem_total_mb": _mem_total_mb(),
        "os": _os_name(),
        "ort_providers": providers,
        "emulation": emulation(machine, _cut(_read("/proc/sys/kernel/arch"))),
        "modules": _env_modules(),
        "c_compiler": _c_compiler(),
        "disk_free_bytes": _disk_free(),
    }


def _c_compiler() -> str | None:
    """The C compiler the ``c`` runtime would build with here (``gcc-12.2.0``, ``zig-0.17.1``), or None."""
    try:
        from .ccompiler import find_compiler

        found = find_compiler()
    except Exception:  # a compiler that cannot even say its version is none to build with
        return None
    return None if found is None else _cut(found.name)


def _env_modules() -> dict[str, bool]:
    """Which env packages the device has (found, not imported: importing ale_py or mujoco takes seconds
    on a board), for the host's pre-flight check before it measures anything."""
    import importlib.util

    try:
        from .envs import ENV_MODULES
    except ImportError:  # no numpy: the runner cannot run anyway, and the facts say so
        return {}
    out = {}
    for mod in (*ENV_MODULES, "cv2", "imageio"):  # cv2: Atari preprocessing; imageio: gymnasium's MuJoCo
        try:
            out[mod] = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            out[mod] = False
    return out


def _disk_free() -> int | None:
    """Free bytes where the runner lives (the device's cache, where bundles are uploaded)."""
    import shutil

    path = os.path.abspath(sys.argv[0] or ".")
    while path and not os.path.isdir(path):  # the zipapp: .../cache/runner-x.pyz
        path = os.path.dirname(path)
    try:
        return int(shutil.disk_usage(path or ".").free)
    except OSError:
        return None


def features_text(features: Any) -> str:
    """``{"asimd": True, "asimddp": False, ...}`` as ``asimd; without asimddp`` (``?`` if unknown)."""
    if not isinstance(features, dict) or not features:
        return "?"
    have = [str(k) for k, v in features.items() if v is True]
    lack = [str(k) for k, v in features.items() if v is False]
    return "; ".join(p for p in (", ".join(have), f"without {', '.join(lack)}" if lack else "") if p) or "?"


def facts_text(d: JSONObject) -> str:
    """A device's facts (device_info's keys; any may be missing or of a wrong type) in one line."""

    def s(key: str) -> str | None:
        v = d.get(key)
        return str(v) if isinstance(v, str | int | float) and not isinstance(v, bool) else None

    parts = [
        ", ".join(
            p for p in (s("machine"), s("cpu_model"), f"{s('cores')} cores" if s("cores") else None) if p
        )
    ]
    if "cpu_features" in d:
        src = f" (from {s('cpu_features_source')})" if s("cpu_features_source") else ""
        parts.append(f"int8 ISA: {features_text(d.get('cpu_features'))}{src}")
    if "governor" in d:
        parts.append(f"governor {s('governor') or 'not exposed'}")
    mem = d.get("mem_total_mb")
    if isinstance(mem, int | float) and not isinstance(mem, bool):
        parts.append(f"{mem / 1024:.1f} GiB")
    parts += [x for x in (s("os"), f"Python {s('python')}" if s("python") else None) if x]
    versions = d.get("runtimes")
    versions = versions if isinstance(versions, dict) else {}
    rts = [f"{k} {v}" for k, v in versions.items() if k not in ("numpy", "gymnasium") and isinstance(v, str)]
    providers = d.get("ort_providers")
    if isinstance(providers, list) and providers:
        rts = [f"{r} ({', '.join(map(str, providers))})" if r.startswith("onnxruntime") else r for r in rts]
    if rts:
        parts.append("; ".join(rts))
    emu = d.get("emulation")
    if isinstance(emu, dict):
        cpu = emu.get("qemu_cpu") or "qemu's default"
        parts.append(f"emulated by {emu.get('emulator', '?')}, CPU model {cpu}")
    return "; ".join(p for p in parts if p)
