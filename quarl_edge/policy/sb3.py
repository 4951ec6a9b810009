"""Stable-Baselines3 policies -> PolicyNet: from a live model (our trainer) or an SB3 / RL Zoo .zip.

Zips are read without executing pickled code: the ``data`` member is JSON, the weights are
``torch.load(weights_only=True)``, and a VecNormalize ``.pkl`` goes through an unpickler that only
rebuilds numpy arrays and turns every other object into an inert record.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quarl_edge.policy.net import NetArch, Policy, build_policy
from quarl_edge.policy.registry import env_config, resolve_id
from quarl_edge.policy.vecnormalize import VecNormStats, load_vecnormalize
from quarl_edge.quant.config import QATConfig
from quarl_edge.runtimes.envs import make_env, space_spec
from quarl_edge.runtimes.errors import InputError, IntegrityError
from quarl_edge.runtimes.spec import PolicySpec, SpaceSpec
from quarl_edge.train.hyperparams import ALGOS

_DEFAULT_ACTIVATION = {
    "ppo": "tanh",
    "a2c": "tanh",
    "dqn": "relu",
    "sac": "relu",
    "td3": "relu",
    "ddpg": "relu",
}
_ACTIVATION_NAMES = {"Tanh": "tanh", "ReLU": "relu", "ELU": "elu", "LeakyReLU": "leaky_relu"}


@dataclass(frozen=True)
class SB3Parts:
    """What is needed from an SB3 policy to rebuild its deterministic actor."""

    algo: str
    state: dict[str, torch.Tensor]
    activation: str
    normalize_images: bool = True
    squash_output: bool = False
    qat: QATConfig | None = None


def _linear_chain(state: dict[str, torch.Tensor], prefix: str) -> list[str]:
    """Prefixes (``{prefix}{i}.``) of the numbered layers under ``prefix``, in order."""
    pattern = re.escape(prefix) + r"(\d+)\.weight"
    idx = sorted(int(m.group(1)) for k in state if (m := re.fullmatch(pattern, k)) is not None)
    return [f"{prefix}{i}." for i in idx]


_LAYER_TENSORS = ("weight", "bias", "act_lo", "act_hi", "act_seen")  # act_*: QAT activation ranges


def _copy_layer(state: dict[str, torch.Tensor], src: str, dst: str, out: dict[str, torch.Tensor]) -> None:
    for t in _LAYER_TENSORS:
        if f"{src}{t}" in state:
            out[f"{dst}{t}"] = state[f"{src}{t}"]


def _features_prefix(state: dict[str, torch.Tensor], candidates: tuple[str, ...]) -> str:
    for p in candidates:
        if any(k.startswith(p) for k in state):
            return p
    return candidates[-1]


def actor_layers(parts: SB3Parts) -> tuple[str, list[str], str]:
    """(features prefix, hidden layer prefixes, output layer prefix) of the deterministic actor / Q-network."""
    s, algo = parts.state, parts.algo
    if algo in ("ppo", "a2c"):
        fx = _features_prefix(s, ("pi_features_extractor.", "features_extractor."))
        hidden, out = _linear_chain(s, "mlp_extractor.policy_net."), "action_net."
    elif algo == "dqn":
        fx = "q_net.features_extractor."
        chain = _linear_chain(s, "q_net.q_net.")
        if not chain:
            raise KeyError("q_net.q_net.0.weight")
        hidden, out = chain[:-1], chain[-1]
    elif algo == "sac":
        fx = "actor.features_extractor."
        hidden, out = _linear_chain(s, "actor.latent_pi."), "actor.mu."
    elif algo in ("td3", "ddpg"):
        fx = "actor.features_extractor."
        chain = _linear_chain(s, "actor.mu.")
        if not chain:
            raise KeyError("actor.mu.0.weight")
        hidden, out = chain[:-1], chain[-1]
    else:
        raise InputError(f"unsupported algorithm {algo!r}", f"supported: {', '.join(ALGOS)}")
    if f"{out}weight" not in s:
        raise KeyError(f"{out}weight")
    return fx, hidden, out


def policy_from_parts(
    parts: SB3Parts,
    base: PolicySpec,
    vecnorm: VecNormStats | None = None,
    extra_train: dict[str, Any] | None = None,
) -> Policy:
    """Rebuild the deterministic policy (actor or greedy Q-network) as a PolicyNet."""
    try:
        fx, hidden, out = actor_layers(parts)
    except KeyError as e:
        raise InputError(
            f"the {parts.algo.upper()} weights lack the layer {e}",
            "is --algo right? the file may hold another algorithm's policy",
        ) from None
    s = parts.state
    cnn = f"{fx}cnn.0.weight" in s
    obs_space, act_space = base.observation_space, base.action_space
    if act_space.is_discrete:
        head = "argmax"
    elif parts.algo in ("sac", "td3", "ddpg") or parts.squash_output:
        head = "tanh_unscale"
    else:
        head = "clip"
    arch = NetArch(
        model="nature_cnn" if cnn else "mlp",
        hidden=tuple(int(s[f"{h}weight"].shape[0]) for h in hidden),
        activation=parts.activation,
        out_dim=int(s[f"{out}weight"].shape[0]),
        head=head,
        scale_uint8=bool(parts.normalize_images and obs_space.is_image),
        obs_norm=vecnorm is not None,
        norm_clip=float(vecnorm.clip_obs) if vecnorm else 10.0,
        norm_eps=float(vecnorm.epsilon) if vecnorm else 1e-8,
        cnn_features=int(s[f"{fx}linear.0.weight"].shape[0]) if cnn else 512,
        qat=parts.qat,
    )
    state: dict[str, torch.Tensor] = {}
    if cnn:
        for i in (0, 2, 4):
            _copy_layer(s, f"{fx}cnn.{i}.", f"cnn.{i}.", state)
        _copy_layer(s, f"{fx}linear.0.", "cnn_fc.0.", state)
    for j, h in enumerate(hidden):
        _copy_layer(s, h, f"mlp.{2 * j}.", state)
    _copy_layer(s, out, "out.", state)
    spec = replace(
        base, model=arch.model, graph_steps=arch.graph_steps(), train={**base.train, **(extra_train or {})}
    )
    policy = build_policy(spec, arch, None)
    net_state = policy.net.state_dict()
    for k in ("act_low", "act_high"):
        if k in net_state:
            state[k] = net_state[k]
    if vecnorm is not None:
        shape = tuple(obs_space.shape)
        state["obs_mean"] = torch.as_tensor(np.asarray(vecnorm.mean, dtype=np.float32).reshape(shape))
        state["obs_var"] = torch.as_tensor(np.asarray(vecnorm.var, dtype=np.float32).reshape(shape))
    return build_policy(
        spec,
        arch,
        {
            k: v.detach().clone() if v.dtype == torch.bool else v.detach().clone().float()
            for k, v in state.items()
        },
    )


def parts_from_model(model: Any, algo: str, qat: QATConfig | None = None) -> SB3Parts:
    """From a live SB3 model (our trainer); ``qat`` describes its fake quantization, if any."""
    pol = model.policy
    act_fn = getattr(pol, "activation_fn", None) or getattr(
        getattr(pol, "actor", None), "activation_fn", None
    )
    activation = _ACTIVATION_NAMES.get(getattr(act_fn, "__name__", ""), _DEFAULT_ACTIVATION[algo])
    return SB3Parts(
        algo=algo,
        state={k: v.detach().cpu() for k, v in pol.state_dict().items()},
        activation=activation,
        normalize_images=bool(getattr(pol, "normalize_images", True)),
        squash_output=bool(getattr(pol, "squash_output", False)) and algo in ("ppo", "a2c"),
        qat=qat,
    )


def base_spec(env_id: str, algo: str, name: str, source: str) -> PolicySpec:
    """A PolicySpec with the env's real spaces (the env is made once to read them)."""
    cfg = env_config(env_id)
    env = make_env(cfg)
    try:
        obs, act = space_spec(env.observation_space), space_spec(env.action_space)
    finally:
        env.close()
    return PolicySpec(
        name=name, algo=algo, model="mlp", env=cfg, observation_space=obs, action_space=act, source=source
    )


