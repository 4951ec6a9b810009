"""SB3 / RL Zoo .zip import: the exported fp32 ONNX acts exactly as SB3's own ``predict``.

Each case trains a real SB3 model briefly (so the weights are not the initialisation), saves it the
RL Zoo way (``{algo}-{EnvId}.zip``), imports it with ``load_sb3_zip``, exports ``onnx-fp32`` and runs the
ONNX model with the device runner on 1,000 raw observations recorded from real env rollouts.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from stable_baselines3 import A2C, DDPG, DQN, PPO, SAC, TD3
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.policy.load import load_policy
from quarl_edge.policy.net import Policy
from quarl_edge.policy.registry import env_config
from quarl_edge.policy.sb3_zip import load_sb3_zip
from quarl_edge.policy.vecnormalize import load_vecnormalize
from quarl_edge.record import RecordConfig, record
from quarl_edge.runtimes.envs import make_env
from quarl_edge.runtimes.errors import InputError, IntegrityError, QuarlError
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.trace import Trace, save_trace

N_OBS = 1000
ALGOS: dict[str, type[BaseAlgorithm]] = {
    "ppo": PPO,
    "a2c": A2C,
    "dqn": DQN,
    "sac": SAC,
    "td3": TD3,
    "ddpg": DDPG,
}
_OFF_POLICY = {"learning_starts": 100, "train_freq": 4}


@dataclass(frozen=True)
class Case:
    id: str
    algo: str
    env_id: str  # gymnasium id the model is trained on
    file_env: str  # EnvId part of the RL Zoo file name
    steps: int
    head: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    policy: str = "MlpPolicy"
    vecnormalize: bool = False
    epsilon: float = 0.3  # exploration while recording, so the observations leave the greedy path
    action_net_std: float | None = None  # wide PPO action layer: the mean leaves the bounds, the clip acts


CASES = [
    Case("ppo-CartPole", "ppo", "CartPole-v1", "CartPole-v1", 256, "argmax",
         {"n_steps": 128, "batch_size": 64, "n_epochs": 2}),
    Case("a2c-CartPole", "a2c", "CartPole-v1", "CartPole-v1", 250, "argmax"),
    Case("dqn-CartPole", "dqn", "CartPole-v1", "CartPole-v1", 1000, "argmax",
         {"learning_starts": 100, "train_freq": 1, "learning_rate": 1e-3, "target_update_interval": 50,
          "policy_kwargs": {"net_arch": [64, 64]}}),
    Case("sac-Pendulum", "sac", "Pendulum-v1", "Pendulum-v1", 300, "tanh_unscale", dict(_OFF_POLICY)),
    Case("td3-Pendulum-vecnormalize", "td3", "Pendulum-v1", "Pendulum-v1", 300, "tanh_unscale",
         dict(_OFF_POLICY), vecnormalize=True),
    Case("ddpg-Pendulum", "ddpg", "Pendulum-v1", "Pendulum-v1", 300, "tanh_unscale", dict(_OFF_POLICY)),
    Case("ppo-Pendulum-clip", "ppo", "Pendulum-v1", "Pendulum-v1", 256, "clip",
         {"n_steps": 128, "batch_size": 64, "n_epochs": 2}, action_net_std=0.5),
    # Nature-CNN DQN on the real Atari preprocessing; the RL Zoo name resolves to ALE/Pong-v5
    Case("dqn-Pong-cnn", "dqn", "ALE/Pong-v5", "PongNoFrameskip-v4", 128, "argmax",
         {"buffer_size": 1000, "learning_starts": 64, "train_freq": 16, "batch_size": 8},
         policy="CnnPolicy", epsilon=0.5),
]  # fmt: skip


@dataclass
class Trained:
    case: Case
    model: BaseAlgorithm
    zip_path: Path
    vecnorm: VecNormalize | None = None
    vecnorm_path: Path | None = None


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    # SB3 training of tiny nets is slower with several threads on a small, shared CI machine
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _train(case: Case, out: Path) -> Trained:
    torch.manual_seed(0)
    cfg = env_config(case.env_id)
    vecnorm = VecNormalize(DummyVecEnv([lambda: make_env(cfg)])) if case.vecnormalize else None
    env: Any = vecnorm if vecnorm is not None else make_env(cfg)
    model = ALGOS[case.algo](case.policy, env, seed=0, device="cpu", **case.kwargs)
    model.learn(case.steps)
    if case.action_net_std is not None:  # after learning, as a fine-tuned policy with large actions
        torch.nn.init.normal_(model.policy.action_net.weight, std=case.action_net_std)
    zip_path = out / f"{case.algo}-{case.file_env}.zip"
    model.save(zip_path)
    vn_path = None
    if vecnorm is not None:
        vn_path = out / "vec_normalize.pkl"
        vecnorm.save(str(vn_path))
    return Trained(case, model, zip_path, vecnorm, vn_path)


@pytest.fixture(scope="module", params=CASES, ids=[c.id for c in CASES])
def trained(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    case: Case = request.param
    return _train(case, tmp_path_factory.mktemp(case.id))


def _sb3_actions(t: Trained, raw_obs: np.ndarray) -> np.ndarray:
    obs = t.vecnorm.normalize_obs(raw_obs) if t.vecnorm is not None else raw_obs
    actions, _ = t.model.predict(obs, deterministic=True)
    return np.asarray(actions)


def _record(policy: Policy, case: Case) -> Trace:
    trace = record(policy, RecordConfig(episodes=N_OBS, epsilon=case.epsilon, seed=7, max_samples=N_OBS))
    assert trace.samples == N_OBS
    return trace


def test_fp32_onnx_acts_like_sb3_predict(trained: Trained, tmp_path: Path) -> None:
    t, case = trained, trained.case
    policy = load_sb3_zip(t.zip_path, vecnormalize=t.vecnorm_path)  # algo and env from data / file name
    assert policy.spec.env.id == case.env_id
    assert policy.spec.algo in (case.algo, "td3" if case.algo == "ddpg" else case.algo)
    assert policy.arch.head == case.head
    assert policy.arch.model == ("nature_cnn" if case.policy == "CnnPolicy" else "mlp")
    assert policy.arch.obs_norm is case.vecnormalize
    assert policy.spec.train["num_timesteps"] == t.model.num_timesteps >= case.steps

    trace = _record(policy, case)  # raw observations of real rollouts
    calib = save_trace(trace, tmp_path / "calib.npz")
    manifest = export_bundle(
        policy, BundleRequest(out=tmp_path / "bundle", targets=("onnx-fp32",), calibration=calib)
    )
    assert [m.name for m in manifest.models] == ["onnx-fp32"]
    runner = PolicyRunner(tmp_path / "bundle", "onnx-fp32")
    rep = runner.replay(trace)
    assert rep.nonfinite_obs == 0 and rep.valid.all()

    expected = _sb3_actions(t, trace.obs)
    assert rep.actions.shape == expected.shape
    if policy.spec.action_space.is_discrete:
        np.testing.assert_array_equal(rep.actions, expected)
        if case.policy == "MlpPolicy":
            assert len(np.unique(expected)) > 1, "degenerate test: SB3 picks one action everywhere"
    else:
        np.testing.assert_allclose(rep.actions, expected, rtol=0, atol=1e-4)
        assert float(np.std(expected)) > 1e-3, "degenerate test: constant actions"
    if case.head == "clip":  # some actions hit the bounds, others not: the clip itself was compared
        at_bound = np.isclose(np.abs(expected), 2.0)
        assert 0 < at_bound.mean() < 1
    if t.vecnorm is not None:
        # the statistics are not trivial: without the in-graph normalization the actions would differ
        assert not np.allclose(t.vecnorm.obs_rms.mean, 0.0, atol=1e-2)
        assert "obs_normalize" in policy.spec.graph_steps
        unnormalized, _ = t.model.predict(trace.obs, deterministic=True)
        assert np.abs(unnormalized - expected).max() > 1e-2


def test_explicit_env_id_and_algo(trained: Trained, tmp_path: Path) -> None:
    """A .zip whose name says nothing loads with --env (and --algo); the same policy results."""
    t, case = trained, trained.case
    plain = tmp_path / "model.zip"
    shutil.copyfile(t.zip_path, plain)
    with pytest.raises(InputError, match="does not say which environment") as ei:
        load_sb3_zip(plain, vecnormalize=t.vecnorm_path)
    assert "--env" in str(ei.value)

    by_name = load_sb3_zip(t.zip_path, vecnormalize=t.vecnorm_path)
    explicit = load_policy(plain, env_id=case.env_id, algo=case.algo, vecnormalize=t.vecnorm_path)
    assert explicit.spec.env == by_name.spec.env
    assert explicit.spec.observation_space == by_name.spec.observation_space
    assert explicit.spec.action_space == by_name.spec.action_space
    assert explicit.arch == by_name.arch
    a, b = explicit.net.state_dict(), by_name.net.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0)
    # and the torch policy itself already agrees with SB3 on a few real observations
    obs = _record(by_name, case).obs[:64] if case.policy == "MlpPolicy" else None
    if obs is not None:
        expected = _sb3_actions(t, obs)
        got = explicit.predict(obs)
        if explicit.spec.action_space.is_discrete:
            np.testing.assert_array_equal(got, expected)
        else:
            np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


# ---- refused inputs --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ppo_cartpole_zip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ppo-zip") / "ppo-CartPole-v1.zip"
    PPO("MlpPolicy", "CartPole-v1", seed=0, device="cpu").save(path)
    return path


@pytest.fixture(scope="module")
def pendulum_vecnorm(tmp_path_factory: pytest.TempPathFactory) -> tuple[VecNormalize, Path]:
    vn = VecNormalize(DummyVecEnv([lambda: make_env(env_config("Pendulum-v1"))]), clip_obs=5.0)
    vn.reset()
    for _ in range(50):
        vn.step(np.array([vn.action_space.sample()]))
    path = tmp_path_factory.mktemp("vecnorm") / "vec_normalize.pkl"
    vn.save(str(path))
    return vn, path


def test_real_vecnormalize_pickle_is_read(pendulum_vecnorm: tuple[VecNormalize, Path]) -> None:
    vn, path = pendulum_vecnorm
    stats = load_vecnormalize(path)
    np.testing.assert_allclose(stats.mean, vn.obs_rms.mean)
    np.testing.assert_allclose(stats.var, vn.obs_rms.var)
    assert stats.clip_obs == 5.0 and stats.epsilon == vn.epsilon


def test_non_sb3_zip_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ppo-CartPole-v1.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("hello.txt", "not a model")
    with pytest.raises(InputError, match="is not a Stable-Baselines3 model") as ei:
        load_policy(path)
    assert "model.save()" in str(ei.value)


def test_corrupt_zip_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "ppo-CartPole-v1.zip"
    path.write_bytes(os.urandom(4096))
    with pytest.raises(IntegrityError, match="is not a valid zip file"):
        load_sb3_zip(path)


def test_truncated_zip_is_refused(ppo_cartpole_zip: Path, tmp_path: Path) -> None:
    path = tmp_path / ppo_cartpole_zip.name
    data = ppo_cartpole_zip.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    # the cut may leave the zip unreadable or expose only the nested torch archive: refused either way
    with pytest.raises((InputError, IntegrityError)):
        load_sb3_zip(path)


def _rewrite(src: Path, dst: Path, member: str, content: bytes) -> None:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for name in zin.namelist():
            zout.writestr(name, content if name == member else zin.read(name))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("member", ["data", "policy.pth"])
def test_damaged_member_is_an_integrity_error(member: str, ppo_cartpole_zip: Path, tmp_path: Path) -> None:
    path = tmp_path / ppo_cartpole_zip.name
    _rewrite(ppo_cartpole_zip, path, member, b"\x80garbage{" * 10)
    with pytest.raises(IntegrityError, match="is damaged") as ei:
        load_sb3_zip(path)
    assert "re-save the model" in str(ei.value)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_random_damage_to_weights_never_escapes_as_a_crash(ppo_cartpole_zip: Path, tmp_path: Path) -> None:
    """Flipped bytes in policy.pth: the import either still works or names the problem, never a traceback."""
    with zipfile.ZipFile(ppo_cartpole_zip) as z:
        weights = z.read("policy.pth")
    rng = np.random.default_rng(0)
    outcomes = {"loaded": 0, "refused": 0}
    for i in range(40):
        damaged = bytearray(weights)
        if i % 4 == 0:
            damaged = damaged[: int(rng.integers(len(damaged)))]
        else:
            for pos in rng.integers(0, len(damaged), size=int(rng.integers(1, 20))):
                damaged[pos] = int(rng.integers(256))
        path = tmp_path / f"{i}" / ppo_cartpole_zip.name
        path.parent.mkdir()
        _rewrite(ppo_cartpole_zip, path, "policy.pth", bytes(damaged))
        try:
            load_sb3_zip(path)
            outcomes["loaded"] += 1
        except QuarlError:
            outcomes["refused"] += 1
    assert outcomes["refused"] > 0


def test_space_mismatch_names_both_spaces(ppo_cartpole_zip: Path) -> None:
    with pytest.raises(InputError) as ei:
        load_sb3_zip(ppo_cartpole_zip, env_id="Acrobot-v1")
    msg = str(ei.value)
    assert "observation space is Box[4]" in msg
    assert "'Acrobot-v1' has Box[6]" in msg
    assert "--env" in msg


def test_wrong_algo_is_refused(ppo_cartpole_zip: Path) -> None:
    with pytest.raises(InputError, match="lack the layer") as ei:
        load_sb3_zip(ppo_cartpole_zip, algo="sac")
    assert "--algo" in str(ei.value)


def test_vecnormalize_of_another_env_is_refused(
    ppo_cartpole_zip: Path, pendulum_vecnorm: tuple[VecNormalize, Path]
) -> None:
    with pytest.raises(InputError, match="VecNormalize statistics have 3 values, the observation has 4"):
        load_sb3_zip(ppo_cartpole_zip, vecnormalize=pendulum_vecnorm[1])


def test_missing_vecnormalize_file(ppo_cartpole_zip: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        load_sb3_zip(ppo_cartpole_zip, vecnormalize=tmp_path / "nope.pkl")


# ---- malicious VecNormalize pickles ----------------------------------------------------------------


class _Reduce:
    """Pickles as ``func(*args)``: what an attacker's pickle runs on a plain ``pickle.load``."""

    def __init__(self, func: Callable[..., Any], *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.func, self.args)


