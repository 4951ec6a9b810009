"""The example CI workflow runs as written: its `run:` steps, executed in order, pass the gate."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import yaml  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / "examples" / "ci" / "quarl-edge-gate.yml"


def test_example_workflow_steps_pass(tmp_path: Path) -> None:
    wf = yaml.safe_load(WORKFLOW.read_text())
    steps = [s for s in wf["jobs"]["gate"]["steps"] if "run" in s and s.get("name") != "install"]
    assert [s["name"].split()[0] for s in steps] == ["export", "bench", "gate"]
    exe = Path(sys.executable).parent / "quarl-edge"
    for link in ("quarl_edge", "calibration_data"):
        (tmp_path / link).symlink_to(ROOT / link)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    for step in steps:
        argv = shlex.split(step["run"].replace("\n", " "))
        assert argv[0] == ".venv/bin/quarl-edge"
        proc = subprocess.run(
            [str(exe), *argv[1:]], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600
        )
        assert proc.returncode == 0, f"{step['name']}: {proc.stderr}"
    junit = (tmp_path / "reports" / "junit.xml").read_text()
    assert "<testcase" in junit and "<failure" not in junit
    assert "PASS" in (tmp_path / "reports" / "gate.md").read_text()
