"""Stable-Baselines3 / sb3-contrib state dicts -> PolicyNet: from a live model (our trainer) or from the
weights of a zip (policy/sb3_zip.py reads those). Where each algorithm keeps its deterministic policy is
the table in policy/algos.py; what does not map one to one onto a PolicyNet layer is folded here:
CrossQ's BatchRenorm (an affine map in eval mode) into the Linear after it, QR-DQN's mean over
quantiles into its output layer, ARS's bias-free layers get a zero bias.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from gymnasium import spaces as gym_spaces

from quarl_edge.policy.algos import IMPORTABLE, LAYOUTS, SQUASHED
from quarl_edge.policy.combined import key_kind, key_parts
from quarl_edge.policy.net import Cell, NetArch, Policy, build_policy
from quarl_edge.policy.registry import env_config
from quarl_edge.policy.vecnormalize import VecNormStats
from quarl_edge.quant.config import QATConfig
from quarl_edge.runtimes.envs import DICT_OBS, make_env, space_spec
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.modelio import VECTOR
from quarl_edge.runtimes.spec import PolicySpec, WrapperConfig

ACTIVATION_NAMES = {"Tanh": "tanh", "ReLU": "relu", "ELU": "elu", "LeakyReLU": "leaky_relu"}


@dataclass(frozen=True)
class SB3Parts:
    """What is needed from an SB3 policy to rebuild its deterministic actor."""

    algo: str
    state: dict[str, torch.Tensor]
    activation: str
    normalize_images: bool = True
    squash_output: bool = False
    qat: QATConfig | None = None
    batch_norm_eps: float = 0.001
    """CrossQ's BatchRenorm epsilon (sb3-contrib's default unless policy_kwargs set another)"""


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
    layout = LAYOUTS.get(algo)
    kind = layout.kind if layout else ""
    if kind in ("actor_critic", "recurrent"):
        fx = _features_prefix(s, ("pi_features_extractor.", "features_extractor."))
        hidden, out = _linear_chain(s, "mlp_extractor.policy_net."), "action_net."
    elif kind in ("q", "quantile", "ars", "actor_chain"):
        fx, net = {
            "q": ("q_net.features_extractor.", "q_net.q_net."),
            "quantile": ("quantile_net.features_extractor.", "quantile_net.quantile_net."),
            "ars": ("features_extractor.", "action_net."),
            "actor_chain": ("actor.features_extractor.", "actor.mu."),
        }[kind]
        chain = _linear_chain(s, net)
        if not chain:
            raise KeyError(f"{net}0.weight")
        hidden, out = chain[:-1], chain[-1]
    elif kind in ("actor", "crossq"):
        fx = "actor.features_extractor."
        hidden, out = _linear_chain(s, "actor.latent_pi."), "actor.mu."
    else:
        raise InputError(f"unsupported algorithm {algo!r}", f"supported: {', '.join(IMPORTABLE)}")
    if f"{out}weight" not in s:
        raise KeyError(f"{out}weight")
    return fx, hidden, out


def _renorm_before(s: dict[str, torch.Tensor], layer: str) -> str | None:
    """The BatchRenorm module right before ``layer`` (``actor.latent_pi.4.`` -> ``actor.latent_pi.3.``;
    ``actor.mu.`` -> the last module of latent_pi), if there is one."""
    if layer == "actor.mu.":
        idx = [int(m.group(1)) for k in s if (m := re.fullmatch(r"actor\.latent_pi\.(\d+)\.ra_mean", k))]
        last = max((int(m.group(1)) for k in s if (m := re.fullmatch(r"actor\.latent_pi\.(\d+)\.\w+", k))),
                   default=-1)  # fmt: skip
        return f"actor.latent_pi.{last}." if idx and max(idx) == last else None
    m = re.fullmatch(r"(.*\.)(\d+)\.", layer)
    if m is None:
        return None
    before = f"{m.group(1)}{int(m.group(2)) - 1}."
    return before if f"{before}ra_mean" in s else None


def _folded(parts: SB3Parts, layer: str, quantile_actions: int | None = None) -> dict[str, torch.Tensor]:
    """A Linear's weight and bias with what precedes or follows it folded in (float64 arithmetic):
    CrossQ's BatchRenorm before it, in eval mode ``scale * (x - ra_mean) / sqrt(ra_var + eps) + bias``;
    QR-DQN's mean over quantiles after its output layer; a zero bias for a bias-free layer (ARS)."""
    s = parts.state
    w = s[f"{layer}weight"].detach().double()
    b = (
        s[f"{layer}bias"].detach().double()
        if f"{layer}bias" in s
        else torch.zeros(w.shape[0], dtype=torch.float64)
    )
    bn = _renorm_before(s, layer) if parts.algo == "crossq" else None
    if bn is not None:
        a = s[f"{bn}scale"].double() / torch.sqrt(s[f"{bn}ra_var"].double() + parts.batch_norm_eps)
        c = s[f"{bn}bias"].double() - s[f"{bn}ra_mean"].double() * a
        w, b = w * a[None, :], b + w @ c
    if quantile_actions:
        n = quantile_actions
        if w.shape[0] % n:
            raise KeyError(f"{layer}weight with {w.shape[0]} rows for {n} actions")
        # QR-DQN's output is viewed as (quantiles, actions); the greedy action maximises the mean
        w = w.reshape(-1, n, w.shape[1]).mean(dim=0)
        b = b.reshape(-1, n).mean(dim=0)
    out = {"weight": w.float(), "bias": b.float()}
    for t in ("act_lo", "act_hi", "act_seen"):  # QAT activation ranges
        if f"{layer}{t}" in s:
            out[t] = s[f"{layer}{t}"]
    return out


