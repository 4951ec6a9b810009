"""A tune stopped with Ctrl-C (SIGINT to the real CLI process) leaves its finished measurements in the
cache and nothing half-written in --out; the rerun finishes without measuring them again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import interruptible

from quarl_edge.tune.search import TuneConfig, run_tune

pytestmark = pytest.mark.slow  # one interrupted tune and one finished: ~1 min


def _measurements(state: Path) -> dict[str, dict[str, object]]:
    data = json.loads(state.read_text())
    return {stage: data.get(stage) or {} for stage in ("layers", "screen", "latency", "closed", "confirm")}


def test_an_interrupted_tune_resumes_without_remeasuring(
    cartpole_policy: Path, cartpole_calib: Path, tmp_path: Path
) -> None:
    out = tmp_path / "tuned"
    args = ["--policy", cartpole_policy, "--calibration", cartpole_calib, "--out", out, "--episodes", "4",
            "--budget-min", "5", "--max-threads", "1"]  # fmt: skip
    cmd = [sys.executable, "-m", "quarl_edge.cli", "tune", *map(str, args)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONWARNINGS="ignore"), preexec_fn=interruptible)  # fmt: skip
    state = out / ".cache" / "state.json"
    deadline = time.monotonic() + 300
    try:
        # wait until the device stage has measured the models (latency) but the closed loop is not done
        while time.monotonic() < deadline and proc.poll() is None:
            if state.is_file() and _measurements(state)["latency"]:
                break
            time.sleep(0.2)
        assert proc.poll() is None, (
            f"tune ended before it could be interrupted: {proc.communicate()[1][-500:]}"
        )
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-800:]
    assert err.strip().splitlines()[-1] == "error: interrupted"
    # nothing half-written: the outputs appear only when the search is done
    assert (
        not (out / "tune.json").exists() and not (out / "tune.md").exists() and not (out / "bundle").exists()
    )
    before = _measurements(state)
    done = sum(len(v) for v in before.values())
    assert before["latency"] and done > 0

    cfg = TuneConfig(policy=cartpole_policy, out=out, calibration=cartpole_calib, episodes=4, budget_min=5,
                     max_threads=1)  # fmt: skip
    result = run_tune(cfg)
    assert result.reused_measurements == done and result.choice is not None
    after = _measurements(state)
    # every measurement finished before Ctrl-C is kept as it was (a re-measured latency would differ)
    for stage, entries in before.items():
        for name, value in entries.items():
            assert after[stage][name] == value, f"{stage}/{name} was measured again"
    assert (out / "tune.json").is_file() and (out / "bundle" / "manifest.json").is_file()
