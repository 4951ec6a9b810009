"""fp32 parity against the source (issue 29 scope 5): export measures the exported fp32 models against
the zip's own SB3 ``predict`` (on VecNormalize-normalized observations, normalized in numpy), the bench
report carries it, and a wrong export (the VecNormalize statistics dropped from the graph) shows in it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from stable_baselines3 import TD3
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from quarl_edge.bench.report import parse_report, printed
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.policy.load import load_policy
from quarl_edge.policy.registry import env_config
from quarl_edge.record import RecordConfig, record
from quarl_edge.runtimes.envs import make_env
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.parity import ModelParity
from quarl_edge.runtimes.trace import save_trace


@pytest.fixture(scope="module")
def td3_vecnorm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("td3")
    vn = VecNormalize(DummyVecEnv([lambda: make_env(env_config("Pendulum-v1"))]))
    model = TD3("MlpPolicy", vn, seed=0, device="cpu", learning_starts=100, train_freq=4,
                policy_kwargs={"net_arch": [32, 32]})  # fmt: skip
    model.learn(400)
    model.save(out / "td3_Pendulum-v1.zip")  # SB3's own naming: algo and env from the name
    vn.save(str(out / "vec_normalize.pkl"))
    policy = load_policy(out / "td3_Pendulum-v1.zip", vecnormalize=out / "vec_normalize.pkl")
    trace = record(policy, RecordConfig(episodes=5, epsilon=0.3, seed=3, max_samples=1000))
    return out / "td3_Pendulum-v1.zip", out / "vec_normalize.pkl", save_trace(trace, out / "calib.npz")


def _parity(bundle: Path) -> ModelParity:
    parity = load_manifest(bundle).source_parity
    assert parity is not None and parity.error is None, parity
    assert parity.reference.startswith("TD3.predict (stable-baselines3 ")
    (m,) = parity.models
    assert m.model == "onnx-fp32" and m.samples == 1000 and m.max_abs_diff is not None
    return m


def test_export_and_bench_report_parity_with_the_zips_own_predict(td3_vecnorm, tmp_path: Path) -> None:
    zip_path, stats, calib = td3_vecnorm
    policy = load_policy(zip_path, vecnormalize=stats)
    logged: list[str] = []
    export_bundle(policy, BundleRequest(out=tmp_path / "b", targets=("onnx-fp32",), calibration=calib),
                  log=logged.append)  # fmt: skip
    m = _parity(tmp_path / "b")
    assert m.max_abs_diff is not None and m.max_abs_diff <= 1e-5 and m.agreement > 0.99999
    assert any(line.startswith("fp32 vs source (TD3.predict") for line in logged)
    report = bench(tmp_path / "b", BenchConfig(episodes=0, latency_samples=10, warmup=1)).to_dict()
    assert report["source_parity"]["models"][0]["max_abs_diff"] == m.max_abs_diff
    after = printed(parse_report(report), None).after
    assert any("fp32 vs source" in line and "max |Δa|" in line for line in after)


def test_a_dropped_vecnormalize_is_caught(td3_vecnorm, tmp_path: Path) -> None:
    zip_path, stats, calib = td3_vecnorm
    policy = load_policy(zip_path, vecnormalize=stats)
    with torch.no_grad():  # the graph's normalization made the identity: what a lost VecNormalize does
        policy.net.obs_mean.zero_()
        policy.net.obs_var.fill_(1.0)
    export_bundle(policy, BundleRequest(out=tmp_path / "b", targets=("onnx-fp32",), calibration=calib))
    m = _parity(tmp_path / "b")
    assert m.max_abs_diff is not None and m.max_abs_diff > 0.05, m
    # the statistics are not trivial: the actions differ because of them
    assert not np.allclose(np.load(calib)["obs"].mean(axis=0), 0.0, atol=0.1)
