"""The DeepMind Control Suite through shimmy (the `dmc` extra): the task list from dm_control itself, the
Dict -> float32 flattening as manifest data rebuilt identically on the device side, and a short SAC run
on cartpole-balance through train, record, export (ONNX fp32/int8, TFLite int8) and a closed-loop bench.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("dm_control", reason="the dmc extra is not installed")
pytest.importorskip("shimmy", reason="the dmc extra is not installed")

from quarl_edge.policy.net import Policy, load_checkpoint  # noqa: E402
from quarl_edge.policy.registry import DMC_IMPORTS, dmc_entries, dmc_tasks, entry, env_config  # noqa: E402
from quarl_edge.runtimes.envs import FLATTEN_DICT, make_env  # noqa: E402
from quarl_edge.runtimes.errors import InputError, MissingDependencyError  # noqa: E402
from quarl_edge.runtimes.runner import PolicyRunner  # noqa: E402
from quarl_edge.runtimes.spec import EnvConfig, WrapperConfig  # noqa: E402
from quarl_edge.runtimes.trace import load_trace  # noqa: E402
from quarl_edge.train.trainer import TrainConfig, evaluate, train  # noqa: E402

CARTPOLE = "dm_control/cartpole-balance-v0"
# walker's entries come in dm_control's own order (orientations, height, velocity) and height is a scalar
TASKS = ("cartpole-balance", "walker-stand", "cheetah-run", "reacher-easy", "finger-spin")


def test_the_suite_tasks_are_dm_controls_own_list() -> None:
    from dm_control import suite

    assert dmc_tasks() == tuple(f"{d}-{t}" for d, t in suite.ALL_TASKS)
    ids = {e.id for e in dmc_entries()}
    assert {f"dm_control/{t}-v0" for t in TASKS} <= ids
    assert entry("dm_control/walker-stand").id == "dm_control/walker-stand-v0"  # the version is optional
    assert entry(CARTPOLE).family == "dmc" and entry(CARTPOLE).extra == "dmc"


def _rollout(env: Any, seed: int, steps: int = 20) -> tuple[list[Any], list[float]]:
    """Observations and rewards under seeded random actions; closes the env."""
    try:
        obs, _ = env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        out, rewards = [obs], []
        for _ in range(steps):
            obs, r, _, _, _ = env.step(rng.uniform(-1, 1, env.action_space.shape))
            out.append(obs)
            rewards.append(float(r))
        return out, rewards
    finally:
        env.close()


@pytest.mark.parametrize("task", TASKS)
def test_the_device_rebuilds_the_hosts_flattened_observations(task: str) -> None:
    """The env as a manifest carries it (JSON round trip, as the runner reads it) gives the host's
    observations bit for bit, and they are the raw Dict's entries in sorted key order, as float32."""
    import gymnasium as gym
    import shimmy

    host = env_config(f"dm_control/{task}-v0")
    assert [w.name for w in host.wrappers] == [FLATTEN_DICT] and host.imports == DMC_IMPORTS
    device = EnvConfig.from_dict(json.loads(json.dumps(host.to_dict())))
    host_obs, host_r = _rollout(make_env(host), seed=3)
    device_obs, device_r = _rollout(make_env(device), seed=3)
    assert host_r == device_r
    for h, d in zip(host_obs, device_obs, strict=True):
        assert h.dtype == np.float32 and d.dtype == np.float32 and np.array_equal(h, d)
    gym.register_envs(shimmy)
    raw_obs, raw_r = _rollout(gym.make(f"dm_control/{task}-v0"), seed=3)
    assert raw_r == host_r
    keys = host.wrappers[0].kwargs["keys"]
    assert keys == sorted(raw_obs[0]) and host.wrappers[0].kwargs["sizes"] == [
        np.size(raw_obs[0][k]) for k in keys
    ]
    for h, raw in zip(host_obs, raw_obs, strict=True):
        assert np.array_equal(h, np.concatenate([np.ravel(raw[k]) for k in keys]).astype(np.float32))
    # the order of gymnasium's own FlattenObservation, so an SB3 policy trained with it imports as is
    flat_obs, _ = _rollout(gym.wrappers.FlattenObservation(gym.make(f"dm_control/{task}-v0")), seed=3)
    assert all(np.array_equal(h, f.astype(np.float32)) for h, f in zip(host_obs, flat_obs, strict=True))
    if task == "walker-stand":
        assert list(raw_obs[0]) != keys  # dm_control's own order differs: the sorted order is a real choice
        assert host_obs[-1][0] == np.float32(raw_obs[-1]["height"])


def test_a_flattening_that_does_not_match_the_env_is_refused() -> None:
    good = env_config(CARTPOLE)
    for kwargs in ({"keys": ["position", "velocity"], "sizes": [3, 3]}, {"keys": ["position"], "sizes": [3]}):
        bad = EnvConfig(CARTPOLE, family="dmc", imports=DMC_IMPORTS,
                        wrappers=(WrapperConfig(FLATTEN_DICT, kwargs),))  # fmt: skip
        with pytest.raises(InputError, match="differ from the policy's"):
            make_env(bad)
    bad = EnvConfig(CARTPOLE, family="dmc", imports=DMC_IMPORTS,
                    wrappers=(WrapperConfig(FLATTEN_DICT, {"keys": ["position"], "sizes": [3, 2]}),))  # fmt: skip
    with pytest.raises(InputError, match="lists of keys and of sizes, of one length"):
        make_env(bad)
    make_env(good).close()


