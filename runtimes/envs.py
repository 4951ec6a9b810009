"""Build environments from an EnvConfig: the one implementation of non-graph preprocessing.

Shared by the host (trainer, recorder, local bench) and the device runner. Imports gymnasium and numpy only.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from .errors import InputError, MissingDependencyError
from .spec import EnvConfig, SpaceSpec, WrapperConfig

# Extra each optional module comes from, for the install hint; an env family's own extra comes first
# (a DM Control task that lacks mujoco needs the dmc extra, whose mujoco dm-control can run on).
_EXTRA_FOR_MODULE = {
    "ale_py": "atari",
    "Box2D": "box2d",
    "mujoco": "mujoco",
    "dm_control": "dmc",
    "shimmy": "dmc",
    "gymnasium_robotics": "robotics",
}
_EXTRA_FOR_FAMILY = {"atari": "atari", "dmc": "dmc", "robotics": "robotics"}
# The packages an environment description may ask to import (they register gymnasium ids on import).
# Anything else in a manifest's env.imports is refused: importing runs a module's code, and a bundle is
# data. A custom env names its own module in its id instead ("my_pkg.envs:MyEnv-v0"), which the user chose.
ENV_MODULES = ("ale_py", "shimmy", "dm_control", "mujoco", "Box2D", "gymnasium_robotics", "minigrid")


def _atari_preprocessing(env: Any, **kw: Any) -> Any:
    from gymnasium.wrappers import AtariPreprocessing

    return AtariPreprocessing(env, **kw)


def _frame_stack(env: Any, **kw: Any) -> Any:
    from gymnasium.wrappers import FrameStackObservation

    return FrameStackObservation(env, **kw)


def _time_limit(env: Any, **kw: Any) -> Any:
    from gymnasium.wrappers import TimeLimit

    return TimeLimit(env, **kw)


# ---- Dict observations (DM Control) -> one float32 vector ------------------------------------------
FLATTEN_DICT = "flatten_dict"
DICT_OBS = "dict_obs"
"""the same flattening held by the deployed policy (SB3's MultiInputPolicy, goal-conditioned agents):
``act`` takes the env's dict, checks each key and flattens it in the manifest's key order"""


def flatten_dict_wrapper(space: Any, name: str = FLATTEN_DICT) -> WrapperConfig:
    """The flattening of a Dict observation space, as data: its keys in sorted (alphabetical) order, as
    gymnasium's Dict space holds them (and SB3's CombinedExtractor concatenates them), with each entry's
    number of elements and shape. DM Control returns the keys in its own order (walker: orientations,
    height, velocity); the vector is always in this one."""
    keys = sorted(space.spaces)
    kwargs: dict[str, Any] = {"keys": keys, "sizes": [int(np.prod(space[k].shape)) for k in keys]}
    if name == DICT_OBS:
        kwargs["shapes"] = [[int(d) for d in space[k].shape] for k in keys]
    return WrapperConfig(name, kwargs)


def flatten_observation(obs: Mapping[str, Any], keys: Sequence[str]) -> np.ndarray:
    """One float32 vector: each entry of ``obs`` in the order of ``keys``, flattened row-major (a scalar
    entry, such as walker's height, gives one element)."""
    return np.concatenate([np.asarray(obs[k], dtype=np.float64).reshape(-1) for k in keys]).astype(np.float32)


def _flatten_dict(
    env: Any, keys: Any = None, sizes: Any = None, shapes: Any = None, kinds: Any = None, dtypes: Any = None
) -> Any:
    # kinds, dtypes: dict_obs's per-key checks, made by the deployed policy (runtimes.modelio.DictInput)
    from gymnasium import spaces
    from gymnasium.wrappers import TransformObservation

    fix = "re-export the policy for this environment"
    if not (isinstance(keys, list) and isinstance(sizes, list) and len(keys) == len(sizes)
            and all(isinstance(k, str) for k in keys) and all(type(n) is int for n in sizes)):  # fmt: skip
        raise InputError(
            "the flatten_dict preprocessing needs lists of keys and of sizes, of one length", fix
        )
    space = env.observation_space
    boxes = {str(k): s for k, s in getattr(space, "spaces", {}).items() if isinstance(s, spaces.Box)}
    if not isinstance(space, spaces.Dict) or len(boxes) != len(space.spaces):
        raise InputError(
            f"the environment's observations are {space}, not the Dict of arrays the policy flattens", fix
        )
    have = {k: int(np.prod(b.shape)) for k, b in boxes.items()}
    want = dict(zip(keys, sizes, strict=True))
    if have != want:
        raise InputError(
            f"the environment's observation entries {have} differ from the policy's {want} "
            "(another dm-control version?)",
            "install the versions the policy was trained with, or retrain it",
        )
    low = np.concatenate([np.broadcast_to(boxes[k].low, boxes[k].shape).reshape(-1) for k in keys])
    high = np.concatenate([np.broadcast_to(boxes[k].high, boxes[k].shape).reshape(-1) for k in keys])
    box = spaces.Box(low.astype(np.float32), high.astype(np.float32), dtype=np.float32)
    return TransformObservation(env, lambda obs: flatten_observation(obs, keys), box)


WRAPPERS: dict[str, Callable[..., Any]] = {
    "atari_preprocessing": _atari_preprocessing,
    "frame_stack": _frame_stack,
    "time_limit": _time_limit,
    FLATTEN_DICT: _flatten_dict,
    DICT_OBS: _flatten_dict,
}


def install_hint(module: str, family: str | None = None) -> str:
    extra = _EXTRA_FOR_FAMILY.get(family or "") or _EXTRA_FOR_MODULE.get(module.split(".")[0])
    if extra:
        return f"install it with: pip install 'quarl-edge[{extra}]'"
    return f"install the package that provides {module!r}"


def import_env_modules(config: EnvConfig) -> None:
    import gymnasium as gym

    if "dm_control" in config.imports and "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
        # Nothing here renders. Without a display dm-control's default (GLFW) only warns on stderr at
        # import, a stray line in every command's output; "disable" skips loading a GL backend at all.
        os.environ["MUJOCO_GL"] = "disable"
    modules = list(config.imports)
    foreign = [m for m in modules if m not in ENV_MODULES]
    if foreign:
        raise InputError(
            f"environment {config.id!r} asks to import {foreign[0]!r}, which is not an environment package "
            f"({', '.join(ENV_MODULES)})",
            "name a custom environment's module in its id instead, e.g. 'my_pkg.envs:MyEnv-v0'",
        )
    if ":" in config.id:  # gymnasium's "module:EnvId" form registers custom environments on import
        modules.append(config.id.split(":", 1)[0])
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ImportError as e:
            raise MissingDependencyError(
                f"environment {config.id!r} needs the module {name!r} ({e})",
                install_hint(name, config.family),
            ) from None
        if name in ("ale_py", "gymnasium_robotics"):
            gym.register_envs(mod)


# Wrappers whose only effect is on the observation, keeping per-episode state: the deployed policy holds
# them (runtimes.policy), so a control loop feeds it the env's own observation and `reset()` clears them.
POLICY_SIDE = ("frame_stack", DICT_OBS)
# Wrappers that pass observations through unchanged: a policy-side wrapper may sit before them.
_OBS_TRANSPARENT = ("time_limit",)


def split_wrappers(config: EnvConfig) -> tuple[EnvConfig, tuple[WrapperConfig, ...]]:
    """The environment a deployed policy acts in, and the wrappers the policy applies itself (in order).

    A frame stack moves to the policy only when nothing after it transforms observations (a frame
    stack before an Atari preprocessing would see other frames than the ones the policy gets).
    """
    tail = len(config.wrappers)
    while tail > 0 and config.wrappers[tail - 1].name in POLICY_SIDE + _OBS_TRANSPARENT:
        tail -= 1
    policy = tuple(w for w in config.wrappers[tail:] if w.name in POLICY_SIDE)
    env = config.wrappers[:tail] + tuple(w for w in config.wrappers[tail:] if w.name not in POLICY_SIDE)
    return replace(config, wrappers=env), policy


_MAZE_MODEL_FILE = re.compile(r"ant_maze\d+(\.\d+)?\.xml")


def _remove_maze_model_file(env: Any) -> None:
    """gymnasium-robotics' mazes (AntMaze, PointMaze: maze_v4.Maze.make_maze) write the generated MuJoCo
    model of each env they make to <temp>/ant_maze<time.time()>.xml and never remove it (a run left 160 in
    /tmp); MuJoCo has read it once the env exists. Only that file of this env, named by the time it was
    made, directly in the temp folder."""
    import tempfile

    path = getattr(env.unwrapped, "tmp_xml_file_path", None)
    if not isinstance(path, str) or not _MAZE_MODEL_FILE.fullmatch(os.path.basename(path)):
        return
    in_temp = os.path.dirname(os.path.abspath(path)) == os.path.abspath(tempfile.gettempdir())
    if in_temp and os.path.isfile(path):
        os.unlink(path)


def make_env(config: EnvConfig, render_mode: str | None = None, *, policy_side: bool = True) -> Any:
    """Create the environment with its preprocessing wrappers, exactly as the policy was trained.

    ``policy_side=False``: without the wrappers a deployed policy applies itself (split_wrappers), the
    environment whose observations ``Policy.act`` takes.
    """
    import gymnasium as gym
    from gymnasium import error as gym_error

    if not policy_side:
        config = split_wrappers(config)[0]
    if config.family == "external":  # Isaac Sim, a robot: nothing here can step it
        raise InputError(
            f"the policy's environment {config.id!r} cannot run here",
            "use recorded observations instead: export --calibration OBS.npz; bench then measures latency and "
            "action error, and reports reward as not measured",
        )

    import_env_modules(config)
    kwargs = dict(config.make_kwargs)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    try:
        env = gym.make(config.id, **kwargs)
    except (gym_error.NameNotFound, gym_error.NamespaceNotFound, gym_error.VersionNotFound) as e:
        raise InputError(
            f"unknown environment id {config.id!r} ({e})",
            "run `quarl-edge envs` for the built-in ids, or pass a gymnasium id like 'my_pkg.envs:MyEnv-v0'",
        ) from None
    except gym_error.DependencyNotInstalled as e:
        raise MissingDependencyError(f"environment {config.id!r} cannot start: {e}", None) from None
    except ImportError as e:
        mod = getattr(e, "name", None) or str(e)
        raise MissingDependencyError(
            f"environment {config.id!r} needs {mod!r}", install_hint(mod, config.family)
        ) from None
    _remove_maze_model_file(env)
    for w in config.wrappers:
        factory = WRAPPERS.get(w.name)
        if factory is None:
            raise InputError(
                f"unknown wrapper {w.name!r} in the environment description",
                f"known wrappers: {', '.join(sorted(WRAPPERS))}",
            )
        try:
            env = factory(env, **w.kwargs)
        except gym_error.DependencyNotInstalled as e:
            raise MissingDependencyError(
                f"the {w.name} preprocessing of {config.id!r} cannot start: {e}",
                "install it with: pip install 'quarl-edge[atari]'" if config.family == "atari" else None,
            ) from None
    return env


def _enc(v: float) -> float | str:
    # JSON has no infinity; unbounded dimensions are written as "inf" / "-inf"
    return float(v) if np.isfinite(v) else ("inf" if v > 0 else "-inf")


def _bound(values: np.ndarray) -> Any:
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return _enc(flat[0])
    return [_enc(v) for v in flat]


def space_spec(space: Any) -> SpaceSpec:
    """Describe a gymnasium space as data (Box, Discrete, MultiDiscrete, MultiBinary)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Discrete):
        if int(space.start) != 0:
            raise InputError(
                "Discrete spaces with a non-zero start are not supported", "wrap the env to start at 0"
            )
        return SpaceSpec(kind="discrete", shape=(), dtype="int64", n=int(space.n))
    if isinstance(space, spaces.MultiDiscrete):
        if np.any(np.asarray(space.start) != 0):
            raise InputError(
                "MultiDiscrete spaces with a non-zero start are not supported", "wrap the env to start at 0"
            )
        nvec = tuple(int(v) for v in np.asarray(space.nvec).reshape(-1))
        return SpaceSpec(kind="multi_discrete", shape=tuple(space.shape), dtype="int64", nvec=nvec)
    if isinstance(space, spaces.MultiBinary):
        return SpaceSpec(kind="multi_binary", shape=tuple(int(s) for s in space.shape), dtype="int8")
    if isinstance(space, spaces.Box):
        return SpaceSpec(
            kind="box",
            shape=tuple(int(s) for s in space.shape),
            dtype=str(space.dtype),
            low=_bound(space.low),
            high=_bound(space.high),
        )
    raise InputError(
        f"unsupported space {type(space).__name__}",
        "quarl-edge handles Box, Discrete, MultiDiscrete and MultiBinary spaces (and Dict observations); "
        "flatten tuple spaces with a wrapper",
    )


def bounds(space: SpaceSpec) -> tuple[np.ndarray, np.ndarray]:
    """Box bounds broadcast to the full shape, as float64 arrays."""

    def full(v: Any) -> np.ndarray:
        a = np.asarray([float(x) for x in v] if isinstance(v, list) else float(np.inf if v is None else v))
        return np.broadcast_to(a, space.shape).copy() if a.ndim == 0 else a.reshape(space.shape)

    return full(space.low), full(space.high)


def action_masks(env: Any) -> np.ndarray | None:
    """The env's allowed actions now (sb3-contrib's ``action_masks()`` convention: one bool per action,
    the components' masks concatenated for MultiDiscrete), as float32 1/0; None when the env has none."""
    try:
        fn = env.get_wrapper_attr("action_masks")
    except AttributeError:
        return None
    return np.asarray(fn(), dtype=np.float32).reshape(-1)


def random_action(space: Any, mask: np.ndarray | None) -> Any:
    """An exploration action of an integer action space, among the allowed ones when masked."""
    from gymnasium import spaces

    if mask is None:
        return space.sample()
    if isinstance(space, spaces.Discrete):
        return int(space.sample(mask=mask.astype(np.int8)))
    if isinstance(space, spaces.MultiDiscrete):
        cuts = np.cumsum(np.asarray(space.nvec).reshape(-1))[:-1]
        parts = tuple(m.astype(np.int8) for m in np.split(mask, cuts))
        return space.sample(mask=parts)
    return space.sample()
