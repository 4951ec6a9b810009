"""Acceptance: int8 ONNX of the shipped policies keeps >= 98% of the fp32 return over 20 paired seeds.

The drop is bench()'s reward_drop_pct: the mean paired return change vs fp32, in % of |fp32 mean return|.
Run with `pytest -s` to see the figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.policy.net import load_checkpoint

EPISODES = 20
MAX_DROP_PCT = 2.0


@pytest.mark.parametrize(
    ("policy_fixture", "calib_fixture"),
    [("cartpole_policy", "cartpole_calib"), ("pendulum_policy", "pendulum_calib")],
    ids=["cartpole-ppo", "pendulum-sac"],
)
def test_int8_keeps_98_percent_of_fp32_return(
    request: pytest.FixtureRequest, tmp_path: Path, policy_fixture: str, calib_fixture: str
) -> None:
    policy_dir: Path = request.getfixturevalue(policy_fixture)
    calib: Path = request.getfixturevalue(calib_fixture)
    bundle = tmp_path / policy_dir.name
    export_bundle(
        load_checkpoint(policy_dir),
        BundleRequest(out=bundle, targets=("onnx-fp32", "onnx-int8"), calibration=calib),
    )
    report = bench(bundle, BenchConfig(episodes=EPISODES, latency_samples=100))
    fp32, int8 = report.models
    assert (fp32.name, int8.name) == ("onnx-fp32", "onnx-int8")
    assert fp32.warnings == () and int8.warnings == ()
    # every episode ran on both models, on the same seeds
    assert fp32.reward.episodes == int8.reward.episodes == EPISODES
    drift = int8.drift
    assert drift is not None and drift.paired_episodes == EPISODES
    drop = drift.reward_drop_pct + 0.0  # + 0.0: print -0.0 as 0.0
    f, q = fp32.reward.mean, int8.reward.mean
    assert f is not None and q is not None
    # reward_drop_pct is the paired mean drop in % of |fp32 mean|
    assert drop == pytest.approx(100.0 * (f - q) / abs(f), abs=1e-6)
    lo, hi = drift.drop_ci95_pct
    agree = int8.agreement
    assert agree is not None and lo is not None and hi is not None
    seeds = report.settings.seeds
    print(
        f"\n{report.bundle.policy} ({report.bundle.env}, {EPISODES} paired seeds {seeds[0]}..{seeds[-1]}): "
        f"fp32 mean {f:.2f} ± {fp32.reward.std:.2f}, int8 mean {q:.2f} ± {int8.reward.std:.2f}, "
        f"drop {drop:+.3f}% (95% CI [{lo + 0.0:+.3f}%, {hi + 0.0:+.3f}%]), "
        f"int8 keeps {100 - drop:.2f}% of the fp32 return; "
        f"agreement {agree.metric} = {agree.value:.4f}"
    )
    assert drop <= MAX_DROP_PCT, f"int8 loses {drop:.2f}% of the fp32 return (limit {MAX_DROP_PCT}%)"
