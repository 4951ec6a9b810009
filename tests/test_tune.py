"""`quarl-edge tune` on the local device: the choice passes the gate, is never slower than the fastest fp32
candidate measured in the same run, is written as a bundle the runner loads, and a rerun reuses the
measurements. Bad input: nothing passes (exit 1, closest named), a budget too small, a device with no runtime."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quarl_edge.bench.report import parse_report
from quarl_edge.gate import GateConfig, evaluate
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.tune.result import TuneResult
from quarl_edge.tune.search import TuneConfig, device_formats, run_tune
from quarl_edge.tune.ship import NothingPasses
from quarl_edge.tune.verify import read_tune_json

pytestmark = pytest.mark.slow  # a whole search: ~40 s


@pytest.fixture(scope="module")
def tuned(
    tmp_path_factory: pytest.TempPathFactory, cartpole_policy: Path, cartpole_calib: Path
) -> tuple[TuneConfig, TuneResult]:
    cfg = TuneConfig(policy=cartpole_policy, out=tmp_path_factory.mktemp("tune") / "t", calibration=cartpole_calib,
                     episodes=4, confirm_episodes=4, budget_min=60, latency_samples=200)  # fmt: skip
    return cfg, run_tune(cfg)


def test_the_choice_passes_the_gate_and_is_never_slower_than_fp32(
    tuned: tuple[TuneConfig, TuneResult],
) -> None:
    cfg, result = tuned
    choice = result.choice
    assert choice is not None
    fp32 = [r for r in result.candidates if r.candidate.precision == "fp32" and r.p50_us]
    assert len(fp32) >= 1 and choice.p50_us <= min(r.p50_us or 0 for r in fp32)
    report = json.loads((cfg.out / "tune.json").read_text())
    assert report["format"] == "quarl-edge/report" and report["tune"]["choice"]["name"] == choice.name
    assert report["tune"]["schema_version"] == 1 and report["tune"]["format"] == "quarl-edge/tune"
    checks = (
        evaluate(parse_report(report), GateConfig(max_reward_drop_pct=cfg.max_reward_drop_pct))
        if choice.name != result.reference
        else []
    )
    assert all(c.passed for c in checks)
    assert (cfg.out / "tune.md").read_text().startswith("# quarl-edge tune:") and (
        cfg.out / "tune.png"
    ).is_file()
    # every candidate is listed with a verdict; the ORT int8 models (slower than fp32 here) are not chosen
    assert all(r.verdict for r in result.candidates if r.p50_us)
    assert not choice.name.startswith("onnx-int8")
    # tune.json reads back as the same typed result (what gate checks), minus what is local to this run
    read = read_tune_json(cfg.out / "tune.json")
    assert read is not None and read.tune_block() == result.tune_block()


def test_the_tuned_bundle_holds_the_choice_and_says_why(tuned: tuple[TuneConfig, TuneResult]) -> None:
    cfg, result = tuned
    assert result.choice is not None
    manifest = load_manifest(cfg.out / "bundle")
    assert manifest.tune is not None and manifest.tune.chosen == result.choice.name
    assert manifest.tune.device == "local" and manifest.tune.threads == result.choice.threads
    assert result.shipped is not None and manifest.tune.measured == result.shipped.models
    # the shipped files are the measured ones: every sha256 in the manifest is one tune.json names
    assert {m.name: m.sha256 for m in manifest.models} == {
        n: result.row(n).sha256 for n in {result.choice.name, result.reference}
    }
    runner = PolicyRunner(cfg.out / "bundle", manifest.tune.chosen, threads=1)
    assert runner.act([0.0, 0.0, 0.0, 0.0]) in (0, 1)


def test_a_second_tune_with_the_same_inputs_reuses_every_measurement(
    tuned: tuple[TuneConfig, TuneResult],
) -> None:
    cfg, first = tuned
    again = run_tune(cfg)
    assert again.reused_measurements > 0 and again.choice == first.choice


def test_nothing_passes_is_exit_1_with_the_closest_named(
    cartpole_policy: Path, cartpole_calib: Path, tmp_path: Path
) -> None:
    cfg = TuneConfig(policy=cartpole_policy, out=tmp_path / "t", calibration=cartpole_calib, episodes=2,
                     confirm_episodes=0, budget_min=5, latency_samples=50, max_p99_ms=1e-6, max_threads=1)  # fmt: skip
    with pytest.raises(NothingPasses) as e:
        run_tune(cfg)
    assert e.value.exit_code == 1 and "no candidate passes" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "t" / "tune.json").exists() and not (tmp_path / "t" / "bundle").exists()


def test_bad_input_is_one_line(cartpole_policy: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="too small to measure anything"):
        TuneConfig(policy=cartpole_policy, out=tmp_path / "t", budget_min=0.1)
    with pytest.raises(InputError, match="quarl-edge devices setup rpi4"):
        device_formats({"runtimes": {"numpy": "2.0", "onnxruntime": None}}, "rpi4")
    assert device_formats({"runtimes": {"onnxruntime": "1.20", "ai_edge_litert": "2.3"}}, "x") == (
        "onnx",
        "tflite",
    )


def test_an_rl_zoo_folder_with_two_zips_or_none_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    two = tmp_path / "ppo-CartPole-v1"
    two.mkdir()
    for name in ("a.zip", "b.zip"):
        (two / name).write_bytes(b"PK")
    none = tmp_path / "empty-model"
    none.mkdir()
    for folder, words in ((two, "holds 2 model zips"), (none, "no .zip")):
        out = tmp_path / f"out-{folder.name}"
        with pytest.raises(InputError, match=words) as e:
            run_tune(TuneConfig(policy=folder, out=out, budget_min=5))
        assert "\n" not in str(e.value) and e.value.exit_code == 2 and not out.exists()


def test_c_candidates_are_listed_beside_onnx_and_tflite_with_latencies(
    tuned: tuple[TuneConfig, TuneResult],
) -> None:
    """An MLP on a device with a C compiler (this machine): c-fp32 and c-int8 are candidates, measured
    like the others (issue 31)."""
    _, result = tuned
    by_format = {r.candidate.format for r in result.candidates}
    assert {"onnx", "c"} <= by_format
    c_rows = [r for r in result.candidates if r.candidate.format == "c"]
    assert {r.candidate.precision for r in c_rows} == {"fp32", "int8"}
    assert all(r.p50_us and r.p50_us > 0 for r in c_rows), [(r.candidate.name, r.p50_us) for r in c_rows]
    print("\n" + "\n".join(f"{r.candidate.name}: p50 {r.p50_us:.2f} us, {r.verdict}" for r in result.candidates
                           if r.p50_us))  # fmt: skip
