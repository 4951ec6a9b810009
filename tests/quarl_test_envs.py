"""Small environments for the action-space tests, registered on import (``quarl_test_envs:Id-v0``, the
gymnasium form the runner imports): an action-masked Discrete env with ``action_masks()`` (sb3-contrib's
convention), a MultiDiscrete one (masked too) and a MultiBinary one. Each rewards the action the
observation points at, so trained policies act on what they see."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class _Pointing(gym.Env[np.ndarray, Any]):
    """Observation: 8 uniform numbers; the rewarded action is read from them; 40 steps an episode."""

    def __init__(self, action_space: spaces.Space[Any], masked: bool) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (8,), np.float32)
        self.action_space = action_space
        self.masked = masked
        self._t = 0
        self._obs = np.zeros(8, np.float32)
        self._mask = np.ones(self._logits(), bool)

    def _logits(self) -> int:
        s = self.action_space
        if isinstance(s, spaces.Discrete):
            return int(s.n)
        if isinstance(s, spaces.MultiDiscrete):
            return int(np.sum(s.nvec))
        return int(np.prod(s.shape))

    def _draw(self) -> None:
        self._obs = self.np_random.uniform(-1, 1, 8).astype(np.float32)
        if self.masked:
            mask = self.np_random.random(self._logits()) < 0.6
            if isinstance(self.action_space, spaces.MultiDiscrete):
                start = 0
                for n in self.action_space.nvec:  # at least one choice per component
                    if not mask[start : start + n].any():
                        mask[start + int(self.np_random.integers(n))] = True
                    start += int(n)
            elif not mask.any():
                mask[int(self.np_random.integers(len(mask)))] = True
            self._mask = mask

    def action_masks(self) -> np.ndarray:
        return self._mask.copy()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        self._draw()
        return self._obs.copy(), {}

    def _reward(self, action: Any) -> float:
        o, s = self._obs, self.action_space
        if isinstance(s, spaces.Discrete):
            scores = np.where(self._mask, o[: s.n], -np.inf)
            return float(int(action) == int(np.argmax(scores)))
        if isinstance(s, spaces.MultiDiscrete):
            a = np.asarray(action)
            return float(np.mean([a[0] == np.argmax(o[:3]), a[1] == np.argmax(o[3:7])]))
        return float(np.mean(np.asarray(action) == (o[: s.shape[0]] > 0)))

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        r = self._reward(action)
        self._t += 1
        self._draw()
        return self._obs.copy(), r, False, self._t >= 40, {}


def _masked() -> _Pointing:
    return _Pointing(spaces.Discrete(5), masked=True)


def _multi_discrete() -> _Pointing:
    return _Pointing(spaces.MultiDiscrete([3, 4]), masked=True)


def _multi_binary() -> _Pointing:
    return _Pointing(spaces.MultiBinary(3), masked=False)


for _id, _fn in (("QuarlMasked-v0", _masked), ("QuarlMultiDiscrete-v0", _multi_discrete),
                 ("QuarlMultiBinary-v0", _multi_binary)):  # fmt: skip
    if _id not in gym.registry:
        gym.register(_id, entry_point=_fn)
