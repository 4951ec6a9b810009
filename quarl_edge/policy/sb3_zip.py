"""The SB3 and sb3-contrib zip importers: a ``model.save()`` zip -> PolicyNet, weights-only.

Zips are read without executing pickled code: the ``data`` member is JSON (its pickled entries are
never unpickled: what is needed of them is read from the plain-text fields SB3 writes beside them), the
weights are ``torch.load(weights_only=True)``, and a VecNormalize ``.pkl`` goes through an unpickler that
only rebuilds numpy arrays (policy/vecnormalize.py). Both packages save the same zip layout; the two
importers differ in what they detect (the policy class's package) and in the algorithms they name.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quarl_edge.policy.algos import IMPORTABLE, LAYOUTS, algo_from_data, canonical
from quarl_edge.policy.importers import LoadOptions, Source, register
from quarl_edge.policy.net import Policy
from quarl_edge.policy.registry import resolve_id
from quarl_edge.policy.sb3 import ACTIVATION_NAMES, SB3Parts, base_spec, policy_from_parts
from quarl_edge.policy.sb3_reference import sb3_reference
from quarl_edge.policy.vecnormalize import load_vecnormalize
from quarl_edge.runtimes.errors import InputError, IntegrityError
from quarl_edge.runtimes.spec import SpaceSpec

_FIX = "pass a .zip saved by SB3's model.save()"
_DATA_OBJECTS = ("policy_class", "observation_space", "action_space", "policy_kwargs")
# feature extractors whose layers map onto PolicyNet's (flattening, the Nature CNN, MultiInputPolicy's
# per-key Nature CNN or flattening: policy/combined.py)
_EXTRACTORS = ("FlattenExtractor", "NatureCNN", "CombinedExtractor")
_FILE_NAME = re.compile(
    r"(" + "|".join(sorted(IMPORTABLE, key=len, reverse=True)) + r")[-_](.+)", flags=re.IGNORECASE
)


@dataclass(frozen=True)
class ZipContents:
    data: dict[str, Any]
    state: dict[str, torch.Tensor]
    algo: str | None
    """from the policy class and hyperparameters in ``data`` (None: it does not say)"""

    @property
    def library(self) -> str:
        return LAYOUTS[self.algo].library if self.algo else "sb3"

    @property
    def policy_class(self) -> str:
        """The policy class's name, from the repr of its ``__init__`` SB3 stores in plain text."""
        pc = self.data.get("policy_class") or {}
        m = re.search(r"function (\w+)\.__init__", str(pc.get("__init__", "")))
        return m.group(1) if m else str(pc.get("__module__", "?"))

    def kwarg(self, name: str) -> str:
        """A policy_kwargs entry as the text SB3 wrote ("" when absent)."""
        return str((self.data.get("policy_kwargs") or {}).get(name, ""))


def names_from_filename(path: Path) -> tuple[str | None, str | None]:
    """SB3's own naming ``{algo}_{EnvId}.zip`` and RL Zoo's ``{algo}-{EnvId}.zip`` (ppo-CartPole-v1.zip,
    tqc_Pendulum-v1.zip, ppo_lstm-CartPole-v1.zip): (algo, env id), or (None, None)."""
    m = _FILE_NAME.fullmatch(path.stem)
    return (m.group(1).lower(), m.group(2)) if m else (None, None)


def read_zip(path: Path) -> ZipContents:
    """The zip's ``data`` and ``policy.pth``, refused in one line when damaged or holding pickled code."""
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
    except (ValueError, RuntimeError, EOFError, IndexError, struct.error, zlib.error) as e:
        raise IntegrityError(
            f"{str(path)!r} is damaged ({type(e).__name__}: {e})", "re-save the model"
        ) from None
    if not isinstance(data, dict):
        raise IntegrityError(f"{str(path)!r}: its data member is not a JSON object", _FIX)
    for key in _DATA_OBJECTS:
        if data.get(key) is not None and not isinstance(data[key], dict):
            raise IntegrityError(f"{str(path)!r}: data.{key} is not an object", _FIX)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise IntegrityError(f"{str(path)!r}: policy.pth is not a state dict of tensors", _FIX)
    return ZipContents(data, state, algo_from_data(data))


def _space_shape(d: dict[str, Any]) -> tuple[str, tuple[int, ...], int | None]:
    kind = "discrete" if "Discrete" in str(d.get(":type:", "")) else "box"
    shape = tuple(int(x) for x in re.findall(r"-?\d{1,9}", str(d.get("_shape", "[]"))[:200]))
    n = d.get("n") if kind == "discrete" else None
    if n is not None:
        n = int(n) if isinstance(n, int | str) and str(n).lstrip("-").isdigit() and len(str(n)) < 10 else -1
    return kind, shape, n


def _check_space(name: str, stored: dict[str, Any] | None, actual: SpaceSpec, env_id: str) -> None:
    if not stored or "Multi" in str(stored.get(":type:", "")) or "Dict" in str(stored.get(":type:", "")):
        return  # multi-part and Dict spaces are compared by their shapes when the weights are read
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


