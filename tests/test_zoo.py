"""`quarl-edge zoo add/list`: a finished training becomes a zoo entry with its return and calibration."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from quarl_edge.policy.net import load_checkpoint, save_checkpoint
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.trace import load_trace
from quarl_edge.zoo import INDEX, POLICIES, add, load_zoo


@pytest.fixture
def zoo_copy(tmp_path: Path) -> Path:
    """A user zoo folder that starts as a copy of the built-in index (without its files)."""
    zoo = tmp_path / "policies"
    zoo.mkdir()
    shutil.copy(INDEX, zoo / "zoo.json")
    return zoo


def test_add_evaluates_records_and_indexes(zoo_copy: Path, tmp_path: Path) -> None:
    before = {e.name for e in load_zoo(zoo_copy)}
    entry = add(POLICIES / "cartpole-ppo", "cartpole-ppo-copy", ("quick",), zoo=zoo_copy)
    assert entry.fp32_return_mean == 500.0 and entry.fp32_episodes == 20 and entry.env == "CartPole-v1"
    assert "--algo ppo" in entry.train_command and entry.train_command.endswith("--out cartpole-ppo-copy")
    assert {e.name for e in load_zoo(zoo_copy)} == before | {"cartpole-ppo-copy"}
    copied = load_checkpoint(zoo_copy / "cartpole-ppo-copy")
    assert copied.spec.name == "cartpole-ppo-copy" and entry.path == zoo_copy / "cartpole-ppo-copy"
    trace = load_trace(zoo_copy / "calibration" / "cartpole-ppo-copy.npz")
    assert entry.calibration == zoo_copy / "calibration" / "cartpole-ppo-copy.npz"
    assert trace.obs.shape[1:] == (4,) and 0 < len(trace.obs) <= 5000
    # adding again replaces the entry instead of duplicating it
    add(POLICIES / "cartpole-ppo", "cartpole-ppo-copy", zoo=zoo_copy)
    assert [e.name for e in load_zoo(zoo_copy)].count("cartpole-ppo-copy") == 1


def test_add_refuses_a_partial_checkpoint_and_bad_names(zoo_copy: Path, tmp_path: Path) -> None:
    import dataclasses

    policy = load_checkpoint(POLICIES / "cartpole-ppo")
    policy.spec = dataclasses.replace(policy.spec, train={**policy.spec.train, "partial": True})
    save_checkpoint(policy, tmp_path / "partial")
    before = (zoo_copy / "zoo.json").read_text()
    with pytest.raises(InputError, match="not a finished"):
        add(tmp_path / "partial", "partial", zoo=zoo_copy)
    with pytest.raises(InputError, match="plain lowercase"):
        add(POLICIES / "cartpole-ppo", "Bad Name", zoo=zoo_copy)
    with pytest.raises(InputError, match="at least 20"):
        add(POLICIES / "cartpole-ppo", "few", episodes=5, zoo=zoo_copy)
    assert (zoo_copy / "zoo.json").read_text() == before and not (zoo_copy / "partial").exists()


def test_add_creates_a_new_user_zoo_and_list_reads_it(tmp_path: Path, cli: Any) -> None:
    zoo = tmp_path / "my" / "zoo"
    r = cli("zoo", "list", "--zoo", str(zoo))
    assert r.returncode == 2 and "no zoo at" in r.stderr and "zoo add --zoo" in r.stderr
    r = cli("zoo", "add", "--policy", str(POLICIES / "cartpole-ppo"), "--name", "mine", "--suite", "quick",
            "--zoo", str(zoo), "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["name"] == "mine"
    assert json.loads((zoo / "zoo.json").read_text())["format"] == "quarl-edge/zoo"
    assert (zoo / "mine" / "policy.json").is_file() and (zoo / "calibration" / "mine.npz").is_file()
    listed = json.loads(cli("zoo", "list", "--zoo", str(zoo), "--json").stdout)
    assert [(e["name"], e["present"], e["suites"]) for e in listed] == [("mine", True, ["quick"])]
    assert not any(e.name == "mine" for e in load_zoo())  # the built-in zoo is untouched
    (zoo / "zoo.json").write_text("{not json")
    r = cli("zoo", "list", "--zoo", str(zoo))
    assert r.returncode == 2 and "malformed" in r.stderr and "Traceback" not in r.stderr


def test_an_sb3_zip_joins_a_user_zoo_with_its_origin_recorded(tmp_path: Path, cli: Any) -> None:
    from stable_baselines3 import A2C

    zip_path = tmp_path / "rlzoo-a2c.zip"
    model = A2C("MlpPolicy", "CartPole-v1", seed=3, device="cpu")
    model.learn(256)
    model.save(zip_path)
    zoo = tmp_path / "zoo"
    r = cli("zoo", "add", "--policy", str(zip_path), "--name", "a2c-import", "--env", "CartPole-v1",
            "--suite", "quick", "--zoo", str(zoo), "--json")  # fmt: skip
    assert r.returncode == 0, r.stderr
    entry = json.loads(r.stdout)
    assert entry["algo"] == "a2c" and entry["env"] == "CartPole-v1" and entry["steps"] == model.num_timesteps
    assert entry["train_command"].startswith("imported from rlzoo-a2c.zip")
    assert 0 < entry["fp32_return_mean"] <= 500 and entry["fp32_episodes"] == 20
    assert load_checkpoint(zoo / "a2c-import").spec.name == "a2c-import"
    r = cli("zoo", "add", "--policy", str(tmp_path / "nope.zip"), "--name", "x", "--zoo", str(zoo))
    assert r.returncode == 2 and "does not exist" in r.stderr and not (zoo / "x").exists()


def test_zoo_list_json_says_which_files_are_present(cli: Any) -> None:
    r = cli("zoo", "list", "--json")
    assert r.returncode == 0, r.stderr
    entries = {e["name"]: e for e in json.loads(r.stdout)}
    assert entries["cartpole-ppo"]["present"] is True and entries["cartpole-ppo"]["fp32_episodes"] >= 20
