"""rsl_rl checkpoints (rsl-rl-lib 5.x ``model_N.pt``: actor MLP with ELU, empirical normalizer, optional
LSTM memory) read weights-only, with an environment that cannot run here: recorded observations stand in
(calibration, action error against fp32, latency), reward is "not measured", and gate judges by
``--max-action-error``. The checkpoint is written here in rsl-rl-lib's own layout (its MLPModel /
RNNModel state-dict names and its normalizer's (x - mean) / (std + 0.01)), with a reference forward of
its semantics to compare against."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from quarl_edge.bench.report import parse_report, printed
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.gate import GateConfig, evaluate
from quarl_edge.inspect import inspect_policy
from quarl_edge.policy.load import load_policy
from quarl_edge.runtimes import load_policy as load_runtime
from quarl_edge.runtimes.errors import InputError, IntegrityError
from quarl_edge.runtimes.trace import load_trace

OBS, ACT, HIDDEN = 12, 4, 16


class RslActor(nn.Module):
    """rsl-rl-lib 5.x's RNNModel / MLPModel actor as its state dict names it (obs_normalizer, rnn.rnn,
    mlp.N, distribution.std_param), with its deterministic forward."""

    def __init__(self, recurrent: bool) -> None:
        super().__init__()
        self.recurrent = recurrent
        self.obs_normalizer = nn.Module()
        for name, value in (("_mean", torch.randn(1, OBS)), ("_var", torch.rand(1, OBS) + 0.5)):
            self.obs_normalizer.register_buffer(name, value)
        self.obs_normalizer.register_buffer("_std", torch.sqrt(self.obs_normalizer._var))
        self.obs_normalizer.register_buffer("count", torch.tensor(1000))
        if recurrent:
            self.rnn = nn.Module()
            self.rnn.rnn = nn.LSTM(OBS, HIDDEN, 1)
        width = HIDDEN if recurrent else OBS
        self.mlp = nn.Sequential(OrderedDict([("0", nn.Linear(width, 32)), ("1", nn.ELU()), ("2", nn.Linear(32, 32)),
                                              ("3", nn.ELU()), ("4", nn.Linear(32, ACT))]))  # fmt: skip
        self.distribution = nn.Module()
        self.distribution.std_param = nn.Parameter(torch.ones(ACT))

    def run(self, obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
        out, state = [], None
        with torch.no_grad():
            for o, s in zip(obs, starts, strict=True):
                x = (torch.as_tensor(o[None]) - self.obs_normalizer._mean) / (self.obs_normalizer._std + 0.01)
                if self.recurrent:
                    if s:
                        state = None
                    y, state = self.rnn.rnn(x.unsqueeze(0), state)
                    x = y.squeeze(0)
                out.append(self.mlp(x)[0].numpy())
        return np.asarray(out)


def _checkpoint(path: Path, recurrent: bool) -> RslActor:
    torch.manual_seed(1)
    actor = RslActor(recurrent)
    torch.save({"actor_state_dict": actor.state_dict(), "critic_state_dict": {}, "optimizer_state_dict": {},
                "iter": 1500, "infos": None}, path)  # fmt: skip
    return actor


def _observations(path: Path) -> Path:
    """A robot's log: observations in episodes, no rewards (the env is Isaac Sim, not here)."""
    rng = np.random.default_rng(0)
    t = np.arange(600)
    obs = np.sin(t[:, None] * rng.uniform(0.02, 0.2, OBS) + rng.uniform(0, 6, OBS)) * rng.uniform(0.5, 3, OBS)
    np.savez(path, obs=obs.astype(np.float32), episode_ids=t // 150)
    return path


@pytest.fixture(scope="module", params=[False, True], ids=["mlp", "lstm"])
def rsl(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[RslActor, Path, Path]:
    out = tmp_path_factory.mktemp("rsl")
    actor = _checkpoint(out / "model_1500.pt", request.param)
    obs = _observations(out / "field_obs.npz")
    bundle = out / "bundle"
    export_bundle(load_policy(out / "model_1500.pt"),
                  BundleRequest(out=bundle, targets=("onnx-fp32", "onnx-int8"), calibration=obs))  # fmt: skip
    return actor, out / "model_1500.pt", bundle


def test_detected_weights_only_and_inspected(rsl: tuple[RslActor, Path, Path]) -> None:
    actor, pt, _ = rsl
    ins = inspect_policy(pt)
    assert ins.source == "rsl_rl" and ins.activation == "elu" and ins.head == "identity"
    assert ins.env_id == "external/model_1500" and ins.normalization
    assert [s.name for s in ins.recurrent_state] == (["h_in", "c_in"] if actor.recurrent else [])


def test_exported_fp32_acts_as_rsl_rl_over_whole_episodes(rsl: tuple[RslActor, Path, Path]) -> None:
    actor, _, bundle = rsl
    trace = load_trace(bundle / "trace.npz")
    expected = actor.run(trace.obs, trace.episode_starts())
    assert float(expected.std()) > 0.05
    policy = load_runtime(bundle, model="onnx-fp32")
    got = []
    for o, start in zip(trace.obs, trace.episode_starts(), strict=True):
        if start:
            policy.reset()
        got.append(policy.act(o))
    assert float(np.abs(np.asarray(got) - expected).max()) <= 1e-4


def test_no_env_here_reward_not_measured_gated_by_action_error(rsl: tuple[RslActor, Path, Path]) -> None:
    _, _, bundle = rsl
    with pytest.raises(InputError, match="cannot run here"):
        load_runtime(bundle, model="onnx-fp32").make_env()
    report = bench(bundle, BenchConfig(episodes=20, latency_samples=50, warmup=5)).to_dict()
    assert report["reward_not_measured"] and report["settings"]["episodes"] == 0
    int8 = next(m for m in report["models"] if m["name"] == "onnx-int8")
    assert int8["latency"]["p50_us"] > 0 and int8["reward"]["episodes"] == 0
    err = int8["agreement"]["max_abs_diff"]
    assert 0 < err < 1.0 and int8["agreement"]["samples"] == 600
    after = printed(parse_report(report), None).after
    assert any(line.startswith("reward: not measured") for line in after)
    assert any("action error vs fp32" in line for line in after)
    ok = evaluate(parse_report(report), GateConfig(max_action_error=err * 1.01))
    assert [c.name for c in ok] == ["action_error"] and all(c.passed for c in ok)
    assert "reward not measured" in ok[0].message
    tight = evaluate(parse_report(report), GateConfig(max_action_error=err * 0.5))
    assert not tight[0].passed
    # without --max-action-error the reward check cannot pass on a report whose reward was not measured
    (drop,) = evaluate(parse_report(report), GateConfig())
    assert not drop.passed and "--max-action-error" in drop.message


def test_a_pickled_object_in_the_checkpoint_is_refused(tmp_path: Path) -> None:
    import os

    class Evil:
        def __reduce__(self) -> tuple:
            return (os.system, ("touch pwned",))

    torch.save({"actor_state_dict": {}, "infos": Evil()}, tmp_path / "model_1.pt")
    with pytest.raises(IntegrityError, match="pickled objects"):
        load_policy(tmp_path / "model_1.pt")
    assert not (tmp_path / "pwned").exists() and not Path("pwned").exists()


def test_tune_without_an_env_needs_max_action_error_in_one_line(
    rsl: tuple[RslActor, Path, Path], tmp_path: Path
) -> None:
    """tune judges such a policy by its action error (tests/test_tune_noenv.py); without the limit it stops
    before anything is written, saying to pass it."""
    from quarl_edge.tune.config import TuneConfig
    from quarl_edge.tune.search import run_tune

    _, pt, bundle = rsl
    out = tmp_path / "tuned"
    with pytest.raises(InputError, match="cannot run here") as ei:
        run_tune(TuneConfig(policy=pt, out=out, calibration=bundle / "trace.npz"))
    assert "pass --max-action-error" in str(ei.value) and "\n" not in str(ei.value)
    assert not out.exists() or not any(out.iterdir())
