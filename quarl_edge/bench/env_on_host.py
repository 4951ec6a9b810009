"""`bench --env-on-host`: the environment runs here, the board runs only the policy, one observation per
step over the link (the device runner's `serve`, runtimes/serve.py). For an env whose packages the board
cannot install (box2d has no aarch64 wheel); the report keeps the policy's own time on the device apart
from the link's, so what the board would do with the env beside it stays readable.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from quarl_edge.bench.result import LinkTiming, Percentiles
from quarl_edge.bench.transport import Event
from quarl_edge.devices.link import PolicyLink
from quarl_edge.runtimes.envs import make_env
from quarl_edge.runtimes.errors import QuarlError
from quarl_edge.runtimes.runner import EpisodeResult, run_episodes
from quarl_edge.runtimes.spec import EnvConfig


def host_episodes(env_cfg: EnvConfig, link: PolicyLink, discrete: bool, seeds: list[int], max_steps: int | None,
                  on_episode: Callable[[Event], None]) -> LinkTiming:  # fmt: skip
    """Closed-loop episodes (the runner's run_episodes) with the env here and the policy on the device, each
    reported to ``on_episode`` as the runner reports it; the link's timing: the device's inference alone,
    the round trip, their difference."""
    act_us: list[float] = []
    rtt_us: list[float] = []

    def act(obs: np.ndarray) -> Any:
        t0 = time.perf_counter_ns()
        action, device_us = link.act(obs, discrete)
        rtt_us.append((time.perf_counter_ns() - t0) / 1000.0)
        act_us.append(device_us)
        return action

    def done(e: EpisodeResult) -> None:
        on_episode(episode_json(e))

    env = make_env(env_cfg)
    try:  # the link or the device failing (QuarlError) is not an episode's doing: it ends the bench
        run_episodes(env, act, seeds, max_steps=max_steps, on_episode=done, reraise=(QuarlError,))
    finally:
        env.close()
    if not rtt_us:
        return LinkTiming(where=WHERE, steps=0)
    a50, a99 = (float(x) for x in np.percentile(act_us, [50, 99]))
    r50, r99 = (float(x) for x in np.percentile(rtt_us, [50, 99]))
    return LinkTiming(
        where=WHERE, steps=len(rtt_us), policy_us=Percentiles(a50, a99), round_trip_us=Percentiles(r50, r99),
        link_us_p50=max(r50 - a50, 0.0))  # fmt: skip


def episode_json(e: EpisodeResult) -> Event:
    """An episode as the runner reports it (its JSON event), without the act() times it does not keep."""
    return {
        "seed": e.seed,
        "ret": e.ret,
        "length": e.length,
        "nonfinite_obs": e.nonfinite_obs,
        "error": e.error,
    }


WHERE = "env on the host, policy on the device"