# ---- SB3 / RL Zoo .zip import ------------------------------------------------------------------------


_DATA_OBJECTS = ("policy_class", "observation_space", "action_space", "policy_kwargs")


def _checked_data(data: Any, path: Path) -> dict[str, Any]:
    """SB3's ``data`` member, with the parts we read checked for their type (a tampered or foreign zip
    is refused in one line, not half-read)."""
    fix = "pass a .zip saved by SB3's model.save()"
    if not isinstance(data, dict):
        raise IntegrityError(f"{str(path)!r}: its data member is not a JSON object", fix)
    for key in _DATA_OBJECTS:
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise IntegrityError(f"{str(path)!r}: data.{key} is not an object", fix)
    return data


def _algo_from_data(data: dict[str, Any]) -> str | None:
    module = str((data.get("policy_class") or {}).get("__module__", ""))
    # SB3's DDPG is TD3 with policy_delay=1 and target noise clipped to 0, sharing TD3's policy class
    if (
        ".td3." in module
        and str(data.get("policy_delay")) == "1"
        and str(data.get("target_noise_clip")) in ("0", "0.0")
    ):
        return "ddpg"
    for name in ("sac", "td3", "dqn", "ddpg"):
        if f".{name}." in module:
            return name
    if "common.policies" in module:
        return "ppo" if "clip_range" in data else "a2c"
    return None


def names_from_filename(path: Path) -> tuple[str | None, str | None]:
    """RL Zoo names files ``{algo}-{EnvId}.zip`` (e.g. ppo-CartPole-v1.zip, dqn-PongNoFrameskip-v4.zip)."""
    m = re.fullmatch(r"(ppo|a2c|dqn|ddpg|td3|sac)-(.+)", path.stem, flags=re.IGNORECASE)
    return (m.group(1).lower(), m.group(2)) if m else (None, None)


