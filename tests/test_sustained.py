"""`bench --duration`: a sustained loop per model with the board's temperature, clock and throttling
flags before, during and after; "not exposed" where the board does not expose them, never a value."""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import assert_no_report, assert_one_error

from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.runtimes import thermal
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.runner import PolicyRunner, timing_batches
from quarl_edge.runtimes.sustained import parse_duration, sustained, sustained_warnings
from quarl_edge.runtimes.trace import load_trace


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_readings_from_a_pi_like_sysfs_tree(tmp_path: Path) -> None:
    """Real files laid out as a Pi 4 kernel exposes them (two zones, cores 0..11 to check the order)."""
    _write(tmp_path / "sys/class/thermal/thermal_zone0/type", "cpu-thermal\n")
    _write(tmp_path / "sys/class/thermal/thermal_zone0/temp", "48312\n")
    _write(tmp_path / "sys/class/thermal/thermal_zone1/temp", "39000\n")  # no type file: named by its folder
    _write(tmp_path / "sys/class/thermal/thermal_zone2/temp", "garbage\n")  # unreadable: left out
    for cpu in range(12):
        _write(
            tmp_path / f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq", f"{(cpu + 1) * 100000}\n"
        )
    assert thermal.temperatures(str(tmp_path)) == {"cpu-thermal": 48.3, "thermal_zone1": 39.0}
    assert thermal.frequencies(str(tmp_path)) == [100.0 * (c + 1) for c in range(12)]
    r = thermal.read(1.5, emulated=False, root=str(tmp_path))
    assert (r.t_s, r.temp_c, r.freq_mhz, r.throttled) == (1.5, {"cpu-thermal": 48.3, "thermal_zone1": 39.0},
                                                          [100.0 * (c + 1) for c in range(12)], None)  # fmt: skip
    assert thermal.read(0.0, emulated=True, root=str(tmp_path)) == thermal.ThermalReading(
        0.0, None, None, None
    )
    assert thermal.temperatures(str(tmp_path / "nothing")) is None
    assert thermal.frequencies(str(tmp_path / "nothing")) is None


def test_vcgencmd_throttled_bits() -> None:
    bits = thermal.parse_throttled("throttled=0x50005\n")
    assert bits == 0x50005
    assert thermal.throttle_flags(bits) == ["under-voltage", "throttled", "under-voltage occurred",
                                            "throttling occurred"]  # fmt: skip
    assert thermal.parse_throttled("throttled=0x0") == 0 and thermal.throttle_flags(0) == []
    assert (
        thermal.parse_throttled("error=1 error_msg=...") is None
        and thermal.parse_throttled("throttled=zz") is None
    )