def _recurrent(s: dict[str, torch.Tensor]) -> Cell | None:
    """RecurrentPPO's actor LSTM (``lstm_actor``; with shared_lstm the same module): its size."""
    if "lstm_actor.weight_hh_l0" not in s:
        return None
    layers = sum(1 for k in s if re.fullmatch(r"lstm_actor\.weight_ih_l\d+", k))
    return Cell("lstm", int(s["lstm_actor.weight_hh_l0"].shape[1]), layers)


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
    images = [p.key for p in key_parts(base.env.wrappers) if p.kind != VECTOR]
    combined = bool(images)  # MultiInputPolicy with image keys: CombinedExtractor's CNN per image key
    obs_space, act_space = base.observation_space, base.action_space
    if act_space.is_discrete:
        head = "argmax"
    elif act_space.kind == "multi_discrete":
        head = "multi_argmax"
    elif act_space.kind == "multi_binary":
        head = "binary"
    elif parts.algo in SQUASHED or parts.squash_output:
        head = "tanh_unscale"
    else:
        head = "clip"
    quantiles = act_space.n if parts.algo == "qrdqn" and act_space.is_discrete else None
    out_dim = quantiles or int(s[f"{out}weight"].shape[0])
    arch = NetArch(
        model="combined" if combined else "nature_cnn" if cnn else "mlp",
        hidden=tuple(int(s[f"{h}weight"].shape[0]) for h in hidden),
        activation=parts.activation,
        out_dim=out_dim,
        head=head,
        scale_uint8=bool(parts.normalize_images and (obs_space.is_image or combined)),
        obs_norm=vecnorm is not None,
        norm_clip=float(vecnorm.clip_obs) if vecnorm else 10.0,
        norm_eps=float(vecnorm.epsilon) if vecnorm else 1e-8,
        cnn_features=int(s[f"{fx}linear.0.weight"].shape[0])
        if cnn
        else int(s[f"{fx}extractors.{images[0]}.linear.0.weight"].shape[0])
        if combined
        else 512,
        qat=parts.qat,
        action_mask=LAYOUTS[parts.algo].mask if parts.algo in LAYOUTS else False,
    ).with_cell(_recurrent(s))
    state: dict[str, torch.Tensor] = {}
    if cnn:
        for i in (0, 2, 4):
            _copy_layer(s, f"{fx}cnn.{i}.", f"cnn.{i}.", state)
        _copy_layer(s, f"{fx}linear.0.", "cnn_fc.0.", state)
    for j, key in enumerate(images):  # SB3: features_extractor.extractors.<key>.{cnn,linear}
        for i in (0, 2, 4):
            _copy_layer(s, f"{fx}extractors.{key}.cnn.{i}.", f"combined.cnns.{j}.{i}.", state)
        _copy_layer(s, f"{fx}extractors.{key}.linear.0.", f"combined.cnn_fcs.{j}.0.", state)
    for i in range(arch.rnn_layers if arch.recurrent else 0):  # RecurrentPPO's actor LSTM
        for src, dst in (("ih", "ih"), ("hh", "hh")):
            state[f"rnn.{dst}{i}.weight"] = s[f"lstm_actor.weight_{src}_l{i}"]
            state[f"rnn.{dst}{i}.bias"] = s[f"lstm_actor.bias_{src}_l{i}"]
    for j, h in enumerate(hidden):
        state.update({f"mlp.{2 * j}.{k}": v for k, v in _folded(parts, h).items()})
    state.update({f"out.{k}": v for k, v in _folded(parts, out, quantiles).items()})
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
    activation = ACTIVATION_NAMES.get(getattr(act_fn, "__name__", ""), LAYOUTS[algo].activation)
    return SB3Parts(
        algo=algo,
        state={k: v.detach().cpu() for k, v in pol.state_dict().items()},
        activation=activation,
        normalize_images=bool(getattr(pol, "normalize_images", True)),
        squash_output=bool(getattr(pol, "squash_output", False)) and algo not in SQUASHED,
        qat=qat,
    )


