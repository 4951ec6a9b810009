"""The model's inputs as the manifest describes them, fed the same way for every runtime: a Dict
observation checked key by key and flattened in the manifest's order, and the action mask of a masked
policy (MaskablePPO: one 1/0 per logit, every action allowed when none is given). Device side: numpy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .adapters import ModelSession
from .errors import InputError
from .spec import PolicySpec

MASK_STEP = "action_mask"
"""the graph step (PolicySpec.graph_steps) of a policy whose graph takes an action mask"""


class ModelInputs:
    """The action mask of the next call, and the recurrent state (PolicySpec.state): fed with every
    call, replaced by the graph's state outputs after it, zeros after ``reset()``. The state is kept
    per batch size (one environment for ``act``; ``act_batch``'s N rows are N environments)."""

    def __init__(self, spec: PolicySpec) -> None:
        self.mask_len: int | None = spec.action_space.logits if MASK_STEP in spec.graph_steps else None
        self._mask: np.ndarray | None = None
        self.state_specs = spec.state
        self._state: list[np.ndarray] | None = None

    @property
    def active(self) -> bool:
        return self.mask_len is not None or bool(self.state_specs)

    def reset(self) -> None:
        """A new episode: the recurrent state back to zeros."""
        self._state = None

    @property
    def state(self) -> tuple[np.ndarray, ...]:
        """The recurrent state the next call feeds (zeros after a reset), a copy."""
        return tuple(s.copy() for s in self._states(1 if self._state is None else self._rows()))

    def _rows(self) -> int:
        assert self._state is not None
        st = self.state_specs[0]
        return int(self._state[0].shape[st.batch_axis])

    def _states(self, rows: int) -> list[np.ndarray]:
        if self._state is not None and self._rows() == rows:
            return self._state
        out = []
        for st in self.state_specs:
            shape = list(st.shape)
            shape[st.batch_axis] = rows
            out.append(np.zeros(shape, np.float32))
        return out

    def snapshot(self) -> tuple[list[np.ndarray] | None, np.ndarray | None]:
        """The state and mask as they are (``restore`` puts them back: a rehearsal leaves no trace)."""
        return self._state, self._mask

    def restore(self, saved: tuple[list[np.ndarray] | None, np.ndarray | None]) -> None:
        self._state, self._mask = saved

    def set_mask(self, mask: Any, rows: int | None) -> None:
        """The mask of the next call (``rows``: None for one observation, else a batch of that many);
        an InputError when it cannot be one."""
        if mask is None:
            self._mask = None
            return
        n = self.mask_len
        if n is None:
            raise InputError("this policy takes no action mask", "call act(obs) without action_mask")
        want = (n,) if rows is None else (rows, n)
        try:
            m = np.asarray(mask)
        except (ValueError, TypeError):
            m = np.asarray([])
        if m.dtype.kind not in "biuf" or m.shape != want:
            raise InputError(f"action_mask of shape {list(m.shape)} ({m.dtype}), the policy takes {list(want)} "
                             "ones and zeros", "pass env.action_masks() (one entry per action)")  # fmt: skip
        m = m.astype(np.float32).reshape(-1, n)
        if not np.all((m == 0) | (m == 1)):
            raise InputError("action_mask holds values other than 0/1 (or True/False)",
                             "pass env.action_masks() as it comes")  # fmt: skip
        if not np.all(m.any(axis=1)):
            raise InputError("action_mask allows no action", "allow at least one action in every row")
        self._mask = m

    def run(self, session: ModelSession, batch: np.ndarray) -> np.ndarray:
        """The model's action output for ``batch`` with the extra inputs of this call."""
        feeds = [batch]
        if self.mask_len is not None:
            m = self._mask
            if m is None or len(m) != len(batch):
                m = np.ones((len(batch), self.mask_len), np.float32)
            feeds.append(m)
        self._mask = None
        feeds.extend(self._states(len(batch)) if self.state_specs else [])
        outs = session.run_io(feeds)
        if self.state_specs:  # the graph's state outputs, in the order of its state inputs
            self._state = [np.asarray(o, np.float32) for o in outs[1 : 1 + len(self.state_specs)]]
        return outs[0]


VECTOR = "vector"
IMAGE_KINDS = ("image_hwc", "image_chw")
"""a Dict entry's kind in the ``dict_obs`` preprocessing: an image (uint8 pixels, height-width-channels or
channels first as the env returns it; the graph scales and transposes it as SB3 does) or a vector"""
KEY_KINDS = (VECTOR, *IMAGE_KINDS)


class DictInput:
    """A Dict observation (the manifest's ``dict_obs`` preprocessing: keys, shapes, order, and each key's
    kind) checked key by key and flattened, in that order, into the model's input vector. Image entries
    go in as their raw pixel values (0..255) cast to float32: the graph slices them back out."""

    def __init__(self, kwargs: dict[str, Any]) -> None:
        keys, sizes, shapes = kwargs.get("keys"), kwargs.get("sizes"), kwargs.get("shapes")
        kinds = kwargs.get("kinds", [VECTOR] * len(keys) if isinstance(keys, list) else None)
        fix = "re-export the bundle"
        if not (isinstance(keys, list) and isinstance(sizes, list) and isinstance(shapes, list)
                and isinstance(kinds, list) and len(keys) == len(sizes) == len(shapes) == len(kinds)
                and all(isinstance(k, str) for k in keys)):  # fmt: skip
            raise InputError(
                "the dict_obs preprocessing needs lists of keys, sizes, shapes (and kinds) of one length", fix
            )
        if any(k not in KEY_KINDS for k in kinds):
            raise InputError(f"the dict_obs preprocessing has a key kind outside {', '.join(KEY_KINDS)}", fix)
        self.keys: tuple[str, ...] = tuple(keys)
        self.kinds: tuple[str, ...] = tuple(kinds)
        self.shapes = tuple(tuple(int(d) for d in s) for s in shapes)
        if any(int(np.prod(s)) != n for s, n in zip(self.shapes, sizes, strict=True)):
            raise InputError("the dict_obs preprocessing has a size that does not fit its shape", fix)
        if any(k != VECTOR and len(s) != 3 for k, s in zip(self.kinds, self.shapes, strict=True)):
            raise InputError("the dict_obs preprocessing has an image key whose shape is not 3-D", fix)

    def flatten(self, obs: Any, refuse: Any) -> np.ndarray:
        """``obs`` (the env's dict) as one float32 vector; ``refuse(problem, fix)`` makes the InputError."""
        if not isinstance(obs, Mapping):
            raise refuse(f"observation of type {type(obs).__name__}, the policy takes a dict with the keys "
                         f"{', '.join(self.keys)}", "pass the env's observation dict as it comes")  # fmt: skip
        parts = []
        for key, shape, kind in zip(self.keys, self.shapes, self.kinds, strict=True):
            if key not in obs:
                raise refuse(f"observation dict has no key {key!r}",
                             f"pass the env's observation dict with the keys {', '.join(self.keys)}")  # fmt: skip
            try:
                x = np.asarray(obs[key])
            except (ValueError, TypeError):
                x = np.asarray([], dtype=object)
            if x.dtype.kind not in "biuf" or x.shape != shape:
                raise refuse(f"observation[{key!r}] of shape {list(x.shape)} ({x.dtype}), the policy takes "
                             f"{list(shape)} numbers", f"pass the env's {key!r} entry as it comes")  # fmt: skip
            if kind != VECTOR:
                _check_pixels(key, x, refuse)
            parts.append(x.reshape(-1))
        return np.concatenate(parts).astype(np.float32)


def _check_pixels(key: str, x: np.ndarray, refuse: Any) -> None:
    # the graph divides by 255: a frame already scaled to 0..1 (float) would pass as a black image
    if x.dtype.kind not in "ui" or not x.size:
        raise refuse(f"observation[{key!r}] is an image of {x.dtype}, the policy takes uint8 pixels 0..255",
                     f"pass the env's {key!r} frame as it comes (uint8, not scaled)")  # fmt: skip
    lo, hi = int(x.min()), int(x.max())
    if lo < 0 or hi > 255:
        raise refuse(f"observation[{key!r}] has pixel values {lo}..{hi}, outside 0..255",
                     f"pass the env's {key!r} frame as it comes (uint8)")  # fmt: skip
