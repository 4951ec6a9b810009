"""The example CI workflow runs as written in a user's own repository: quarl-edge installed from its
wheel, the user's policy and calibration file, the `run:` steps in order, the gate passes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import yaml  # type: ignore[import-untyped]

if TYPE_CHECKING:
    from conftest import InstalledWheel

pytestmark = pytest.mark.slow  # a study / workflow end to end: `make test`, not `make test-fast`


ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / "examples" / "ci" / "quarl-edge-gate.yml"


def test_example_workflow_steps_pass_in_a_users_repository(
    tmp_path: Path, installed_wheel: InstalledWheel, pendulum_policy: Path, pendulum_calib: Path
) -> None:
    wf = yaml.safe_load(WORKFLOW.read_text())
    steps = [s for s in wf["jobs"]["gate"]["steps"] if "run" in s]
    assert [s["name"].split()[0] for s in steps] == ["install", "export", "bench", "gate"]
    assert "pip install quarl-edge" in steps[0]["run"] and "-e ." not in steps[0]["run"]
    # the user's repository: their policy and calibration file where the workflow's env says
    repo = tmp_path / "user-repo"
    shutil.copytree(pendulum_policy, repo / wf["env"]["POLICY"])
    (repo / wf["env"]["CALIBRATION"]).parent.mkdir(parents=True)
    shutil.copyfile(pendulum_calib, repo / wf["env"]["CALIBRATION"])
    (repo / ".venv").symlink_to(installed_wheel.venv)  # what the install step makes
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(wf["env"], PYTHONWARNINGS="ignore")
    for step in steps[1:]:
        proc = subprocess.run(["bash", "-ec", step["run"]], cwd=repo, capture_output=True, text=True, env=env,
                              timeout=600)  # fmt: skip
        assert proc.returncode == 0, f"{step['name']}: {proc.stderr}"
    junit = (repo / "reports" / "junit.xml").read_text()
    assert "<testcase" in junit and "<failure" not in junit
    assert "PASS" in (repo / "reports" / "gate.md").read_text()
    assert str(ROOT) not in (repo / "bundles" / "policy" / "manifest.json").read_text()