def _payloads(marker: Path) -> dict[str, Any]:
    touch = f"open({str(marker)!r}, 'w').write('pwned')"
    return {
        "os.system": _Reduce(os.system, f"touch {marker}"),
        "exec": _Reduce(exec, touch),
        "eval": _Reduce(eval, touch),
        "subprocess": _Reduce(subprocess.call, ["touch", str(marker)]),
        # hidden inside a structure that looks like a VecNormalize state
        "nested": {
            "norm_obs": True,
            "clip_obs": 10.0,
            "obs_rms": {"mean": np.zeros(4), "var": _Reduce(os.system, f"touch {marker}")},
        },
    }


@pytest.mark.parametrize("kind", ["os.system", "exec", "eval", "subprocess", "nested"])
def test_malicious_vecnormalize_is_refused_and_not_run(
    kind: str, tmp_path: Path, ppo_cartpole_zip: Path
) -> None:
    marker = tmp_path / "pwned"
    pkl = tmp_path / "vec_normalize.pkl"
    pkl.write_bytes(pickle.dumps(_payloads(marker)[kind]))

    with pytest.raises(IntegrityError, match="not a readable VecNormalize file") as ei:
        load_vecnormalize(pkl)
    assert "refusing to load" in str(ei.value)
    with pytest.raises(IntegrityError):
        load_sb3_zip(ppo_cartpole_zip, vecnormalize=pkl)
    with pytest.raises(IntegrityError):
        load_policy(ppo_cartpole_zip, vecnormalize=pkl)
    assert not marker.exists()

    # control: the payload is live, a plain unpickler (in a throwaway process) does run it
    subprocess.run(
        [sys.executable, "-c", "import pickle, sys; pickle.load(open(sys.argv[1], 'rb'))", str(pkl)],
        capture_output=True,
        timeout=60,
    )
    assert marker.exists()


