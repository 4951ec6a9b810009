"""The numbers the gate and the studies decide on, checked against independent computations (scipy),
and the gate's agreement threshold tested below and above its limit on discrete and continuous actions."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from report_json import model_json, report_json
from scipy import stats as sps

from quarl_edge.bench.report import parse_report
from quarl_edge.bench.run import action_agreement as _agreement
from quarl_edge.gate import GateConfig, evaluate
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.stats import Drift, drift_scale, mean_ci95, paired_drift, t975
from quarl_edge.study.ptq import keeps_reward
from quarl_edge.study.result import VariantResult


@pytest.mark.parametrize("df", [1, 2, 5, 9, 19, 29, 30, 31, 45, 60, 99, 119, 120, 121, 250, 1000])
def test_t975_matches_scipy(df: int) -> None:
    # the 3-decimal table (df <= 30) is within 2.3e-4; the expansion beyond it within 1e-6
    assert t975(df) == pytest.approx(sps.t.ppf(0.975, df), rel=3e-4)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n", [2, 3, 20, 45, 130])
def test_mean_ci95_matches_scipy_t_interval(seed: int, n: int) -> None:
    xs = np.random.default_rng(seed).normal(3.0, 7.0, n).tolist()
    m, lo, hi = mean_ci95(xs)
    want_lo, want_hi = sps.t.interval(0.95, n - 1, loc=np.mean(xs), scale=sps.sem(xs))
    assert m == pytest.approx(np.mean(xs))
    assert (lo, hi) == pytest.approx((want_lo, want_hi), rel=3e-4, abs=1e-9)


def test_mean_ci95_of_one_sample_is_unbounded_and_of_none_is_nan() -> None:
    assert mean_ci95([4.0]) == (4.0, -math.inf, math.inf)
    assert all(math.isnan(x) for x in mean_ci95([]))


def test_paired_drift_and_its_interval_match_scipy() -> None:
    rng = np.random.default_rng(7)
    ref = rng.normal(-120.0, 60.0, 20)  # a reward spread like Pendulum's
    run = ref + rng.normal(-2.0, 5.0, 20)  # paired: same seeds, a small systematic loss
    d = paired_drift(ref.tolist(), run.tolist())
    assert d is not None
    diffs = run - ref
    lo, hi = sps.t.interval(0.95, len(diffs) - 1, loc=diffs.mean(), scale=sps.sem(diffs))
    scale = abs(ref.mean())
    assert d.paired_episodes == 20
    assert d.abs == pytest.approx(diffs.mean())
    assert d.abs_ci95 == pytest.approx((lo, hi), rel=3e-4)
    assert d.rel_ci95 == pytest.approx((lo / scale, hi / scale), rel=3e-4)
    assert d.reward_drop_pct == pytest.approx(-100 * diffs.mean() / scale)
    assert d.drop_ci95_pct == pytest.approx((-100 * hi / scale, -100 * lo / scale), rel=3e-4)
    assert d.abs_ci95[0] < d.abs_ci95[1]  # type: ignore[operator]  # a real spread, not a constant policy's


def test_a_zero_fp32_mean_measures_the_drop_in_one_reward_unit() -> None:
    """The one rule (stats.drift_scale): with an fp32 mean return of exactly 0 the drop is relative to one
    reward unit, so it stays a finite number the gate can judge (it was NaN in bench, 1.0 in the studies)."""
    ref = [-1.0, 1.0, -2.0, 2.0]  # mean 0: Pong-like returns that cancel
    other = [-2.0, 0.0, -3.0, 1.0]  # one point lower on every seed
    d = paired_drift(ref, other)
    assert d is not None and d.abs == pytest.approx(-1.0)
    assert d.rel == pytest.approx(-1.0) and d.reward_drop_pct == pytest.approx(100.0)
    assert all(math.isfinite(x) for x in (*d.rel_ci95, *d.abs_ci95) if x is not None)
    assert drift_scale(0.0) == drift_scale(-0.0) == drift_scale(math.nan) == 1.0
    assert drift_scale(-250.0) == 250.0 and drift_scale(0.5) == 0.5  # only zero is special
    same = paired_drift([0.0, 0.0], [0.0, 0.0])  # a policy that earns nothing, quantized: no drop
    assert same is not None and same.reward_drop_pct == 0.0


def test_paired_drift_pairs_only_finite_returns_and_one_pair_is_unbounded() -> None:
    d = paired_drift([10.0, None, math.inf, 12.0], [9.0, 5.0, 7.0, None])
    assert d is not None and d.paired_episodes == 1 and d.abs == -1.0
    assert d.abs_ci95 == (None, None) and d.drop_ci95_pct == (None, None)  # one pair: no interval
    assert paired_drift([None], [1.0]) is None
    with pytest.raises(ValueError, match="different lengths"):
        paired_drift([1.0], [1.0, 2.0])


@pytest.mark.parametrize("bad", [{"reward_drop_pct": -math.inf}, {"abs": math.nan}, {"paired_episodes": 0},
                                 {"rel_ci95": (0.1, -0.1)}])  # fmt: skip
def test_a_drift_outside_its_meaning_cannot_be_made(bad: dict[str, Any]) -> None:
    fields = {"paired_episodes": 3, "abs": -1.0, "abs_ci95": (-2.0, 0.0), "rel": -0.01, "rel_ci95": (-0.02, 0.0),
              "reward_drop_pct": 1.0}  # fmt: skip
    Drift(**fields)
    with pytest.raises(ValueError):
        Drift(**{**fields, **bad})


def test_the_studies_keep_reward_rule_passes_inside_fp32s_interval_and_fails_outside() -> None:
    fp32 = [100.0, 140.0, 60.0, 120.0, 80.0]
    _, lo, hi = mean_ci95(fp32)

    def row(drop: float, mean: float) -> VariantResult:
        return VariantResult("p", "CartPole-v1", "ppo", "onnx-int8", 8, None, mean=mean, drop_pct=drop)

    inside = row(8.0, lo + 1.0)  # over the 2% drop, but inside fp32's own interval
    outside = row(8.0, lo - 1.0)
    small = row(1.5, lo - 50.0)  # within 2%, whatever the interval
    assert keeps_reward(inside, lo, hi) and keeps_reward(small, lo, hi)
    assert not keeps_reward(outside, lo, hi)


def test_continuous_agreement_is_one_minus_mean_abs_error_over_the_action_range(
    pendulum_bundle: Path,
) -> None:
    manifest = load_manifest(pendulum_bundle)
    low, high = np.asarray(manifest.policy.action_space.low), np.asarray(manifest.policy.action_space.high)
    rng = np.random.default_rng(3)
    ref = rng.uniform(low, high, (50, low.size))
    other = np.clip(ref + rng.normal(0.0, 0.1, ref.shape), low, high)
    a = _agreement(manifest, ref.tolist(), other.tolist())
    assert a is not None and a.samples == 50
    want = 1.0 - np.mean(np.abs(ref - other) / (high - low))  # computed here, independently
    assert a.value == pytest.approx(want) and a.mean_abs_diff_rel == pytest.approx(1.0 - want)
    assert a.value < 1.0
    # a model answering NaN, or far outside the range, disagrees fully there: agreement stays in [0, 1]
    wild = other.copy()
    wild[:25] = np.nan
    wild[25:] = 1e9
    assert _agreement(manifest, ref.tolist(), wild.tolist()).value == 0.0  # type: ignore[union-attr]


def test_discrete_agreement_is_the_share_of_equal_actions(cartpole_bundle: Path) -> None:
    manifest = load_manifest(cartpole_bundle)
    ref = [0, 1, 1, 0, 1, 0, 0, 1, 1, 1]
    other = [0, 1, 0, 0, 1, 0, 1, 1, 1, 1]
    a = _agreement(manifest, ref, other)
    assert a is not None and a.value == pytest.approx(0.8) and a.metric == "exact_match_rate"


def _report(metric: str, agreement: float) -> Any:
    quant = model_json("onnx-int8", "int8", agreement=agreement)
    if metric != "exact_match_rate":
        quant["agreement"].update(metric=metric, mean_abs_diff_rel=1.0 - agreement)
    return parse_report(report_json(model_json("onnx-fp32", "fp32", None), quant))


@pytest.mark.parametrize("metric", ["exact_match_rate", "1 - mean_abs_diff/action_range"])
def test_gate_min_agreement_fails_below_and_passes_above_the_limit(metric: str) -> None:
    def agreement_check(value: float, limit: float) -> Any:
        checks = evaluate(_report(metric, value), GateConfig(max_reward_drop_pct=2.0, min_agreement=limit))
        (c,) = [c for c in checks if c.name == "agreement"]
        return c

    below = agreement_check(0.93, 0.95)
    assert not below.passed and below.value == pytest.approx(0.93) and "short by 0.0200" in below.message
    assert agreement_check(0.97, 0.95).passed
    assert agreement_check(0.95, 0.95).passed  # the limit itself passes
    # without --min-agreement the same low agreement is not a check at all
    checks = evaluate(_report(metric, 0.5), GateConfig(max_reward_drop_pct=2.0))
    assert [c.name for c in checks] == ["reward_drop"] and all(c.passed for c in checks)
