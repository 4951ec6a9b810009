"""Every number a user sets, checked once here, whichever command takes it (gate, tune, bench, the
studies): a NaN, an infinity, a bool or a value out of its range is one InputError naming the flag and an
example, raised when the config is made, before anything runs.

The gate's thresholds are tune's too (tune keeps the fastest model that passes them), so their defaults
and ranges live here once."""

from __future__ import annotations

import math

from quarl_edge.runtimes.errors import InputError

MAX_REWARD_DROP_PCT = 2.0
"""the default reward-drop limit of gate and tune, % of the fp32 mean return"""
REWARD_DROP_CAP_PCT = 1e6  # beyond this a "limit" is a typo: no policy's drop is checked against it
P99_CAP_MS = 3_600_000.0  # an hour per inference is no control loop
MAX_THREADS = 1024  # more is no thread count of any board (the device side caps lower, runtimes/adapters.py)
MAX_SEED = 2**31 - 1  # environments take non-negative 32-bit seeds
MAX_EPISODES = 100_000


def parse_percent(text: str, flag: str = "--max-reward-drop") -> float:
    """A percent flag's value, in percent. One rule for every such flag (gate's --max-reward-drop,
    --max-miss-rate and --max-out-of-range, tune's --max-reward-drop): ``2%`` is a percentage; a bare number
    is a fraction of one, ``0.02`` = 2%, as the report's own fractions (miss_rate) are written; a bare number
    above 1 is refused, since ``2`` could mean 2% or 200%. A non-finite value is returned for the limit's
    own check to refuse by name."""
    t = text.strip()
    percent = t.endswith("%")
    try:
        value = float(t[:-1].strip() if percent else t)
    except ValueError:
        raise InputError(f"{flag} {text.strip()[:40]!r} is not a percentage",
                         f"write it like {flag} 2% (or as a fraction of one: {flag} 0.02)") from None  # fmt: skip
    if percent or not math.isfinite(value):
        return value
    if abs(value) > 1:
        raise InputError(f"{flag} {t} is ambiguous: {value:g}% or {100 * value:g}%?",
                         f"write {flag} {value:g}% (a percentage), or a fraction of one: {flag} {value / 100:g}")  # fmt: skip
    return 100 * value


def finite(value: object, flag: str, example: str) -> float:
    """``value`` as a float; InputError unless it is a finite number (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(f"{flag} must be a finite number (got {value!r})", f"e.g. {flag} {example}")
    return float(value)


def number(value: object, flag: str, lo: float, hi: float, example: str, *, lo_open: bool = False) -> float:
    """A finite number in [lo, hi] ((lo, hi] with ``lo_open``)."""
    v = finite(value, flag, example)
    if not (v > lo if lo_open else v >= lo) or v > hi:
        bound = f"> {lo:g}" if lo_open else f">= {lo:g}"
        raise InputError(f"{flag} must be {bound} and <= {hi:g} (got {v:g})", f"e.g. {flag} {example}")
    return v


def count(value: object, flag: str, lo: int, hi: int, example: str) -> int:
    """A whole number in [lo, hi]."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InputError(f"{flag} {value!r} is not a whole number in [{lo}, {hi}]", f"e.g. {flag} {example}")
    return value


def check_max_reward_drop(pct: object) -> None:
    """gate's and tune's --max-reward-drop, in %: >= 0 (0: no drop at all)."""
    v = finite(pct, "--max-reward-drop", "2%")
    if not 0 <= v <= REWARD_DROP_CAP_PCT:
        raise InputError(f"--max-reward-drop must be >= 0 and <= {REWARD_DROP_CAP_PCT:g}% (got {v:g}%)",
                         "e.g. --max-reward-drop 2%")  # fmt: skip


def check_min_agreement(value: object) -> None:
    """--min-agreement: a share of the recorded states, between 0 and 1."""
    v = finite(value, "--min-agreement", "0.95")
    if not 0 <= v <= 1:
        raise InputError(f"--min-agreement must be between 0 and 1 (got {v:g})", "e.g. --min-agreement 0.95")


def check_max_p99_ms(ms: object) -> None:
    """--max-p99-ms: a positive latency, at most an hour."""
    v = finite(ms, "--max-p99-ms", "5")
    if not 0 < v <= P99_CAP_MS:
        raise InputError(
            f"--max-p99-ms must be positive and <= {P99_CAP_MS:g} (got {v:g})", "e.g. --max-p99-ms 5"
        )


def check_max_miss_rate(pct: object) -> None:
    """--max-miss-rate: a share of closed-loop steps, between 0% and 100%."""
    v = finite(pct, "--max-miss-rate", "1%")
    if not 0 <= v <= 100:
        raise InputError(
            f"--max-miss-rate must be between 0% and 100% (got {v:g}%)", "e.g. --max-miss-rate 1%"
        )


def check_max_action_error(value: object) -> None:
    """--max-action-error: action units (continuous) or a share of differing actions (discrete), >= 0."""
    v = finite(value, "--max-action-error", "0.05")
    if v < 0:
        raise InputError(f"--max-action-error must be >= 0 (got {v:g})", "e.g. --max-action-error 0.05")


def check_max_out_of_range(pct: object) -> None:
    """--max-out-of-range: a field report's share of observations outside the calibration range, 0%..100%."""
    v = finite(pct, "--max-out-of-range", "5%")
    if not 0 <= v <= 100:
        raise InputError(
            f"--max-out-of-range must be between 0% and 100% (got {v:g}%)", "e.g. --max-out-of-range 5%"
        )


def check_threads(n: object, flag: str = "--threads") -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_THREADS:
        raise InputError(
            f"{flag} {n!r} is not a thread count of any board (1..{MAX_THREADS})", f"e.g. {flag} 2"
        )


def check_seed(seed: object, flag: str = "--seed") -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise InputError(f"{flag} must be >= 0 and <= {MAX_SEED} (got {seed!r}): environments take "
                         "non-negative 32-bit seeds", f"e.g. {flag} 1000")  # fmt: skip


def check_paired_episodes(n: object, flag: str = "--episodes") -> None:
    """Paired episodes that a confidence interval is computed over: at least two."""
    count(n, flag, 2, MAX_EPISODES, "20 (a paired interval needs two)")
