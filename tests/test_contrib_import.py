"""sb3-contrib zips (TQC, QR-DQN, TRPO, ARS, CrossQ): trained here for a few hundred steps, imported
weights-only with no --env or --algo (both from the zip and its SB3 / RL Zoo name), and the exported fp32
ONNX acts as sb3-contrib's own ``predict`` on 1,000 recorded states; int8 ONNX + TFLite, a closed-loop
bench and a gate on each (slow tier)."""

from __future__ import annotations

import json
import shutil
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("sb3_contrib")
from sb3_contrib import ARS, QRDQN, TQC, TRPO, CrossQ  # noqa: E402
from stable_baselines3.common.base_class import BaseAlgorithm  # noqa: E402

from quarl_edge.bench.report import parse_report  # noqa: E402
from quarl_edge.bench.run import BenchConfig, bench  # noqa: E402
from quarl_edge.bundle import BundleRequest, export_bundle  # noqa: E402
from quarl_edge.gate import GateConfig, evaluate  # noqa: E402
from quarl_edge.inspect import inspect_policy  # noqa: E402
from quarl_edge.policy.load import load_policy  # noqa: E402
from quarl_edge.policy.net import Policy  # noqa: E402
from quarl_edge.record import RecordConfig, record  # noqa: E402
from quarl_edge.runtimes.errors import InputError  # noqa: E402
from quarl_edge.runtimes.manifest import load_manifest  # noqa: E402
from quarl_edge.runtimes.runner import PolicyRunner  # noqa: E402
from quarl_edge.runtimes.trace import Trace, save_trace  # noqa: E402

N_OBS = 1000
_SMALL = {"net_arch": [32, 32]}


@dataclass(frozen=True)
class Case:
    id: str
    cls: type[BaseAlgorithm]
    algo: str
    env_id: str
    file: str  # SB3's algo_Env.zip or RL Zoo's algo-Env.zip
    steps: int
    head: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    policy: str = "MlpPolicy"


CASES = [
    Case("tqc", TQC, "tqc", "Pendulum-v1", "tqc-Pendulum-v1.zip", 300, "tanh_unscale",
         {"learning_starts": 50, "policy_kwargs": {"net_arch": [32, 32], "n_critics": 1, "n_quantiles": 5}}),
    Case("qrdqn", QRDQN, "qrdqn", "CartPole-v1", "qrdqn_CartPole-v1.zip", 600, "argmax",
         {"learning_starts": 50, "train_freq": 1, "policy_kwargs": {"net_arch": [32, 32], "n_quantiles": 7}}),
    Case("trpo", TRPO, "trpo", "CartPole-v1", "trpo-CartPole-v1.zip", 256, "argmax",
         {"n_steps": 128, "batch_size": 64, "policy_kwargs": _SMALL}),
    Case("ars", ARS, "ars", "Pendulum-v1", "ars-Pendulum-v1.zip", 400, "tanh_unscale",
         {"n_delta": 2, "zero_policy": False, "policy_kwargs": _SMALL}),
    Case("ars-linear", ARS, "ars", "CartPole-v1", "ars_CartPole-v1.zip", 400, "argmax",
         {"n_delta": 2, "zero_policy": False}, policy="LinearPolicy"),
    Case("crossq", CrossQ, "crossq", "Pendulum-v1", "crossq-Pendulum-v1.zip", 300, "tanh_unscale",
         {"learning_starts": 50, "policy_kwargs": {"net_arch": {"pi": [32, 32], "qf": [64, 64]}}}),
]  # fmt: skip


@dataclass
class Trained:
    case: Case
    model: BaseAlgorithm
    zip_path: Path
    policy: Policy
    trace: Trace
    calib: Path


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module", params=CASES, ids=[c.id for c in CASES])
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    case: Case = request.param
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp(case.id)
    model = case.cls(case.policy, case.env_id, seed=0, device="cpu", **case.kwargs)
    model.learn(case.steps)
    zip_path = out / case.file
    model.save(zip_path)
    policy = load_policy(zip_path)  # algorithm and env from the zip and its name
    trace = record(policy, RecordConfig(episodes=N_OBS, epsilon=0.3, seed=7, max_samples=N_OBS))
    return Trained(case, model, zip_path, policy, trace, save_trace(trace, out / "calib.npz"))


def test_imported_without_env_or_algo(trained: Trained) -> None:
    t, case = trained, trained.case
    assert t.policy.spec.algo == case.algo and t.policy.spec.env.id == case.env_id
    assert t.policy.arch.head == case.head
    assert t.policy.spec.train["library"] == "sb3-contrib"
    ins = inspect_policy(t.zip_path)
    assert ins.source == "sb3-contrib" and ins.algo == case.algo and ins.env_from == "file name"
    assert [la.name for la in ins.layers][-1] == "out" and ins.graph_steps[-1] == case.head


