"""`quarl-edge study qat --suite quick` end to end on local Ray: PTQ vs QAT on CartPole PPO, 2 and 8 bits."""

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
from quarl_edge.study.qat import QATStudyConfig, markdown, summarize

pytestmark = pytest.mark.slow  # a study / workflow end to end: `make test`, not `make test-fast`


def test_quick_suite_trains_qat_and_compares_with_ptq(tmp_path: Path) -> None:
    out = tmp_path / "study"
    ray_tmp = Path(tempfile.mkdtemp(prefix="qe-ray-", dir="/tmp"))  # Ray's socket paths are length-limited
    env = dict(os.environ, RAY_TMPDIR=str(ray_tmp), PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "quarl_edge.cli", "study", "qat", "--suite", "quick", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    study = json.loads((out / "qat.json").read_text())
    got = {r["variant"]: r for r in study["results"] if r["policy"] == "cartpole-ppo"}
    for v in ("fp32", "random", "ptq2", "ptq8", "qat2", "qat8"):
        assert not got[v].get("skipped") and len(got[v]["returns"]) == 3, v
    assert study["bits"] == [2, 8] and study["findings"][0]["task"] == "cartpole-ppo"
    assert got["ptq8"]["normalized"] > 0.9  # 8-bit weights keep the fp32 zoo policy's reward
    assert "| task | bits |" in (out / "qat.md").read_text()
    assert len(list(csv.DictReader((out / "qat.csv").open()))) == len(study["results"])
    assert (out / "qat_reward_vs_bits.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    left = subprocess.run(["pgrep", "-f", str(ray_tmp)], capture_output=True, text=True)
    assert left.stdout.strip() == ""
    shutil.rmtree(ray_tmp, ignore_errors=True)


def test_missing_task_is_a_skipped_row_and_the_table_says_why() -> None:
    rows = [Row("pong-dqn", "ALE/Pong-v5", "dqn", "all", None, skipped="zoo policy missing: pong-dqn")]
    study = summarize(rows, QATStudyConfig(suite="paper"))
    assert "skipped: zoo policy missing" in markdown(study)


def test_paper_suite_lists_the_paper_tasks_and_bits() -> None:
    cfg = QATStudyConfig(suite="paper")
    assert {t.name for t in cfg.tasks} >= {
        "cartpole-ppo",
        "lunarlander-dqn",
        "pendulum-sac",
        "halfcheetah-td3",
    }
    assert cfg.bit_list == (2, 3, 4, 5, 6, 7, 8)
    by_name = {t.name: t for t in cfg.tasks}
    assert cfg.task_bits(by_name["cartpole-ppo"]) == cfg.bit_list
    assert 4 in cfg.task_bits(by_name["halfcheetah-td3"])  # the claim is about 4 bits
    assert QATStudyConfig(suite="paper", bits=(3,)).task_bits(by_name["halfcheetah-td3"]) == (3,)
    picked = QATStudyConfig(suite="paper", policies=("pendulum-sac", "cartpole-ppo"))
    assert [t.name for t in picked.tasks] == ["cartpole-ppo", "pendulum-sac"]  # the suite's order
    with pytest.raises(InputError, match="no task 'nope'"):
        QATStudyConfig(suite="paper", policies=("nope",))


def test_bad_study_options_are_user_errors() -> None:
    with pytest.raises(InputError):
        QATStudyConfig(suite="huge")
    with pytest.raises(InputError):
        QATStudyConfig(bits=(1, 8))
    with pytest.raises(InputError):
        QATStudyConfig(steps=10)


def test_a_finished_qat_training_is_reused_only_with_the_same_settings(tmp_path: Path) -> None:
    import json

    from quarl_edge.quant.config import QATConfig
    from quarl_edge.study.qat import _trained

    def want(**kw: object) -> QATConfig:
        return QATConfig(**{"bits": 4, "delay": 512, "activations": False, **kw})  # type: ignore[arg-type]

    train = {"steps": 2048, "seed": 0, "qat": {"bits": 4, "delay": 512, "activations": False}}
    (tmp_path / "policy.json").write_text(json.dumps({"spec": {"train": train}}))
    assert _trained(tmp_path, 2048, 0, want())  # a checkpoint from before scopes: scope all
    assert not _trained(tmp_path, 2048, 0, want(activations=True))  # weight-only is another training
    assert not _trained(tmp_path, 2048, 0, want(bits=3))
    assert not _trained(tmp_path, 2048, 0, want(scope="actor"))  # actor-only QAT is another training
    assert not _trained(tmp_path, 4096, 0, want())  # too short
    assert not _trained(tmp_path / "missing", 2048, 0, want())
    train["qat"]["scope"] = "actor"
    (tmp_path / "policy.json").write_text(json.dumps({"spec": {"train": train}}))
    assert _trained(tmp_path, 2048, 0, want(scope="actor")) and not _trained(tmp_path, 2048, 0, want())


def test_qat_scope_names_its_runs_and_the_table_says_which_layers() -> None:
    from quarl_edge.study.qat import run_name

    assert run_name("pendulum-sac", 4, True, "all") == "pendulum-sac-qat4"  # the earlier studies' folders
    assert run_name("pendulum-sac", 4, False, "actor") == "pendulum-sac-qat4-weights-actor"
    study = summarize([], QATStudyConfig(suite="paper", scope="actor"))
    assert study.qat_scope == "actor" and "critics and value heads fp32" in markdown(study)
    with pytest.raises(InputError, match="unknown --qat-scope 'critic'"):
        QATStudyConfig(scope="critic")
