"""Latency as the loop sees it: `bench --hz` paces the closed-loop episodes at the rate in the loop runner
(runtimes.loop.Pace: real idle time between steps, the warm-up before every other step), times act()
there, reports the steps with and without the warm-up side by side and counts those over the period's
budget; `gate --max-miss-rate` gates on that share. A deliberately slow model (three 2048-wide layers) at
an absurd rate must miss (and overrun every period, skipping rather than bursting), the shipped CartPole
policy at 50 Hz must not."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import assert_no_report, assert_one_error

from quarl_edge.bench.report import write_report
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.policy.net import NetArch, build_policy, load_checkpoint
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.inloop import in_loop_stats
from quarl_edge.runtimes.realtime import SETTINGS

ABSURD_HZ = 100_000  # a 10 us budget: one 2048x2048 layer alone takes far longer on any CPU
GENEROUS_HZ = 50  # a 20 ms budget: the CartPole MLP takes microseconds; the margin is for a loaded CI host
IN_LOOP_KEYS = ("hz", "budget_us", "steps", "over_budget", "miss_rate", "p50_us", "p99_us", "p999_us",
                "max_us", "mean_us", "first_call_ms", "paced", "overruns", "no_warmup_steps",
                "no_warmup_p50_us", "no_warmup_p99_us", "no_warmup_miss_rate", "os_settings")  # fmt: skip


def test_in_loop_stats_count_steps_over_the_budget() -> None:
    s = in_loop_stats([[5_000, 10_000], None, [], [30_000, 20_001]], hz=100_000, first_call_ms=1.5)
    assert s is not None
    assert (s.steps, s.over_budget, s.budget_us, s.max_us) == (4, 2, 10.0, 30.0)  # 10 us exactly: on time
    assert s.miss_rate == 0.5 and s.first_call_ms == 1.5 and s.p50_us == pytest.approx(15.0005)
    assert in_loop_stats([None, []], hz=50) is None
    s = in_loop_stats([[5_000, 50_000], [6_000, 70_000]], hz=50, warmed=[[True, False], [True, False]],
                      overruns=1, os_settings=("affinity",))  # fmt: skip
    assert s is not None and s.paced and (s.steps, s.no_warmup_steps, s.overruns) == (2, 2, 1)
    assert (s.p50_us, s.no_warmup_p50_us, s.os_settings) == (5.5, 60.0, ("affinity",))
    for bad in (0, -5, float("nan"), float("inf")):
        with pytest.raises(InputError, match="--hz must be a control rate"):
            BenchConfig(hz=bad)


@pytest.fixture(scope="module")
def slow_bundle(
    tmp_path_factory: pytest.TempPathFactory, cartpole_policy: Path, cartpole_calib: Path
) -> Path:
    """A CartPole MLP of three 2048-wide layers (random init), fp32 + int8, through the normal export."""
    spec = load_checkpoint(cartpole_policy).spec
    arch = NetArch(model="mlp", hidden=(2048, 2048, 2048), activation="tanh", out_dim=2, head="argmax")
    spec = dataclasses.replace(spec, name="cartpole-slow", graph_steps=arch.graph_steps())
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("slow") / "bundle"
    export_bundle(build_policy(spec, arch), BundleRequest(out=out, targets=("onnx-fp32", "onnx-int8"),
                                                         calibration=cartpole_calib))  # fmt: skip
    return out


def gate_json(cli: Any, report: Path, *args: str) -> tuple[int, dict[str, Any]]:
    p = cli("gate", report, "--max-reward-drop", "1000%", *args, "--json")
    return p.returncode, json.loads(p.stdout)


def test_a_slow_model_at_an_absurd_rate_misses_and_fails_the_gate(
    slow_bundle: Path, cli: Any, tmp_path: Path
) -> None:
    cfg = BenchConfig(episodes=2, latency_samples=20, max_steps=15, hz=ABSURD_HZ)
    typed = bench(slow_bundle, cfg)
    report = typed.to_dict()
    assert report["settings"]["hz"] == ABSURD_HZ
    for m in report["models"]:
        loop = m["in_loop"]
        assert set(IN_LOOP_KEYS) <= set(loop), m["name"]
        steps = sum(int(r) for r in m["reward"]["per_episode"])  # CartPole pays 1 per step
        assert (
            loop["paced"] and loop["steps"] + loop["no_warmup_steps"] == steps and loop["budget_us"] == 10.0
        )
        assert loop["over_budget"] > 0 and loop["miss_rate"] > 0, loop
        assert loop["overruns"] >= steps - 2  # every period overran (the runner skipped to the next one)
        assert loop["p50_us"] <= loop["p99_us"] <= loop["p999_us"] <= loop["max_us"]
        assert loop["first_call_ms"] == m["first_inference_ms"] > 0
    path, md = write_report(typed, tmp_path / "slow.json")
    text = md.read_text()
    assert "| loop p50 us | loop p99 us | loop max us | no warm-up p50 / p99 us | miss |" in text
    assert "paced at 100000 Hz in the loop runner" in text and "over the 10.0 us budget" in text
    assert "overran the period" in text and "First call after load: onnx-fp32" in text
    code, out = gate_json(cli, path, "--max-miss-rate", "1%")
    assert code == 1
    failed = {(c["model"], c["name"]) for c in out["checks"] if not c["passed"]}
    assert failed == {("onnx-fp32", "deadline_miss_rate"), ("onnx-int8", "deadline_miss_rate")}
    assert cli("gate", path, "--max-miss-rate", "100%").returncode == 0  # the limit is what decides


def test_a_tiny_model_at_a_generous_rate_passes(cartpole_bundle: Path, cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "tiny.json"
    p = cli("bench", "--bundle", cartpole_bundle, "--episodes", "2", "--latency-samples", "50",
            "--max-steps", "100", "--hz", str(GENEROUS_HZ), "--out", out)  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert "--max-miss-rate 1%" in p.stderr  # the next command it suggests
    report = json.loads(out.read_text())
    unpaced = bench(cartpole_bundle, BenchConfig(episodes=2, latency_samples=20, max_steps=100)).to_dict()
    for m, u in zip(report["models"], unpaced["models"], strict=True):
        loop = m["in_loop"]
        assert (
            loop["paced"] and loop["steps"] + loop["no_warmup_steps"] == 200 and loop["over_budget"] == 0
        ), loop
        assert loop["steps"] >= 50 and loop["no_warmup_steps"] >= 50 and loop["no_warmup_p50_us"] > 0
        # the runner's settings reach the report (a frozen GC needs no privilege: always applied on CPython)
        assert (
            loop["overruns"] == 0
            and "gc_freeze" in loop["os_settings"]
            and set(loop["os_settings"]) <= set(SETTINGS)
        )
        assert m["reward"]["per_episode"] == u["reward"]["per_episode"]  # pacing changes when, not what
    code, result = gate_json(cli, out, "--max-miss-rate", "1%")
    assert code == 0 and result["passed"]
    assert [c["value"] for c in result["checks"] if c["name"] == "deadline_miss_rate"] == [0.0, 0.0, 0.0]


def test_a_resumed_bench_counts_the_kept_episodes(cartpole_bundle: Path, tmp_path: Path) -> None:
    cfg = BenchConfig(episodes=2, latency_samples=20, max_steps=30, hz=50, models=("onnx-int8",))
    partial = tmp_path / "r.partial.json"
    first = bench(cartpole_bundle, cfg, partial=partial)
    kept = json.loads(partial.read_text())["models"]["onnx-int8"]["episodes"]
    assert [len(e["act_ns"]) for e in kept] == [30, 30]
    again = bench(cartpole_bundle, cfg, partial=partial, resume=True)  # nothing left: all from the file
    assert [m.in_loop for m in again.models] == [m.in_loop for m in first.models]
    data = json.loads(partial.read_text())
    data["models"]["onnx-int8"]["episodes"][0]["act_ns"] = ["x"]
    partial.write_text(json.dumps(data))
    with pytest.raises(InputError, match="act_ns holds something other than nanosecond counts"):
        bench(cartpole_bundle, cfg, partial=partial, resume=True)


def test_gate_without_in_loop_data_and_bad_rates_are_one_line_errors(
    cartpole_bundle: Path, cli: Any, tmp_path: Path
) -> None:
    path, _ = write_report(
        bench(cartpole_bundle, BenchConfig(episodes=1, latency_samples=20)), tmp_path / "r.json"
    )
    line = assert_one_error(cli("gate", path, "--max-miss-rate", "1%"))
    assert "no in-loop latency" in line and "quarl-edge bench --bundle B --hz 50" in line
    for bad in ("101%", "-1%", "nan"):
        assert_one_error(cli("gate", path, "--max-miss-rate", bad))
    line = assert_one_error(cli("gate", path, "--max-out-of-range", "5%"))
    assert "--max-out-of-range does not apply to a bench report" in line and "field report" in line
    for rate in ("0", "-50", "nan", "inf"):
        out = tmp_path / f"hz{rate}.json"
        line = assert_one_error(cli("bench", "--bundle", cartpole_bundle, "--hz", rate, "--out", out))
        assert "--hz must be a control rate" in line and "e.g. --hz 50" in line
        assert_no_report(out)
