"""The deterministic policy as a plain torch module, and its checkpoint format.

``PolicyNet`` holds the actor (or Q-network) of any supported algorithm together with the
preprocessing and action postprocessing that can live in the graph, so its input is the raw environment
observation and its output the environment action. Checkpoints are a folder of plain files:
``policy.json`` (PolicySpec + architecture + sha256 of the weights) and ``weights.npz`` (no pickle).
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from quarl_edge.policy.combined import CombinedFeatures, key_parts, nature_cnn
from quarl_edge.policy.format import CHECKPOINT_FORMAT, CHECKPOINT_VERSION
from quarl_edge.quant.config import QATConfig
from quarl_edge.quant.qat import QATClock, convert
from quarl_edge.runtimes import schema
from quarl_edge.runtimes.artifact import read_artifact
from quarl_edge.runtimes.envs import bounds
from quarl_edge.runtimes.errors import InputError, IntegrityError
from quarl_edge.runtimes.fsutil import atomic_directory, atomic_write_bytes, sha256_bytes, sha256_file
from quarl_edge.runtimes.schema import JSONObject
from quarl_edge.runtimes.spec import PolicySpec, StateSpec

ACTIVATIONS: dict[str, type[nn.Module]] = {
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "elu": nn.ELU,
    "leaky_relu": nn.LeakyReLU,
}
MODELS = ("mlp", "nature_cnn", "combined")
HEADS = ("argmax", "clip", "tanh_unscale", "identity", "multi_argmax", "binary")
RECURRENT = ("lstm", "gru")
STATE_NAMES = {"lstm": (("h_in", "h_out"), ("c_in", "c_out")), "gru": (("h_in", "h_out"),)}
"""graph input and output names of the recurrent state, as Isaac Lab's rsl_rl exporter names them"""
MASKED_LOGIT = -1e8
"""what a masked-out action's logit becomes (sb3-contrib's MaskableCategorical: HUGE_NEG)"""


@dataclass(frozen=True)
class Cell:
    """A recurrent cell as a checkpoint's weights show it (lstm or gru, hidden size, layers); checked when
    :meth:`NetArch.with_cell` puts it into an architecture."""

    kind: str
    hidden: int
    layers: int


