"""The in-loop statistics of ``bench --hz``: act() timed inside the closed-loop episodes against a
period's budget (1/RATE), with and without the loop runner's warm-up (runtimes.loop)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from .errors import InputError
from .schema import JSONObject

MIN_HZ = 0.01
"""the slowest rate the runner accepts (a period of 100 s)"""
MAX_LOOP_HZ = 100_000.0
"""the fastest: a 10 us period leaves no room for a Python act(), let alone a warm-up"""


def check_hz(hz: Any, flag: str = "--hz", example: str = "--hz 50", required: bool = False) -> float | None:
    """``hz`` as a control rate the loop runner can pace (None: no in-loop measurement, unless
    ``required``); an InputError for 0, negative, nan, inf, or a rate outside MIN_HZ..MAX_LOOP_HZ."""
    if hz is None and not required:
        return None
    if isinstance(hz, bool) or not isinstance(hz, int | float) or not (MIN_HZ <= hz <= MAX_LOOP_HZ):
        raise InputError(f"{flag} must be a control rate from {MIN_HZ:g} to {MAX_LOOP_HZ:g} steps per second "
                         f"(got {str(hz)[:24]})", f"e.g. {example}")  # fmt: skip
    return float(hz)


@dataclass(frozen=True)
class InLoopStats:
    """act() latency over the closed-loop steps of a model, and the steps over the period's budget.

    Paced (``bench --hz``: the episodes run in the loop runner at the rate, warm-up before every other
    step), the main figures are over the steps with a warm-up, ``no_warmup_*`` over the others: the two
    side by side, in the same run, on the same episodes."""

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
    paced: bool = False
    """the steps ran at the rate, with real idle time between them (the loop runner's Pace)"""
    overruns: int = 0
    """paced steps whose act() + env.step ended after the next deadline (the loop skipped a period)"""
    no_warmup_steps: int = 0
    no_warmup_p50_us: float | None = None
    no_warmup_p99_us: float | None = None
    no_warmup_miss_rate: float | None = None
    os_settings: tuple[str, ...] = ()
    """the OS settings the loop runner applied (runtimes.realtime), e.g. ``sched_fifo``"""

    def to_dict(self) -> JSONObject:
        d = asdict(self)
        d["os_settings"] = list(self.os_settings)
        return d


def in_loop_stats(
    act_ns: Iterable[Sequence[int] | None],
    hz: float,
    first_call_ms: float | None = None,
    warmed: Iterable[Sequence[bool] | None] | None = None,
    overruns: int = 0,
    os_settings: Sequence[str] = (),
) -> InLoopStats | None:
    """The stats over every episode's act() times (None when no step was timed). ``warmed``: per episode,
    per step, whether a warm-up ran before it (paced episodes): the main figures are over those steps,
    ``no_warmup_*`` over the others."""
    chunks = [np.asarray(a, dtype=np.int64) for a in act_ns if a]
    if not chunks:
        return None
    ns = np.concatenate(chunks)
    flags = [np.asarray(w, dtype=bool) for w in warmed if w] if warmed is not None else []
    paced = bool(flags) and sum(f.size for f in flags) == ns.size
    warm = np.concatenate(flags) if paced else np.ones(ns.size, bool)
    if not warm.any():  # paced without a single warm-up (every step overran): the figures are the others'
        warm = np.ones(ns.size, bool)
    budget_ns = 1e9 / hz
    main, other = ns[warm], ns[~warm]
    us = main.astype(np.float64) / 1e3
    over = int(np.count_nonzero(main > budget_ns))
    cold = other.astype(np.float64) / 1e3
    return InLoopStats(
        hz=hz,
        budget_us=budget_ns / 1e3,
        steps=int(main.size),
        over_budget=over,
        miss_rate=over / main.size,
        p50_us=float(np.percentile(us, 50)),
        p99_us=float(np.percentile(us, 99)),
        p999_us=float(np.percentile(us, 99.9)),
        max_us=float(us.max()),
        mean_us=float(us.mean()),
        first_call_ms=first_call_ms if first_call_ms is None or math.isfinite(first_call_ms) else None,
        paced=paced,
        overruns=overruns,
        no_warmup_steps=int(other.size),
        no_warmup_p50_us=float(np.percentile(cold, 50)) if cold.size else None,
        no_warmup_p99_us=float(np.percentile(cold, 99)) if cold.size else None,
        no_warmup_miss_rate=float(np.count_nonzero(other > budget_ns) / other.size) if other.size else None,
        os_settings=tuple(os_settings),
    )
