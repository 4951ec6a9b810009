"""tune where the policy's environment cannot run here (an rsl_rl checkpoint from Isaac Lab and a robot's
recorded observations): each candidate is judged by its action error against fp32 on those observations,
replayed on the device (a recurrent policy's state carried over each episode), and the fastest within
--max-action-error is chosen; the reward is not measured, never estimated, and `gate tune.json
--max-action-error X` passes for the choice. The same for an ONNX policy from another framework with
its io.yaml (`--io`): ONNX candidates only, and the io.yaml's and the graph's bytes key the cache."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from test_onnx_io import make_isaac
from test_rsl_rl import _checkpoint, _observations
from torch import nn

from quarl_edge.bench.report import read_report
from quarl_edge.gate import GateConfig, evaluate
from quarl_edge.policy.load import load_policy
from quarl_edge.runtimes.errors import InputError
from quarl_edge.tune.cache import policy_sha256
from quarl_edge.tune.candidates import IMPORTED
from quarl_edge.tune.config import TuneConfig
from quarl_edge.tune.result import TuneResult
from quarl_edge.tune.search import run_tune
from quarl_edge.tune.verify import check_against_report, read_tune_json

CARTPOLE = Path(__file__).resolve().parents[1] / "quarl_edge" / "assets" / "policies" / "cartpole-ppo"


@pytest.fixture(scope="module", params=[False, True], ids=["mlp", "lstm"])
def rsl(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("rsl-tune")
    _checkpoint(out / "model_1500.pt", request.param)
    return out / "model_1500.pt", _observations(out / "field_obs.npz")


def _cfg(pt: Path, obs: Path, out: Path, limit: float | None) -> TuneConfig:
    """A small real tune: fp16 and the default int8 of every format the device runs, 1 thread."""
    return TuneConfig(policy=pt, out=out, calibration=obs, max_action_error=limit, kinds=("fp16", "int8-default"),
                      max_threads=1, latency_samples=50, budget_min=5)  # fmt: skip


def test_the_fastest_within_the_action_error_limit_is_chosen(rsl: tuple[Path, Path], tmp_path: Path) -> None:
    pt, obs = rsl
    out = tmp_path / "tuned"
    # a limit of 0: every candidate faster than fp32 is measured (and rejected unless it is exact)
    first = run_tune(_cfg(pt, obs, out, 0.0))
    measured = sorted((r for r in first.candidates if r.action_error is not None and r.name != first.reference),
                      key=lambda r: r.p50_us or 0.0)  # fmt: skip
    assert measured, [(r.name, r.verdict, r.why) for r in first.candidates]
    assert all(r.verdict == "rejected" and (r.action_error or 0.0) > 0 for r in measured)
    # a limit between two candidates' measured errors (the fp32 reference's is 0 by definition): the
    # fastest is over it, a slower one within it
    fastest = measured[0]
    slower = min([*measured[1:], first.row(first.reference)], key=lambda r: r.action_error or 0.0)
    assert (slower.action_error or 0.0) < (fastest.action_error or 0.0)
    limit = ((slower.action_error or 0.0) + (fastest.action_error or 0.0)) / 2
    result = run_tune(_cfg(pt, obs, out, limit))
    assert result.reused_measurements > 0  # the errors and latencies of the first run, for the same bytes
    c = result.choice
    assert c is not None and c.name != fastest.name and c.drop_pct is None and c.episodes is None
    assert result.row(fastest.name).verdict == "rejected" and (c.action_error or 0.0) <= limit
    if slower.name != result.reference:  # a quantized model within the limit: it is chosen over fp32
        assert c.name != result.reference and c.action_error == result.row(c.name).action_error
        assert (result.row(c.name).p50_us or 0.0) <= (result.row(slower.name).p50_us or 0.0)
    for r in result.candidates:  # the reward is not measured: no drop anywhere, nothing estimated
        assert r.drop_pct is None and r.confirm_drop_pct is None and r.episodes_judged is None
        if r.verdict == "pass" and r.name != result.reference:
            assert r.name == c.name
    assert result.reward_not_measured and "cannot run here" in result.reward_not_measured

    data = json.loads((out / "tune.json").read_text())
    assert data["reward_not_measured"] and data["tune"]["reward_not_measured"]
    assert (
        data["tune"]["settings"]["max_action_error"] == limit and data["tune"]["choice"]["drop_pct"] is None
    )
    assert all(m["reward"]["episodes"] == 0 and m.get("drift") is None for m in data["models"])
    md = (out / "tune.md").read_text()
    assert "action error" in md and "not measured" in md
    # gate reads it as tune's evidence and passes the choice at the limit it was chosen under
    block = read_tune_json(out / "tune.json")
    assert block is not None and block.choice is not None and block.choice.name == c.name
    if c.name != result.reference:  # (a report of the fp32 reference alone has nothing for gate to check)
        checks = evaluate(read_report(out / "tune.json"), GateConfig(max_action_error=limit))
        assert checks and all(ch.passed for ch in checks), [ch.message for ch in checks]
        err = next(ch.value for ch in checks if ch.name == "action_error")
        assert err is not None and math.isclose(err, c.action_error or 0.0, rel_tol=1e-9)
        # the same gate fails a tighter limit: the number is the measured one, not a stamp
        tight = evaluate(read_report(out / "tune.json"), GateConfig(max_action_error=err / 2))
        assert not all(ch.passed for ch in tight)
        _forged_blocks_are_refused(data, c.name)


def _forged_blocks_are_refused(data: dict[str, Any], chosen: str) -> None:
    """What gate reads back: a choice over its own limit, an error other than its row's, a reward drop in a
    block that says the reward was not measured, a block that hides it from its report."""

    def forged(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        block = copy.deepcopy(data["tune"])
        change(block)
        return block

    row = next(i for i, r in enumerate(data["tune"]["candidates"]) if r["name"] == chosen)
    err = data["tune"]["choice"]["action_error"]
    cases = {
        "above the limit": lambda b: b["settings"].update(max_action_error=err / 2),
        "other than the one measured": lambda b: b["candidates"][row].update(action_error=err * 2),
        "yet gives a reward drop": lambda b: b["choice"].update(drop_pct=0.0),
        # without the words, the choice is read as judged by reward, and it has no drop
        "reward drop other than the one judged": lambda b: b.pop("reward_not_measured"),
    }
    for message, change in cases.items():
        with pytest.raises(InputError, match=message):
            TuneResult.from_dict(forged(change))
    # a block that would hide it from a report whose reward was not measured
    with pytest.raises(InputError, match="says the reward was not measured, its report says otherwise"):
        check_against_report(
            TuneResult.from_dict(data["tune"]), {**data, "reward_not_measured": None}, "tune.json"
        )


def test_without_max_action_error_one_line_and_nothing_written(
    rsl: tuple[Path, Path], tmp_path: Path
) -> None:
    pt, obs = rsl
    out = tmp_path / "tuned"
    with pytest.raises(InputError, match="cannot run here") as ei:
        run_tune(_cfg(pt, obs, out, None))
    assert "--max-action-error" in str(ei.value) and "\n" not in str(ei.value)
    with pytest.raises(InputError, match="--calibration"):  # no rollouts can be recorded either
        run_tune(TuneConfig(policy=pt, out=out, max_action_error=0.05))
    assert not out.exists()


def test_cli_refuses_in_one_line_before_anything_is_written(rsl: tuple[Path, Path], tmp_path: Path) -> None:
    pt, obs = rsl
    out = tmp_path / "tuned"
    cli = [sys.executable, "-m", "quarl_edge.cli", "tune", "--policy", str(pt), "--calibration", str(obs)]
    p = subprocess.run([*cli, "--out", str(out)], capture_output=True, text=True, timeout=120)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "--max-action-error" in lines[0], p.stderr
    assert not out.exists()
    p = subprocess.run([*cli, "--out", str(out), "--max-action-error", "nan"], capture_output=True, text=True,
                       timeout=120)  # fmt: skip
    assert p.returncode == 2 and "--max-action-error" in p.stderr and "Traceback" not in p.stderr
    assert not out.exists()


@pytest.mark.parametrize("value", [math.nan, math.inf, -0.1, -math.inf])
def test_the_limit_is_finite_and_not_negative(value: float, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--max-action-error"):
        TuneConfig(policy=tmp_path, out=tmp_path / "o", max_action_error=value)


def test_a_policy_whose_env_runs_here_is_judged_by_reward(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="closed-loop reward") as ei:
        run_tune(TuneConfig(policy=CARTPOLE, out=tmp_path / "o", max_action_error=0.05))
    assert "\n" not in str(ei.value) and not (tmp_path / "o").exists()


# An ONNX policy exported by another framework, with its io.yaml (policy/onnx_source.py): the Isaac-style
# recurrent graph of test_onnx_io, and a wide MLP (wide enough that ORT's int8 is faster than its fp32
# here, so a quantized model is judged, chosen and gated).
WIDE = 1024


def _wide_mlp(out: Path) -> tuple[Path, Path, Path]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(10, WIDE), nn.ELU(), nn.Linear(WIDE, WIDE), nn.ELU(), nn.Linear(WIDE, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net.eval(), (torch.zeros(1, 10),), out / "policy.onnx", dynamo=False, opset_version=11,
                          input_names=["obs"], output_names=["actions"])  # fmt: skip
    (out / "io.yaml").write_text("observation: {size: 10}\naction: {size: 3}\nonnx: {action: actions}\n")
    t = np.arange(400)
    obs = np.sin(t[:, None] * np.linspace(0.03, 0.3, 10) + np.linspace(0, 3, 10)) * 2.0
    np.savez(out / "robot_log.npz", obs=obs.astype(np.float32), episode_ids=t // 100)
    return out / "policy.onnx", out / "io.yaml", out / "robot_log.npz"


@pytest.fixture(scope="module", params=["isaac-lstm", "wide-mlp"])
def foreign(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path, Path]:
    out = tmp_path_factory.mktemp(request.param)
    if request.param == "wide-mlp":
        return _wide_mlp(out)
    _, onnx_file, io, _ = make_isaac(out)
    return onnx_file, io, out / "robot_log.npz"


def _foreign_cfg(onnx_file: Path, io: Path, obs: Path, out: Path, limit: float) -> TuneConfig:
    """Every candidate kind asked for (int8-layers too): the grid holds only what can be made."""
    return replace(_cfg(onnx_file, obs, out, limit), io=io, kinds=None)


def test_an_imported_onnx_graph_is_tuned_by_its_action_error(
    foreign: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    onnx_file, io, obs = foreign
    out = tmp_path / "tuned"
    first = run_tune(_foreign_cfg(onnx_file, io, obs, out, 0.0))
    # only what the exporters make from an imported graph: ONNX fp32/fp16/int8, no float-layer splits
    assert {r.candidate.format for r in first.candidates} == {"onnx"}, [r.name for r in first.candidates]
    assert {r.candidate.precision for r in first.candidates} == {"fp32", "fp16", "int8"}
    assert {r.candidate.kind for r in first.candidates} == {"fp32", "fp16", "int8-default", "int8-options"}
    assert all(r.candidate.float_layers is None for r in first.candidates) and not first.layer_search
    assert IMPORTED in first.notes
    measured = sorted((r for r in first.candidates if r.action_error is not None and r.name != first.reference),
                      key=lambda r: r.p50_us or 0.0)  # fmt: skip
    assert all(r.verdict == "rejected" and (r.action_error or 0.0) > 0 for r in measured)
    if "wide-mlp" in onnx_file.parent.name:
        assert measured, [(r.name, r.p50_us) for r in first.candidates]  # its int8 is faster than fp32
    if measured:
        # the largest error measured: the fastest candidate is within it and chosen over fp32
        limit = max(r.action_error or 0.0 for r in measured)
        result = run_tune(_foreign_cfg(onnx_file, io, obs, out, limit))
        assert result.reused_measurements > 0
        c = result.choice
        assert c is not None and c.name == measured[0].name and (c.action_error or 0.0) <= limit
        assert c.drop_pct is None and result.reward_not_measured
        checks = evaluate(read_report(out / "tune.json"), GateConfig(max_action_error=limit))
        assert checks and all(ch.passed for ch in checks), [ch.message for ch in checks]
        err = next(ch.value for ch in checks if ch.name == "action_error")
        assert err is not None and err > 0 and math.isclose(err, c.action_error or 0.0, rel_tol=1e-9)
        tight = evaluate(read_report(out / "tune.json"), GateConfig(max_action_error=err / 2))
        assert not all(ch.passed for ch in tight)
    else:  # nothing beat fp32 here (the LSTM stays float in int8): fp32 is the choice, within any limit
        assert first.choice is not None and first.choice.name == first.reference
        limit = 0.0
    # a changed io.yaml is another policy: nothing of the earlier runs is reused
    io.write_text(io.read_text() + "# edited\n")
    logs: list[str] = []
    again = run_tune(_foreign_cfg(onnx_file, io, obs, out, limit), log=logs.append)
    assert again.reused_measurements == 0 and again.inputs.policy_sha256 != first.inputs.policy_sha256
    assert any("the policy" in m and "measuring again" in m for m in logs), logs


def test_the_policy_hash_covers_the_onnx_file_and_the_io_yaml(tmp_path: Path) -> None:
    onnx_file, io, _ = _wide_mlp(tmp_path)
    sha = policy_sha256(onnx_file, None, load_policy(onnx_file, io=io), io)
    assert sha == policy_sha256(onnx_file, None, load_policy(onnx_file, io=io), io)  # same bytes, same hash
    io.write_text(io.read_text() + "# edited\n")
    edited = policy_sha256(onnx_file, None, load_policy(onnx_file, io=io), io)
    assert edited != sha
    model = onnx.load(str(onnx_file))
    w = model.graph.initializer[0]
    w.raw_data = (np.frombuffer(w.raw_data, np.float32) * 1.01).astype(np.float32).tobytes()
    onnx.save(model, str(onnx_file))
    assert policy_sha256(onnx_file, None, load_policy(onnx_file, io=io), io) not in (sha, edited)


def test_cli_tunes_an_onnx_policy_with_io_and_gate_passes(tmp_path: Path) -> None:
    onnx_file, io, obs = _wide_mlp(tmp_path)
    out = tmp_path / "tuned"
    cli = [sys.executable, "-m", "quarl_edge.cli"]
    p = subprocess.run([*cli, "tune", "--policy", str(onnx_file), "--io", str(io), "--calibration", str(obs),
                        "--max-action-error", "1", "--kinds", "int8-default", "--max-threads", "1",
                        "--budget-min", "5", "--out", str(out)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    tuned = json.loads((out / "tune.json").read_text())["tune"]
    assert tuned["choice"] is not None and {r["format"] for r in tuned["candidates"]} == {"onnx"}
    p = subprocess.run([*cli, "gate", str(out / "tune.json"), "--max-action-error", "1"], capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0, p.stdout + p.stderr