@dataclass(frozen=True)
class NetArch:
    """Shape of the network; weights are stored separately.

    head: ``argmax`` (discrete: logits or Q-values -> action index), ``clip`` (Gaussian mean clipped to
    the action bounds, as SB3 PPO/A2C predict), ``tanh_unscale`` (SAC/TD3/DDPG: tanh then rescale from
    [-1, 1] to the action bounds), ``identity``, ``multi_argmax`` (MultiDiscrete: an argmax per
    component over its slice of the logits), ``binary`` (MultiBinary: logit > 0, Bernoulli's mode).
    """

    model: str  # "mlp" | "nature_cnn" | "combined" (SB3's CombinedExtractor: policy/combined.py)
    hidden: tuple[int, ...]
    activation: str
    out_dim: int
    head: str
    scale_uint8: bool = False
    obs_norm: bool = False
    norm_clip: float = 10.0
    norm_eps: float = 1e-8
    cnn_features: int = 512
    qat: QATConfig | None = None
    """set for quantization-aware-trained policies (bits, activations, delay, ...); the net then runs
    with fake quantization (weights on the n-bit grid, activations over the ranges learned in training)"""
    action_mask: bool = False
    """the graph takes an action mask (1 allowed, 0 not, one per logit) as a second input (MaskablePPO)"""
    recurrent: str | None = None
    """``lstm`` or ``gru``: a recurrent cell between the (normalized) features and the MLP, one step per
    call, its state an explicit input and output of the graph (RecurrentPPO, rsl_rl's RNN models)"""
    rnn_hidden: int = 0
    rnn_layers: int = 1

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise InputError(f"unsupported model type {self.model!r}", f"supported: {', '.join(MODELS)}")
        if self.model == "combined" and (self.obs_norm or self.recurrent):
            raise InputError("a Dict observation with image keys and observation normalization or a recurrent "
                             "cell", "quarl-edge rebuilds MultiInputPolicy's feed-forward policies")  # fmt: skip
        if self.activation not in ACTIVATIONS:
            raise InputError(
                f"unsupported activation {self.activation!r}", f"supported: {', '.join(sorted(ACTIVATIONS))}"
            )
        if self.head not in HEADS:
            raise InputError(f"unsupported action head {self.head!r}", f"supported: {', '.join(HEADS)}")
        if self.recurrent is not None and (self.recurrent not in RECURRENT or self.rnn_hidden < 1
                                           or self.rnn_layers < 1 or self.model != "mlp"):  # fmt: skip
            raise InputError(f"unsupported recurrent cell {self.recurrent!r} ({self.rnn_layers} x {self.rnn_hidden})",
                             f"supported: {', '.join(RECURRENT)} after an MLP policy's features")  # fmt: skip
        if self.action_mask and self.head not in ("argmax", "multi_argmax"):
            raise InputError(f"an action mask with the {self.head!r} head", "masks apply to discrete actions")

    def with_cell(self, cell: Cell | None) -> NetArch:
        """This architecture with ``cell`` between its features and its MLP (None: as it is)."""
        if cell is None:
            return self
        return replace(self, recurrent=cell.kind, rnn_hidden=cell.hidden, rnn_layers=cell.layers)

    def to_dict(self) -> JSONObject:
        d = asdict(self)
        d["hidden"] = list(self.hidden)
        d["qat"] = self.qat.to_dict() if self.qat else None
        return d

    @classmethod
    def from_dict(cls, d: Any) -> NetArch:
        """From a checkpoint's ``arch``: each field's type and size checked before a layer is built."""
        fix = "re-train or re-import the policy"
        d = dict(schema.obj(d, "checkpoint arch", fix))
        hidden = d.get("hidden", [])
        if not isinstance(hidden, list | tuple) or len(hidden) > 64:
            raise InputError("checkpoint arch hidden is not a list of at most 64 layer sizes", fix)
        d["hidden"] = tuple(schema.integer(h, "checkpoint arch hidden size", fix, 1, 65_536) for h in hidden)
        d["out_dim"] = schema.integer(d.get("out_dim"), "checkpoint arch out_dim", fix, 1, 65_536)
        d["cnn_features"] = schema.integer(
            d.get("cnn_features", 512), "checkpoint arch cnn_features", fix, 1, 65_536
        )
        for k in ("model", "activation", "head"):
            d[k] = schema.text(d.get(k), f"checkpoint arch {k}", fix, 64)
        if d.get("recurrent") is not None and d["recurrent"] not in RECURRENT:
            raise InputError(
                f"checkpoint arch recurrent {str(d['recurrent'])[:20]!r} is not lstm or gru", fix
            )
        for k in ("rnn_hidden", "rnn_layers"):
            if k in d:
                d[k] = schema.integer(d[k], f"checkpoint arch {k}", fix, 0, 65_536)
        for k in ("scale_uint8", "obs_norm", "action_mask"):
            if not isinstance(d.get(k, False), bool):
                raise InputError(f"checkpoint arch {k} is not true/false", fix)
        for k in ("norm_clip", "norm_eps"):
            if k in d:
                d[k] = schema.number(d[k], f"checkpoint arch {k}", fix)
        d["qat"] = QATConfig.from_dict(d["qat"]) if d.get("qat") else None
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InputError(f"checkpoint arch has unknown fields {unknown[:3]}", fix)
        return cls(**d)

    def graph_steps(self) -> tuple[str, ...]:
        steps = []
        if self.scale_uint8:
            steps.append("scale_uint8")
        if self.obs_norm:
            steps.append("obs_normalize")
        if self.recurrent:
            steps.append(self.recurrent)
        steps.append(self.model if not self.qat else f"{self.model}[qat{self.qat.bits}]")
        if self.action_mask:
            steps.append("action_mask")
        steps.append(self.head)
        return tuple(steps)


