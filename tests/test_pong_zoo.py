"""The trained zoo Pong DQN through the whole pipeline: exported to ONNX and TFLite int8, its actions on
recorded frames compared with fp32, benched in capped closed-loop episodes on paired seeds, and scored
against a random policy on the same seeds. A deliberately broken int8 model must fail the same checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from conftest import assert_discriminating
from onnx import numpy_helper

from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.policy.net import load_checkpoint
from quarl_edge.runtimes.envs import make_env
from quarl_edge.runtimes.fsutil import sha256_file
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.trace import load_trace

pytestmark = pytest.mark.slow  # ~40 s: four exports and capped Atari episodes

EPISODES, MAX_STEPS = 4, 600  # capped episodes: ~8 points are played, enough to tell skill from chance
MIN_AGREEMENT = 0.85  # measured here: ONNX int8 0.95, TFLite int8 0.91 on the bundle's 1,000 frames
MIN_NORMALIZED = 0.5  # (R - R_random) / (R_fp32 - R_random) on the same seeds; measured 1.04 / 0.89


def agreement(bundle: Path, model: str) -> float:
    """Share of the bundle's recorded frames where ``model`` picks fp32's action."""
    trace = load_trace(bundle / "trace.npz")
    ref = PolicyRunner(bundle, "onnx-fp32").replay(trace).actions
    return float(np.mean(PolicyRunner(bundle, model).replay(trace).actions == ref))


def random_returns(bundle: Path, seeds: list[int]) -> list[float]:
    env = make_env(load_manifest(bundle).policy.env)
    out = []
    try:
        for seed in seeds:
            env.reset(seed=seed)
            env.action_space.seed(seed)
            ret = 0.0
            for _ in range(MAX_STEPS):
                _, r, term, trunc, _ = env.step(env.action_space.sample())
                ret += float(r)
                if term or trunc:
                    break
            out.append(ret)
    finally:
        env.close()
    return out


def normalized(report: dict[str, Any], model: str, rand: list[float]) -> float:
    by = {m["name"]: m["reward"]["mean"] for m in report["models"]}
    r_rand = float(np.mean(rand))
    return (by[model] - r_rand) / (by[report["reference"]] - r_rand)


@pytest.fixture(scope="module")
def pong_bundle(tmp_path_factory: pytest.TempPathFactory, zoo_pong: tuple[Path, Path]) -> Path:
    policy_dir, frames = zoo_pong
    out = tmp_path_factory.mktemp("zoo-pong") / "bundle"
    targets = ["onnx-fp32", "onnx-int8"]
    if load_checkpoint(policy_dir) and _has_litert():
        targets.append("tflite-int8")
    export_bundle(
        load_checkpoint(policy_dir), BundleRequest(out=out, targets=tuple(targets), calibration=frames)
    )
    return out


def _has_litert() -> bool:
    import importlib.util

    return importlib.util.find_spec("litert_torch") is not None


@pytest.fixture(scope="module")
def pong_report(pong_bundle: Path) -> dict[str, Any]:
    return bench(
        pong_bundle, BenchConfig(episodes=EPISODES, max_steps=MAX_STEPS, latency_samples=100)
    ).to_dict()


def test_the_zoo_pong_policy_is_discriminating(pong_bundle: Path, pong_report: dict[str, Any]) -> None:
    trace = load_trace(pong_bundle / "trace.npz")
    assert_discriminating(PolicyRunner(pong_bundle, "onnx-fp32").replay(trace).actions, 6)
    fp32 = next(m for m in pong_report["models"] if m["name"] == "onnx-fp32")["reward"]["per_episode"]
    rand = random_returns(pong_bundle, pong_report["settings"]["seeds"])
    assert len(set(fp32)) > 1, fp32  # its returns differ from seed to seed
    assert min(fp32) > max(rand), (fp32, rand)  # and it plays: it beats chance on every seed


def test_int8_onnx_and_tflite_keep_the_actions_and_the_reward(
    pong_bundle: Path, pong_report: dict[str, Any]
) -> None:
    rand = random_returns(pong_bundle, pong_report["settings"]["seeds"])
    int8 = [m for m in pong_report["models"] if m["precision"] == "int8"]
    assert int8 and {m["format"] for m in int8} <= {"onnx", "tflite"}
    for m in int8:
        agree, norm = agreement(pong_bundle, m["name"]), normalized(pong_report, m["name"], rand)
        print(f"\nzoo Pong DQN {m['name']}: agreement {agree:.3f}, normalized return {norm:.2f}, "
              f"p50 {m['latency']['p50_us']:.0f} us vs fp32 ({m['speedup_p50_vs_ref']:.2f}x)")  # fmt: skip
        assert m["agreement"]["value"] == pytest.approx(agree)  # the report says what the replay shows
        assert agree >= MIN_AGREEMENT, (m["name"], agree)
        assert norm >= MIN_NORMALIZED, (m["name"], norm, m["reward"]["per_episode"], rand)
        assert m["drift"]["paired_episodes"] == EPISODES


def _break_int8(bundle: Path, out: Path) -> Path:
    """A copy of the bundle whose int8 ONNX has its first convolution's int8 weights negated (a wrong
    sign in a scale would do the same), re-hashed so it loads: the checks, not the hashes, must catch it."""
    broken = Path(shutil.copytree(bundle, out))
    entry = load_manifest(broken).model("onnx-int8")
    path = broken / entry.file
    model = onnx.load(str(path))
    init = next(
        i for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT8 and len(i.dims) == 4
    )
    w = numpy_helper.to_array(init)
    init.CopyFrom(numpy_helper.from_array(np.clip(-w.astype(np.int16), -127, 127).astype(np.int8), init.name))
    onnx.save(model, str(path))
    manifest = json.loads((broken / "manifest.json").read_text())
    for m in manifest["models"]:
        if m["name"] == "onnx-int8":
            m["sha256"], m["size_bytes"] = sha256_file(path), path.stat().st_size
    (broken / "manifest.json").write_text(json.dumps(manifest))
    return broken


def test_a_broken_int8_model_fails_both_checks(pong_bundle: Path, tmp_path: Path) -> None:
    broken = _break_int8(pong_bundle, tmp_path / "broken")
    agree = agreement(broken, "onnx-int8")
    report = bench(broken, BenchConfig(episodes=EPISODES, max_steps=MAX_STEPS, latency_samples=10,
                                       models=("onnx-int8",))).to_dict()  # fmt: skip
    norm = normalized(report, "onnx-int8", random_returns(broken, report["settings"]["seeds"]))
    print(f"\nbroken int8: agreement {agree:.3f}, normalized return {norm:.2f}")
    assert agree < MIN_AGREEMENT and norm < MIN_NORMALIZED
