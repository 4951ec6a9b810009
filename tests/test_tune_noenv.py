"""tune where the policy's environment cannot run here (an rsl_rl checkpoint from Isaac Lab and a robot's
recorded observations): each candidate is judged by its action error against fp32 on those observations,
replayed on the device (a recurrent policy's state carried over each episode), and the fastest within
--max-action-error is chosen; the reward is not measured, never estimated, and `gate tune.json
--max-action-error X` passes for the choice."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_rsl_rl import _checkpoint, _observations

from quarl_edge.bench.report import read_report
from quarl_edge.gate import GateConfig, evaluate
from quarl_edge.runtimes.errors import InputError
from quarl_edge.tune.config import TuneConfig
from quarl_edge.tune.result import TuneResult
from quarl_edge.tune.search import run_tune
from quarl_edge.tune.verify import check_against_report, read_tune_json

CARTPOLE = Path(__file__).resolve().parents[1] / "quarl_edge" / "assets" / "policies" / "cartpole-ppo"


@pytest.fixture(scope="module", params=[False, True], ids=["mlp", "lstm"])
def rsl(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("rsl-tune")
    _checkpoint(out / "model_1500.pt", request.param)
    return out / "model_1500.pt", _observations(out / "field_obs.npz")


def _cfg(pt: Path, obs: Path, out: Path, limit: float | None) -> TuneConfig:
    """A small real tune: fp16 and the default int8 of every format the device runs, 1 thread."""
    return TuneConfig(policy=pt, out=out, calibration=obs, max_action_error=limit, kinds=("fp16", "int8-default"),
                      max_threads=1, latency_samples=50, budget_min=5)  # fmt: skip


def test_the_fastest_within_the_action_error_limit_is_chosen(rsl: tuple[Path, Path], tmp_path: Path) -> None:
    pt, obs = rsl
    out = tmp_path / "tuned"
    # a limit of 0: every candidate faster than fp32 is measured (and rejected unless it is exact)
    first = run_tune(_cfg(pt, obs, out, 0.0))
    measured = sorted((r for r in first.candidates if r.action_error is not None and r.name != first.reference),
                      key=lambda r: r.p50_us or 0.0)  # fmt: skip
    assert measured, [(r.name, r.verdict, r.why) for r in first.candidates]
    assert all(r.verdict == "rejected" and (r.action_error or 0.0) > 0 for r in measured)
    # a limit between two candidates' measured errors (the fp32 reference's is 0 by definition): the
    # fastest is over it, a slower one within it
    fastest = measured[0]
    slower = min([*measured[1:], first.row(first.reference)], key=lambda r: r.action_error or 0.0)
    assert (slower.action_error or 0.0) < (fastest.action_error or 0.0)
    limit = ((slower.action_error or 0.0) + (fastest.action_error or 0.0)) / 2
    result = run_tune(_cfg(pt, obs, out, limit))
    assert result.reused_measurements > 0  # the errors and latencies of the first run, for the same bytes
    c = result.choice
    assert c is not None and c.name != fastest.name and c.drop_pct is None and c.episodes is None
    assert result.row(fastest.name).verdict == "rejected" and (c.action_error or 0.0) <= limit
    if slower.name != result.reference:  # a quantized model within the limit: it is chosen over fp32
        assert c.name != result.reference and c.action_error == result.row(c.name).action_error
        assert (result.row(c.name).p50_us or 0.0) <= (result.row(slower.name).p50_us or 0.0)
    for r in result.candidates:  # the reward is not measured: no drop anywhere, nothing estimated
        assert r.drop_pct is None and r.confirm_drop_pct is None and r.episodes_judged is None
        if r.verdict == "pass" and r.name != result.reference:
            assert r.name == c.name
    assert result.reward_not_measured and "cannot run here" in result.reward_not_measured

    data = json.loads((out / "tune.json").read_text())
    assert data["reward_not_measured"] and data["tune"]["reward_not_measured"]
    assert (
        data["tune"]["settings"]["max_action_error"] == limit and data["tune"]["choice"]["drop_pct"] is None
    )
    assert all(m["reward"]["episodes"] == 0 and m.get("drift") is None for m in data["models"])
    md = (out / "tune.md").read_text()
    assert "action error" in md and "not measured" in md
    # gate reads it as tune's evidence and passes the choice at the limit it was chosen under
    report, block = read_tune_json(out / "tune.json") or ({}, None)
    assert block is not None and block.choice is not None and block.choice.name == c.name
    if c.name != result.reference:  # (a report of the fp32 reference alone has nothing for gate to check)
        checks = evaluate(read_report(out / "tune.json"), GateConfig(max_action_error=limit))
        assert checks and all(ch.passed for ch in checks), [ch.message for ch in checks]
        err = next(ch.value for ch in checks if ch.name == "action_error")
        assert err is not None and math.isclose(err, c.action_error or 0.0, rel_tol=1e-9)
        # the same gate fails a tighter limit: the number is the measured one, not a stamp
        tight = evaluate(read_report(out / "tune.json"), GateConfig(max_action_error=err / 2))
        assert not all(ch.passed for ch in tight)
        _forged_blocks_are_refused(data, c.name)


def _forged_blocks_are_refused(data: dict[str, Any], chosen: str) -> None:
    """What gate reads back: a choice over its own limit, an error other than its row's, a reward drop in a
    block that says the reward was not measured, a block that hides it from its report."""

    def forged(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        block = copy.deepcopy(data["tune"])
        change(block)
        return block

    row = next(i for i, r in enumerate(data["tune"]["candidates"]) if r["name"] == chosen)
    err = data["tune"]["choice"]["action_error"]
    cases = {
        "above the limit": lambda b: b["settings"].update(max_action_error=err / 2),
        "other than the one measured": lambda b: b["candidates"][row].update(action_error=err * 2),
        "yet gives a reward drop": lambda b: b["choice"].update(drop_pct=0.0),
        # without the words, the choice is read as judged by reward, and it has no drop
        "reward drop other than the one judged": lambda b: b.pop("reward_not_measured"),
    }
    for message, change in cases.items():
        with pytest.raises(InputError, match=message):
            TuneResult.from_dict(forged(change))
    # a block that would hide it from a report whose reward was not measured
    with pytest.raises(InputError, match="says the reward was not measured, its report says otherwise"):
        check_against_report(
            TuneResult.from_dict(data["tune"]), {**data, "reward_not_measured": None}, "tune.json"
        )


def test_without_max_action_error_one_line_and_nothing_written(
    rsl: tuple[Path, Path], tmp_path: Path
) -> None:
    pt, obs = rsl
    out = tmp_path / "tuned"
    with pytest.raises(InputError, match="cannot run here") as ei:
        run_tune(_cfg(pt, obs, out, None))
    assert "--max-action-error" in str(ei.value) and "\n" not in str(ei.value)
    with pytest.raises(InputError, match="--calibration"):  # no rollouts can be recorded either
        run_tune(TuneConfig(policy=pt, out=out, max_action_error=0.05))
    assert not out.exists()


def test_cli_refuses_in_one_line_before_anything_is_written(rsl: tuple[Path, Path], tmp_path: Path) -> None:
    pt, obs = rsl
    out = tmp_path / "tuned"
    cli = [sys.executable, "-m", "quarl_edge.cli", "tune", "--policy", str(pt), "--calibration", str(obs)]
    p = subprocess.run([*cli, "--out", str(out)], capture_output=True, text=True, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "--max-action-error" in lines[0], p.stderr
    assert not out.exists()
    p = subprocess.run([*cli, "--out", str(out), "--max-action-error", "nan"], capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert p.returncode == 2 and "--max-action-error" in p.stderr and "Traceback" not in p.stderr
    assert not out.exists()


@pytest.mark.parametrize("value", [math.nan, math.inf, -0.1, -math.inf])
def test_the_limit_is_finite_and_not_negative(value: float, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--max-action-error"):
        TuneConfig(policy=tmp_path, out=tmp_path / "o", max_action_error=value)


def test_a_policy_whose_env_runs_here_is_judged_by_reward(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="closed-loop reward") as ei:
        run_tune(TuneConfig(policy=CARTPOLE, out=tmp_path / "o", max_action_error=0.05))
    assert "\n" not in str(ei.value) and not (tmp_path / "o").exists()
