"""Fake quantization while an SB3 model trains: the step clock's callback, and which layers train
fake-quantized. ``--qat-scope all``: every Linear/Conv2d of the policy (actor, critics, value heads,
target networks). ``actor``: only the layers exported as the deployed network (SAC's actor.latent_pi +
actor.mu, TD3/DDPG's actor.mu, DQN's q_net, PPO/A2C's policy_net + action_net, each with its features
extractor), read from the prefixes the checkpoint writer copies (policy.sb3.actor_layers), so the two
cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from quarl_edge.policy.sb3 import actor_layers, parts_from_model
from quarl_edge.quant.config import QATConfig
from quarl_edge.quant.qat import QATClock, convert, convert_layer
from quarl_edge.runtimes.errors import InputError

SCOPE_FIX = "use --qat-scope all, or an MLP policy (its actor has layers of its own)"


def check_scope(cfg: QATConfig | None, algo: str, model: str) -> None:
    """Before the model is built: PPO/A2C share the Nature-CNN between the actor and the value head."""
    if cfg is not None and cfg.scope == "actor" and algo in ("ppo", "a2c") and model == "nature_cnn":
        raise no_separate_actor(algo)


def no_separate_actor(algo: str) -> InputError:
    return InputError(
        f"--qat-scope actor: this {algo.upper()} policy has no separate actor (its exported network "
        "shares layers with the value head, e.g. the Nature-CNN of PPO/A2C)",
        SCOPE_FIX,
    )


def _under(name: str, prefix: str) -> bool:
    return (name + ".").startswith(prefix)


def exported_prefixes(model: Any, algo: str) -> list[str]:
    """State-dict prefixes ('actor.mu.', ...) of the deployed network's modules in the SB3 ``model``."""
    fx, hidden, out = actor_layers(parts_from_model(model, algo))
    return [fx, *hidden, out]


def check_separate(policy: nn.Module, prefixes: list[str], algo: str) -> None:
    """Refuse a deployed network whose parameters other modules also use (a shared features extractor):
    fake-quantizing it would quantize the value head as well."""
    inside: set[int] = set()
    outside: set[int] = set()
    for name, module in policy.named_modules(remove_duplicate=False):  # aliases under every name
        own = {id(p) for p in module.parameters(recurse=False)}
        (inside if any(_under(name, p) for p in prefixes) else outside).update(own)
    if inside & outside:
        raise no_separate_actor(algo)


def convert_scoped(model: Any, algo: str, cfg: QATConfig, clock: QATClock) -> int:
    """Fake-quantize ``model.policy`` in place as ``cfg.scope`` says; returns the number of layers."""
    policy: nn.Module = model.policy
    if cfg.scope == "all":
        return convert(policy, cfg, clock)
    prefixes = exported_prefixes(model, algo)
    check_separate(policy, prefixes, algo)
    names = dict(policy.named_modules())
    return sum(convert_layer(names[p[:-1]], cfg, clock, p[:-1]) for p in prefixes if p[:-1] in names)


def clock_callback(clock: QATClock) -> Any:
    """An SB3 callback that advances ``clock`` with the environment steps."""
    from stable_baselines3.common.callbacks import BaseCallback

    class QATStep(BaseCallback):
        """Advances the QAT clock with the environment steps (fake quantization starts at the delay)."""

        def _on_training_start(self) -> None:
            clock.step = self.model.num_timesteps

        def _on_step(self) -> bool:
            clock.step = self.model.num_timesteps
            return True

    return QATStep()
