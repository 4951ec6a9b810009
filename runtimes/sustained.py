"""A sustained loop (`bench --duration`): the model run back to back for a while, its latency per
one-second window, and the board's temperature, clock and throttling flags before, during and after.

An uncooled board slows down under sustained load (a Pi 4 can lose most of its throughput once it
throttles); a tight loop of a second or two never shows it. Readings come from runtimes.thermal: where
the board does not expose one (or is emulated), it is reported as not exposed, never guessed. Reading
the sensors takes a moment once per window; that time is not in any window's calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from . import thermal
from .errors import InputError
from .schema import JSONObject

MAX_DURATION_S = 24 * 3600.0
CLOCK_DROP_WARN_PCT = 10.0  # the slowest core clock during the loop this far below its fastest
SLOWDOWN_WARN = 1.2  # the last window's p50 this many times the first's


def check_duration(duration_s: float | None) -> float | None:
    if duration_s is None:
        return None
    if (
        isinstance(duration_s, bool)
        or not isinstance(duration_s, int | float)
        or not 0 < duration_s <= MAX_DURATION_S
    ):
        raise InputError(
            f"--duration must be between 0 and 24 h (got {duration_s!r} s)", "e.g. --duration 60s"
        )
    return float(duration_s)


def parse_duration(text: str) -> float:
    """``60s``, ``2m``, ``1h``, ``90`` (seconds) -> seconds."""
    t = text.strip().lower()
    scale = {"s": 1.0, "m": 60.0, "h": 3600.0}.get(t[-1:])
    try:
        value = float(t[:-1] if scale else t) * (scale or 1.0)
    except ValueError:
        raise InputError(f"not a duration: {text!r}", "write it like 60s, 2m or 1h") from None
    return check_duration(value) or 0.0


@dataclass(frozen=True)
class Window:
    t_s: float
    """the window's end, seconds since the loop started"""
    calls: int
    p50_us: float
    p99_us: float


@dataclass(frozen=True)
class SustainedStats:
    duration_s: float
    calls: int
    windows: list[Window]
    readings: list[thermal.ThermalReading]
    """before the loop (t_s 0), after each window, the last one after the loop"""
    first_p50_us: float
    last_p50_us: float
    slowdown: float
    """last window's p50 / first window's p50"""
    clock_drop_pct: float | None
    """how far the slowest mean core clock during the loop fell below the fastest (None: not exposed)"""
    max_temp_c: float | None
    throttle_flags: list[str]
    """vcgencmd flags seen during or after the loop"""
    not_exposed: list[str] = field(default_factory=list)
    """which of temperature, clock, throttling the board does not expose (all of them when emulated)"""
    emulated: bool = False

    def to_dict(self) -> JSONObject:
        return asdict(self)


def _window(t_s: float, times: list[int]) -> Window:
    us = np.asarray(times, dtype=np.float64) / 1e3
    return Window(round(t_s, 3), len(times), float(np.percentile(us, 50)), float(np.percentile(us, 99)))


def sustained(
    run: Callable[[np.ndarray], Any], batches: Sequence[np.ndarray], duration_s: float, emulated: bool
) -> SustainedStats:
    """Call ``run`` on ``batches`` (cycling) back to back for ``duration_s``; one window per second."""
    clock, window_ns = time.perf_counter_ns, 1_000_000_000
    readings = [thermal.read(0.0, emulated)]
    windows: list[Window] = []
    times: list[int] = []
    start = clock()
    end, next_window, i = start + int(duration_s * 1e9), start + window_ns, 0
    while True:
        t0 = clock()
        run(batches[i % len(batches)])
        t1 = clock()
        times.append(t1 - t0)
        i += 1
        if t1 >= next_window or t1 >= end:
            windows.append(_window((t1 - start) / 1e9, times))
            times = []
            readings.append(thermal.read(round((t1 - start) / 1e9, 3), emulated))
            if t1 >= end:
                break
            next_window = clock() + window_ns
    during = readings[1:]
    clocks = [float(np.mean(r.freq_mhz)) for r in during if r.freq_mhz]
    temps = [max(r.temp_c.values()) for r in readings if r.temp_c]
    flags = sorted({f for r in during for f in thermal.throttle_flags(r.throttled)})
    not_exposed = [what for what, seen in (("temperature", temps), ("clock", clocks),
                                           ("throttling", [r for r in readings if r.throttled is not None])) if not seen]  # fmt: skip
    return SustainedStats(
        duration_s=float(duration_s),
        calls=sum(w.calls for w in windows),
        windows=windows,
        readings=readings,
        first_p50_us=windows[0].p50_us,
        last_p50_us=windows[-1].p50_us,
        slowdown=windows[-1].p50_us / windows[0].p50_us if windows[0].p50_us > 0 else 1.0,
        clock_drop_pct=100.0 * (1 - min(clocks) / max(clocks)) if clocks and max(clocks) > 0 else None,
        max_temp_c=max(temps) if temps else None,
        throttle_flags=flags,
        not_exposed=not_exposed,
        emulated=emulated,
    )


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def sustained_warnings(block: Any) -> list[str]:
    """The report's warnings for a sustained block (a dict from the device: every field checked)."""
    if not isinstance(block, dict):
        return []
    out = []
    dur = _num(block.get("duration_s")) or 0.0
    drop = _num(block.get("clock_drop_pct"))
    if drop is not None and drop > CLOCK_DROP_WARN_PCT:
        out.append(f"the clock dropped {drop:.0f}% during the {dur:g} s sustained loop")
    flags = block.get("throttle_flags")
    if isinstance(flags, list) and flags:
        out.append(f"the board throttled during the sustained loop: {', '.join(map(str, flags))}")
    slow, first, last = (_num(block.get(k)) for k in ("slowdown", "first_p50_us", "last_p50_us"))
    if slow is not None and first is not None and last is not None and slow > SLOWDOWN_WARN:
        out.append(
            f"p50 rose from {first:.1f} to {last:.1f} us (x{slow:.2f}) over the {dur:g} s sustained loop"
        )
    return out