def dict_obs_wrapper(space: Any, env_id: str) -> WrapperConfig:
    """SB3's CombinedExtractor over a Dict observation, as data held by the deployed policy: the keys in
    the space's own order (gymnasium sorts a plain dict's keys; SB3 iterates them in that order), each
    key's shape and dtype as the env returns it, and its kind: an image (SB3's ``is_image_space``; the graph
    runs a Nature CNN on it, policy/combined.py) or a vector (concatenated as it is)."""
    if not all(isinstance(s, gym_spaces.Box) for s in space.spaces.values()):
        raise InputError(
            f"{env_id!r} has Dict observations with non-Box entries",
            "quarl-edge rebuilds MultiInputPolicy over Box entries (images and vectors); "
            "export the network yourself to ONNX and import it with --io",
        )
    keys = list(space.spaces)
    return WrapperConfig(DICT_OBS, {
        "keys": keys,
        "sizes": [int(np.prod(space[k].shape)) for k in keys],
        "shapes": [[int(d) for d in space[k].shape] for k in keys],
        "dtypes": [str(np.dtype(space[k].dtype)) for k in keys],
        "kinds": [key_kind(space[k]) for k in keys],
    })  # fmt: skip


def base_spec(env_id: str, algo: str, name: str, source: str) -> PolicySpec:
    """A PolicySpec with the env's real spaces (the env is made once to read them)."""
    cfg = env_config(env_id)
    env = make_env(cfg)
    try:
        space = env.observation_space
        if isinstance(space, gym_spaces.Dict):  # MultiInputPolicy: the policy flattens the env's dict
            cfg = replace(cfg, wrappers=(*cfg.wrappers, dict_obs_wrapper(space, env_id)))
            space = make_env(cfg).observation_space
        obs, act = space_spec(space), space_spec(env.action_space)
    finally:
        env.close()
    return PolicySpec(
        name=name, algo=algo, model="mlp", env=cfg, observation_space=obs, action_space=act, source=source
    )
