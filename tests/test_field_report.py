"""`field report`: the deployed model against the bundle's fp32 on logged field observations, on a
continuous policy (Pendulum) whose sensor is pushed out of the calibration range and a discrete one (Pong);
the report typed and validated where it is read; logs that are not of the bundle refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import _export_shipped, assert_discriminating, assert_one_error

from quarl_edge.field.calibration import calibration_trace, field_trace
from quarl_edge.field.render import load_field_report, write_field_report
from quarl_edge.field.report import FieldReport, field_report
from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.trace import load_trace


def log_pushed_out(bundle: Path, log_dir: Path, n: int = 120, every: int = 3) -> np.ndarray:
    """Log the int8 model on recorded Pendulum observations, every ``every``-th with its angular velocity
    pushed past the calibration range by a bias of the range's own size (not a number fixed here)."""
    obs = load_trace(bundle / "trace.npz").obs[:n].astype(np.float32).copy()
    rng = load_manifest(bundle, verify=False).calibration["range"]
    span = rng["high"][2] - rng["low"][2]
    obs[::every, 2] += np.float32(0.75 * span)
    with load_policy(bundle, model="onnx-int8", log_dir=log_dir) as policy:
        for o in obs:
            policy.act(o)
    return obs


def test_out_of_range_records_show_the_agreement_drop(pendulum_bundle: Path, tmp_path: Path) -> None:
    obs = log_pushed_out(pendulum_bundle, tmp_path / "log")
    r = field_report(tmp_path / "log", pendulum_bundle)
    assert (r.model, r.reference, r.records, r.compared, r.replay) == (
        "onnx-int8",
        "onnx-fp32",
        120,
        120,
        False,
    )
    assert r.out_of_range_rate == pytest.approx(40 / 120) == r.logged_out_of_range_rate
    assert r.out_of_range_features[2] == pytest.approx(40 / 120)
    assert r.agreement_in_range is not None and r.agreement_out_of_range is not None
    assert (
        r.agreement_out_of_range < r.agreement_in_range
    )  # int8 departs from fp32 where it was not calibrated
    fp32 = load_policy(pendulum_bundle, model="onnx-fp32")
    int8 = load_policy(pendulum_bundle, model="onnx-int8")
    err = np.abs(np.stack([int8.act(o) for o in obs]) - np.stack([fp32.act(o) for o in obs])).max(axis=1)
    assert r.action_error_max == pytest.approx(float(err.max()), rel=1e-6)
    assert r.action_error == pytest.approx(float(np.percentile(err, 99)), rel=1e-6)
    assert r.logged_vs_replayed == 0.0  # the same model here as in the loop
    assert r.latency is not None and r.latency.count == 120 and len(r.over_time) == 20
    # the fp32 model against itself agrees exactly: the comparison is not constant
    same = field_report(tmp_path / "log", pendulum_bundle, model="onnx-fp32")
    assert same.agreement == 1.0 and same.action_error_max == 0.0


def test_a_discrete_frame_stacked_policy(
    pong_rt_bundle: Path, zoo_pong: tuple[Path, Path], tmp_path: Path
) -> None:
    """Pong (uint8 frame stacks, 6 actions) against an fp32 export of the same policy: the report replays
    the logged stacks, compares actions, and counts nothing out of range on frames inside 0-255."""
    bundle = _export_shipped(tmp_path / "pong", zoo_pong[0], zoo_pong[1], ("onnx-fp32", "onnx-int8"))
    frames = load_trace(zoo_pong[1]).obs[:48, -1]
    with load_policy(bundle, model="onnx-int8", log_dir=tmp_path / "log") as policy:
        actions = [policy.act(f) for f in frames]
    assert_discriminating(actions, 6, min_distinct=2, max_share=0.9)
    r = field_report(tmp_path / "log", bundle)
    assert r.discrete and r.records == 48 and r.logged_vs_replayed == 0.0
    assert r.action_error == pytest.approx(1.0 - r.agreement) and 0.0 <= r.action_error <= 1.0
    assert r.out_of_range_features and len(r.out_of_range_features) == 1  # one range over all pixels


def test_the_report_is_written_whole_and_validated_where_it_is_read(
    pendulum_bundle: Path, tmp_path: Path, cli: Any
) -> None:
    log_pushed_out(pendulum_bundle, tmp_path / "log", n=60)
    out = tmp_path / "rep"
    p = cli("field", "report", tmp_path / "log", "--bundle", pendulum_bundle, "--out", out)
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in out.iterdir()) == ["agreement.png", "field.json", "field.md", "latency.png",
                                                     "out_of_range.png"]  # fmt: skip
    r = load_field_report(out)
    assert r.plots == ("agreement.png", "out_of_range.png", "latency.png") and r.records == 60
    md = (out / "field.md").read_text()
    assert md.startswith("# Field report: pendulum-sac / onnx-int8 vs onnx-fp32") and "![latency.png]" in md
    data = json.loads((out / "field.json").read_text())
    for field, bad in (
        ("out_of_range_rate", 1.5),
        ("action_error", -1),
        ("records", "many"),
        ("agreement", None),
    ):
        (tmp_path / "bad.json").write_text(json.dumps({**data, field: bad}))
        with pytest.raises(InputError, match=f"is not a valid field report .*{field}"):
            load_field_report(tmp_path / "bad.json")
    (tmp_path / "bad.json").write_text(json.dumps({**data, "extra": 1}))
    with pytest.raises(InputError, match="fields differ"):
        load_field_report(tmp_path / "bad.json")
    assert FieldReport.from_dict(data) == r
    # a second report replaces the first; a folder that is not one, or inside the log, is refused
    assert cli("field", "report", tmp_path / "log", "--bundle", pendulum_bundle, "--out", out).returncode == 0
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    line = assert_one_error(
        cli("field", "report", tmp_path / "log", "--bundle", pendulum_bundle, "--out", tmp_path / "mine")
    )
    assert (
        "is not a quarl-edge field report" in line and (tmp_path / "mine" / "notes.txt").read_text() == "mine"
    )
    line = assert_one_error(
        cli("field", "report", tmp_path / "log", "--bundle", pendulum_bundle, "--out", tmp_path / "log" / "r")
    )
    assert "is inside the field log" in line


