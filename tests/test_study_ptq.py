"""`quarl-edge study ptq --suite quick` end to end on local Ray (the CI tier of the PTQ study)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from quarl_edge.runtimes.errors import InputError
from quarl_edge.study.ptq import Row, StudyConfig, summarize


def test_quick_suite_writes_tables_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "study"
    ray_tmp = Path(
        tempfile.mkdtemp(prefix="qe-ray-", dir="/tmp")
    )  # short: Ray's socket paths are length-limited
    env = dict(os.environ, RAY_TMPDIR=str(ray_tmp), PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "quarl_edge.cli", "study", "ptq", "--suite", "quick", "--episodes", "3",
           "--bits", "2,8", "--out", str(out)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    study = json.loads((out / "ptq.json").read_text())
    variants = {(r["policy"], r["variant"]) for r in study["results"] if not r.get("skipped")}
    for policy in ("cartpole-ppo", "pendulum-sac"):
        for v in ("fp32", "random", "w2", "w8", "onnx-fp16", "onnx-int8"):
            assert (policy, v) in variants
    for r in study["results"]:
        if not r.get("skipped"):
            assert r["episodes"] == 3 and len(r["returns"]) == 3
    # int8 ONNX keeps the reward of these two policies; 8-bit weights too
    drops = {(r["policy"], r["variant"]): r.get("drop_pct") for r in study["results"]}
    assert drops[("cartpole-ppo", "onnx-int8")] <= 2.0 and drops[("pendulum-sac", "onnx-int8")] <= 2.0
    assert drops[("cartpole-ppo", "w8")] <= 2.0
    rows = list(csv.DictReader((out / "ptq.csv").open()))
    assert len(rows) == len(study["results"])
    assert "| policy | variant |" in (out / "ptq.md").read_text()
    for png in ("ptq_reward_vs_bits.png", "ptq_int8_drift.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Ray was shut down: no process of this run's Ray session is left
    left = subprocess.run(["pgrep", "-f", str(ray_tmp)], capture_output=True, text=True)
    assert left.stdout.strip() == ""
    shutil.rmtree(ray_tmp, ignore_errors=True)


def test_missing_zoo_file_is_skipped_with_reason() -> None:
    rows = [Row("ghost", "CartPole-v1", "ppo", "all", None, skipped="zoo file missing: ghost/policy.json")]
    study = summarize(rows, StudyConfig())
    assert study["results"][0]["skipped"].startswith("zoo file missing")


def test_bad_study_options_are_user_errors() -> None:
    with pytest.raises(InputError):
        StudyConfig(suite="huge")
    with pytest.raises(InputError):
        StudyConfig(bits=(1, 8))
