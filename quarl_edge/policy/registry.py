"""The registry of environment specs: how each built-in environment is made and preprocessed.

The preprocessing is data (runtimes.spec.EnvConfig) so the device side rebuilds it without this module.
Any other gymnasium id (including ``module:EnvId`` for custom envs) is accepted as a plain ``gym`` env.
"""

from __future__ import annotations

from dataclasses import dataclass

from quarl_edge.runtimes.spec import EnvConfig, WrapperConfig

# Standard DQN preprocessing (Mnih et al. 2015): no-op reset, frame skip 4, 84x84 grey, 4-frame stack.
ATARI_WRAPPERS = (
    WrapperConfig(
        "atari_preprocessing",
        {
            "noop_max": 30,
            "frame_skip": 4,
            "screen_size": 84,
            "grayscale_obs": True,
            "terminal_on_life_loss": False,
            "scale_obs": False,
        },
    ),
    WrapperConfig("frame_stack", {"stack_size": 4}),
)
# ALE's own frame skip must be off when AtariPreprocessing skips frames.
ATARI_MAKE_KWARGS = {"frameskip": 1, "repeat_action_probability": 0.25}


@dataclass(frozen=True)
class EnvEntry:
    id: str
    family: str  # classic | box2d | mujoco | atari | gym
    extra: str | None  # pip extra that provides the simulator
    default_model: str  # mlp | nature_cnn


BUILTIN: dict[str, EnvEntry] = {
    e.id: e
    for e in (
        EnvEntry("CartPole-v1", "classic", None, "mlp"),
        EnvEntry("Acrobot-v1", "classic", None, "mlp"),
        EnvEntry("MountainCar-v0", "classic", None, "mlp"),
        EnvEntry("Pendulum-v1", "classic", None, "mlp"),
        EnvEntry("MountainCarContinuous-v0", "classic", None, "mlp"),
        EnvEntry("LunarLander-v3", "box2d", "box2d", "mlp"),
        EnvEntry("LunarLanderContinuous-v3", "box2d", "box2d", "mlp"),
        EnvEntry("HalfCheetah-v5", "mujoco", "mujoco", "mlp"),
        EnvEntry("Hopper-v5", "mujoco", "mujoco", "mlp"),
        EnvEntry("Walker2d-v5", "mujoco", "mujoco", "mlp"),
        EnvEntry("ALE/Pong-v5", "atari", "atari", "nature_cnn"),
        EnvEntry("ALE/Breakout-v5", "atari", "atari", "nature_cnn"),
        EnvEntry("ALE/SpaceInvaders-v5", "atari", "atari", "nature_cnn"),
        EnvEntry("ALE/BeamRider-v5", "atari", "atari", "nature_cnn"),
        EnvEntry("ALE/Qbert-v5", "atari", "atari", "nature_cnn"),
    )
}
_ALIASES = {
    "Pong": "ALE/Pong-v5",
    "PongNoFrameskip-v4": "ALE/Pong-v5",
    "BreakoutNoFrameskip-v4": "ALE/Breakout-v5",
}


def resolve_id(env_id: str) -> str:
    return _ALIASES.get(env_id, env_id)


def entry(env_id: str) -> EnvEntry:
    env_id = resolve_id(env_id)
    if env_id in BUILTIN:
        return BUILTIN[env_id]
    if env_id.startswith("ALE/"):
        return EnvEntry(env_id, "atari", "atari", "nature_cnn")
    return EnvEntry(env_id, "gym", None, "mlp")


def env_config(env_id: str) -> EnvConfig:
    """The EnvConfig for an id; unknown ids are checked when the env is first made."""
    e = entry(env_id)
    if e.family == "atari":
        return EnvConfig(
            id=e.id,
            family="atari",
            make_kwargs=dict(ATARI_MAKE_KWARGS),
            wrappers=ATARI_WRAPPERS,
            imports=("ale_py",),
        )
    return EnvConfig(id=e.id, family=e.family)
