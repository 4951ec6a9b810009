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
from quarl_edge.study._common import Row
from quarl_edge.study.ptq import StudyConfig, summarize
from quarl_edge.study.result import PTQStudy

pytestmark = pytest.mark.slow  # a study / workflow end to end: `make test`, not `make test-fast`


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
    # fidelity on recorded states: greedy-action agreement (discrete), action error % of range (continuous)
    res = {(r["policy"], r["variant"]): r for r in study["results"]}
    assert 90.0 <= res[("cartpole-ppo", "onnx-int8")]["agreement_pct"] <= 100.0
    assert res[("cartpole-ppo", "onnx-fp16")]["agreement_pct"] >= res[("cartpole-ppo", "w2")]["agreement_pct"]
    assert 0.0 <= res[("pendulum-sac", "onnx-int8")]["action_err_pct"] < 5.0
    assert res[("pendulum-sac", "w2")]["action_err_pct"] > res[("pendulum-sac", "w8")]["action_err_pct"]
    assert "agreement_pct" not in res[("cartpole-ppo", "random")]
    rows = list(csv.DictReader((out / "ptq.csv").open()))
    assert len(rows) == len(study["results"])
    assert "| policy | variant |" in (out / "ptq.md").read_text()
    for png in ("ptq_reward_vs_bits.png", "ptq_int8_drift.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Ray was shut down: no process of this run's Ray session is left
    left = subprocess.run(["pgrep", "-f", str(ray_tmp)], capture_output=True, text=True)
    assert left.stdout.strip() == ""
    shutil.rmtree(ray_tmp, ignore_errors=True)


def test_a_user_zoo_with_a_missing_file_and_an_uninstalled_env_is_studied_with_skipped_rows(
    tmp_path: Path,
) -> None:
    """`study ptq --zoo DIR` on a zoo of one's own: the broken entries become skipped rows with their
    reason, and the good policy is still studied."""
    from quarl_edge.zoo import POLICIES, add

    zoo = tmp_path / "zoo"
    add(POLICIES / "cartpole-ppo", "my-cartpole", zoo=zoo)  # suite paper, as by default
    shutil.copytree(zoo / "my-cartpole", zoo / "flappy")
    shutil.copytree(zoo / "my-cartpole", zoo / "nocalib")  # its calibration rollouts were never committed
    index = json.loads((zoo / "zoo.json").read_text())
    good = index["policies"][0]
    index["policies"] += [
        {**good, "name": "ghost"},  # indexed, but its checkpoint folder was never committed
        {**good, "name": "flappy", "env": "flappy_bird_gymnasium:FlappyBird-v0"},  # env package not installed
        {**good, "name": "nocalib"},
    ]
    (zoo / "zoo.json").write_text(json.dumps(index))
    out = tmp_path / "study"
    ray_tmp = Path(tempfile.mkdtemp(prefix="qe-ray-", dir="/tmp"))
    env = dict(os.environ, RAY_TMPDIR=str(ray_tmp), PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "quarl_edge.cli", "study", "ptq", "--zoo", str(zoo), "--episodes", "2",
           "--bits", "8", "--out", str(out), "--json"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr
    study = json.loads(proc.stdout)
    assert study["zoo"] == str(zoo)
    skipped = {r["policy"]: r["skipped"] for r in study["results"] if r.get("skipped")}
    assert skipped["ghost"] == "zoo file missing: ghost/policy.json"
    assert (
        skipped["flappy"].startswith("environment not available")
        and "flappy_bird_gymnasium" in skipped["flappy"]
    )
    mine = {r["variant"]: r for r in study["results"] if r["policy"] == "my-cartpole"}
    assert {"fp32", "w8", "onnx-int8", "tflite-int8"} <= set(mine)
    assert mine["fp32"]["returns"] == [500.0, 500.0] and mine["onnx-int8"]["drop_pct"] <= 2.0
    # a missing calibration file is not fatal: int8 is calibrated on rollouts recorded on the fly, and the
    # table says so
    nocalib = {r["variant"]: r for r in study["results"] if r["policy"] == "nocalib"}
    assert not any(r.get("skipped") for r in nocalib.values())
    assert nocalib["fp32"]["note"].startswith("zoo file missing: calibration/nocalib.npz")
    assert "note" in nocalib["onnx-int8"] and "note" not in nocalib["w8"] and "note" not in mine["onnx-int8"]
    assert "agreement_pct" not in nocalib["onnx-int8"] and nocalib["onnx-int8"]["drop_pct"] <= 2.0
    md = (out / "ptq.md").read_text()
    assert "zoo file missing: ghost/policy.json" in md and "flappy_bird_gymnasium" in md
    assert "zoo file missing: calibration/nocalib.npz" in md
    assert "calibration/nocalib.npz" in (out / "ptq.csv").read_text()
    # `study ptq --zoo` defaults to suite paper, `zoo add`'s default (above); a zoo folder without an
    # index, or with nothing in the chosen suite, is one clear error line
    for bad, msg in ((tmp_path / "nothing", "no zoo at"), (zoo, "no policy in suite quick")):
        proc = subprocess.run(cmd[:6] + [str(bad), "--suite", "quick", "--out", str(out)], capture_output=True,
                              text=True, env=env, timeout=120, cwd=tmp_path)  # fmt: skip
        assert proc.returncode == 2 and msg in proc.stderr and "Traceback" not in proc.stderr


def test_bad_study_options_are_user_errors() -> None:
    with pytest.raises(InputError):
        StudyConfig(suite="huge")
    with pytest.raises(InputError):
        StudyConfig(bits=(1, 8))


def test_an_int8_gate_failure_is_rechecked_on_fresh_seeds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A NO from the first episodes is re-run, for real, on more paired seeds and reported beside it."""
    from quarl_edge.parallel import Workers, pool
    from quarl_edge.study.ptq import _confirm, _export
    from quarl_edge.study.ptq_report import markdown
    from quarl_edge.zoo import suite

    entry = next(e for e in suite("quick") if e.name == "cartpole-ppo")
    _export(entry, tmp_path)
    # first pass as if onnx-int8 had lost reward on 3 episodes (cartpole-ppo really scores 500)
    rows = [Row("cartpole-ppo", "CartPole-v1", "ppo", "fp32", None, returns=[500.0] * 3),
            Row("cartpole-ppo", "CartPole-v1", "ppo", "onnx-int8", 8, returns=[100.0] * 3),
            Row("cartpole-ppo", "CartPole-v1", "ppo", "tflite-int8", 8, returns=[500.0] * 3)]  # fmt: skip
    cfg = StudyConfig(suite="quick", episodes=3, confirm_episodes=2)
    assert cfg.confirm_seeds == [cfg.seed + 3, cfg.seed + 4]
    with pool(Workers()) as jobs:  # in this process, as a study without --workers runs it
        conf = _confirm(rows, cfg, jobs, tmp_path, {entry.name: entry.path}, None)
    assert [(c.policy, c.variant) for c in conf] == [("cartpole-ppo", "onnx-int8")]  # only the failure
    c = conf[0]
    assert c.episodes == 5 and c.fp32_mean == 500.0
    assert c.mean == pytest.approx((3 * 100 + 2 * 500) / 5)  # the 2 fresh episodes really ran: 500 each
    assert c.keeps_reward is False
    study = summarize(rows, cfg, conf)
    finding = study.findings[0]
    assert finding.keeps_reward == {"onnx-int8": False, "tflite-int8": True}
    assert "onnx-int8" in finding.confirmed and study.confirm_episodes == 2
    # what is written reads back as the same typed study (and the committed studies load: test_study_results)
    assert PTQStudy.from_dict(json.loads(json.dumps(study.to_dict())), "ptq.json") == study
    assert "onnx-int8: NO on 3 eps, NO on 5" in markdown(study)


def test_sweet_spot_is_the_lowest_width_of_the_unbroken_run_from_8_bits() -> None:
    from quarl_edge.study.ptq import sweet_spot

    assert sweet_spot({8: True, 7: True, 6: True, 5: False, 4: True, 3: False, 2: True}) == 6  # lucky 4 and 2
    assert sweet_spot({8: False, 7: True, 4: True}) is None
    assert sweet_spot({8: True, 4: True, 2: True}) == 2
    assert sweet_spot({}) is None
