"""A fleet bench (`bench --device a,b`) without SSH: two devices on this machine (`local` and a profile
`local2` that extends it), the comparison, the Markdown, the gate on a fleet report, and every input
mistake refused in one line before any work. The SSH tier (a loopback sshd beside `local`, a link cut
mid-run and --resume) is tests/test_fleet_ssh.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FAST_BENCH, assert_one_error, interruptible

from quarl_edge.bench.fleet import FleetRequest, bench_fleet, partial_file
from quarl_edge.bench.fleet_result import FLEET_FORMAT, FleetReport
from quarl_edge.bench.partial import partial_path
from quarl_edge.bench.report import EMULATED_NOTE, comparison_rows, markdown, parse_report, read_report
from quarl_edge.bench.result import REPORT_FORMAT, ModelResult
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.gate import GateConfig, evaluate
from quarl_edge.runtimes.errors import InputError

DEVICES = ("local", "local2")
MODELS = ["onnx-fp32", "onnx-int8"]
CFG = BenchConfig(episodes=3, latency_samples=50, warmup=5)


def write_profiles(xdg: Path, text: str) -> None:
    (xdg / "quarl-edge").mkdir(parents=True, exist_ok=True)
    (xdg / "quarl-edge" / "devices.toml").write_text(text)


@pytest.fixture(scope="module")
def xdg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A second device on this machine: `local2` extends the built-in `local` profile."""
    xdg = tmp_path_factory.mktemp("xdg")
    write_profiles(xdg, '[local2]\nextends = "local"\n')
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CONFIG_HOME", str(xdg))
        yield xdg


@pytest.fixture(scope="module")
def fleet(
    xdg: Path, pendulum_bundle: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, dict[str, Any]]:
    """One fleet bench of the Pendulum bundle (returns differ by seed) on local + local2, with --out."""
    out = tmp_path_factory.mktemp("fleet") / "fleet.json"
    seen: dict[str, list[int]] = {}

    def progress(dev: str, ev: dict[str, Any]) -> None:
        if ev.get("event") == "episode":
            seen.setdefault(dev, []).append(ev["seed"])

    result = bench_fleet(FleetRequest(pendulum_bundle, DEVICES, CFG, out=out), progress=progress)
    assert result.errors == {} and result.error(out) is None
    return out, {"report": result.report, "seen": seen}


def section(report: FleetReport, dev: str, model: str) -> ModelResult:
    return report.reports[dev].model(model)


def test_a_fleet_report_holds_every_device_on_the_same_seeds(
    fleet: tuple[Path, dict[str, Any]], pendulum_bundle: Path
) -> None:
    out, run = fleet
    report: FleetReport = run["report"]
    doc = report.to_dict()
    assert doc["format"] == FLEET_FORMAT and doc["complete"] is True and doc["failed"] == {}
    assert doc["devices"] == list(DEVICES) and list(doc["reports"]) == list(DEVICES)
    assert json.loads(out.read_text()) == json.loads(json.dumps(doc))  # what was returned is on disk
    single = bench(pendulum_bundle, CFG)  # the same bench on one device
    for dev in DEVICES:
        sec = report.reports[dev]
        assert (
            doc["reports"][dev]["format"] == REPORT_FORMAT and sec.device.name == dev
        )  # a full report per device
        assert sec.device.facts["machine"] and sec.device.facts["runtimes"]["onnxruntime"]  # type: ignore[index]
        assert list(sec.settings.seeds) == CFG.seeds == list(report.settings.seeds)
        assert sorted(run["seen"][dev]) == sorted(CFG.seeds * len(MODELS))  # each model played every seed
        for m, s in zip(sec.models, single.models, strict=True):
            per_ep = m.reward.per_episode
            assert len(set(per_ep)) == CFG.episodes  # Pendulum: every seed its own return
            assert per_ep == s.reward.per_episode  # the single-device bench's, seed for seed
            assert m.agreement == s.agreement
    # the partial files are gone once the report is on disk, and nothing else was left beside it
    assert sorted(p.name for p in out.parent.iterdir()) == ["fleet.json", "fleet.md"]
    assert read_report(out) == report  # read back: the same typed report