def test_fp32_onnx_acts_like_contrib_predict(trained: Trained, tmp_path: Path) -> None:
    t = trained
    export_bundle(t.policy, BundleRequest(out=tmp_path / "b", targets=("onnx-fp32",), calibration=t.calib))
    rep = PolicyRunner(tmp_path / "b", "onnx-fp32").replay(t.trace)
    expected, _ = t.model.predict(t.trace.obs, deterministic=True)
    assert rep.valid.all() and rep.actions.shape == np.asarray(expected).shape
    if t.policy.spec.action_space.is_discrete:
        assert float(np.mean(rep.actions == expected)) >= 0.999
        assert len(np.unique(expected)) > 1, "degenerate test: one action everywhere"
    else:
        assert float(np.abs(rep.actions - expected).max()) <= 1e-5
        assert float(np.std(expected)) > 1e-2, "degenerate test: constant actions"
    # the export measured the same against the zip's own predict, loaded without unpickling (scope 5)
    parity = load_manifest(tmp_path / "b").source_parity
    assert parity is not None and parity.error is None, parity
    (m,) = parity.models
    assert m.samples == N_OBS and m.agreement >= 0.999
    assert m.max_abs_diff is None or m.max_abs_diff <= 1e-5


@pytest.mark.only_for("qrdqn", "crossq")
def test_a_wrong_layer_fold_is_caught(trained: Trained) -> None:
    """The parity above can fail: QR-DQN's quantile mean and CrossQ's BatchRenorm, left unfolded, act
    differently (here: the torch module with the fold undone, against contrib's predict)."""
    t = trained
    expected, _ = t.model.predict(t.trace.obs, deterministic=True)
    broken = load_policy(t.zip_path)
    with torch.no_grad():
        if t.case.algo == "crossq":  # the BatchRenorm before the output layer dropped
            broken.net.out.weight.copy_(t.model.policy.actor.mu.weight)
            broken.net.out.bias.copy_(t.model.policy.actor.mu.bias)
        else:  # the first quantile instead of the mean
            n = t.policy.spec.action_space.n or 0
            broken.net.out.weight.copy_(t.model.policy.quantile_net.quantile_net[-1].weight[:n])
            broken.net.out.bias.copy_(t.model.policy.quantile_net.quantile_net[-1].bias[:n])
    got = broken.predict(t.trace.obs)
    if t.case.algo == "crossq":
        assert float(np.abs(got - expected).max()) > 1e-3
    else:
        assert float(np.mean(got == expected)) < 0.999


@pytest.mark.only_for("tqc")  # one zip is enough
def test_a_custom_policy_class_is_named(trained: Trained, tmp_path: Path) -> None:
    for key, value, named in (
        ("policy_class", {"__module__": "my_lab.policies", "__init__": "<function LabPolicy.__init__ at 0x1>"}, "LabPolicy"),
        ("policy_kwargs", {"features_extractor_class": "<class 'my_lab.nets.LabExtractor'>"}, "LabExtractor"),
    ):  # fmt: skip
        path = tmp_path / key / trained.zip_path.name
        path.parent.mkdir()
        with zipfile.ZipFile(trained.zip_path) as src, zipfile.ZipFile(path, "w") as dst:
            for item in src.infolist():
                raw = src.read(item.filename)
                if item.filename == "data":
                    data = json.loads(raw)
                    data[key] = {**data.get(key, {}), **value}
                    raw = json.dumps(data).encode()
                dst.writestr(item, raw)
        with pytest.raises(InputError, match=named) as ei:
            load_policy(path)
        assert "supported" in str(ei.value) or "SB3's and sb3-contrib's" in str(ei.value)
        assert "\n" not in str(ei.value)


@pytest.mark.only_for("trpo")
def test_rl_zoo_log_folder_finds_env_and_stats_in_args_yml(trained: Trained, tmp_path: Path) -> None:
    """RL Zoo's training log layout: Env.zip + best_model.zip + Env/args.yml (an OrderedDict dump)."""
    folder = tmp_path / "logs" / "trpo" / "CartPole-v1_1"
    (folder / "CartPole-v1").mkdir(parents=True)
    shutil.copyfile(trained.zip_path, folder / "CartPole-v1.zip")
    shutil.copyfile(trained.zip_path, folder / "best_model.zip")
    (folder / "CartPole-v1" / "args.yml").write_text(
        "!!python/object/apply:collections.OrderedDict\n- - - algo\n    - trpo\n  - - env\n    - CartPole-v1\n"
    )
    policy = load_policy(folder)
    assert policy.spec.env.id == "CartPole-v1" and policy.spec.algo == "trpo"
    assert policy.spec.train["env_from"] == "args.yml"


@pytest.mark.slow
def test_int8_onnx_and_tflite_bench_and_gate(trained: Trained, tmp_path: Path) -> None:
    pytest.importorskip("litert_torch")
    t = trained
    bundle = tmp_path / "bundle"
    export_bundle(
        t.policy,
        BundleRequest(out=bundle, targets=("onnx-fp32", "onnx-int8", "tflite-int8"), calibration=t.calib),
    )
    report = bench(bundle, BenchConfig(episodes=3, latency_samples=50, warmup=5, max_steps=200)).to_dict()
    by_name = {m["name"]: m for m in report["models"]}
    assert set(by_name) == {"onnx-fp32", "onnx-int8", "tflite-int8"}
    for name in ("onnx-int8", "tflite-int8"):
        assert by_name[name]["reward"]["episodes"] == 3 and by_name[name]["agreement"]["samples"] > 0
    checks = evaluate(parse_report(report), GateConfig(max_reward_drop_pct=1000.0, min_agreement=0.5))
    assert checks and all(c.passed for c in checks), [c.message for c in checks if not c.passed]
