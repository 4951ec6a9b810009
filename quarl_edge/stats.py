"""Small statistics helpers (no scipy): paired drift with a t-based 95% confidence interval."""

from __future__ import annotations

import math
from collections.abc import Sequence

# two-sided 95% Student-t quantiles t_{0.975, df} for df = 1..30; larger df use the normal 1.96
_T975 = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
]  # fmt: skip


def t975(df: int) -> float:
    """The two-sided 95% Student-t quantile for ``df`` degrees of freedom: the table up to 30, then the
    Cornish-Fisher expansion around the normal quantile (error < 1e-4 there; tests/test_stats.py checks
    it against scipy)."""
    if df < 1:
        return math.inf
    if df <= 30:
        return _T975[df - 1]
    z, v = 1.959963984540054, float(df)
    return (
        z
        + (z**3 + z) / (4 * v)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * v**4)
    )


def mean_std(xs: Sequence[float]) -> tuple[float, float]:
    n = len(xs)
    if n == 0:
        return math.nan, math.nan
    m = sum(xs) / n
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / n)


def mean_ci95(xs: Sequence[float]) -> tuple[float, float, float]:
    """Mean and the 95% confidence interval of the mean (sample std, Student t)."""
    n = len(xs)
    if n == 0:
        return math.nan, math.nan, math.nan
    m = sum(xs) / n
    if n == 1:
        return m, -math.inf, math.inf
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    h = t975(n - 1) * s / math.sqrt(n)
    return m, m - h, m + h