def test_the_comparison_table_per_model_and_device(fleet: tuple[Path, dict[str, Any]]) -> None:
    out, run = fleet
    report: FleetReport = run["report"]
    doc = report.to_dict()
    rows = doc["comparison"]["rows"]
    assert [(r["model"], r["device"]) for r in rows] == [(m, d) for m in MODELS for d in DEVICES]
    for r in rows:
        m = section(report, r["device"], r["model"])
        assert m.latency is not None and (r["p50_us"], r["p99_us"]) == (m.latency.p50_us, m.latency.p99_us)
        assert r["speedup_vs_fp32"] == m.speedup_p50_vs_ref  # against that device's own fp32
        assert r["reward_mean"] == m.reward.mean and r["emulated"] is False
        if r["model"] == "onnx-fp32":
            assert r["reward_drop_pct"] is None and r["speedup_vs_fp32"] == 1.0
        else:
            assert m.drift is not None and r["reward_drop_pct"] == m.drift.reward_drop_pct
    for model in MODELS:
        group = [r for r in rows if r["model"] == model]
        best = min(group, key=lambda r: r["p50_us"])
        assert [r["device"] for r in group if r["fastest"]] == [best["device"]]
        assert doc["comparison"]["fastest"][model] == best["device"]
    md = out.with_suffix(".md").read_text()
    assert md.startswith("# quarl-edge fleet bench: pendulum-sac")
    assert (
        "| model | device | threads | p50 us | p99 us | speedup vs fp32 | reward | drop | agree | fastest |"
        in md
    )
    for model in MODELS:
        for dev in DEVICES:
            assert f"| {model} | {dev} | 1 |" in md
    assert "## Device local\n" in md and "## Device local2\n" in md  # a section per device
    assert md.count("| model | size | p50 us |") == 2 and md.count("Device facts:") == 2


def _edited(out: Path, tmp_path: Path, edit: Any) -> Path:
    data = json.loads(out.read_text())
    edit(data)
    bad = tmp_path / "edited.json"
    bad.write_text(json.dumps(data))
    return bad


