"""The source policy itself, as the parity reference of an imported zip: SB3's / sb3-contrib's own model
loaded from the zip and its ``predict(deterministic=True)``, on observations normalized in numpy with the
VecNormalize statistics (as a VecNormalize env would hand them to it).

It is loaded without running pickled code: every pickled entry of the zip's ``data`` is replaced through
SB3's ``custom_objects`` (the spaces from the environment, the policy class and its keyword arguments
rebuilt from the plain text beside them, schedules as constants), and SB3 reads the weights with
``torch.load(weights_only=True)``. Only classes of torch, SB3 and sb3-contrib are looked up by name.
"""

from __future__ import annotations

import copy
import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from quarl_edge.policy.vecnormalize import VecNormStats
from quarl_edge.runtimes.envs import DICT_OBS, make_env
from quarl_edge.runtimes.errors import MissingDependencyError
from quarl_edge.runtimes.spec import EnvConfig

_ALGO_CLASSES = {
    "ppo": ("stable_baselines3", "PPO"),
    "a2c": ("stable_baselines3", "A2C"),
    "dqn": ("stable_baselines3", "DQN"),
    "sac": ("stable_baselines3", "SAC"),
    "td3": ("stable_baselines3", "TD3"),
    "ddpg": ("stable_baselines3", "DDPG"),
    "tqc": ("sb3_contrib", "TQC"),
    "crossq": ("sb3_contrib", "CrossQ"),
    "qrdqn": ("sb3_contrib", "QRDQN"),
    "trpo": ("sb3_contrib", "TRPO"),
    "ars": ("sb3_contrib", "ARS"),
    "ppo_mask": ("sb3_contrib", "MaskablePPO"),
    "ppo_lstm": ("sb3_contrib", "RecurrentPPO"),
}
_TRUSTED = ("torch.nn.", "torch.optim.", "stable_baselines3.", "sb3_contrib.")
_CLASS = re.compile(r"<class '([\w.]+)\.(\w+)'>")


def _class(text: str) -> Any:
    m = _CLASS.fullmatch(text.strip())
    if m is None or not m.group(1).startswith(_TRUSTED):
        return None
    return getattr(importlib.import_module(m.group(1)), m.group(2), None)


def _policy_class(data: dict[str, Any]) -> Any:
    pc = data.get("policy_class") or {}
    module = str(pc.get("__module__", ""))
    name = re.search(r"function (\w+)\.__init__", str(pc.get("__init__", "")))
    if name is None or not module.startswith(_TRUSTED):
        return None
    return getattr(importlib.import_module(module), name.group(1), None)


