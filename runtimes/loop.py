"""Latency as a control loop sees it: act() timed inside closed-loop episodes, against a period's budget.

The runner times every ``Policy.act`` call of its closed-loop episodes (``--hz``), between two real
``env.step`` calls, so the caches hold the environment's data, not the model's, as in a control loop.
What is counted is act() alone: the observation check, the frame stack, the model's inference and the
action's conversion; not env.step (in a bench the environment stands in for the world). A step misses
its deadline when its act() took longer than the budget, 1/RATE. The episodes are not paced (no sleep
between steps), so the figures leave out what idling between periods costs: examples/control_loop.py
measures that.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .errors import InputError

MAX_HZ = 1e9  # one step per nanosecond: the clock's resolution


def check_hz(hz: float | None, flag: str = "--hz") -> float | None:
    """``hz`` as a control rate (None: no in-loop measurement); an InputError for 0, negative, nan, inf."""
    if hz is None:
        return None
    if isinstance(hz, bool) or not isinstance(hz, int | float) or not (0 < hz <= MAX_HZ):
        raise InputError(f"{flag} must be a control rate in steps per second above 0 (got {hz!r})",
                         f"e.g. {flag} 50")  # fmt: skip
    return float(hz)


@dataclass(frozen=True)
class InLoopStats:
    """act() latency over every closed-loop step of a model, and the steps over the period's budget."""

    hz: float
    budget_us: float
    """the period, 1e6 / hz"""
    steps: int
    over_budget: int
    """steps whose act() took longer than the budget"""
    miss_rate: float
    """over_budget / steps"""
    p50_us: float
    p99_us: float
    p999_us: float
    max_us: float
    mean_us: float
    first_call_ms: float | None
    """the model's first inference after load (cold: before any warm-up)"""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def in_loop_stats(
    act_ns: Iterable[Sequence[int] | None], hz: float, first_call_ms: float | None = None
) -> InLoopStats | None:
    """The stats over every episode's act() times (None when no step was timed)."""
    chunks = [np.asarray(a, dtype=np.int64) for a in act_ns if a]
    if not chunks:
        return None
    ns = np.concatenate(chunks)
    budget_ns = 1e9 / hz
    us = ns.astype(np.float64) / 1e3
    over = int(np.count_nonzero(ns > budget_ns))
    return InLoopStats(
        hz=hz,
        budget_us=budget_ns / 1e3,
        steps=int(ns.size),
        over_budget=over,
        miss_rate=over / ns.size,
        p50_us=float(np.percentile(us, 50)),
        p99_us=float(np.percentile(us, 99)),
        p999_us=float(np.percentile(us, 99.9)),
        max_us=float(us.max()),
        mean_us=float(us.mean()),
        first_call_ms=first_call_ms if first_call_ms is None or math.isfinite(first_call_ms) else None,
    )
