"""Measured = shipped, with real tunes (CartPole, the fp32 reference and one other fp32 format, 1 thread,
2-3 episodes: ~20 s each): whatever changes between two tunes into the same --out (the weights at the same
path, the calibration file, the policy itself, the device's port, a damaged cache), the second tune measures
what changed, ships exactly the bytes it measured, and its tune.json equals a fresh bench of the shipped
bundle (the same reward on the same seeds)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from test_tune_inputs import small

from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.policy.net import load_checkpoint, save_checkpoint
from quarl_edge.runtimes.fsutil import sha256_file
from quarl_edge.runtimes.manifest import load_manifest
from quarl_edge.runtimes.trace import load_trace
from quarl_edge.tune.result import TuneResult
from quarl_edge.tune.search import run_tune
from quarl_edge.tune.verify import read_tune_json

pytestmark = pytest.mark.slow


class Logs(list[str]):
    def __call__(self, message: str) -> None:
        self.append(message)

    def having(self, words: str) -> list[str]:
        return [m for m in self if words in m]


def assert_ships_what_it_measured(out: Path, result: TuneResult) -> dict[str, Any]:
    """tune.json reads back (gate's checks), names the sha256 of every model it reports, the shipped
    bundle holds exactly those bytes, and a fresh bench of it gives tune.json's rewards on the same seeds."""
    block = read_tune_json(out / "tune.json")
    assert block is not None
    report = json.loads((out / "tune.json").read_text())  # the JSON as written, beside its typed reading
    assert (
        block.tune_block() == result.tune_block() and block.choice is not None and block.shipped is not None
    )
    manifest = load_manifest(out / "bundle")
    shipped = {m.name: m.sha256 for m in manifest.models}
    assert shipped == dict(block.shipped.models) == {n: block.row(n).sha256 for n in shipped}
    assert shipped[block.choice.name] == block.choice.sha256
    assert (
        sha256_file(out / "bundle" / "manifest.json")
        == block.shipped.manifest_sha256
        == report["bundle"]["manifest_sha256"]
    )
    assert manifest.policy.name == block.policy == report["bundle"]["policy"]
    # the measured files are in the candidates bundle tune measured, byte for byte
    candidates = load_manifest(result.bundle)
    assert {m.name: m.sha256 for m in candidates.models if m.name in shipped} == shipped
    s = report["settings"]
    fresh = bench(out / "bundle", BenchConfig(episodes=s["episodes"], seed=s["seeds"][0], threads=s["threads"],
                                              latency_samples=0, models=(block.choice.name,))).to_dict()  # fmt: skip
    rewards = {m["name"]: (m["reward"]["seeds"], m["reward"]["per_episode"]) for m in report["models"]}
    assert {m["name"]: (m["reward"]["seeds"], m["reward"]["per_episode"]) for m in fresh["models"]} == rewards
    return report


def _reference_reward(report: dict[str, Any]) -> float:
    return float(next(m for m in report["models"] if m["name"] == report["reference"])["reward"]["mean"])


def test_changed_weights_at_the_same_path_are_measured_again(cartpole_policy: Path, cartpole_calib: Path,
                                                             tmp_path: Path) -> None:  # fmt: skip
    policy, out = tmp_path / "policy", tmp_path / "tuned"
    shutil.copytree(cartpole_policy, policy)
    first = run_tune(small(policy, out, cartpole_calib, episodes=3))
    assert _reference_reward(assert_ships_what_it_measured(out, first)) == 500.0
    # the same policy file names, spec and path; weights that always push left: ~9 steps of CartPole
    p = load_checkpoint(policy)
    with torch.no_grad():
        p.net.out.weight.zero_()
        p.net.out.bias.copy_(torch.tensor([1.0, 0.0]))
    save_checkpoint(p, policy)
    assert load_checkpoint(policy).spec.to_dict() == load_checkpoint(cartpole_policy).spec.to_dict()
    logs = Logs()
    second = run_tune(small(policy, out, cartpole_calib, episodes=3), log=logs)
    assert logs.having("the policy changed") and second.reused_measurements == 0
    assert second.inputs.policy_sha256 != first.inputs.policy_sha256
    assert {r.sha256 for r in second.candidates}.isdisjoint(r.sha256 for r in first.candidates)
    report = assert_ships_what_it_measured(out, second)
    assert _reference_reward(report) < 50  # the changed policy's own reward, not the cached 500


def test_a_changed_calibration_file_is_measured_again(cartpole_policy: Path, cartpole_calib: Path,
                                                      tmp_path: Path) -> None:  # fmt: skip
    calib, out = tmp_path / "calib.npz", tmp_path / "tuned"
    shutil.copyfile(cartpole_calib, calib)
    first = run_tune(small(cartpole_policy, out, calib))
    other = cartpole_calib.with_name("cartpole-a2c.npz")  # another recorded CartPole trace, same path
    shutil.copyfile(other, calib)
    logs = Logs()
    second = run_tune(small(cartpole_policy, out, calib), log=logs)
    assert logs.having("the calibration changed") and second.reused_measurements == 0
    assert second.inputs.calibration_sha256 == sha256_file(other) != first.inputs.calibration_sha256
    assert (
        second.bundle != first.bundle and not Path(first.bundle).exists()
    )  # re-exported, the stale one gone
    assert_ships_what_it_measured(out, second)
    assert load_manifest(out / "bundle").calibration["sha256"] == load_trace(other).sha256  # type: ignore[index]


def test_a_policy_replaced_by_another_at_the_same_path(cartpole_policy: Path, tmp_path: Path) -> None:
    policy, out = tmp_path / "policy", tmp_path / "tuned"
    shutil.copytree(cartpole_policy, policy)
    first = run_tune(small(policy, out))  # no --calibration: recorded into the cache, for this policy
    shutil.rmtree(policy)
    shutil.copytree(cartpole_policy.with_name("cartpole-a2c"), policy)
    logs = Logs()
    second = run_tune(small(policy, out), log=logs)
    assert logs.having("recording 10 episodes")  # the first policy's recorded calibration is not reused
    assert (first.policy, second.policy) == ("cartpole-ppo", "cartpole-a2c")
    report = assert_ships_what_it_measured(out, second)
    assert report["bundle"]["policy"] == report["tune"]["policy"] == "cartpole-a2c"
    assert sorted(p.name for p in (out / ".cache").glob("calibration*.npz")) == [
        Path(second.calibration).name
    ]


def test_a_damaged_cache_is_measured_again_never_reused_never_fatal(cartpole_policy: Path, cartpole_calib: Path,
                                                                    tmp_path: Path) -> None:  # fmt: skip
    out = tmp_path / "tuned"
    cfg = small(cartpole_policy, out, cartpole_calib)
    first = run_tune(cfg)
    state = out / ".cache" / "state.json"
    data = json.loads(state.read_text())
    entries = sum(len(data[s]) for s in ("layers", "screen", "latency", "closed", "confirm"))
    assert first.choice is not None and first.choice.name != first.reference
    # an impossible latency and a closed loop said to be of other bytes: both measured again
    lat = next(iter(data["latency"]))
    data["latency"][lat]["value"]["p50_us"] = -5.0
    data["closed"][first.choice.name]["model"] = "0" * 64 + "+" + "0" * 64
    state.write_text(json.dumps(data))
    logs = Logs()
    second = run_tune(cfg, log=logs)
    assert len(logs.having("damaged or stale entries")) == 1 and second.reused_measurements == entries - 2
    again = json.loads(state.read_text())
    assert (
        again["latency"][lat]["value"]["p50_us"] > 0
        and again["closed"][first.choice.name]["model"] != "0" * 64
    )
    assert_ships_what_it_measured(out, second)
    # not JSON at all
    state.write_text('{"format": "quarl-edge/tune-state", "latency": ')
    logs = Logs()
    third = run_tune(cfg, log=logs)
    assert logs.having("is damaged or not readable") and third.reused_measurements == 0
    assert_ships_what_it_measured(out, third)
    # a cached candidate bundle whose model file was changed: exported again, its models measured again
    model = next(Path(third.bundle).glob("policy.*.tflite"))
    model.write_bytes(model.read_bytes()[:-1] + bytes([model.read_bytes()[-1] ^ 1]))
    logs = Logs()
    fourth = run_tune(cfg, log=logs)
    assert logs.having("cached candidates bundle") and logs.having("fails its check")
    assert_ships_what_it_measured(out, fourth)
