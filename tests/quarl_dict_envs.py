"""A small environment with a Dict(image, vectors) observation for the MultiInputPolicy tests, registered
on import (``quarl_dict_envs:QuarlDictImage-v0``, the gymnasium form the bench runner imports): an agent
steered towards a target that only the camera shows (a bright square in channel 0; the agent in channel
1, noise in channel 2), its position and velocity as vector keys. The reward (minus the distance to the
target) needs both the image and the vectors. ``-v0``: discrete actions (push along x or y), camera
height-width-channels (SB3 transposes it); ``Continuous-v0``: a 2-D push, camera channels first."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

SIZE = 36  # the Nature CNN's smallest input
_PUSH = np.array([[0, 0], [1, 0], [-1, 0], [0, 1], [0, -1]], np.float32)


class DictImageEnv(gym.Env[dict[str, np.ndarray], Any]):
    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, continuous: bool = False, render_mode: str | None = None) -> None:
        self.continuous, self.render_mode = continuous, render_mode
        cam = (SIZE, SIZE, 3) if not continuous else (3, SIZE, SIZE)
        self.observation_space = spaces.Dict({
            "agent": spaces.Box(-1.0, 1.0, (2,), np.float32),
            "camera": spaces.Box(0, 255, cam, np.uint8),
            "velocity": spaces.Box(-1.0, 1.0, (2,), np.float32),
        })  # fmt: skip
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32) if continuous else spaces.Discrete(5)
        self._pos = np.zeros(2, np.float32)
        self._vel = np.zeros(2, np.float32)
        self._target = np.zeros(2, np.float32)
        self._t = 0

    def _pixel(self, p: np.ndarray) -> tuple[int, int]:
        r, c = ((p + 1.0) / 2.0 * (SIZE - 6)).astype(int)
        return int(r), int(c)

    def _obs(self) -> dict[str, np.ndarray]:
        img = np.zeros((SIZE, SIZE, 3), np.uint8)
        img[..., 2] = self.np_random.integers(0, 40, (SIZE, SIZE))
        r, c = self._pixel(self._target)
        img[r : r + 6, c : c + 6, 0] = 255
        r, c = self._pixel(self._pos)
        img[r : r + 4, c : c + 4, 1] = 200
        cam = img if not self.continuous else np.ascontiguousarray(img.transpose(2, 0, 1))
        return {"agent": self._pos.copy(), "camera": cam, "velocity": self._vel.copy()}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict]:
        super().reset(seed=seed)
        self._pos = self.np_random.uniform(-0.8, 0.8, 2).astype(np.float32)
        self._vel = np.zeros(2, np.float32)
        self._target = self.np_random.uniform(-0.8, 0.8, 2).astype(np.float32)
        self._t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[dict[str, np.ndarray], float, bool, bool, dict]:
        push = np.clip(np.asarray(action, np.float32), -1, 1) if self.continuous else _PUSH[int(action)]
        self._vel = np.clip(0.7 * self._vel + 0.3 * push, -1, 1).astype(np.float32)
        self._pos = np.clip(self._pos + 0.15 * self._vel, -1, 1).astype(np.float32)
        self._t += 1
        reward = -float(np.linalg.norm(self._pos - self._target))
        return self._obs(), reward, False, self._t >= 40, {}


for _id, _kw in (("QuarlDictImage-v0", {}), ("QuarlDictImageContinuous-v0", {"continuous": True})):
    if _id not in gym.registry:
        gym.register(_id, entry_point=DictImageEnv, kwargs=_kw)
