"""The device runner's `serve` (the policy alone, for `bench --env-on-host`): its protocol with a real
child process and a real Pendulum env here (seeds with different returns), and requests that are not observations."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.devices.link import local_link
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.serve import decode_obs, encode_obs


def test_env_on_host_locally_plays_the_device_episodes(pendulum_bundle: Path) -> None:
    cfg = BenchConfig(episodes=2, latency_samples=20, max_steps=120)
    a, b = (
        bench(pendulum_bundle, cfg).to_dict(),
        bench(pendulum_bundle, replace(cfg, env_on_host=True)).to_dict(),
    )
    for x, y in zip(a["models"], b["models"], strict=True):
        assert y["reward"]["per_episode"] == x["reward"]["per_episode"]
        assert len(set(y["reward"]["per_episode"])) == 2
        assert y["env_on_host"]["steps"] == 2 * 120 and y["latency"]["p50_us"] > 0  # latency still measured


def test_the_served_action_is_the_runners(pendulum_bundle: Path) -> None:
    runner = PolicyRunner(pendulum_bundle, "onnx-int8")
    link = local_link(pendulum_bundle, "onnx-int8", threads=1)
    try:
        assert link.ready["event"] == "ready"
        for obs in np.random.default_rng(0).uniform(-1, 1, size=(5, 3)).astype(np.float32):
            action, act_us = link.act(obs, discrete=False)
            np.testing.assert_array_equal(action, runner.act(obs))
            assert act_us > 0
    finally:
        link.close()


def test_a_model_that_is_not_there_is_one_line(pendulum_bundle: Path) -> None:
    with pytest.raises(QuarlError, match="no-such-model"):
        local_link(pendulum_bundle, "no-such-model", threads=1)


@pytest.mark.parametrize(
    "req, words",
    [({"obs": 3}, "is not {'obs'"), ({"obs": "AAAA", "dtype": "object", "shape": [1]}, "dtype"),
     ({"obs": "AAAA", "dtype": "float32", "shape": "3"}, "shape"),
     ({"obs": "!!", "dtype": "float32", "shape": [1]}, "do not match"),
     ({"obs": base64.b64encode(b"\\0" * 8).decode(), "dtype": "float32", "shape": [3]}, "do not match")],
)  # fmt: skip
def test_requests_that_are_not_observations_are_refused(req: dict, words: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(InputError, match=words):
        decode_obs(req)


def test_observations_round_trip() -> None:
    for obs in (np.arange(6, dtype=np.float32).reshape(2, 3), np.zeros((4, 84, 84), np.uint8)):
        back = decode_obs(json.loads(encode_obs(obs)))
        assert back.dtype == obs.dtype and np.array_equal(back, obs)
