"""What field telemetry adds to act(): the same model loaded twice, without and with ``log_dir`` (every call
recorded), timed in interleaved rounds in one run; medians over rounds of each round's p50 and mean.

    python benchmarks/telemetry_overhead.py --bundle bundles/cartpole-ppo:onnx-int8 --bundle bundles/pong-dqn:onnx-int8

Two settings: act() back to back (a tight loop: the logger's thread writes a chunk every few ms beside it,
the worst case) and act() in the loop runner at --hz (the control loop telemetry is for: chunks are
written while the loop waits for its deadline). The logged act() pays for its own timing, the flags and a
copy of the model input into the open chunk; the chunk's write happens in the logger's thread.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.loop import LoopConfig, run_loop
from quarl_edge.runtimes.trace import load_trace


def timed(policy: object, obs: np.ndarray, n: int) -> np.ndarray:
    clock, act, out = time.perf_counter_ns, policy.act, np.empty(n, np.int64)  # type: ignore[attr-defined]
    for i in range(n):
        o = obs[i % len(obs)]
        t0 = clock()
        act(o)
        out[i] = clock() - t0
    return out / 1e3


def in_loop(policy: object, obs: np.ndarray, hz: float, n: int) -> np.ndarray:
    it = iter(range(10**9))
    r = run_loop(
        policy, LoopConfig(hz, n), read_obs=lambda: obs[next(it) % len(obs)], write_action=lambda a: None
    )  # type: ignore[arg-type]
    assert r.trace is not None
    return r.trace.act_ns / 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", action="append", required=True, help="BUNDLE:MODEL (repeat for several)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--samples", type=int, default=3000, help="act() calls per round and variant (tight)")
    p.add_argument("--hz", type=float, default=200.0, help="the loop runner's rate")
    p.add_argument("--steps", type=int, default=400, help="loop steps per round and variant")
    args = p.parse_args()
    print(
        "| model | where | act() p50 | logged p50 | added p50 | ratio | act() mean | logged mean | added mean | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for spec in args.bundle:
        bundle, _, model = spec.rpartition(":")
        with tempfile.TemporaryDirectory() as tmp:
            plain = load_policy(bundle, model=model)
            logged = load_policy(bundle, model=model, log_dir=Path(tmp) / "log")
            obs = load_trace(Path(bundle) / "trace.npz").obs
            stack = len(plain.model_input_shape) - len(plain.observation_shape)
            obs = obs[(slice(None),) + (-1,) * stack] if stack else obs
            rows: dict[str, list[float]] = {}
            for _ in range(args.rounds):
                for where in ("tight", f"loop {args.hz:g} Hz"):
                    if where == "tight":
                        a, b = timed(plain, obs, args.samples), timed(logged, obs, args.samples)
                    else:
                        a, b = (
                            in_loop(plain, obs, args.hz, args.steps),
                            in_loop(logged, obs, args.hz, args.steps),
                        )
                    for key, v in (("p50", np.percentile(a, 50)), ("lp50", np.percentile(b, 50)), ("mean", a.mean()),
                                   ("lmean", b.mean())):  # fmt: skip
                        rows.setdefault(f"{where}|{key}", []).append(float(v))
            logged.close()
            stats = logged.log_stats
        for where in dict.fromkeys(k.split("|")[0] for k in rows):
            m = {k.split("|")[1]: statistics.median(v) for k, v in rows.items() if k.startswith(where + "|")}
            print(f"| {Path(bundle).name} {plain.info.model} | {where} | {m['p50']:.1f} us | {m['lp50']:.1f} us | "
                  f"{m['lp50'] - m['p50']:+.1f} us | {m['lp50'] / m['p50']:.2f}x | {m['mean']:.1f} us | "
                  f"{m['lmean']:.1f} us | {m['lmean'] - m['mean']:+.1f} us | {m['lmean'] / m['mean']:.2f}x |")  # fmt: skip
        if stats is not None:
            print(
                f"  ({stats.records} records in {stats.chunks} chunks, {stats.dropped} dropped)",
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
