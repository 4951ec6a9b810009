"""In-loop act() latency before and after the loop runner, side by side in one run, with ratios.

    python benchmarks/loop_latency.py --bundle bundles/cartpole-ppo:onnx-int8 --bundle bundles/pong-dqn:onnx-int8
    python benchmarks/loop_latency.py ... --device rpi4-emu    # the same on a board over SSH (emulated: marked)

Per model: act() in a tight loop (back to back: the bench's figure), then at each --hz rate the loop most
control scripts are ("before": act, then sleep to the deadline; LoopConfig.plain) and the loop runner
("after": warm-up a lead before each deadline, a spin to it, affinity / SCHED_FIFO / mlockall / frozen GC
where permitted; LoopConfig defaults), each for --seconds on the bundle's recorded observations (a
callback loop: read the next observation, act, write nowhere). Rounds interleave the three (--rounds;
medians over rounds). The goal (issue 32): in-loop p50 <= 1.5x and p99 <= 3x the tight-loop p50.

Device side: the measuring part imports the runtime API only. With --device, the runtime-only wheel of this
checkout, the bundles' files and this script go to a scratch folder on the board (the board's own venv is
not changed) and the script runs there with the profile's python.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

SCRATCH = ".cache/quarl-edge-loop-bench"


def _obs(bundle: Path, policy: Any) -> np.ndarray:
    from quarl_edge.runtimes.trace import load_trace

    obs = load_trace(bundle / "trace.npz").obs
    stack = len(policy.model_input_shape) - len(policy.observation_shape)
    return obs[(slice(None),) + (-1,) * stack] if stack else obs  # the env's observation: the newest frame


def _tight(policy: Any, obs: np.ndarray, n: int) -> np.ndarray:
    clock, act, out = time.perf_counter_ns, policy.act, np.empty(n, np.int64)
    for i in range(n):
        o = obs[i % len(obs)]
        t0 = clock()
        act(o)
        out[i] = clock() - t0
    return out / 1e3


def _loop(policy: Any, obs: np.ndarray, cfg: Any) -> Any:
    from quarl_edge.runtimes.loop import run_loop

    it = iter(range(10**9))
    return run_loop(policy, cfg, read_obs=lambda: obs[next(it) % len(obs)], write_action=lambda a: None)


def measure(spec: str, rates: list[float], seconds: float, rounds: int, samples: int) -> list[dict[str, Any]]:
    from quarl_edge.runtimes import load_policy
    from quarl_edge.runtimes.facts import is_emulated
    from quarl_edge.runtimes.loop import LoopConfig

    bundle, _, model = spec.rpartition(":")
    policy = load_policy(bundle, model=model or None)
    obs = _obs(Path(bundle), policy)
    _tight(policy, obs, samples)  # the first pass pays for caches the rounds should not
    rows = []
    for hz in rates:
        steps = max(50, int(hz * seconds))
        got: dict[str, list[float]] = {
            k: [] for k in ("tight50", "tight99", "b50", "b99", "a50", "a99", "bo", "ao")
        }
        settings: list[str] = []
        for _ in range(rounds):
            t = _tight(policy, obs, samples)
            got["tight50"].append(float(np.percentile(t, 50)))
            got["tight99"].append(float(np.percentile(t, 99)))
            before = _loop(policy, obs, LoopConfig.plain(hz, steps))
            after = _loop(policy, obs, LoopConfig(hz, steps))
            got["b50"].append(before.act.p50_us), got["b99"].append(before.act.p99_us)
            got["a50"].append(after.act.p50_us), got["a99"].append(after.act.p99_us)
            got["bo"].append(before.overruns), got["ao"].append(after.overruns)
            settings = [s.name for s in after.settings if s.applied]
            lead, warm = after.lead_us, after.warmup_cost.p50_us if after.warmup_cost else 0.0
        m = {k: statistics.median(v) for k, v in got.items()}
        rows.append({"bundle": Path(bundle).name, "model": policy.info.model, "hz": hz, "steps": steps,
                     "rounds": rounds, "emulated": is_emulated(), "tight_p50_us": m["tight50"],
                     "tight_p99_us": m["tight99"], "before_p50_us": m["b50"], "before_p99_us": m["b99"],
                     "after_p50_us": m["a50"], "after_p99_us": m["a99"], "before_overruns": m["bo"],
                     "after_overruns": m["ao"], "lead_us": lead, "warmup_p50_us": warm, "settings": settings})  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]], where: str) -> str:
    head = ("| model | rate | tight p50 | before p50 / p99 | after p50 / p99 | before p50 / tight | "
            "after p50 / tight | after p99 / tight p50 | overruns before / after |")  # fmt: skip
    lines = [f"{where}:", "", head, "|" + "---|" * 9]
    for r in rows:
        t = r["tight_p50_us"]
        lines.append(f"| {r['bundle']} {r['model']} | {r['hz']:g} Hz | {t:.1f} us | {r['before_p50_us']:.1f} / "
                     f"{r['before_p99_us']:.1f} us | {r['after_p50_us']:.1f} / {r['after_p99_us']:.1f} us | "
                     f"{r['before_p50_us'] / t:.2f}x | {r['after_p50_us'] / t:.2f}x | {r['after_p99_us'] / t:.2f}x | "
                     f"{r['before_overruns']:g} / {r['after_overruns']:g} |")  # fmt: skip
    return "\n".join(lines)


def on_device(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run this script on ``args.device`` over SSH (a scratch folder there; the board's venv untouched)."""
    from quarl_edge.devices.profiles import load_profile, remote_path
    from quarl_edge.devices.runtime_wheel import build_runtime_wheel
    from quarl_edge.devices.ssh import SSHConnection, sh
    from quarl_edge.runtimes.manifest import load_manifest

    profile = load_profile(args.device)
    wheel = build_runtime_wheel()
    with SSHConnection(profile) as ssh:

        def put(data: bytes, rel: str) -> str:
            path = f"{SCRATCH}/{rel}"
            ssh.run(
                sh("mkdir", "-p", str(Path(path).parent)) + " && " + sh("cat") + " > " + sh(path), stdin=data
            )
            return path

        whl = put(wheel.data, wheel.name)
        specs = []
        for spec in args.bundle:
            bundle, _, model = spec.rpartition(":")
            m = load_manifest(bundle, verify=False)
            entry = m.model(model) if model else m.models[0]
            for f in ("manifest.json", "trace.npz", entry.file):
                put((Path(bundle) / f).read_bytes(), f"{Path(bundle).name}/{f}")
            specs.append(f"{SCRATCH}/{Path(bundle).name}:{entry.name}")
        script = put(Path(__file__).read_bytes(), "loop_latency.py")
        python = remote_path(profile.python) if "/" in profile.python else profile.python
        cmd = ("PYTHONPATH=" + sh(whl) + " " + sh(python, script, *(a for s in specs for a in ("--bundle", s)),
               "--hz", args.hz, "--seconds", str(args.seconds), "--rounds", str(args.rounds),
               "--samples", str(args.samples), "--json"))  # fmt: skip
        r = ssh.run(cmd, timeout=3600)
    if r.exit_status != 0:
        sys.exit(f"on {args.device}: {r.stderr.strip()[-2000:]}")
    return list(json.loads(r.stdout.splitlines()[-1]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bundle", action="append", required=True, help="BUNDLE:MODEL (repeat for several)")
    p.add_argument("--hz", default="50,1000", help="control rates, comma-separated")
    p.add_argument("--seconds", type=float, default=6.0, help="per loop and rate")
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds (medians reported)")
    p.add_argument("--samples", type=int, default=2000, help="tight-loop act() calls per round")
    p.add_argument("--device", default=None, help="run on this SSH board instead (e.g. rpi4-emu)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args()
    if args.device:
        rows = on_device(args)
    else:
        rows = [r for spec in args.bundle for r in measure(spec, [float(h) for h in args.hz.split(",")],
                                                           args.seconds, args.rounds, args.samples)]  # fmt: skip
    if args.json:
        print(json.dumps(rows))
        return 0
    where = args.device or "this machine"
    if rows and rows[0]["emulated"]:
        where += " (EMULATED: qemu's latency, not a board's)"
    print(table(rows, where))
    print("\nOS settings applied in the 'after' loop: " + ", ".join(rows[0]["settings"]) if rows else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
