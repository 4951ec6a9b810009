"""A bundle's policy in a fixed-rate control loop, as on a board: the runtime API and gymnasium only.

    python examples/control_loop.py bundles/cartpole-ppo --hz 50 --steps 1000
    python examples/control_loop.py bundles/pendulum-sac --hz 50 --steps 2000 \\
        --log-dir logs/pendulum --sensor-bias 2=4.0 --sensor-noise 0.05     # a field run, logged

The loop runner (quarl_edge.runtimes.loop) calls ``policy.act(obs)`` then ``env.step`` once per period
(1/--hz) on absolute deadlines of the monotonic clock, with a throw-away act() a lead before each deadline
and a spin to it, and, where the OS allows, CPU affinity, SCHED_FIFO, mlockall and a frozen garbage
collector. A step *overruns* when its act() + env.step ends after the next deadline; the loop then waits
for the first deadline still ahead (it skips, it never bursts). ``--plain`` runs the loop most scripts are
(act, step, sleep to the deadline) for comparison. ``--sensor-bias I=V`` / ``--sensor-noise S`` add a
constant to feature I / Gaussian noise to every feature of each observation, as a miscalibrated sensor
would; ``--log-dir`` records what the policy saw and did (field telemetry, for `quarl-edge field`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import gymnasium as gym
import numpy as np

from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.loop import LoopConfig, LoopResult, run_loop


class SensorFault(gym.ObservationWrapper):  # type: ignore[misc]
    """Observations as a faulty sensor gives them: a constant bias on some features, Gaussian noise."""

    def __init__(self, env: Any, bias: dict[int, float], noise: float, seed: int) -> None:
        super().__init__(env)
        self.offset = np.zeros(env.observation_space.shape, np.float64)
        for i, v in bias.items():
            if not 0 <= i < self.offset.size:
                raise InputError(f"--sensor-bias feature {i} is not one of the {self.offset.size} features",
                                 f"use 0 to {self.offset.size - 1}")  # fmt: skip
            self.offset.reshape(-1)[i] = v
        self.noise, self.rng = noise, np.random.default_rng(seed)

    def observation(self, obs: Any) -> Any:
        x = np.asarray(obs, np.float64) + self.offset
        if self.noise:
            x = x + self.rng.normal(0.0, self.noise, x.shape)
        return x.astype(np.asarray(obs).dtype)


def parse_bias(items: list[str]) -> dict[int, float]:
    out = {}
    for item in items:
        i, sep, v = item.partition("=")
        try:
            feature, value = int(i), float(v)
        except ValueError:
            feature, value = -1, float("nan")
        if not sep or feature < 0 or not np.isfinite(value):
            raise InputError(f"--sensor-bias {item!r} is not FEATURE=VALUE", "e.g. --sensor-bias 2=4.0")
        out[feature] = value
    return out


def run(args: argparse.Namespace) -> tuple[LoopResult, dict[str, Any]]:
    threads = "tune" if args.threads is None else args.threads
    policy = load_policy(args.bundle, model=args.model, threads=threads, log_dir=args.log_dir,
                         log_every=args.log_every)  # fmt: skip
    cfg = LoopConfig.plain(args.hz, args.steps) if args.plain else LoopConfig(args.hz, args.steps)
    env = policy.make_env()
    if args.sensor_bias or args.sensor_noise:
        env = SensorFault(env, parse_bias(args.sensor_bias), args.sensor_noise, args.seed)
    try:
        r = run_loop(policy, cfg, env=env, seeds=range(args.seed, args.seed + 10**6))
    finally:
        env.close()
        policy.close()
    info, stats, log = policy.info, policy.stats, policy.log_stats
    facts = {"model": info.model, "runtime": f"{info.runtime} {info.runtime_version}".strip(),
             "threads": info.threads, "first_call_ms": info.first_call_ms, "observations": stats.observations,
             "out_of_range": stats.out_of_range, "out_of_range_features": list(stats.out_of_range_features),
             "log": None if log is None else log.__dict__}  # fmt: skip
    return r, facts


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
    p.add_argument("--plain", action="store_true", help="act, step, sleep: no warm-up, spin or OS settings")
    p.add_argument("--log-dir", default=None, help="record every act() there (field telemetry)")
    p.add_argument("--log-every", type=int, default=1, help="record every N-th act() (with --log-dir)")
    p.add_argument("--sensor-bias", action="append", default=[], metavar="I=V", help="add V to feature I")
    p.add_argument(
        "--sensor-noise", type=float, default=0.0, help="Gaussian noise of this std on each feature"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    try:
        r, facts = run(args)
    except QuarlError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    if args.json:
        print(json.dumps({**r.to_dict(), **facts}))
        return 0
    print(f"{facts['model']} ({facts['runtime']}, {facts['threads']} thread(s)) at {r.hz:g} Hz: {r.steps} steps, "
          f"{len(r.returns)} episodes ended, {facts['out_of_range']} observations outside the calibration range")  # fmt: skip
    print(f"overruns (act + env.step past the next deadline): {r.overruns} of {r.steps}, "
          f"{r.skipped_periods} periods skipped")  # fmt: skip
    print(f"act() latency: p50 {r.act.p50_us:.1f} us, p99 {r.act.p99_us:.1f} us, max {r.act.max_us:.1f} us; "
          f"wake-up lateness p99 {r.lateness.p99_us:.1f} us")  # fmt: skip
    if r.warmup_cost is not None:
        print(f"warm-up: p50 {r.warmup_cost.p50_us:.1f} us, {r.lead_us:.0f} us before each deadline; "
              f"spin {r.spin_us:.0f} us")  # fmt: skip
    for s in r.settings:
        print(f"  {s.name}: {'applied, ' if s.applied else ''}{s.detail}")
    if facts["log"]:
        log = facts["log"]
        print(f"field log {log['dir']}: {log['records']} records in {log['chunks']} chunks"
              + (f"; stopped: {log['failed']}" if log["failed"] else ""))  # fmt: skip
    if r.returns:
        print(f"returns: {', '.join(f'{x:g}' for x in r.returns)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
