"""The algorithm table: which algorithms quarl-edge trains, and how each importable algorithm's
deterministic actor (or greedy Q-network) sits in its Stable-Baselines3 / sb3-contrib state dict.

It sits in policy/ (below train/, which imports it) so that importing a zip never pulls training code.
Names are RL Zoo's (``ppo_lstm``, ``ppo_mask``), which are also the first part of its file names.
"""

from __future__ import annotations

from dataclasses import dataclass

ALGOS = ("ppo", "a2c", "dqn", "ddpg", "td3", "sac")
"""what `quarl-edge train` trains"""
CONTINUOUS_ONLY = ("ddpg", "td3", "sac")
DISCRETE_ONLY = ("dqn",)


@dataclass(frozen=True)
class AlgoLayout:
    """Where one algorithm keeps its deterministic policy in the SB3 state dict, and what it ends in."""

    name: str
    library: str
    """``sb3`` or ``sb3-contrib`` (the pip package its zips come from)"""
    kind: str
    """actor_critic (mlp_extractor.policy_net + action_net), q (a Q-network, argmax), quantile (QR-DQN:
    the mean over quantiles, argmax), actor (SAC-style latent_pi + mu, tanh-squashed), actor_chain (TD3:
    actor.mu.N), ars (action_net.N), crossq (SAC's actor with BatchRenorm before every Linear),
    recurrent (RecurrentPPO: an LSTM before the actor-critic head)"""
    activation: str
    """the activation SB3 uses when the zip's policy_kwargs do not name one"""
    continuous_only: bool = False
    discrete_only: bool = False
    mask: bool = False
    """the action mask is an input at every step (MaskablePPO)"""


LAYOUTS: dict[str, AlgoLayout] = {
    a.name: a
    for a in (
        AlgoLayout("ppo", "sb3", "actor_critic", "tanh"),
        AlgoLayout("a2c", "sb3", "actor_critic", "tanh"),
        AlgoLayout("dqn", "sb3", "q", "relu", discrete_only=True),
        AlgoLayout("sac", "sb3", "actor", "relu", continuous_only=True),
        AlgoLayout("td3", "sb3", "actor_chain", "relu", continuous_only=True),
        AlgoLayout("ddpg", "sb3", "actor_chain", "relu", continuous_only=True),
        AlgoLayout("tqc", "sb3-contrib", "actor", "relu", continuous_only=True),
        AlgoLayout("crossq", "sb3-contrib", "crossq", "relu", continuous_only=True),
        AlgoLayout("qrdqn", "sb3-contrib", "quantile", "relu", discrete_only=True),
        AlgoLayout("trpo", "sb3-contrib", "actor_critic", "tanh"),
        AlgoLayout("ars", "sb3-contrib", "ars", "relu"),
        AlgoLayout("ppo_mask", "sb3-contrib", "actor_critic", "tanh", mask=True),
        AlgoLayout("ppo_lstm", "sb3-contrib", "recurrent", "tanh"),
    )
}
IMPORTABLE = tuple(LAYOUTS)
"""every algorithm whose zips import (RL Zoo names)"""
SQUASHED = ("sac", "td3", "ddpg", "tqc", "crossq")
"""actors whose output is tanh-squashed and rescaled to the action bounds"""

# sb3-contrib's module of each algorithm's policy class (``sb3_contrib.tqc.policies``)
_CONTRIB_MODULES = {
    "tqc": "tqc",
    "qrdqn": "qrdqn",
    "ars": "ars",
    "crossq": "crossq",
    "ppo_mask": "ppo_mask",
    "ppo_lstm": "ppo_recurrent",
}
ALIASES = {"maskableppo": "ppo_mask", "maskable_ppo": "ppo_mask", "recurrentppo": "ppo_lstm",
           "recurrent_ppo": "ppo_lstm", "qr-dqn": "qrdqn", "qr_dqn": "qrdqn"}  # fmt: skip


def canonical(name: str) -> str:
    """An algorithm name as the user may type it (``RecurrentPPO``, ``qr-dqn``) -> the table's."""
    low = name.strip().lower()
    return ALIASES.get(low, low)


def algo_from_data(data: dict[str, object]) -> str | None:
    """The algorithm of an SB3 / sb3-contrib zip from its ``data``: the policy class's module, then the
    hyperparameters only one algorithm saves (TRPO's conjugate gradient, PPO's clip range, DDPG's delay)."""
    policy_class = data.get("policy_class")
    module = str(policy_class.get("__module__", "")) if isinstance(policy_class, dict) else ""
    for algo, mod in _CONTRIB_MODULES.items():
        if module.startswith(f"sb3_contrib.{mod}."):
            return algo
    # MaskablePPO's and RecurrentPPO's policy classes live in sb3-contrib's common package
    if module.startswith("sb3_contrib.common.maskable."):
        return "ppo_mask"
    if module.startswith("sb3_contrib.common.recurrent."):
        return "ppo_lstm"
    # SB3's DDPG is TD3 with policy_delay=1 and target noise clipped to 0, sharing TD3's policy class
    if (
        ".td3." in module
        and str(data.get("policy_delay")) == "1"
        and str(data.get("target_noise_clip")) in ("0", "0.0")
    ):
        return "ddpg"
    for name in ("sac", "td3", "dqn"):
        if f"stable_baselines3.{name}." in module:
            return name
    if "stable_baselines3.common.policies" in module:
        if "cg_max_steps" in data:
            return "trpo"
        return "ppo" if "clip_range" in data else "a2c"
    return None
