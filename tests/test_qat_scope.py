"""`--qat-scope actor`: only the exported network trains fake-quantized; critics, value heads and target
networks stay fp32. `all` (the default) fake-quantizes every layer of the SB3 policy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import CliRun, assert_absent, assert_one_error
from torch import nn

from quarl_edge.policy.net import load_checkpoint
from quarl_edge.quant.config import QATConfig
from quarl_edge.quant.qat import QATClock, qat_layers
from quarl_edge.runtimes.errors import InputError
from quarl_edge.train.qat_sb3 import check_separate, convert_scoped
from quarl_edge.train.trainer import TrainConfig, train

# The deployed network's Linear layers, by hand (the oracle: not read from the code under test)
EXPORTED = {
    "sac": {"actor.latent_pi.0", "actor.latent_pi.2", "actor.mu"},
    "td3": {"actor.mu.0", "actor.mu.2", "actor.mu.4"},
    "dqn": {"q_net.q_net.0", "q_net.q_net.2", "q_net.q_net.4"},
    "ppo": {"mlp_extractor.policy_net.0", "mlp_extractor.policy_net.2", "action_net"},
}
ENVS = {"sac": "Pendulum-v1", "td3": "Pendulum-v1", "dqn": "CartPole-v1", "ppo": "CartPole-v1"}


def _sb3(algo: str) -> Any:
    import stable_baselines3 as sb3

    return getattr(sb3, algo.upper())(
        "MlpPolicy", ENVS[algo], device="cpu", policy_kwargs={"net_arch": [16, 16]}
    )


@pytest.mark.parametrize("algo", list(EXPORTED))
def test_actor_scope_quantizes_exactly_the_exported_layers(algo: str) -> None:
    actor, every = _sb3(algo), _sb3(algo)
    assert convert_scoped(actor, algo, QATConfig(bits=4, scope="actor"), QATClock(0)) == len(EXPORTED[algo])
    assert {name for name, _ in qat_layers(actor.policy)} == EXPORTED[algo]
    plain = [n for n, m in actor.policy.named_modules() if type(m) is nn.Linear]
    # critics / value heads / targets are untouched, and there are some
    assert plain and not any(n in EXPORTED[algo] for n in plain)
    n_all = convert_scoped(every, algo, QATConfig(bits=4), QATClock(0))
    assert n_all == len(plain) + len(EXPORTED[algo])  # `all` takes them too (SAC's log_std included)


def test_a_network_shared_with_the_value_head_is_refused() -> None:
    trunk = nn.Linear(4, 8)
    policy = nn.Module()
    policy.pi = nn.Sequential(trunk, nn.Linear(8, 2))
    policy.vf = nn.Sequential(trunk, nn.Linear(8, 1))
    with pytest.raises(InputError, match="no separate actor"):
        check_separate(policy, ["pi."], "ppo")
    check_separate(policy, ["pi.1."], "ppo")  # the pi head alone is its own


def test_ppo_on_the_nature_cnn_has_no_separate_actor(tmp_path: Path) -> None:
    out = tmp_path / "pong"
    with pytest.raises(InputError, match="PPO policy has no separate actor") as info:
        train(TrainConfig(env="ALE/Pong-v5", algo="ppo", out=out, steps=100,
                          qat=QATConfig(bits=4, scope="actor")))  # fmt: skip
    assert info.value.exit_code == 2 and "--qat-scope all" in str(info.value.fix)
    assert_absent(out)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--qat-scope", "actor"], "--qat-bits"),
        (["--qat-bits", "4", "--qat-scope", "critic"], "choose all or actor"),
    ],
)
def test_bad_scope_options_are_one_line_errors(
    cli: CliRun, tmp_path: Path, args: list[str], says: str
) -> None:
    p = cli("train", "--env", "CartPole-v1", "--algo", "ppo", *args, "--out", tmp_path / "x")
    assert says in assert_one_error(p)
    assert_absent(tmp_path / "x")


@pytest.mark.slow
def test_actor_scope_training_checkpoint_records_its_scope(cli: CliRun, tmp_path: Path) -> None:
    out = tmp_path / "sac-actor"
    p = cli("train", "--env", "Pendulum-v1", "--algo", "sac", "--steps", "400", "--qat-bits", "4",
            "--qat-scope", "actor", "--net-arch", "16,16", "--eval-episodes", "1", "--out", out)  # fmt: skip
    assert p.returncode == 0, p.stderr
    meta = json.loads((out / "policy.json").read_text())
    assert meta["arch"]["qat"]["scope"] == "actor" and meta["arch"]["qat"]["layers"] == 3
    with np.load(out / "weights.npz") as z:  # the exported layers learned their activation ranges
        his = [float(z[k]) for k in z.files if k.endswith("act_hi")]
    assert len(his) == 3 and all(h > 0 for h in his)
    policy = load_checkpoint(out)
    assert len(qat_layers(policy.net)) == 3 and policy.spec.train["qat"]["scope"] == "actor"
