"""The rsl_rl importer: a ``model_N.pt`` of rsl-rl-lib (5.x: the runner's ``actor_state_dict``), read
weights-only: the actor MLP (ELU by default), its empirical observation normalizer, and an optional
recurrent memory (LSTM or GRU) before the MLP; the deterministic action is the MLP's output (the
Gaussian's mean). The environment (Isaac Sim, a robot) usually cannot run here: the policy's env is
``external`` unless the io.yaml names a gymnasium id, and recorded observations stand in for it
(docs/policies.md). An io.yaml (policy/iodesc.py) may name the activation, the action bounds and the env.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import torch

from quarl_edge.policy.importers import LoadOptions, Source, register
from quarl_edge.policy.iodesc import IoDescription, external_env, read_io
from quarl_edge.policy.net import Cell, NetArch, Policy, build_policy
from quarl_edge.runtimes.errors import InputError, IntegrityError
from quarl_edge.runtimes.spec import PolicySpec, SpaceSpec

_FIX = "pass a model_N.pt saved by rsl-rl-lib's OnPolicyRunner"
_MAX_BYTES = 512 * 2**20
NORMALIZER_EPS = 1e-2
"""rsl_rl's EmpiricalNormalization default: (x - mean) / (std + eps)"""


def read_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """The actor's state dict of a model_N.pt, loaded with ``weights_only=True`` (no pickled code runs)."""
    if path.stat().st_size > _MAX_BYTES:
        raise IntegrityError(f"{str(path)!r} is too large to be an rsl_rl checkpoint", _FIX)
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        what = next((ln.strip() for ln in str(e).splitlines() if "GLOBAL" in ln or "global" in ln), "")
        raise IntegrityError(f"{str(path)!r} holds pickled objects other than tensors; refusing to load it"
                             + (f" ({what[:160]})" if what else ""), _FIX) from None  # fmt: skip
    except (RuntimeError, ValueError, EOFError, OSError) as e:
        raise IntegrityError(
            f"{str(path)!r} is not a readable checkpoint ({type(e).__name__}: {str(e)[:120]})", _FIX
        ) from None
    actor = data.get("actor_state_dict") if isinstance(data, dict) else None
    if not isinstance(actor, dict) or not all(isinstance(v, torch.Tensor) for v in actor.values()):
        raise InputError(f"{str(path)!r} has no actor_state_dict (rsl-rl-lib 5.x's runner checkpoint)", _FIX)
    return actor


def _chain(s: dict[str, torch.Tensor]) -> list[int]:
    return sorted(int(m.group(1)) for k in s if (m := re.fullmatch(r"mlp\.(\d+)\.weight", k)))


def _memory(s: dict[str, torch.Tensor]) -> Cell | None:
    if "rnn.rnn.weight_hh_l0" not in s:
        return None
    hidden = int(s["rnn.rnn.weight_hh_l0"].shape[1])
    gates = int(s["rnn.rnn.weight_hh_l0"].shape[0]) // hidden
    layers = sum(1 for k in s if re.fullmatch(r"rnn\.rnn\.weight_ih_l\d+", k))
    return Cell({4: "lstm", 3: "gru"}.get(gates, "?"), hidden, layers)


def policy_from_actor(s: dict[str, torch.Tensor], io: IoDescription, name: str, source: str) -> Policy:
    """rsl_rl's actor state dict (the layout of its MLPModel / RNNModel) as a PolicyNet."""
    chain = _chain(s)
    if not chain:
        raise InputError(f"{source}: the actor has no mlp.N.weight layers", _FIX)
    memory = _memory(s)
    first = s["rnn.rnn.weight_ih_l0"] if memory else s[f"mlp.{chain[0]}.weight"]
    obs_dim, act_dim = int(first.shape[1]), int(s[f"mlp.{chain[-1]}.weight"].shape[0])
    io.check_dims(obs_dim, act_dim)
    norm = "obs_normalizer._mean" in s
    arch = NetArch(model="mlp", hidden=tuple(int(s[f"mlp.{i}.weight"].shape[0]) for i in chain[:-1]),
                   activation=io.activation or "elu", out_dim=act_dim, head=io.head(), obs_norm=norm,
                   norm_clip=1e9, norm_eps=1e-12).with_cell(memory)  # fmt: skip
    spec = PolicySpec(name=name, algo="rsl_rl_ppo", model="mlp", env=io.env or external_env(name),
                      observation_space=SpaceSpec("box", (obs_dim,), "float32", "-inf", "inf"),
                      action_space=io.action_space(act_dim), graph_steps=arch.graph_steps(), source=source,
                      train={"library": "rsl-rl-lib", "imported_from": name,
                             "env_from": "io.yaml" if io.env else None})  # fmt: skip
    state: dict[str, torch.Tensor] = {}
    for j, i in enumerate(chain[:-1]):
        state[f"mlp.{2 * j}.weight"], state[f"mlp.{2 * j}.bias"] = s[f"mlp.{i}.weight"], s[f"mlp.{i}.bias"]
    state["out.weight"], state["out.bias"] = s[f"mlp.{chain[-1]}.weight"], s[f"mlp.{chain[-1]}.bias"]
    for i in range(memory.layers if memory else 0):
        for part in ("ih", "hh"):
            state[f"rnn.{part}{i}.weight"] = s[f"rnn.rnn.weight_{part}_l{i}"]
            state[f"rnn.{part}{i}.bias"] = s[f"rnn.rnn.bias_{part}_l{i}"]
    if norm:  # (x - mean) / (std + eps) as our (x - mean) / sqrt(var' + eps'): var' = (std + eps)^2
        std = s["obs_normalizer._std"].reshape(-1).double()
        state["obs_mean"] = s["obs_normalizer._mean"].reshape(-1).float()
        state["obs_var"] = ((std + NORMALIZER_EPS) ** 2 - arch.norm_eps).float()
    policy = build_policy(spec, arch, None)
    for k in ("act_low", "act_high"):
        if k in policy.net.state_dict():
            state[k] = policy.net.state_dict()[k]
    try:
        return build_policy(spec, arch, {k: v.detach().clone().float() for k, v in state.items()})
    except (RuntimeError, KeyError, ValueError) as e:
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise IntegrityError(
            f"{source}: the actor's weights do not fit its layers ({first_line})", _FIX
        ) from None


def _load(path: Path, opts: LoadOptions) -> Policy:
    if opts.vecnormalize:
        raise InputError(
            "--vecnormalize applies to SB3 .zip files", "rsl_rl checkpoints carry their normalizer"
        )
    io = read_io(opts.io, opts.env_id)
    policy = policy_from_actor(read_checkpoint(path), io, path.stem, f"rsl_rl:{path.name}")
    policy.reference_name = "the rsl_rl actor as a torch module"
    return policy


def _detect(path: Path) -> bool:
    return path.is_file() and path.suffix == ".pt"


register(Source("rsl_rl", "an rsl_rl model_N.pt (rsl-rl-lib 5.x)", _detect, _load))