def test_a_log_of_another_bundle_or_policy_is_a_one_line_error(
    pendulum_bundle: Path, cartpole_bundle: Path, tmp_path: Path, cli: Any
) -> None:
    log_pushed_out(pendulum_bundle, tmp_path / "log", n=10)
    other = tmp_path / "copy"
    shutil.copytree(pendulum_bundle, other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["created"] = "another export"
    (other / "manifest.json").write_text(json.dumps(manifest))  # the same models: another bundle all the same
    line = assert_one_error(
        cli("field", "report", tmp_path / "log", "--bundle", other, "--out", tmp_path / "r")
    )
    assert "field log" in line and "is of pendulum-sac/onnx-int8 of the bundle with manifest sha256" in line
    assert "--replay" in line
    assert field_report(tmp_path / "log", other, replay=True).replay  # same policy: replayed
    with pytest.raises(InputError, match="is of policy pendulum-sac on Pendulum-v1"):
        field_report(tmp_path / "log", cartpole_bundle, replay=True)
    with pytest.raises(InputError, match="is not a quarl-edge field log"):
        field_report(tmp_path, pendulum_bundle)
    (tmp_path / "empty").mkdir()
    shutil.copy(tmp_path / "log" / "log.json", tmp_path / "empty" / "log.json")
    with pytest.raises(InputError, match="holds no records yet"):
        field_report(tmp_path / "empty", pendulum_bundle)


def test_field_logs_become_calibration_data(
    pendulum_bundle: Path, pendulum_calib: Path, cartpole_calib: Path, tmp_path: Path
) -> None:
    obs = log_pushed_out(pendulum_bundle, tmp_path / "log", n=30)
    t = field_trace(tmp_path / "log")
    np.testing.assert_array_equal(t.obs, obs)
    assert t.meta["source"] == "field-log" and t.meta["env_id"] == "Pendulum-v1" and t.episodes == 1
    rollouts = load_trace(pendulum_calib)
    merged = calibration_trace([pendulum_calib, tmp_path / "log"])
    assert merged.samples == rollouts.samples + 30 and merged.episodes == rollouts.episodes + 1
    np.testing.assert_array_equal(merged.obs[-30:], obs)
    assert [m["source"] for m in merged.meta["merged"]] == ["rollouts", "field-log"]
    with pytest.raises(InputError, match="the calibration sources differ"):
        calibration_trace([cartpole_calib, tmp_path / "log"])


def test_gate_on_a_field_report(pendulum_bundle: Path, tmp_path: Path, cli: Any) -> None:
    """The field thresholds decide (exit 1 over them, 0 under), JUnit and Markdown name the field checks;
    a bench threshold on a field report, a field threshold on a bench report, or none at all: one line."""
    log_pushed_out(pendulum_bundle, tmp_path / "log", n=60)
    r = write_field_report(field_report(tmp_path / "log", pendulum_bundle), tmp_path / "rep", [])
    err, oor = r.action_error, 100 * (r.out_of_range_rate or 0)
    over = cli("gate", tmp_path / "rep", "--max-action-error", f"{err / 2:.6f}", "--max-out-of-range", f"{oor + 1}%",
               "--junit", tmp_path / "g.xml", "--markdown", tmp_path / "g.md", "--json")  # fmt: skip
    assert over.returncode == 1, over.stderr
    checks = {c["name"]: c for c in json.loads(over.stdout)["checks"]}
    assert (checks["field_action_error"]["passed"], checks["field_out_of_range"]["passed"]) == (False, True)
    assert "FAIL" in over.stderr and "action error p99 vs fp32 on 60 field observations" in over.stderr
    assert 'classname="onnx-int8"' in (tmp_path / "g.xml").read_text()
    assert (tmp_path / "g.md").read_text().startswith("## quarl-edge gate: FAIL (pendulum-sac in the field)")
    under = cli("gate", tmp_path / "rep" / "field.json", "--max-action-error", f"{err + 0.01:.6f}",
                "--max-out-of-range", f"{oor + 1}%", "--min-agreement", "0.5")  # fmt: skip
    assert under.returncode == 0, under.stderr
    assert (
        cli("gate", tmp_path / "rep", "--max-out-of-range", f"{oor / 2}%").returncode == 1
    )  # the limit decides
    line = assert_one_error(
        cli("gate", tmp_path / "rep", "--max-reward-drop", "2%", "--max-action-error", "1")
    )
    assert "--max-reward-drop does not apply to a field report" in line
    assert "nothing to check on a field report" in assert_one_error(cli("gate", tmp_path / "rep"))
    for bad in ("-1", "nan"):
        assert "--max-action-error" in assert_one_error(
            cli("gate", tmp_path / "rep", "--max-action-error", bad)
        )
    assert "--max-out-of-range" in assert_one_error(
        cli("gate", tmp_path / "rep", "--max-out-of-range", "101%")
    )
