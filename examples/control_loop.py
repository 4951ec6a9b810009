"""A bundle's policy in a fixed-rate control loop, as on a board: the runtime API and gymnasium only.

    python examples/control_loop.py bundles/cartpole-ppo --hz 50 --steps 1000

Every period (1/--hz, on the monotonic clock) the loop calls ``policy.act(obs)`` then ``env.step``, then
sleeps to the next deadline. A step *overruns* when its act() + env.step took longer than the period;
the loop then skips the deadlines it missed instead of bursting to catch up. At the end it prints the
overruns and the act() latency (p50 / p99 / max), or one JSON object with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.errors import QuarlError


@dataclass(frozen=True)
class LoopResult:
    hz: float
    steps: int
    episodes: int
    """episodes that ended (terminated or truncated) during the run"""
    returns: list[float]
    overruns: int
    """steps whose act() + env.step took longer than the period"""
    act_p50_us: float
    act_p99_us: float
    act_max_us: float
    step_max_us: float
    """the slowest act() + env.step"""
    model: str
    runtime: str
    threads: int
    first_call_ms: float | None
    out_of_range: int
    """observations outside the bundle's calibration range (policy.stats)"""


def run(bundle: str, hz: float, steps: int, model: str | None, threads: int | str, seed: int) -> LoopResult:
    policy = load_policy(bundle, model=model, threads=threads)  # verified and warmed up
    env = policy.make_env()
    period = round(1e9 / hz)
    act_ns = np.empty(steps, np.int64)
    step_ns = np.empty(steps, np.int64)
    returns, ret, overruns = [], 0.0, 0
    obs, _ = env.reset(seed=seed)
    policy.reset()
    deadline = time.monotonic_ns() + period
    try:
        for i in range(steps):
            t0 = time.monotonic_ns()
            action = policy.act(obs)
            t1 = time.monotonic_ns()
            obs, reward, terminated, truncated, _ = env.step(action)
            t2 = time.monotonic_ns()
            act_ns[i], step_ns[i] = t1 - t0, t2 - t0
            overruns += int(t2 - t0 > period)
            ret += float(reward)
            if terminated or truncated:
                returns.append(ret)
                ret = 0.0
                obs, _ = env.reset()
                policy.reset()
            now = time.monotonic_ns()
            if now < deadline:
                time.sleep((deadline - now) / 1e9)
            else:  # late: the next deadline is the first one still ahead
                deadline += ((now - deadline) // period + 1) * period
                continue
            deadline += period
    finally:
        env.close()
    us = act_ns / 1e3
    info = policy.info
    return LoopResult(
        hz=hz,
        steps=steps,
        episodes=len(returns),
        returns=returns,
        overruns=overruns,
        act_p50_us=float(np.percentile(us, 50)),
        act_p99_us=float(np.percentile(us, 99)),
        act_max_us=float(us.max()),
        step_max_us=float(step_ns.max() / 1e3),
        model=info.model,
        runtime=f"{info.runtime} {info.runtime_version}".strip(),
        threads=info.threads,
        first_call_ms=info.first_call_ms,
        out_of_range=policy.stats.out_of_range,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle", help="bundle folder (from `quarl-edge export` or `quarl-edge tune`)")
    p.add_argument("--hz", type=float, default=50.0, help="control rate (steps per second)")
    p.add_argument("--steps", type=int, default=1000, help="control steps to run")
    p.add_argument("--model", default=None, help="model name (default: tune's choice or the only one)")
    p.add_argument(
        "--threads", type=int, default=None, help="default: tune's count for a tuned bundle, else 1"
    )
    p.add_argument("--seed", type=int, default=0, help="the first episode's seed")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if not (args.hz > 0 and np.isfinite(args.hz)) or args.steps < 1:
        print("error: --hz must be a positive rate and --steps at least 1; e.g. --hz 50 --steps 1000",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        threads = "tune" if args.threads is None else args.threads
        r = run(args.bundle, args.hz, args.steps, args.model, threads, args.seed)
    except QuarlError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    if args.json:
        print(json.dumps(asdict(r)))
        return 0
    print(f"{r.model} ({r.runtime}, {r.threads} thread(s)) at {r.hz:g} Hz: {r.steps} steps, "
          f"{r.episodes} episodes ended, {r.out_of_range} observations outside the calibration range")  # fmt: skip
    print(f"overruns (act + env.step > {1e6 / r.hz:.0f} us): {r.overruns} of {r.steps}")
    print(f"act() latency: p50 {r.act_p50_us:.1f} us, p99 {r.act_p99_us:.1f} us, max {r.act_max_us:.1f} us "
          f"(first call after load {r.first_call_ms or 0:.2f} ms, then warmed up)")  # fmt: skip
    if r.returns:
        print(f"returns: {', '.join(f'{x:g}' for x in r.returns)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