def _kwargs(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (data.get("policy_kwargs") or {}).items():
        if key.startswith(":"):
            continue
        if isinstance(value, str) and value.startswith("<class "):
            cls = _class(value)
            if cls is not None:
                out[key] = cls
        elif isinstance(value, (int, float, bool, list, dict)) or value is None:
            out[key] = value
    return out


def _stand_in(key: str, type_name: str) -> Any:
    if key == "train_freq":
        return 1
    if "Schedule" in type_name or "function" in type_name:
        return lambda _progress: 0.0
    if "numpy.float" in type_name:
        return 0.0
    return None


def _as_sb3_sees(space: Any) -> Any:
    """A Dict observation space with its channels-last image keys transposed, as SB3's VecTransposeImage
    hands it to the model at training (its policy was built for that space; ``predict`` transposes the
    env's frames itself)."""
    from gymnasium import spaces

    if not isinstance(space, spaces.Dict):
        return space
    from stable_baselines3.common.preprocessing import is_image_space, is_image_space_channels_first
    from stable_baselines3.common.vec_env import VecTransposeImage

    out = copy.deepcopy(space)  # VecTransposeImage's way: the keys keep their order
    for k, s in space.spaces.items():
        if isinstance(s, spaces.Box) and is_image_space(s) and not is_image_space_channels_first(s):
            out.spaces[k] = VecTransposeImage.transpose_space(s, k)
    return out


def sb3_reference(
    path: Path, algo: str, data: dict[str, Any], env: EnvConfig, vecnorm: VecNormStats | None
) -> tuple[str, Callable[..., np.ndarray]]:
    """(what it is, a function raw observations [N, ...] -> the source's deterministic actions [N, ...]).
    The model is loaded on the first call."""
    package, cls_name = _ALGO_CLASSES[algo]
    from importlib.metadata import PackageNotFoundError, version

    try:
        label = f"{cls_name}.predict ({package.replace('_', '-')} {version(package.replace('_', '-'))})"
    except PackageNotFoundError:
        label = f"{cls_name}.predict ({package.replace('_', '-')}, not installed)"
    model: list[Any] = []
    dict_obs = next((w.kwargs for w in env.wrappers if w.name == DICT_OBS), None)
    keys = list(dict_obs["keys"]) if dict_obs else None
    shapes = [tuple(sh) for sh in dict_obs["shapes"]] if dict_obs else []
    images = {
        k
        for k, kind in zip(keys or [], (dict_obs or {}).get("kinds") or [], strict=False)
        if kind != "vector"
    }

    def load() -> Any:
        try:
            algo_cls = getattr(importlib.import_module(package), cls_name)
        except ImportError:
            extra = "contrib" if package == "sb3_contrib" else "base"
            raise MissingDependencyError(
                f"the parity reference of {path.name!r} needs {package.replace('_', '-')}",
                f"install it with: pip install 'quarl-edge[{extra}]'",
            ) from None
        made = make_env(env, policy_side=False)  # the env's own spaces (a Dict observation as a dict)
        try:
            # what predict needs is the policy; the rest only has to construct: a schedule a constant,
            # a numpy scalar 0, train_freq a step count, any other pickled object absent
            custom: dict[str, Any] = {k: _stand_in(k, str(v.get(":type:"))) for k, v in data.items()
                                      if isinstance(v, dict) and ":serialized:" in v}  # fmt: skip
            if "replay_buffer_kwargs" in data:  # a HER buffer's arguments, for the default buffer it gets
                custom["replay_buffer_kwargs"] = {}
            custom.update(
                observation_space=_as_sb3_sees(made.observation_space),
                action_space=made.action_space,
                policy_class=_policy_class(data),
                policy_kwargs=_kwargs(data),
            )
        finally:
            made.close()
        return algo_cls.load(path, custom_objects=custom, device="cpu")

    def predict(obs: np.ndarray, action_masks: np.ndarray | None = None,
                episode_starts: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
        if not model:
            model.append(load())
        x: Any = np.asarray(obs)
        if keys is not None:  # the trace holds the flattened dict: SB3 takes the dict
            cuts = np.cumsum([int(np.prod(sh)) for sh in shapes])[:-1]
            x = {  # image keys as the env returned them: uint8 pixels
                k: part.reshape(len(part), *sh).astype(np.uint8 if k in images else part.dtype)
                for k, sh, part in zip(keys, shapes, np.split(x, cuts, axis=1), strict=True)
            }
        elif vecnorm is not None:
            shape = x.shape[1:]
            mean, var = vecnorm.mean.reshape(shape), vecnorm.var.reshape(shape)
            x = np.clip((x - mean) / np.sqrt(var + vecnorm.epsilon), -vecnorm.clip_obs, vecnorm.clip_obs)
            x = x.astype(np.float32)
        if algo == "ppo_lstm":  # RecurrentPPO: one step at a time, its state carried, reset per episode
            starts = np.zeros(len(x), bool) if episode_starts is None else np.asarray(episode_starts, bool)
            state, out = None, []
            for i in range(len(x)):
                a, state = model[0].predict(x[i : i + 1], state=state, episode_start=starts[i : i + 1] | (i == 0),
                                            deterministic=True)  # fmt: skip
                out.append(a[0])
            return np.asarray(out)
        if action_masks is not None:  # MaskablePPO: the allowed actions at each recorded step
            actions, _ = model[0].predict(x, deterministic=True, action_masks=np.asarray(action_masks) > 0.5)
        else:
            actions, _ = model[0].predict(x, deterministic=True)
        return np.asarray(actions)

    return label, predict