def _check_classes(z: ZipContents, path: Path) -> None:
    """A custom policy or feature-extractor class cannot be rebuilt from weights: refused by name."""
    module = str((z.data.get("policy_class") or {}).get("__module__", ""))
    if module and not module.startswith(("stable_baselines3.", "sb3_contrib.")):
        raise InputError(
            f"{str(path)!r} uses the custom policy class {z.policy_class!r} ({module[:80]})",
            "quarl-edge rebuilds SB3's and sb3-contrib's own policy classes (MlpPolicy, CnnPolicy); "
            "export the network yourself to ONNX and import it with --io",
        )
    extractor = re.search(r"\.(\w+)'>", z.kwarg("features_extractor_class"))
    if extractor and extractor.group(1) not in _EXTRACTORS:
        raise InputError(
            f"{str(path)!r} uses the custom feature extractor {extractor.group(1)!r}",
            f"supported extractors: {', '.join(_EXTRACTORS)} (SB3's MlpPolicy, CnnPolicy, MultiInputPolicy); "
            "export the "
            "network yourself to ONNX and import it with --io",
        )


def _activation(z: ZipContents, algo: str, path: Path) -> str:
    text = z.kwarg("activation_fn")
    m = re.search(r"\.(\w+)'>", text)
    if not m:
        return LAYOUTS[algo].activation
    name = ACTIVATION_NAMES.get(m.group(1))
    if name is None:
        raise InputError(
            f"{str(path)!r} uses the activation {m.group(1)!r}",
            f"supported activations: {', '.join(ACTIVATION_NAMES)}",
        )
    return name


def _squash(z: ZipContents, algo: str) -> bool:
    given = z.kwarg("squash_output")
    if given in ("True", "False"):
        return given == "True" and algo not in ("sac", "td3", "ddpg", "tqc", "crossq")
    # ARS's MlpPolicy squashes with tanh by default; its LinearPolicy clips
    return algo == "ars" and z.policy_class != "ARSLinearPolicy"


def load_zip(path: Path, opts: LoadOptions) -> Policy:
    z = read_zip(path)
    _check_classes(z, path)
    file_algo, file_env = names_from_filename(path)
    algo = canonical(opts.algo or z.algo or file_algo or "")
    if algo not in LAYOUTS:
        raise InputError(
            f"cannot tell the algorithm of {str(path)!r}", f"pass --algo ({', '.join(IMPORTABLE)})"
        )
    env_id = opts.env_id or file_env or opts.env_hint
    env_from = "--env" if opts.env_id else "file name" if file_env else opts.env_hint_from
    if not env_id:
        raise InputError(
            f"{str(path)!r} does not say which environment it was trained on", "pass --env ENV_ID"
        )
    env_id = resolve_id(env_id)
    base = base_spec(env_id, algo, name=path.stem, source=f"{LAYOUTS[algo].library}-zip:{path.name}")
    _check_space("observation", z.data.get("observation_space"), base.observation_space, env_id)
    _check_space("action", z.data.get("action_space"), base.action_space, env_id)
    eps = z.kwarg("batch_norm_eps")
    parts = SB3Parts(
        algo=algo,
        state=z.state,
        activation=_activation(z, algo, path),
        normalize_images=z.kwarg("normalize_images") != "False",
        squash_output=_squash(z, algo),
        batch_norm_eps=float(eps) if re.fullmatch(r"[0-9.eE+-]{1,24}", eps) else 0.001,
    )
    vn = load_vecnormalize(opts.vecnormalize) if opts.vecnormalize else None
    if vn is not None and vn.mean.size != int(np.prod(base.observation_space.shape)):
        raise InputError(
            f"VecNormalize statistics have {vn.mean.size} values, the observation has "
            f"{int(np.prod(base.observation_space.shape))}",
            "pass the vecnormalize.pkl saved with this model",
        )
    train = {"num_timesteps": z.data.get("num_timesteps"), "imported_from": path.name,
             "library": LAYOUTS[algo].library, "env_from": env_from}  # fmt: skip
    try:
        policy = policy_from_parts(parts, base, vn, extra_train=train)
    except (RuntimeError, KeyError, ValueError, TypeError, IndexError) as e:  # shapes or names of policy.pth
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        raise IntegrityError(
            f"{str(path)!r}: the weights in policy.pth do not fit a {algo.upper()} policy for {env_id} ({first})",
            "pass the zip's own --env and --algo, or re-save the model",
        ) from None
    policy.reference_name, policy.reference = sb3_reference(path, algo, z.data, base.env, vn)
    return policy


def load_sb3_zip(
    path: str | Path,
    env_id: str | None = None,
    algo: str | None = None,
    vecnormalize: str | Path | None = None,
) -> Policy:
    """An SB3 / sb3-contrib zip as a Policy (the library call behind ``--policy X.zip``)."""
    return load_zip(Path(path), LoadOptions(env_id, algo, Path(vecnormalize) if vecnormalize else None))


def _is_zip_of(library: str) -> Any:
    """Detection: a zip whose ``data`` names an algorithm of ``library``'s (a damaged or foreign zip goes
    to the SB3 importer, which says what is wrong with it)."""

    def detect(path: Path) -> bool:
        if path.suffix != ".zip" or not path.is_file():
            return False
        try:
            with zipfile.ZipFile(path) as z:
                data = json.loads(z.read("data")) if "data" in z.namelist() else {}
        except (zipfile.BadZipFile, ValueError, OSError, KeyError):
            return library == "sb3"
        algo = algo_from_data(data) if isinstance(data, dict) else None
        return (LAYOUTS[algo].library if algo else "sb3") == library

    return detect


register(Source("sb3-contrib", "sb3-contrib zip (TQC, QR-DQN, TRPO, ARS, CrossQ, MaskablePPO, RecurrentPPO)",
                _is_zip_of("sb3-contrib"), load_zip))  # fmt: skip
register(Source("sb3", "Stable-Baselines3 / RL Zoo zip", _is_zip_of("sb3"), load_zip))