def test_a_missing_dmc_extra_names_its_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a machine without dm-control: importing it fails (sys.modules[name] = None makes it so)."""
    for name in [m for m in sys.modules if m == "dm_control" or m.startswith("dm_control.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "dm_control", None)
    dmc_tasks.cache_clear()
    try:
        with pytest.raises(MissingDependencyError) as info:
            entry("dm_control/walker-stand-v0")
        assert info.value.fix == "install it with: pip install 'quarl-edge[dmc]'"
        assert "'dm_control/walker-stand-v0' needs the module 'dm_control'" in info.value.problem
        with pytest.raises(MissingDependencyError, match=r"quarl-edge\[dmc\]"):  # the device side too
            make_env(EnvConfig(CARTPOLE, family="dmc", imports=DMC_IMPORTS))
    finally:
        dmc_tasks.cache_clear()


# ---- a short SAC run, end to end ---------------------------------------------------------------------

STEPS = 2000


@pytest.fixture(scope="module")
def sac_cartpole(tmp_path_factory: pytest.TempPathFactory) -> tuple[Policy, Path]:
    """SAC on cartpole-balance for 2,000 steps (updates from step 500, a 32x32 MLP): not a good policy,
    but one whose actions vary with the state, so agreement and paired returns discriminate."""
    import torch

    out = tmp_path_factory.mktemp("dmc") / "cartpole-sac"
    cfg = TrainConfig(env=CARTPOLE, algo="sac", out=out, steps=STEPS, net_arch=(32, 32), eval_episodes=2,
                      overrides={"learning_starts": 500, "batch_size": 64})  # fmt: skip
    # One thread: on a loaded 2-core machine a 64x64 MLP's Adam step took 127 ms with torch's default two
    # intra-op threads (spin-waiting for each other) and 5 ms with one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train(cfg), out
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_sac_trains_exports_and_benches_closed_loop(
    sac_cartpole: tuple[Policy, Path], tmp_path: Path
) -> None:
    """record, export and bench as the commands call them (library calls: the commands' own contract is
    tested in test_bad_input.py and test_bench_gate.py)."""
    from quarl_edge.bench.run import BenchConfig, bench
    from quarl_edge.bundle import BundleRequest, export_bundle
    from quarl_edge.record import RecordConfig, record_to_file

    policy, ckpt = sac_cartpole
    assert policy.spec.train["steps"] == STEPS
    assert policy.spec.observation_space.shape == (5,) and policy.spec.observation_space.dtype == "float32"
    assert load_checkpoint(ckpt).spec.env == env_config(CARTPOLE)
    record_to_file(load_checkpoint(ckpt), RecordConfig(episodes=2), tmp_path / "calib.npz")
    targets = ("onnx-fp32", "onnx-int8", "tflite-int8")
    request = BundleRequest(out=tmp_path / "bundle", targets=targets, calibration=tmp_path / "calib.npz")
    export_bundle(load_checkpoint(ckpt), request)
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert EnvConfig.from_dict(manifest["policy"]["env"]) == env_config(CARTPOLE)  # the flattening is data
    report = bench(tmp_path / "bundle", BenchConfig(episodes=2, latency_samples=50)).to_dict()
    models: dict[str, Any] = {m["name"]: m for m in report["models"]}
    assert set(models) == {"onnx-fp32", "onnx-int8", "tflite-int8"}
    for m in models.values():
        assert m["reward"]["episodes"] == 2 and m["warnings"] == [], m
    for name in ("onnx-int8", "tflite-int8"):
        assert models[name]["agreement"]["value"] >= 0.95, models[name]["agreement"]
    # closed loop on the device side (the runner's env from the manifest) earns what the torch policy
    # earns on the host, seed for seed: a flattening that differed would steer it elsewhere
    seeds = report["settings"]["seeds"]
    runner = PolicyRunner(tmp_path / "bundle", "onnx-fp32")
    device = [r.ret for r in runner.episodes(seeds)]
    host = [evaluate(policy, 1, seed0=s)[0] for s in seeds]
    assert device == pytest.approx(host, rel=0.02) and device == pytest.approx(
        models["onnx-fp32"]["reward"]["per_episode"]
    )
    greedy = policy.predict(load_trace(tmp_path / "calib.npz").obs)
    assert float(np.std(greedy)) > 0.05, "a constant policy would agree with anything"


@pytest.mark.slow
def test_a_dmc_policy_joins_a_user_zoo_and_the_ptq_study(
    sac_cartpole: tuple[Policy, Path], tmp_path: Path
) -> None:
    """`zoo add` then `study ptq --zoo DIR`: the zoo's env check makes the task (no skipped row) and
    every variant runs closed loop on it."""
    import os
    import shutil
    import subprocess
    import tempfile

    from quarl_edge.zoo import add

    _, ckpt = sac_cartpole
    zoo = tmp_path / "zoo"
    added = add(ckpt, "my-cartpole-balance", zoo=zoo, max_samples=2000)
    assert added.env == CARTPOLE and added.calibration.is_file()
    ray_tmp = Path(tempfile.mkdtemp(prefix="qe-ray-", dir="/tmp"))
    env = dict(os.environ, RAY_TMPDIR=str(ray_tmp), PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "quarl_edge.cli", "study", "ptq", "--zoo", str(zoo), "--episodes", "2",
           "--bits", "8", "--out", str(tmp_path / "study"), "--json"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, proc.stderr
    rows = {r["variant"]: r for r in json.loads(proc.stdout)["results"]}
    assert not any(r.get("skipped") for r in rows.values()), rows
    assert {"fp32", "w8", "onnx-int8", "tflite-int8"} <= set(rows)
    assert all(len(r["returns"]) == 2 for r in rows.values())
