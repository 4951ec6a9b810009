"""The registry of environment specs: how each built-in environment is made and preprocessed.

The preprocessing is data (runtimes.spec.EnvConfig) so the device side rebuilds it without this module.
Any other gymnasium id (including ``module:EnvId`` for custom envs) is accepted as a plain ``gym`` env.
The DeepMind Control Suite's tasks (``dm_control/<domain>-<task>-v0``, through shimmy) are listed from
dm_control.suite itself when the ``dmc`` extra is installed.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from quarl_edge.runtimes.envs import flatten_dict_wrapper, import_env_modules, make_env
from quarl_edge.runtimes.errors import InputError
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


DMC_PREFIX = "dm_control/"
# dm_control first: shimmy imports without it but then registers no dm_control/ ids
DMC_IMPORTS = ("dm_control", "shimmy")
_DMC_UNVERSIONED = re.compile(r"dm_control/\w+-\w+")  # domain and task names have no hyphen


def resolve_id(env_id: str) -> str:
    if _DMC_UNVERSIONED.fullmatch(env_id):  # dm_control/walker-stand -> shimmy's dm_control/walker-stand-v0
        return env_id + "-v0"
    return _ALIASES.get(env_id, env_id)


@functools.cache
def dmc_tasks() -> tuple[str, ...]:
    """The DM Control Suite's tasks as ``domain-task``, from dm_control.suite (needs the dmc extra)."""
    import_env_modules(EnvConfig(DMC_PREFIX + "*", family="dmc", imports=DMC_IMPORTS))
    from dm_control import suite

    return tuple(f"{domain}-{task}" for domain, task in suite.ALL_TASKS)


def dmc_entries() -> list[EnvEntry]:
    return [EnvEntry(f"{DMC_PREFIX}{t}-v0", "dmc", "dmc", "mlp") for t in dmc_tasks()]


def _dmc_entry(env_id: str) -> EnvEntry:
    task = env_id.removeprefix(DMC_PREFIX).removesuffix("-v0")
    import_env_modules(EnvConfig(env_id, family="dmc", imports=DMC_IMPORTS))  # a missing extra names this id
    known = dmc_tasks()
    if not env_id.endswith("-v0") or task not in known:
        raise InputError(
            f"unknown DM Control task {env_id!r}",
            f"use dm_control/<task>-v0 with one of the suite's tasks: {', '.join(known)}",
        )
    return EnvEntry(env_id, "dmc", "dmc", "mlp")


ROBOTICS_PREFIXES = ("Fetch", "PointMaze_", "AntMaze_", "HandManipulate", "HandReach", "AdroitHand")
"""gymnasium-robotics' task families (goal-conditioned Dict observations); the package registers them"""


def entry(env_id: str) -> EnvEntry:
    env_id = resolve_id(env_id)
    if env_id in BUILTIN:
        return BUILTIN[env_id]
    if env_id.startswith(ROBOTICS_PREFIXES):
        return EnvEntry(env_id, "robotics", "robotics", "mlp")
    if env_id.startswith("ALE/"):
        return EnvEntry(env_id, "atari", "atari", "nature_cnn")
    if env_id.startswith(DMC_PREFIX):
        return _dmc_entry(env_id)
    return EnvEntry(env_id, "gym", None, "mlp")


@functools.cache
def _dmc_flattening(env_id: str) -> WrapperConfig:
    # made once per task and process: the keys and sizes of its Dict observation
    env = make_env(EnvConfig(env_id, family="dmc", imports=DMC_IMPORTS))
    try:
        return flatten_dict_wrapper(env.observation_space)
    finally:
        env.close()


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
    if e.family == "dmc":
        flat = _dmc_flattening(e.id)  # a fresh copy: the cached kwargs are never handed out
        wrapper = WrapperConfig(flat.name, {k: list(v) for k, v in flat.kwargs.items()})
        return EnvConfig(id=e.id, family="dmc", wrappers=(wrapper,), imports=DMC_IMPORTS)
    if e.family == "robotics":
        return EnvConfig(id=e.id, family="robotics", imports=("gymnasium_robotics",))
    return EnvConfig(id=e.id, family=e.family)


def make(env_id: str) -> Any:
    """The environment of a registered or gymnasium id with its preprocessing (DM Control flattening,
    Atari wrappers): what every process that steps a task for training builds."""
    return make_env(env_config(env_id))