# ---- malicious policy.pth (weights) ----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["os.system", "exec", "nested"])
def test_malicious_policy_pth_is_refused_in_one_line_and_not_run(
    kind: str, tmp_path: Path, ppo_cartpole_zip: Path
) -> None:
    marker = tmp_path / "pwned"
    payload = _payloads(marker)[kind]
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(ppo_cartpole_zip) as src, zipfile.ZipFile(evil, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename == "policy.pth":  # the real state dict, with the payload beside the tensors
                state = torch.load(io.BytesIO(data), weights_only=True)
                buf = io.BytesIO()
                torch.save({**state, "extra": payload}, buf)
                data = buf.getvalue()
            dst.writestr(item, data)

    with pytest.raises(IntegrityError) as ei:
        load_sb3_zip(evil)
    msg = str(ei.value)
    assert "refusing to load" in msg and "\n" not in msg and "weights_only=False" not in msg
    with pytest.raises(IntegrityError):
        load_policy(evil)
    assert not marker.exists()

    # control: the payload is live, torch's unsafe load (in a throwaway process) does run it
    code = "import sys, torch; torch.load(sys.argv[1], weights_only=False)"
    member = tmp_path / "policy.pth"
    member.write_bytes(zipfile.ZipFile(evil).read("policy.pth"))
    subprocess.run([sys.executable, "-c", code, str(member)], capture_output=True, timeout=120)
    assert marker.exists()


# ---- RL Zoo / Hugging Face model folders ------------------------------------------------------------


def test_an_rl_zoo_folder_loads_its_zip_with_the_vecnormalize_beside_it(
    tmp_path: Path, ppo_cartpole_zip: Path
) -> None:
    folder = tmp_path / "ppo-CartPole-v1"
    folder.mkdir()
    shutil.copyfile(ppo_cartpole_zip, folder / "model.zip")  # the folder's name carries algo and env
    (folder / "config.yml").write_text("!!python/tuple\n- - n_timesteps\n  - 1000\n")  # read by nobody
    policy = load_policy(folder)
    assert policy.spec.env.id == "CartPole-v1" and policy.spec.algo == "ppo"
    direct = load_policy(ppo_cartpole_zip)
    obs = np.zeros((1, 4), np.float32)
    np.testing.assert_array_equal(policy.predict(obs), direct.predict(obs))


def test_an_rl_zoo_folder_with_two_zips_or_none_is_one_line(tmp_path: Path, ppo_cartpole_zip: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no .zip"):
        load_policy(empty)
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.zip", "b.zip"):
        shutil.copyfile(ppo_cartpole_zip, two / name)
    with pytest.raises(InputError, match="holds 2 model zips") as e:
        load_policy(two)
    assert "\n" not in str(e.value) and "--policy" in str(e.value)
