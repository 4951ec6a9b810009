"""Small statistics helpers (no scipy): the t-based 95% confidence interval, and the one paired reward drift
(paired_drift) that bench, the studies and tune all report."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from quarl_edge.typed import integer, number, opt_number

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


def drift_scale(ref_mean: float) -> float:
    """What a relative drift is relative to: ``|ref_mean|``, the fp32 mean return; when that is 0 (or not
    finite) there is no relative change to speak of, so the scale is one reward unit and the drop reads as
    hundredths of a reward unit. One rule for every drift (bench, studies, tune), so a drop stays a finite
    number a gate can judge: a NaN there would turn the check into "not measured" and a scale of the
    smallest return would make any change infinite."""
    scale = abs(ref_mean)
    return scale if math.isfinite(scale) and scale > 0 else 1.0


@dataclass(frozen=True)
class Drift:
    """A variant's paired reward change against the fp32 reference, with its 95% interval (Student t over
    the per-seed differences). ``rel`` is ``abs / drift_scale(fp32 mean)``; ``reward_drop_pct`` is
    ``-100 * rel`` (positive: the variant earns less). An interval bound is None when it is unbounded
    (a single paired episode)."""

    paired_episodes: int
    abs: float
    abs_ci95: tuple[float | None, float | None]
    rel: float
    rel_ci95: tuple[float | None, float | None]
    reward_drop_pct: float

    def __post_init__(self) -> None:
        integer(self.paired_episodes, "paired_episodes", lo=1)
        for name in ("abs", "rel", "reward_drop_pct"):
            number(getattr(self, name), name)
        for name in ("abs_ci95", "rel_ci95"):
            pair = getattr(self, name)
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ValueError(f"{name} is not a pair of bounds")
            lo, hi = (opt_number(v, name) for v in pair)
            if lo is not None and hi is not None and lo > hi:
                raise ValueError(f"{name} is [{lo:g}, {hi:g}], its low end above its high end")

    @property
    def drop_ci95_pct(self) -> tuple[float | None, float | None]:
        """The 95% interval of ``reward_drop_pct`` (low, high); None where it is unbounded."""
        lo, hi = self.rel_ci95
        return (None if hi is None else -100.0 * hi, None if lo is None else -100.0 * lo)


def _bound(x: float) -> float | None:
    return x if math.isfinite(x) else None


def paired_drift(ref: Sequence[float | None], other: Sequence[float | None]) -> Drift | None:
    """The drift of ``other``'s returns against ``ref``'s, episode by episode on the same seeds (the two
    lists in seed order). Only pairs where both returns are finite numbers count (a failed episode is
    None); None when no pair is left. The scale is the reference's mean over those pairs (drift_scale)."""
    if len(ref) != len(other):
        raise ValueError(f"paired returns of different lengths ({len(ref)} and {len(other)})")
    pairs = [(float(a), float(b)) for a, b in zip(ref, other, strict=True)
             if a is not None and b is not None and math.isfinite(a) and math.isfinite(b)]  # fmt: skip
    if not pairs:
        return None
    m, lo, hi = mean_ci95([b - a for a, b in pairs])
    scale = drift_scale(sum(a for a, _ in pairs) / len(pairs))
    rel = m / scale
    return Drift(
        paired_episodes=len(pairs),
        abs=m,
        abs_ci95=(_bound(lo), _bound(hi)),
        rel=rel,
        rel_ci95=(_bound(lo / scale), _bound(hi / scale)),
        reward_drop_pct=-100.0 * rel + 0.0,
    )
