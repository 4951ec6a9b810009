"""The board's temperature, clock and throttling flags, read where it exposes them; None where not.

Linux: ``/sys/class/thermal/thermal_zone*/{type,temp}`` (millidegrees C) and
``/sys/devices/system/cpu/cpu*/cpufreq/scaling_cur_freq`` (kHz); Raspberry Pi: ``vcgencmd
get_throttled``. Under qemu-user nothing is read: the sensors there are the host's, not the board's.
Standard library only; a missing file or command is "not exposed", never a guessed value.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass

from .schema import JSONObject

# vcgencmd get_throttled bits (Raspberry Pi firmware): now (0-3) and since boot (16-19)
THROTTLE_BITS = {0: "under-voltage", 1: "arm frequency capped", 2: "throttled", 3: "soft temperature limit",
                 16: "under-voltage occurred", 17: "arm frequency capping occurred", 18: "throttling occurred",
                 19: "soft temperature limit occurred"}  # fmt: skip
_CORE = re.compile(r"/cpu(\d+)/cpufreq/[^/]+$")


@dataclass(frozen=True)
class ThermalReading:
    t_s: float
    """seconds since the sustained loop started (0: before it, its duration: after it)"""
    temp_c: dict[str, float] | None
    """per thermal zone (its type, e.g. ``cpu-thermal``), degrees C; None: not exposed"""
    freq_mhz: list[float] | None
    """current clock of each core with cpufreq, MHz; None: not exposed"""
    throttled: int | None
    """vcgencmd get_throttled's bits; None: not exposed (no vcgencmd)"""

    def to_dict(self) -> JSONObject:
        return asdict(self)


def _number(path: str) -> float | None:
    try:
        with open(path) as f:
            return float(f.read(64).strip())
    except (OSError, ValueError):
        return None


def temperatures(root: str = "/") -> dict[str, float] | None:
    out: dict[str, float] = {}
    for zone in sorted(glob.glob(os.path.join(root, "sys/class/thermal/thermal_zone*"))):
        milli = _number(os.path.join(zone, "temp"))
        if milli is None:
            continue
        try:
            with open(os.path.join(zone, "type")) as f:
                name = f.read(64).strip() or os.path.basename(zone)
        except OSError:
            name = os.path.basename(zone)
        out[name if name not in out else os.path.basename(zone)] = round(milli / 1000, 1)
    return out or None


def frequencies(root: str = "/", which: str = "scaling_cur_freq") -> list[float] | None:
    cpus = glob.glob(os.path.join(root, "sys/devices/system/cpu/cpu[0-9]*/cpufreq", which))
    by_core = {int(m.group(1)): p for p in cpus if (m := _CORE.search(p))}
    khz = [_number(by_core[c]) for c in sorted(by_core)]
    mhz = [round(k / 1000, 1) for k in khz if k is not None]
    return mhz or None


def parse_throttled(text: str) -> int | None:
    """``throttled=0x50005`` -> 0x50005; None for anything else."""
    key, _, value = text.strip().partition("=")
    if key != "throttled":
        return None
    try:
        return int(value, 16)
    except ValueError:
        return None


def throttle_flags(bits: int | None) -> list[str]:
    return [] if bits is None else [name for bit, name in THROTTLE_BITS.items() if bits >> bit & 1]


def throttled() -> int | None:
    exe = shutil.which("vcgencmd")
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "get_throttled"], capture_output=True, text=True, timeout=2)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_throttled(r.stdout) if r.returncode == 0 else None


def read(t_s: float, emulated: bool, root: str = "/") -> ThermalReading:
    if emulated:
        return ThermalReading(t_s, None, None, None)
    return ThermalReading(t_s, temperatures(root), frequencies(root), throttled() if root == "/" else None)