def test_gate_on_a_fleet_report_passes_and_names_the_device_that_fails(
    cli: Any, fleet: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    out, _ = fleet
    p = cli("gate", out, "--json")
    assert p.returncode == 0, p.stderr
    verdict = json.loads(p.stdout)
    assert verdict["passed"] is True and list(verdict["devices"]) == list(DEVICES)
    assert all(c["model"] == "onnx-int8" for d in verdict["devices"].values() for c in d["checks"])

    def worse(d: dict[str, Any]) -> None:  # int8 loses 5% of its reward, on local2 only
        next(m for m in d["reports"]["local2"]["models"] if m["name"] == "onnx-int8")["drift"][
            "reward_drop_pct"
        ] = 5.0

    bad = _edited(out, tmp_path, worse)
    junit, md = tmp_path / "junit.xml", tmp_path / "gate.md"
    p = cli("gate", bad, "--max-reward-drop", "2%", "--junit", junit, "--markdown", md)
    assert p.returncode == 1, p.stderr
    fails = [line for line in p.stderr.splitlines() if line.startswith("FAIL")]
    assert fails == ["FAIL local2: onnx-int8: reward drop +5.00% > 2% (over by 3.00 points)"]
    suites = {s.get("name"): s for s in ET.parse(junit).getroot().iter("testsuite")}
    assert set(suites) == {"quarl-edge gate pendulum-sac on local", "quarl-edge gate pendulum-sac on local2"}
    assert suites["quarl-edge gate pendulum-sac on local2"].get("failures") == "1"
    assert suites["quarl-edge gate pendulum-sac on local"].get("failures") == "0"
    text = md.read_text()
    assert text.startswith("## quarl-edge gate: FAIL (pendulum-sac on local, local2)")
    assert "| local2 | onnx-int8 | reward_drop | 5 % | 2 % | **FAIL** |" in text
    assert "| local | onnx-int8 | reward_drop |" in text and text.count("**FAIL**") == 1


def _drop_local2(d: dict[str, Any]) -> None:
    del d["reports"]["local2"]
    d["failed"]["local2"] = {"error": "SSH link to local2 dropped", "fix": None, "partial": None}
    d["complete"] = False


def test_gate_refuses_a_fleet_report_whose_device_did_not_finish(
    cli: Any, fleet: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """An incomplete fleet report is not a verdict on the fleet: exit 2, one line naming the device."""
    incomplete = _edited(out := fleet[0], tmp_path, _drop_local2)
    assert out.is_file()
    junit = tmp_path / "junit.xml"
    line = assert_one_error(cli("gate", incomplete, "--junit", junit))
    assert "the fleet report is incomplete: local2 did not finish (SSH link to local2 dropped)" in line
    assert "--resume" in line and not junit.exists()


FLEET_DEFECTS = {
    "section-removed": (lambda d: d["reports"].pop("local2"), "device 'local2' is neither finished nor failed"),
    "complete-false": (lambda d: d.update(complete=False), "says complete: false, but no device failed"),
    "complete-true-with-a-failure": (lambda d: (_drop_local2(d), d.update(complete=True)),
                                     "says complete: true, but local2 did not finish"),
    "device-not-in-settings": (lambda d: d["settings"]["threads"].pop("local2"), "its settings name the devices"),
    "device-listed-twice": (lambda d: d.update(devices=["local", "local2", "local"]), "'local' twice"),
    "extra-section": (lambda d: d["reports"].update(rpi4=d["reports"]["local"]), "not one of its devices"),
    "section-of-another-device": (lambda d: d["reports"]["local2"]["device"].update(name="local"),
                                  "section is a report of 'local'"),
    "agreement-7-in-a-section": (lambda d: d["reports"]["local2"]["models"][1]["agreement"].update(value=7.0),
                                 "device 'local2': model onnx-int8 agreement: value is 7, outside [0, 1]"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(FLEET_DEFECTS))
def test_gate_refuses_a_fleet_report_that_is_incomplete_or_inconsistent(
    fleet: tuple[Path, dict[str, Any]], case: str
) -> None:
    """Library level, a test per case: each is refused in one line (InputError, the CLI's exit 2)."""
    edit, expect = FLEET_DEFECTS[case]
    doc = json.loads(fleet[0].read_text())
    evaluate(parse_report(doc), GateConfig())  # as written, it is gated
    edit(doc)
    with pytest.raises(InputError) as e:
        evaluate(parse_report(doc, "report 'fleet.json'"), GateConfig())
    assert expect in str(e.value) and "\n" not in str(e.value)


def test_one_gate_and_one_writer_for_one_device_and_a_fleet(fleet: tuple[Path, dict[str, Any]]) -> None:
    """A fleet of one is gated and written as one device's report always was (no device column); a fleet
    names the device of every check, in one testsuite per device."""
    from quarl_edge.gate import check_rows, junit_xml, markdown_summary, verdict_json

    report: FleetReport = fleet[1]["report"]
    one = FleetReport.of_one(report.reports["local2"])
    for r, suites, cols in ((one, ["quarl-edge gate pendulum-sac"], 5),
                            (report, [f"quarl-edge gate pendulum-sac on {d}" for d in DEVICES], 6)):  # fmt: skip
        checks = evaluate(r, GateConfig(max_p99_ms=1000.0))
        root = ET.fromstring(junit_xml(r, checks))
        assert [s.get("name") for s in root.iter("testsuite")] == suites
        assert {len(row) for row in check_rows(r, checks)} == {cols}
        assert markdown_summary(r, checks).startswith("## quarl-edge gate: PASS (pendulum-sac")
        assert verdict_json(r, checks)["passed"] is True
    assert one.to_dict() == report.reports["local2"].to_dict()  # a fleet of one is written as its report


# --- bad input: one line, exit 2, before any work, nothing written ---------------------------------------


@pytest.mark.parametrize(
    ("device", "extra", "expect"),
    [
        ("local,nope", (), "unknown device 'nope'; known devices: "),
        ("local,local2,local", (), "--device 'local,local2,local' names 'local' twice"),
        ("local,,local2", (), "has an empty name"),
        (
            "local,local2",
            ("--host", "10.0.0.9"),
            "--host would apply to every device of --device local,local2",
        ),
        ("local,local2", ("--identity", "/k"), "--identity would apply to every device"),
        ("local,local2", ("--resume",), "nothing to resume: none of "),
        ("local,local2", ("--models", "onnx-bf16"), "bundle has no model 'onnx-bf16'"),
    ],
)
def test_fleet_input_mistakes_are_one_line_before_any_work(
    cli: Any,
    xdg: Path,
    pendulum_bundle: Path,
    tmp_path: Path,
    device: str,
    extra: tuple[str, ...],
    expect: str,
) -> None:
    out = tmp_path / "reports" / "fleet.json"
    line = assert_one_error(cli("bench", "--bundle", pendulum_bundle, "--device", device, *FAST_BENCH,
                                "--out", out, *extra))  # fmt: skip
    assert expect in line
    assert not out.parent.exists() or not list(out.parent.iterdir())  # nothing written, no partial file


def test_a_fleet_refuses_outputs_that_are_not_its_own(
    cli: Any, xdg: Path, pendulum_bundle: Path, tmp_path: Path
) -> None:
    out = tmp_path / "fleet.json"
    theirs = partial_file(out, "local2")
    theirs.write_text("my notes\n")
    line = assert_one_error(cli("bench", "--bundle", pendulum_bundle, "--device", "local,local2", *FAST_BENCH,
                                "--out", out))  # fmt: skip
    assert "the partial results file of local2" in line and "exists and is not a quarl-edge" in line
    assert theirs.read_text() == "my notes\n" and not out.exists() and not partial_file(out, "local").exists()
    # a fleet of one is a bench on that device: its report is the device's own, beside --out
    one = bench_fleet(FleetRequest(pendulum_bundle, ("local2",), BenchConfig(episodes=1, latency_samples=5, warmup=1),
                                   out=tmp_path / "one.json"))  # fmt: skip
    assert (
        one.report.single is not None
        and json.loads((tmp_path / "one.json").read_text())["format"] == REPORT_FORMAT
    )
    assert not partial_path(tmp_path / "one.json").exists() and theirs.read_text() == "my notes\n"


def test_one_device_failing_its_preflight_stops_the_fleet_before_any_measurement(
    cli: Any, xdg: Path, pendulum_bundle: Path, tmp_path: Path
) -> None:
    """A board that cannot be reached (a closed port) fails its pre-flight: the fleet stops at once, in one
    line naming it, and `local`, whose pre-flight passed, measured nothing (no partial file)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends
    write_profiles(xdg, f'[local2]\nextends = "local"\n\n[deadpi]\nextends = "rpi4"\nhost = "127.0.0.1"\n'
                        f'port = {port}\nconnect_timeout = 2\n')  # fmt: skip
    out = tmp_path / "fleet.json"
    p = cli(
        "bench",
        "--bundle",
        pendulum_bundle,
        "--device",
        "local,deadpi",
        *FAST_BENCH,
        "--out",
        out,
        timeout=90,
    )
    line = assert_one_error(p)
    assert "deadpi" in line and "connection refused" in line and "before any device measured" in line
    assert sorted(tmp_path.iterdir()) == []


def test_a_single_device_bench_is_unchanged(cli: Any, xdg: Path, pendulum_bundle: Path) -> None:
    p = cli("bench", "--bundle", pendulum_bundle, "--device", "local2", *FAST_BENCH, "--json")
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["format"] == REPORT_FORMAT and report["device"]["name"] == "local2"


def test_an_emulated_device_is_labelled_and_never_the_fastest_over_a_real_one(
    fleet: tuple[Path, dict[str, Any]],
) -> None:
    doc = fleet[1]["report"].to_dict()
    doc["reports"]["local2"]["device"]["emulated"] = True
    for m in doc["reports"]["local2"]["models"]:  # qemu's time, here the fastest of the two
        m["latency"]["p50_us"] = 0.001
    report = parse_report(doc)
    rows = report.comparison()
    assert {r.device: r.emulated for r in rows} == {"local": False, "local2": True}
    assert all(r.fastest == (r.device == "local") for r in rows)
    cells = comparison_rows(report)
    assert [c[1] for c in cells] == ["local", "local2 (emulated)"] * 2
    assert EMULATED_NOTE in markdown(report)
    doc["reports"]["local"]["device"]["emulated"] = True  # no real device: the fastest emulated one
    assert [r.device for r in parse_report(doc).comparison() if r.fastest] == ["local2"] * 2
    one = FleetReport.of_one(report.reports["local2"])
    assert not any(r.fastest for r in one.comparison())  # one is no comparison


def test_ctrl_c_keeps_each_devices_finished_work_and_resume_finishes(
    cli: Any, xdg: Path, pendulum_bundle: Path, tmp_path: Path
) -> None:
    out = tmp_path / "fleet.json"
    args = ["bench", "--bundle", str(pendulum_bundle), "--device", "local,local2", "--episodes", "40",
            "--latency-samples", "20", "--out", str(out)]  # fmt: skip
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    proc = subprocess.Popen([sys.executable, "-m", "quarl_edge.cli", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        partials = [partial_file(out, d) for d in ("local", "local2")]
        while not all(_episodes_kept(p) for p in partials) and proc.poll() is None:
            assert time.monotonic() < deadline, "no episode was kept within 120 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # Ctrl-C reaches this process only: its runners go on
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert (
        lines[-1].startswith("error: interrupted; finished episodes are kept in ") and "--resume" in lines[-1]
    )
    assert all(str(p) in lines[-1] for p in partials) and not out.exists()
    kept = {p: _episodes_kept(p) for p in partials}
    p = cli("bench", *args[1:], "--resume", "--json")
    assert p.returncode == 0, p.stderr
    done = json.loads(p.stdout)
    assert done["complete"] is True and not any(x.exists() for x in partials)
    for dev, part in zip(("local", "local2"), partials, strict=True):
        section = done["reports"][dev]
        assert section["resumed"]["episodes_kept"] == kept[part] > 0
        assert all(m["reward"]["episodes"] == 40 for m in section["models"])


def _episodes_kept(path: Path) -> int:
    try:
        return sum(len(m["episodes"]) for m in json.loads(path.read_text())["models"].values())
    except (OSError, ValueError):
        return 0