def _exposed_here() -> dict[str, bool]:
    """What this machine's own /sys exposes, looked up by the test itself."""
    temps = [
        p for p in glob.glob("/sys/class/thermal/thermal_zone*/temp") if Path(p).read_text().strip().isdigit()
    ]
    return {"temperature": bool(temps),
            "clock": bool(glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq")),
            "throttling": thermal.throttled() is not None}  # fmt: skip


def test_sustained_loop_on_a_real_session(cartpole_bundle: Path) -> None:
    runner = PolicyRunner(cartpole_bundle, "onnx-int8")
    batches = timing_batches(load_trace(cartpole_bundle / "trace.npz").obs)
    s = sustained(runner.session.run, batches, 2.0, emulated=False)
    assert (
        s.duration_s == 2.0 and len(s.windows) in (2, 3) and s.calls == sum(w.calls for w in s.windows) > 100
    )
    assert len(s.readings) == len(s.windows) + 1 and s.readings[0].t_s == 0.0
    assert all(0 < w.p50_us <= w.p99_us for w in s.windows) and s.windows[-1].t_s >= 2.0
    assert s.slowdown == pytest.approx(s.last_p50_us / s.first_p50_us)
    exposed = _exposed_here()
    assert s.not_exposed == [k for k, v in exposed.items() if not v]
    assert (s.max_temp_c is None) == (not exposed["temperature"])
    assert (s.clock_drop_pct is None) == (not exposed["clock"])
    emulated = sustained(runner.session.run, batches, 0.2, emulated=True)
    assert emulated.not_exposed == ["temperature", "clock", "throttling"] and emulated.max_temp_c is None


def test_warnings_for_a_clock_drop_throttling_and_a_slowdown() -> None:
    block: dict[str, Any] = {"duration_s": 60.0, "clock_drop_pct": 35.0, "throttle_flags": ["throttled"],
                             "slowdown": 1.8, "first_p50_us": 100.0, "last_p50_us": 180.0}  # fmt: skip
    assert sustained_warnings(block) == [
        "the clock dropped 35% during the 60 s sustained loop",
        "the board throttled during the sustained loop: throttled",
        "p50 rose from 100.0 to 180.0 us (x1.80) over the 60 s sustained loop",
    ]
    calm = {**block, "clock_drop_pct": 2.0, "throttle_flags": [], "slowdown": 1.05}
    assert sustained_warnings(calm) == [] and sustained_warnings(None) == []
    assert sustained_warnings({"clock_drop_pct": "35", "throttle_flags": "x", "slowdown": [2]}) == []


def test_durations_parse_and_bad_ones_are_refused() -> None:
    assert [parse_duration(t) for t in ("60s", "2m", "1h", "90", " 1.5S ")] == [
        60.0,
        120.0,
        3600.0,
        90.0,
        1.5,
    ]
    for bad in ("0", "-1s", "abc", "25h", "nan", "inf", ""):
        with pytest.raises(InputError):
            parse_duration(bad)


def test_bench_duration_reports_the_sustained_loop(cartpole_bundle: Path, cli: Any, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    p = cli("bench", "--bundle", cartpole_bundle, "--models", "onnx-int8", "--episodes", "1",
            "--latency-samples", "50", "--duration", "1s", "--out", out)  # fmt: skip
    assert p.returncode == 0, p.stderr
    report = json.loads(out.read_text())
    assert report["settings"]["duration_s"] == 1.0
    for m in report["models"]:
        s = m["sustained"]
        assert s["duration_s"] == 1.0 and s["calls"] > 0 and len(s["readings"]) == len(s["windows"]) + 1
    md = out.with_suffix(".md").read_text()
    assert "Sustained loop (`--duration`)" in md and "onnx-int8 sustained 1.0 s:" in md
    hidden = [k for k, v in _exposed_here().items() if not v]
    if hidden:  # said, not faked
        assert f"{', '.join(hidden)} not exposed" in md and f"{', '.join(hidden)} not exposed" in p.stderr
    for bad in ("0", "-5s", "soon", "48h"):
        bad_out = tmp_path / f"bad{bad}.json"
        line = assert_one_error(
            cli("bench", "--bundle", cartpole_bundle, "--duration", bad, "--out", bad_out)
        )
        assert "--duration" in line or "not a duration" in line
        assert_no_report(bad_out)


def test_a_resumed_bench_keeps_the_sustained_loop(cartpole_bundle: Path, tmp_path: Path) -> None:
    cfg = BenchConfig(episodes=1, latency_samples=20, max_steps=10, duration_s=0.5, models=("onnx-int8",))
    partial = tmp_path / "r.partial.json"
    first = bench(cartpole_bundle, cfg, partial=partial).to_dict()
    data = json.loads(partial.read_text())
    for model in data["models"].values():  # as if the link dropped before the episodes finished
        model["run"], model["episodes"] = None, []
    partial.write_text(json.dumps(data))
    again = bench(
        cartpole_bundle, cfg, partial=partial, resume=True
    ).to_dict()  # the episodes again, nothing else
    assert [m["sustained"] for m in again["models"]] == [m["sustained"] for m in first["models"]]
    assert np.all([m["reward"]["per_episode"] == [10.0] for m in again["models"]])