class RecurrentStep(nn.Module):
    """One step of a (multi-layer) LSTM or GRU written with Linear layers, so that exporters see plain
    matrix products (int8-quantizable like any layer) and the state stays an explicit input/output.
    State tensors are [layers, batch, hidden] (torch's and rsl_rl's layout). Gate order is torch's:
    LSTM (input, forget, cell, output), GRU (reset, update, new)."""

    def __init__(self, cell: str, in_dim: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.cell, self.hidden, self.layers = cell, hidden, layers
        gates = 4 if cell == "lstm" else 3
        for i in range(layers):  # registered in the order the graph runs them: ih0, hh0, ih1, ...
            setattr(self, f"ih{i}", nn.Linear(in_dim if i == 0 else hidden, gates * hidden))
            setattr(self, f"hh{i}", nn.Linear(hidden, gates * hidden))

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        hs, cs = [], []
        for i in range(self.layers):
            gi, gh = getattr(self, f"ih{i}")(x), getattr(self, f"hh{i}")(h[i])
            if self.cell == "lstm":
                assert c is not None
                ig, fg, gg, og = torch.chunk(gi + gh, 4, dim=1)
                ci = torch.sigmoid(fg) * c[i] + torch.sigmoid(ig) * torch.tanh(gg)
                x = torch.sigmoid(og) * torch.tanh(ci)
                cs.append(ci)
            else:
                ir, iz, inn = torch.chunk(gi, 3, dim=1)
                hr, hz, hn = torch.chunk(gh, 3, dim=1)
                r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
                x = (1 - z) * torch.tanh(inn + r * hn) + z * h[i]
            hs.append(x)
        out = (x, torch.stack(hs))
        return (*out, torch.stack(cs)) if self.cell == "lstm" else out


class PolicyNet(nn.Module):
    """obs -> action, with in-graph preprocessing and postprocessing."""

    obs_mean: torch.Tensor
    obs_var: torch.Tensor
    act_low: torch.Tensor
    act_high: torch.Tensor

    def __init__(self, arch: NetArch, spec: PolicySpec) -> None:
        super().__init__()
        self.arch = arch
        obs_shape = tuple(spec.observation_space.shape)
        act_cls = ACTIVATIONS[arch.activation]
        if arch.obs_norm:
            self.register_buffer("obs_mean", torch.zeros(obs_shape))
            self.register_buffer("obs_var", torch.ones(obs_shape))
        in_dim: int
        if arch.model == "nature_cnn":
            if len(obs_shape) != 3:
                raise InputError(
                    f"the Nature-CNN needs image observations (C, H, W), got shape {list(obs_shape)}",
                    "use --model mlp for vector observations",
                )
            self.cnn = nature_cnn(obs_shape[0])
            with torch.no_grad():
                n_flat = int(self.cnn(torch.zeros(1, *obs_shape)).shape[1])
            self.cnn_fc = nn.Sequential(nn.Linear(n_flat, arch.cnn_features), nn.ReLU())
            in_dim = arch.cnn_features
        elif arch.model == "combined":
            parts = key_parts(spec.env.wrappers)
            if sum(p.size for p in parts) != int(np.prod(obs_shape)):
                raise InputError(
                    f"the combined model needs the env's Dict keys, its spec has {list(obs_shape)} inputs",
                    "re-import the policy",
                )
            self.combined = CombinedFeatures(parts, arch.cnn_features, arch.scale_uint8)
            in_dim = self.combined.out_dim
        else:
            in_dim = int(np.prod(obs_shape)) if obs_shape else 1
        if arch.recurrent:
            self.rnn = RecurrentStep(arch.recurrent, in_dim, arch.rnn_hidden, arch.rnn_layers)
            in_dim = arch.rnn_hidden
        layers: list[nn.Module] = []
        for h in arch.hidden:
            layers += [nn.Linear(in_dim, h), act_cls()]
            in_dim = h
        self.mlp = nn.Sequential(*layers)
        self.out = nn.Linear(in_dim, arch.out_dim)
        if arch.qat:
            convert(self, arch.qat, QATClock(delay=0))  # deployed: fake quantization on from step 0
        self.nvec = [int(v) for v in spec.action_space.nvec or ()]
        self.action_shape = tuple(spec.action_space.shape)
        if arch.head in ("clip", "tanh_unscale"):
            low, high = bounds(spec.action_space)
            self.register_buffer("act_low", torch.as_tensor(low, dtype=torch.float32).reshape(-1))
            self.register_buffer("act_high", torch.as_tensor(high, dtype=torch.float32).reshape(-1))

    def _inputs(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float()
        if self.arch.model == "combined":  # each image key scaled by itself, the vectors as they are
            return self.combined(x)
        if self.arch.scale_uint8:
            x = x / 255.0
        if self.arch.obs_norm:
            x = (x - self.obs_mean) / torch.sqrt(self.obs_var + self.arch.norm_eps)
            x = torch.clamp(x, -self.arch.norm_clip, self.arch.norm_clip)
        if self.arch.model == "nature_cnn":
            return self.cnn_fc(self.cnn(x))
        return torch.flatten(x, 1)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.mlp(self._inputs(obs))

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """The network output before the action head (logits, Q-values or pre-tanh action)."""
        return self.out(self.features(obs))

    def forward(self, obs: torch.Tensor, *extra: torch.Tensor) -> Any:
        """``extra``: the action mask of a masked policy, then the recurrent state (h, and c for an
        LSTM), in graph order; a recurrent net returns (action, *state after the step)."""
        if self.arch.recurrent:
            mask = extra[0] if self.arch.action_mask else None
            state = extra[1:] if self.arch.action_mask else extra
            out = self.rnn(self._inputs(obs), *state, *([None] if len(state) == 1 else []))
            return (self._head(self.out(self.mlp(out[0])), mask), *out[1:])
        return self._head(self.logits(obs), extra[0] if extra else None)

    def _head(self, y: torch.Tensor, action_mask: torch.Tensor | None) -> torch.Tensor:
        head = self.arch.head
        if action_mask is not None:
            y = torch.where(action_mask > 0.5, y, torch.full_like(y, MASKED_LOGIT))
        if head == "argmax":
            return torch.argmax(y, dim=1)
        if head == "multi_argmax":
            parts = [torch.argmax(p, dim=1) for p in torch.split(y, self.nvec, dim=1)]
            return torch.stack(parts, dim=1).reshape(-1, *self.action_shape)
        if head == "binary":
            return (y > 0).to(torch.int64).reshape(-1, *self.action_shape)
        if head == "clip":
            return torch.minimum(torch.maximum(y, self.act_low), self.act_high)
        if head == "tanh_unscale":
            return self.act_low + 0.5 * (torch.tanh(y) + 1.0) * (self.act_high - self.act_low)
        return y


@dataclass
class Policy:
    """A loaded policy: spec, architecture and the torch module (eval mode)."""

    spec: PolicySpec
    arch: NetArch
    net: PolicyNet
    extra: dict[str, Any] = field(default_factory=dict)
    reference: Callable[..., np.ndarray] | None = field(default=None, repr=False, compare=False)
    """the source's own deterministic actions for raw observations [N, ...] and action masks [N, logits]
    or None (an imported zip: SB3's ``predict``), what the exported fp32 models are checked against;
    None: the torch module itself"""
    reference_name: str = "the checkpoint's torch module"
    source_model: bytes | None = field(default=None, repr=False, compare=False)
    """a foreign ONNX policy's graph (policy/onnx_source.py): the fp32 model the ONNX exporters copy and
    quantize; None: the torch module is exported"""

    def predict(
        self,
        obs: np.ndarray,
        action_mask: np.ndarray | None = None,
        episode_starts: np.ndarray | None = None,
    ) -> np.ndarray:
        """Actions for a batch of observations (numpy in, numpy out); ``action_mask`` [N, logits] for a
        masked policy (None: every action allowed). A recurrent policy takes the rows as one sequence of
        steps, its state zeroed at row 0 and wherever ``episode_starts`` is true."""
        return self.run_sequence(obs, action_mask, episode_starts)[0]

    def _mask(self, n: int, action_mask: np.ndarray | None) -> list[torch.Tensor]:
        if not self.arch.action_mask:
            return []
        size = self.spec.action_space.logits
        m = np.ones((n, size), np.float32) if action_mask is None else np.asarray(action_mask, np.float32)
        return [torch.as_tensor(m.reshape(n, size))]

    def zero_state(self, batch: int = 1) -> list[torch.Tensor]:
        a = self.arch
        if not a.recurrent:
            return []
        return [torch.zeros(a.rnn_layers, batch, a.rnn_hidden) for _ in STATE_NAMES[a.recurrent]]

    def run_sequence(
        self,
        obs: np.ndarray,
        action_mask: np.ndarray | None = None,
        episode_starts: np.ndarray | None = None,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """(actions, the state fed at each row: one [N, layers, hidden] array per state tensor)."""
        x = torch.as_tensor(np.asarray(obs))
        masks = self._mask(len(x), action_mask)
        with torch.no_grad():
            if not self.arch.recurrent:
                return self.net(x, *masks).numpy(), []
            starts = np.zeros(len(x), bool) if episode_starts is None else np.asarray(episode_starts, bool)
            state = self.zero_state()
            actions, fed = [], []
            for i in range(len(x)):
                if i == 0 or starts[i]:
                    state = self.zero_state()
                fed.append([t[:, 0].numpy().copy() for t in state])
                out = self.net(x[i : i + 1], *[m[i : i + 1] for m in masks], *state)
                actions.append(out[0].numpy()[0])
                state = list(out[1:])
        return np.stack(actions), [np.stack([f[j] for f in fed]) for j in range(len(state))]

    def reset(self) -> None:
        """A new episode: the recurrent state back to zeros."""
        self._state: list[torch.Tensor] = self.zero_state()

    def act(self, obs: np.ndarray, action_mask: np.ndarray | None = None) -> Any:
        x = torch.as_tensor(np.asarray(obs)[None])
        masks = self._mask(1, None if action_mask is None else np.asarray(action_mask)[None])
        with torch.no_grad():
            if self.arch.recurrent:
                state = getattr(self, "_state", None) or self.zero_state()
                out = self.net(x, *masks, *state)
                self._state = list(out[1:])
                a = out[0].numpy()[0]
            else:
                a = self.net(x, *masks).numpy()[0]
        space = self.spec.action_space
        if space.is_discrete:
            return int(a)
        return a.astype(np.int64 if space.is_integer else np.float32)


def state_specs(arch: NetArch) -> tuple[StateSpec, ...]:
    """The graph's recurrent state inputs/outputs for ``arch`` ([layers, 1, hidden] each)."""
    if not arch.recurrent:
        return ()
    return tuple(
        StateSpec(i, o, (arch.rnn_layers, 1, arch.rnn_hidden)) for i, o in STATE_NAMES[arch.recurrent]
    )


def build_policy(spec: PolicySpec, arch: NetArch, state: dict[str, torch.Tensor] | None = None) -> Policy:
    spec = replace(spec, state=state_specs(arch))  # the graph's state inputs follow from the architecture
    net = PolicyNet(arch, spec)
    if state is not None:
        missing, unexpected = net.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise InputError(
                f"weights do not fit the architecture (missing {missing[:3]}, unexpected {unexpected[:3]})",
                "the checkpoint is damaged or from another version; re-train or re-import it",
            )
    net.eval()
    return Policy(spec=spec, arch=arch, net=net)


def _weights_bytes(net: nn.Module) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: v.detach().cpu().numpy() for k, v in net.state_dict().items()})
    return buf.getvalue()


def _link_or_copy(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a file system without hard links
        shutil.copy2(src, dst)


def save_checkpoint(
    policy: Policy, out_dir: str | Path, extra: dict[str, Any] | None = None, keep: tuple[str, ...] = ()
) -> Path:
    """Write ``policy.json`` + ``weights.npz`` atomically (the folder appears complete or not at all).

    ``keep`` names entries of an existing ``out_dir`` carried over into the new one (e.g. resume state).
    """
    out_dir = Path(out_dir)
    weights = _weights_bytes(policy.net)
    meta = {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "spec": policy.spec.to_dict(),
        "arch": policy.arch.to_dict(),
        "weights": {"file": "weights.npz", "sha256": sha256_bytes(weights)},
        "extra": {**policy.extra, **(extra or {})},
    }
    with atomic_directory(out_dir) as tmp:
        for name in keep:
            # hard links, not a move: until the new folder is in place the old one stays whole, so a
            # run killed here loses nothing (the temporary folder is a leftover the next run removes)
            if (out_dir / name).is_dir():
                shutil.copytree(out_dir / name, tmp / name, copy_function=_link_or_copy)
            elif (out_dir / name).exists():
                _link_or_copy(out_dir / name, tmp / name)
        atomic_write_bytes(tmp / "weights.npz", weights)
        atomic_write_bytes(tmp / "policy.json", (json.dumps(meta, indent=2) + "\n").encode())
    return out_dir


def is_checkpoint(path: str | Path) -> bool:
    return (Path(path) / "policy.json").is_file()


def load_checkpoint(path: str | Path) -> Policy:
    path = Path(path)
    meta_path = path / "policy.json"
    if not meta_path.is_file():
        raise InputError(
            f"{str(path)!r} is not a quarl-edge policy (no policy.json)",
            "pass a folder written by `quarl-edge train` or an SB3 .zip",
        )
    meta = read_artifact(meta_path, CHECKPOINT_FORMAT, CHECKPOINT_VERSION, "checkpoint",
                         "re-train or re-import the policy", error=IntegrityError, version_key="version")  # fmt: skip
    weights = schema.obj(meta.get("weights", {}), "checkpoint weights", "re-train or re-import the policy")
    weights_path = path / schema.text(weights.get("file", "weights.npz"), "checkpoint weights.file",
                                      "re-train or re-import the policy", 255)  # fmt: skip
    if not weights_path.resolve().is_relative_to(path.resolve()):
        raise IntegrityError(
            f"checkpoint {str(path)!r} names weights outside its folder ({weights.get('file')!r})",
            "re-train or re-import the policy",
        )
    if not weights_path.is_file():
        raise IntegrityError(
            f"checkpoint weights {str(weights_path)!r} are missing", "re-train or re-import the policy"
        )
    expected = weights.get("sha256")
    actual = sha256_file(weights_path)
    if expected != actual:
        raise IntegrityError(
            f"checkpoint weights {str(weights_path)!r} fail their sha256 check",
            "the file was modified or damaged; re-train or re-import the policy",
        )
    try:
        spec = PolicySpec.from_dict(meta["spec"])
        arch = NetArch.from_dict(meta["arch"])
        with np.load(weights_path, allow_pickle=False) as z:
            state = {k: torch.from_numpy(z[k].copy()) for k in z.files}
    except schema.MALFORMED as e:
        raise IntegrityError(
            f"checkpoint {str(path)!r} is malformed ({type(e).__name__}: {str(e)[:160]})",
            "re-train or re-import the policy",
        ) from None
    try:  # the spec's spaces and the arch decide the layers; weights of other shapes do not fit them
        policy = build_policy(spec, arch, state)
    except (RuntimeError, KeyError, ValueError, TypeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise IntegrityError(
            f"checkpoint {str(path)!r}: its weights do not fit its architecture ({first})",
            "re-train or re-import the policy",
        ) from None
    policy.extra = dict(
        schema.obj(meta.get("extra", {}), "checkpoint extra", "re-train or re-import the policy")
    )
    return policy
