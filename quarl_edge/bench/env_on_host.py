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

from quarl_edge.devices.link import PolicyLink
from quarl_edge.runtimes.envs import make_env
from quarl_edge.runtimes.errors import QuarlError
from quarl_edge.runtimes.spec import EnvConfig


def host_episodes(env_cfg: EnvConfig, link: PolicyLink, discrete: bool, seeds: list[int], max_steps: int | None,
                  on_episode: Callable[[dict[str, Any]], None]) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """Closed-loop episodes with the env here and the policy on the device; the episodes (as the runner
    reports them) and the link's timing: the device's inference alone, the round trip, their difference."""
    env = make_env(env_cfg)
    episodes, act_us, rtt_us = [], [], []
    try:
        for seed in seeds:
            obs, _ = env.reset(seed=int(seed))
            ret, steps, nonfinite, error = 0.0, 0, 0, None
            try:
                while True:
                    obs = np.asarray(obs)
                    if obs.dtype.kind == "f" and not np.all(np.isfinite(obs)):
                        nonfinite += 1
                    t0 = time.perf_counter_ns()
                    action, device_us = link.act(obs, discrete)
                    rtt_us.append((time.perf_counter_ns() - t0) / 1000.0)
                    act_us.append(device_us)
                    obs, reward, terminated, truncated, _ = env.step(action)
                    ret, steps = ret + float(reward), steps + 1
                    if terminated or truncated or (max_steps is not None and steps >= max_steps):
                        break
            except QuarlError:
                raise  # the link or the device failed: not this episode's doing
            except Exception as e:  # a broken episode is reported, the bench goes on (as on the device)
                error = f"{type(e).__name__}: {e}"
            ep = {"seed": int(seed), "ret": ret, "length": steps, "nonfinite_obs": nonfinite, "error": error}
            episodes.append(ep)
            on_episode(ep)
    finally:
        env.close()
    stats = {"where": "env on the host, policy on the device", "steps": len(rtt_us)}
    if rtt_us:
        a50, a99 = (float(x) for x in np.percentile(act_us, [50, 99]))
        r50, r99 = (float(x) for x in np.percentile(rtt_us, [50, 99]))
        stats.update(policy_us={"p50": a50, "p99": a99}, round_trip_us={"p50": r50, "p99": r99},
                     link_us_p50=max(r50 - a50, 0.0))  # fmt: skip
    return episodes, stats
