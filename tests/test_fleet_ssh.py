"""A fleet bench of a board over SSH (a real OpenSSH sshd on 127.0.0.1, tests/test_devices_ssh.py) beside
`local`: one report with both, the same episodes as a single-device bench, the gate on it; the board's
pre-flight failing stops the fleet; the link cut mid-run leaves `local` finished, the report naming the
board, every partial file kept, and --resume finishing only what the board lacked."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import test_devices_ssh as ssh_tier
from conftest import assert_one_error
from test_devices_ssh import DEV, SSHD, Env, Sshd

from quarl_edge.bench.fleet import FleetRequest, bench_fleet, partial_file
from quarl_edge.bench.run import BenchConfig, bench

pytestmark = [
    pytest.mark.ssh,
    pytest.mark.skipif(not SSHD.is_file(), reason="needs OpenSSH's sshd (apt-get install openssh-server)"),
]
# the SSH tier's fixtures: its sshd (one per module), a HOME of the test's own, the device trusted
sshd, env, trusted = ssh_tier.sshd, ssh_tier.env, ssh_tier.trusted
DEVICES = ("local", DEV)
MODELS = ["onnx-fp32", "onnx-int8"]
FLAGS = ("--episodes", "3", "--latency-samples", "50")


def model(report: dict[str, Any], dev: str, name: str) -> dict[str, Any]:
    return next(m for m in report["reports"][dev]["models"] if m["name"] == name)


def test_fleet_of_local_and_a_board_over_ssh_writes_one_report_with_both(
    cli: Any, trusted: Env, pendulum_bundle: Path, tmp_path: Path
) -> None:
    p = cli("bench", "--bundle", pendulum_bundle, "--device", f"local,{DEV}", *FLAGS, "--out", "fleet.json")
    assert p.returncode == 0, p.stderr
    out = tmp_path / "fleet.json"
    report = json.loads(out.read_text())
    assert report["format"] == "quarl-edge/fleet-report" and report["complete"] is True
    assert list(report["reports"]) == list(DEVICES)
    board = report["reports"][DEV]
    assert board["device"]["transport"] == "ssh" and board["device"]["machine"] == os.uname().machine
    assert board["harness"]["connect_s"] > 0 and report["reports"]["local"]["device"]["transport"] == "local"
    single = bench(
        pendulum_bundle, BenchConfig(episodes=3, latency_samples=50)
    ).to_dict()  # one device, same seeds
    for dev in DEVICES:
        assert report["reports"][dev]["settings"]["seeds"] == [1000, 1001, 1002]
        for name, s in zip(MODELS, single["models"], strict=True):
            per_ep = model(report, dev, name)["reward"]["per_episode"]
            assert len(set(per_ep)) == 3 and per_ep == s["reward"]["per_episode"]
    rows = report["comparison"]["rows"]
    assert [(r["model"], r["device"]) for r in rows] == [(m, d) for m in MODELS for d in DEVICES]
    assert set(report["comparison"]["fastest"]) == set(MODELS)
    md = out.with_suffix(".md").read_text()
    assert f"| onnx-int8 | {DEV} | 1 |" in md and f"## Device {DEV}\n" in md and "## Device local\n" in md
    # the terminal: one comparison table on stdout, each device's harness line on stderr
    assert "speedup vs fp32" in p.stdout and DEV in p.stdout and "local" in p.stdout
    assert f"{DEV} harness: connect" in p.stderr and "next: quarl-edge gate fleet.json" in p.stderr
    assert not list(tmp_path.glob("*.partial.json"))
    print(f"\n[fleet local + {DEV}]\n{p.stdout}")  # the comparison table, for `pytest -s`

    assert cli("gate", out).returncode == 0
    data = json.loads(out.read_text())
    model(data, DEV, "onnx-int8")["drift"]["reward_drop_pct"] = 7.5  # a model that broke on the board
    (tmp_path / "broken.json").write_text(json.dumps(data))
    junit = tmp_path / "junit.xml"
    p = cli("gate", "broken.json", "--junit", junit)
    assert p.returncode == 1, p.stderr
    assert f"FAIL {DEV}: onnx-int8: reward drop +7.50% > 2%" in p.stderr and "FAIL local" not in p.stderr
    failed = [s.get("name") for s in ET.parse(junit).getroot().iter("testsuite") if s.get("failures") != "0"]
    assert failed == [f"quarl-edge gate pendulum-sac on {DEV}"]


def test_a_board_failing_its_preflight_stops_the_fleet(
    cli: Any, trusted: Env, sshd: Sshd, pendulum_bundle: Path, tmp_path: Path
) -> None:
    trusted.device(sshd, name="nopython", python="/nonexistent/venv/bin/python")
    line = assert_one_error(cli("bench", "--bundle", pendulum_bundle, "--device", "local,nopython", *FLAGS,
                                "--out", "fleet.json"))  # fmt: skip
    assert "no Python at '/nonexistent/venv/bin/python' on nopython" in line
    assert "quarl-edge devices setup nopython" in line and "before any device measured" in line
    assert not list(tmp_path.glob("fleet*"))  # local measured nothing: not even a partial file


EPISODES = 20


def test_a_link_cut_mid_fleet_keeps_the_others_and_resume_finishes_the_board(
    cli: Any, trusted: Env, sshd: Sshd, pendulum_bundle: Path, tmp_path: Path
) -> None:
    out = tmp_path / "fleet.json"
    cfg = BenchConfig(episodes=EPISODES, latency_samples=50)
    cut: dict[str, bool] = {}

    def progress(dev: str, ev: dict[str, Any]) -> None:
        # the board's link drops as its int8 model starts its episodes (latency kept, fp32 complete):
        # Pendulum's episodes are short enough that a later cut could find them all sent already
        if dev == DEV and ev.get("event") == "measured" and ev["model"] == "onnx-int8" and not cut:
            cut["done"] = True
            sshd.cut_sessions()

    try:
        result = bench_fleet(FleetRequest(pendulum_bundle, DEVICES, cfg, out=out), progress=progress)
    finally:
        sshd.reap_stopped()
    assert cut and list(result.errors) == [DEV]
    error = result.error(out)
    assert error is not None and error.exit_code == 2
    assert f"{DEV} did not finish: the SSH link to {DEV} dropped" in str(error)
    assert f"(local finished, in {out})" in str(error) and "--resume" in str(error)
    report = json.loads(out.read_text())  # written: the finished device's section, the failed one named
    assert report["complete"] is False and list(report["reports"]) == ["local"]
    failed = report["failed"][DEV]
    assert failed["partial"] == str(partial_file(out, DEV))
    assert "missing: onnx-int8 (" in failed["error"]
    local = report["reports"]["local"]
    assert all(m["reward"]["episodes"] == EPISODES for m in local["models"])
    assert partial_file(out, "local").is_file() and partial_file(out, DEV).is_file()  # both kept
    kept = json.loads(partial_file(out, DEV).read_text())["models"]
    assert kept["onnx-fp32"]["run"] is not None and kept["onnx-int8"]["run"] is None
    assert kept["onnx-int8"]["measured"]["latency"]["count"] == 50
    assert cli("gate", out).returncode == 2  # an incomplete fleet is refused: it is no verdict

    p = cli("bench", "--bundle", pendulum_bundle, "--device", f"local,{DEV}", "--episodes", str(EPISODES),
            "--latency-samples", "50", "--out", out, "--resume", "--json")  # fmt: skip
    assert p.returncode == 0, p.stderr
    done = json.loads(p.stdout)
    assert done["complete"] is True and list(done["reports"]) == list(DEVICES) and done["failed"] == {}
    # only what was missing ran: nothing on local (its latency is the kept one), the board's int8 only
    assert done["reports"]["local"]["harness"]["runner_startup_s"] == {}
    for m in done["reports"]["local"]["models"]:
        assert m["latency"] == next(x for x in local["models"] if x["name"] == m["name"])["latency"]
    assert set(done["reports"][DEV]["harness"]["runner_startup_s"]) == {"onnx-int8"}
    for name in MODELS:  # the board's latencies are the ones measured before the cut
        assert model(done, DEV, name)["latency"] == (kept[name]["run"] or kept[name]["measured"])["latency"]
    for dev in DEVICES:
        assert all(m["reward"]["episodes"] == EPISODES for m in done["reports"][dev]["models"])
        assert (
            model(done, dev, "onnx-int8")["reward"]["per_episode"]
            == model(done, "local", "onnx-int8")["reward"]["per_episode"]
        )
    assert not partial_file(out, "local").exists() and not partial_file(out, DEV).exists()
    assert cli("gate", out).returncode == 0
