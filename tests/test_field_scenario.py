"""The field closes the loop, end to end, on a board over SSH (a real OpenSSH sshd on 127.0.0.1): a
Pendulum int8 policy runs in the loop runner there on an env whose angular-velocity sensor reads with a
bias past the calibration range (the bias is computed from the bundle's own range, not fixed here) and
noise, telemetry on; `field pull` brings the log back; `field report` shows the out-of-range rate and the
agreement drop against fp32; `export --calibration` with the field log re-exports the bundle; the re-export,
replayed on the same observations, agrees with fp32 again; `gate` on the field report fails before and
passes after."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import test_devices_ssh as ssh_tier
from conftest import ROOT
from test_devices_ssh import DEV, SSHD, Env

from quarl_edge.devices.field import pull
from quarl_edge.devices.profiles import load_profile
from quarl_edge.devices.ssh import SSHConnection, sh
from quarl_edge.field.report import field_report
from quarl_edge.runtimes.manifest import load_manifest

pytestmark = [
    pytest.mark.ssh,
    pytest.mark.slow,
    pytest.mark.skipif(not SSHD.is_file(), reason="needs OpenSSH's sshd (apt-get install openssh-server)"),
]
sshd, env, trusted = ssh_tier.sshd, ssh_tier.env, ssh_tier.trusted
EXAMPLE = ROOT / "examples" / "control_loop.py"
MAX_ACTION_ERROR = "0.3"
"""torque (Pendulum's actions are -2..2): int8 in range stays under it at p99, out of range it does not"""


def test_a_biased_sensor_is_seen_recalibrated_and_gated(
    trusted: Env, pendulum_bundle: Path, pendulum_policy: Path, pendulum_calib: Path, cli: Any, tmp_path: Path
) -> None:
    high = load_manifest(pendulum_bundle, verify=False).calibration["range"]["high"][2]
    bias = f"2={1.25 * high:.3f}"  # the angular velocity reads a quarter past the calibrated range's edge
    board = tmp_path / "board"
    with SSHConnection(load_profile(DEV)) as ssh:
        r = ssh.run(sh(sys.executable, EXAMPLE, pendulum_bundle, "--model", "onnx-int8", "--hz", "200", "--steps",
                       "800", "--sensor-bias", bias, "--sensor-noise", "0.1", "--log-dir", board / "pendulum-1",
                       "--json"), timeout=600)  # fmt: skip
    assert r.exit_status == 0, r.stderr[-3000:]
    loop = json.loads(r.stdout.splitlines()[-1])
    assert loop["steps"] == 800 and loop["log"]["records"] == 800 and loop["out_of_range"] > 400
    (got,) = pull(DEV, tmp_path / "pulled", str(board)).logs
    logs = Path(got.local)

    before = field_report(logs, pendulum_bundle)
    assert before.out_of_range_rate is not None and before.out_of_range_rate > 0.5
    assert before.out_of_range_features[2] > 0.5  # the biased feature
    assert before.agreement_in_range is not None and before.agreement_out_of_range is not None
    assert before.agreement_out_of_range < before.agreement_in_range
    assert before.action_error > float(MAX_ACTION_ERROR)

    # re-export on what the robot saw, merged with the recorded rollouts
    new = tmp_path / "recalibrated"
    p = cli("export", "--policy", pendulum_policy, "--calibration", pendulum_calib, "--calibration", logs,
            "--to", "onnx-fp32,onnx-int8", "--out", new)  # fmt: skip
    assert p.returncode == 0, p.stderr
    calib = load_manifest(new, verify=False).calibration
    assert calib["range"]["high"][2] > high + 0.5 * (1.25 * high - high)  # the range now covers the field
    after = field_report(logs, new, replay=True)
    assert after.replay and after.compared == before.compared
    assert after.out_of_range_rate is not None and after.out_of_range_rate < 0.05
    assert after.action_error < before.action_error and after.agreement > before.agreement
    assert after.action_error < float(MAX_ACTION_ERROR)

    # the gate: the deployed bundle fails on the field, the re-export passes on the same observations
    for name, r_, bundle, flags, want in (("before", before, pendulum_bundle, [], 1),
                                          ("after", after, new, ["--replay"], 0)):  # fmt: skip
        out = tmp_path / f"report-{name}"
        p = cli("field", "report", logs, "--bundle", bundle, *flags, "--out", out)
        assert p.returncode == 0, p.stderr
        g = cli("gate", out, "--max-action-error", MAX_ACTION_ERROR, "--max-out-of-range", "5%", "--json")
        assert g.returncode == want, g.stdout + g.stderr
        checks = {c["name"]: c for c in json.loads(g.stdout)["checks"]}
        assert checks["field_action_error"]["value"] == pytest.approx(r_.action_error)
        assert checks["field_out_of_range"]["value"] == pytest.approx(100 * r_.out_of_range_rate)  # in %
    print(f"\n[field scenario] bias {bias}: out of range {before.out_of_range_rate:.1%} -> {after.out_of_range_rate:.1%}, "
          f"agreement {before.agreement:.4f} (in {before.agreement_in_range:.4f} / out {before.agreement_out_of_range:.4f}) "
          f"-> {after.agreement:.4f}, action error p99 {before.action_error:.3f} -> {after.action_error:.3f}")  # fmt: skip
