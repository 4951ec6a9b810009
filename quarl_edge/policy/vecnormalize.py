"""SB3 VecNormalize statistics (``vec_normalize.pkl``), read without executing pickled code: an
unpickler that rebuilds only numpy arrays and turns every other object into an inert record."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quarl_edge.runtimes.errors import InputError, IntegrityError


@dataclass(frozen=True)
class VecNormStats:
    mean: np.ndarray
    var: np.ndarray
    clip_obs: float
    epsilon: float


class _Inert:
    """Stands in for any non-numpy object in a VecNormalize pickle; keeps its state, runs no code."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            state = {**(state[0] or {}), **state[1]}
        self.__dict__["state"] = state

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert(*args)


_MAX_VECNORM_BYTES = 64 * 2**20


class _SafeUnpickler(pickle.Unpickler):
    _NUMPY = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
    }
    _INERT_MODULES = ("stable_baselines3", "gymnasium", "gym", "numpy.random", "collections", "copyreg")

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._NUMPY:
            return super().find_class(module, name)
        if module == "builtins" and name in ("object", "set", "frozenset", "slice"):
            return super().find_class(module, name)
        if module.startswith(self._INERT_MODULES):
            return _Inert
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def _state(obj: Any) -> dict[str, Any]:
    st = getattr(obj, "__dict__", {}).get("state")
    return st if isinstance(st, dict) else {}


def load_vecnormalize(path: str | Path) -> VecNormStats:
    path = Path(path)
    if not path.is_file():
        raise InputError(
            f"VecNormalize file {str(path)!r} does not exist",
            "pass the vecnormalize.pkl saved with the model",
        )
    fix = "pass the vecnormalize.pkl that SB3's VecNormalize.save() wrote"
    if path.stat().st_size > _MAX_VECNORM_BYTES:
        raise IntegrityError(f"{str(path)!r} is too large to be a VecNormalize file", fix)
    try:
        with open(path, "rb") as f:
            obj = _SafeUnpickler(f).load()
        st = _state(obj)
        rms = _state(st["obs_rms"])
        if not st.get("norm_obs", True):
            raise InputError(f"{str(path)!r} does not normalize observations", "omit --vecnormalize")
        stats = VecNormStats(
            mean=np.asarray(rms["mean"], dtype=np.float64).reshape(-1),
            var=np.asarray(rms["var"], dtype=np.float64).reshape(-1),
            clip_obs=float(st.get("clip_obs", 10.0)),
            epsilon=float(st.get("epsilon", 1e-8)),
        )
    except InputError:
        raise
    # the unpickler builds only numpy arrays and inert records, so whatever a damaged file makes it raise
    # (numpy's own SystemError included) means "damaged", never a crash
    except (Exception, MemoryError, RecursionError) as e:
        raise IntegrityError(
            f"{str(path)!r} is not a readable VecNormalize file ({type(e).__name__}: {str(e)[:160]})", fix
        ) from None
    finite = np.all(np.isfinite(stats.mean)) and np.all(np.isfinite(stats.var)) and np.all(stats.var >= 0)
    if (
        stats.mean.shape != stats.var.shape
        or not finite
        or not (np.isfinite(stats.clip_obs) and stats.clip_obs > 0)
    ):
        raise IntegrityError(f"{str(path)!r} holds statistics no VecNormalize could have saved", fix)
    return stats