def _space_shape(d: dict[str, Any]) -> tuple[str, tuple[int, ...], int | None]:
    kind = "discrete" if "Discrete" in str(d.get(":type:", "")) else "box"
    shape = tuple(int(x) for x in re.findall(r"-?\d{1,9}", str(d.get("_shape", "[]"))[:200]))
    n = d.get("n") if kind == "discrete" else None
    if n is not None:
        n = int(n) if isinstance(n, int | str) and str(n).lstrip("-").isdigit() and len(str(n)) < 10 else -1
    return kind, shape, n


def _check_space(name: str, stored: dict[str, Any] | None, actual: SpaceSpec, env_id: str) -> None:
    if not stored:
        return
    kind, shape, n = _space_shape(stored)
    if (
        kind != actual.kind
        or (kind == "box" and shape != tuple(actual.shape))
        or (kind == "discrete" and n != actual.n)
    ):
        want = f"Discrete({n})" if kind == "discrete" else f"Box{list(shape)}"
        got = f"Discrete({actual.n})" if actual.is_discrete else f"Box{list(actual.shape)}"
        raise InputError(
            f"the .zip's {name} space is {want} but {env_id!r} has {got}",
            "pass the environment the model was trained on with --env",
        )


def load_sb3_zip(
    path: str | Path,
    env_id: str | None = None,
    algo: str | None = None,
    vecnormalize: str | Path | None = None,
) -> Policy:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"policy file {str(path)!r} does not exist", "check the path")
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
            if "data" not in names or "policy.pth" not in names:
                raise InputError(
                    f"{str(path)!r} is not a Stable-Baselines3 model (no data/policy.pth inside)",
                    "pass a .zip saved by SB3's model.save() or a quarl-edge checkpoint folder",
                )
            data = json.loads(z.read("data"))
            state = torch.load(io.BytesIO(z.read("policy.pth")), map_location="cpu", weights_only=True)
    except zipfile.BadZipFile:
        raise IntegrityError(
            f"{str(path)!r} is not a valid zip file", "re-download or re-save the model"
        ) from None
    except pickle.UnpicklingError as e:
        # torch's refusal is several lines that end advising weights_only=False: the one thing not to do
        what = next((ln.strip() for ln in str(e).splitlines() if "GLOBAL" in ln or "global" in ln), "")
        raise IntegrityError(
            f"{str(path)!r}: policy.pth holds pickled objects other than tensors; refusing to load it"
            + (f" ({what[:160]})" if what else ""),
            "use a zip saved by SB3 from a model you trust (its weights are plain tensors)",
        ) from None
    # ValueError covers bad JSON and bad UTF-8; torch.load on damaged bytes also raises the others
    except (
        ValueError,
        RuntimeError,
        EOFError,
        IndexError,
        struct.error,
        zlib.error,
    ) as e:
        raise IntegrityError(
            f"{str(path)!r} is damaged ({type(e).__name__}: {e})", "re-save the model"
        ) from None
    data = _checked_data(data, path)
    file_algo, file_env = names_from_filename(path)
    algo = (algo or _algo_from_data(data) or file_algo or "").lower()
    if algo not in ALGOS:
        raise InputError(f"cannot tell the algorithm of {str(path)!r}", f"pass --algo ({', '.join(ALGOS)})")
    env_id = env_id or file_env
    if not env_id:
        raise InputError(
            f"{str(path)!r} does not say which environment it was trained on", "pass --env ENV_ID"
        )
    env_id = resolve_id(env_id)
    base = base_spec(env_id, algo, name=path.stem, source=f"sb3-zip:{path.name}")
    _check_space("observation", data.get("observation_space"), base.observation_space, env_id)
    _check_space("action", data.get("action_space"), base.action_space, env_id)
    kwargs = data.get("policy_kwargs") or {}
    act_name = re.search(r"\.(\w+)'>", str(kwargs.get("activation_fn", "")))
    activation = _ACTIVATION_NAMES.get(act_name.group(1), "") if act_name else _DEFAULT_ACTIVATION[algo]
    if not activation:
        raise InputError(f"unsupported activation {kwargs.get('activation_fn')!r} in {str(path)!r}")
    parts = SB3Parts(
        algo=algo,
        state=state,
        activation=activation,
        normalize_images=str(kwargs.get("normalize_images", True)) != "False",
        squash_output=str(kwargs.get("squash_output", False)) == "True" and algo in ("ppo", "a2c"),
    )
    vn = load_vecnormalize(vecnormalize) if vecnormalize else None
    if vn is not None and vn.mean.size != int(np.prod(base.observation_space.shape)):
        raise InputError(
            f"VecNormalize statistics have {vn.mean.size} values, the observation has "
            f"{int(np.prod(base.observation_space.shape))}",
            "pass the vecnormalize.pkl saved with this model",
        )
    train = {"num_timesteps": data.get("num_timesteps"), "imported_from": path.name}
    try:
        return policy_from_parts(parts, base, vn, extra_train=train)
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:  # shapes or names of policy.pth
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise IntegrityError(
            f"{str(path)!r}: the weights in policy.pth do not fit a {algo.upper()} policy for {env_id} ({first})",
            "pass the zip's own --env and --algo, or re-save the model",
        ) from None
