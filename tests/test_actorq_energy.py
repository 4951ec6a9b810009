"""ActorQ energy accounting: the RAPL reader on a folder laid out like /sys/class/powercap."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from quarl_edge.actorq.energy import WATTS_PER_BUSY_CORE, EnergyMeter, rapl_delta_j, read_rapl
from quarl_edge.actorq.result import ActorQStudy, CurvePoint, Energy, RunSummary, Throughput
from quarl_edge.study.actorq import Suite, Task, _rows, energy_note, table_rows, time_to_target


def _zone(root: Path, name: str, energy_uj: int, span_uj: int = 262_143_328_850) -> None:
    zone = root / name
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{span_uj}\n")
    (zone / "name").write_text("package-0\n")


def test_rapl_reader_sums_packages_and_recovers_a_wrap(tmp_path: Path) -> None:
    span = 1_000_000_000  # 1 kJ
    _zone(tmp_path, "intel-rapl:0", 999_000_000, span)  # 1 J before its wrap
    _zone(tmp_path, "intel-rapl:1", 5_000_000, span)
    _zone(tmp_path, "intel-rapl:0:0", 123, span)  # a subzone of package 0: counted in it already
    before = read_rapl(tmp_path)
    assert before == {"intel-rapl:0": (999_000_000, span), "intel-rapl:1": (5_000_000, span)}
    _zone(tmp_path, "intel-rapl:0", 2_000_000, span)  # wrapped: 1 J + 2 J
    _zone(tmp_path, "intel-rapl:1", 9_500_000, span)  # 4.5 J
    _zone(tmp_path, "intel-rapl:0:0", 999_999, span)
    after = read_rapl(tmp_path)
    assert after is not None and rapl_delta_j(before, after) == pytest.approx(3.0 + 4.5)


def test_meter_accumulates_across_samples_and_names_its_source(tmp_path: Path) -> None:
    span = 10_000_000  # 10 J: wraps often, each sample sees at most one wrap
    _zone(tmp_path, "intel-rapl:0", 8_000_000, span)
    meter = EnergyMeter(tmp_path)
    assert meter.source == "rapl"
    for energy in (1_000_000, 9_000_000, 3_000_000):  # +3 J (wrap), +8 J, +4 J (wrap)
        _zone(tmp_path, "intel-rapl:0", energy, span)
        meter.joules(cpu_s=0.0)
    report = meter.report({"learner": 1.0, "actor0": 2.0}, wall_s=4.0)
    assert report.source == "rapl" and report.joules == pytest.approx(15.0)
    assert report.assumption is None and report.cpu_s_total == 3.0


def test_without_readable_rapl_the_estimate_states_its_assumption(tmp_path: Path) -> None:
    assert read_rapl(tmp_path) is None  # no zones (a VM)
    _zone(tmp_path, "intel-rapl:0", 1)
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("")  # unreadable/garbled counter
    assert read_rapl(tmp_path) is None
    meter = EnergyMeter(tmp_path)
    report = meter.report({"learner": 2.0, "actor0": 1.0, "actor1": 1.0}, wall_s=3.0)
    assert report.source == "estimate" and report.joules == pytest.approx(4.0 * WATTS_PER_BUSY_CORE)
    assert f"{WATTS_PER_BUSY_CORE:g} W per busy core" in str(report.assumption)


def _run(precision: str, seed: int, seconds: float, joules: float, cpu_per_s: float) -> RunSummary:
    curve = [CurvePoint(wall_s=t, env_steps=int(10 * t), ret=r, length=1, actor=0,
                        energy_j=t * cpu_per_s * WATTS_PER_BUSY_CORE)
             for t, r in ((seconds / 2, 10.0), (seconds, 100.0))]  # fmt: skip
    energy = Energy(source="estimate", joules=joules, wall_s=seconds, cpu_s={"learner": 1.0}, cpu_s_total=1.0,
                    assumption="assumed 5 W", scope="test")  # fmt: skip
    return RunSummary(task="T d4pg 8", env="T", algo="d4pg", hidden=(8,), seed=seed, update_period=100,
                      precision=precision, final_return=100.0, time_to_target_s=time_to_target(curve, 50.0),
                      energy_to_target_j=time_to_target(curve, 50.0, "energy_j"), energy=energy, target=50.0,
                      run_s=seconds, env_steps=200, payload_bytes={}, learner_share={}, actor_s_per_1k_steps={},
                      inference_throughput=Throughput(calls_per_s={"fp32": 1.0}, calls=1), curve=())  # fmt: skip


def test_study_reports_fp32_over_int8_energy_to_target() -> None:
    task = Task("T", "d4pg", 100, 50.0, (8,), seeds=(0, 1), precisions=("fp32", "int8"))
    # int8 reaches the target in half the time on the same 3 busy cores: half the energy
    runs = [_run("fp32", s, 20.0, 500.0, 3.0) for s in (0, 1)] + [
        _run("int8", s, 10.0, 300.0, 3.0) for s in (0, 1)
    ]
    rows = {r.precision: r for r in _rows(runs, Suite(tasks=(task,)))}
    assert rows["fp32"].energy_to_target_j == pytest.approx(20.0 * 3.0 * WATTS_PER_BUSY_CORE)
    assert rows["int8"].energy_ratio_fp32 == pytest.approx(2.0)
    assert rows["fp32"].energy_ratio_fp32 == pytest.approx(1.0) and rows["int8"].energy_source == "estimate"
    table = table_rows(ActorQStudy(suite="t", config={}, runs=tuple(runs), rows=tuple(rows.values())))
    assert table[1][-2:] == ["150", "2.00x"] and table[1][2] == "0,1"  # the seeds behind the row
    assert "estimate" in energy_note(runs) and "assumed 5 W" in energy_note(runs)
    assert "not recorded" in energy_note([dataclasses.replace(runs[0], energy=None)])
