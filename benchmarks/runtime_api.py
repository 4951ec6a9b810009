"""The runtime API's own costs, side by side in one run, on zoo bundles (CartPole MLP, Pendulum MLP,
Pong Nature-CNN; ONNX Runtime and LiteRT int8):

- ``act()`` against the bare model call on the same session (``run_batch``: no checks, no conversion),
  so the input contract's price is a ratio; with ``--baseline-rev REV`` also the ``act()`` of the runtimes
  package as it was at git revision REV (extracted with ``git archive``), for a before/after;
- ``act_batch`` on N observations against N ``act()`` calls, per observation.

Variants are timed in interleaved rounds so machine noise hits each alike; medians over rounds.

    .venv/bin/python benchmarks/runtime_api.py [--rounds 5] [--samples 2000] [--batch 64] [--baseline-rev main] [--json]
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _timing import per_call_us  # benchmarks/ (this script's folder) is on sys.path

from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.cli._output import table
from quarl_edge.policy.net import load_checkpoint
from quarl_edge.runtimes import load_policy
from quarl_edge.runtimes.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
CASES = (  # (zoo policy, model, observations per act(): frames are pushed one at a time)
    ("cartpole-ppo", "onnx-int8"),
    ("cartpole-ppo", "tflite-int8"),
    ("pendulum-sac", "onnx-int8"),
    ("pendulum-sac", "tflite-int8"),
    ("pong-dqn", "onnx-int8"),
)


def export(work: Path, name: str, targets: tuple[str, ...]) -> Path:
    out = work / name
    policy = load_checkpoint(ROOT / "quarl_edge/assets/policies" / name)
    calibration = ROOT / "calibration_data" / f"{name}.npz"
    export_bundle(policy, BundleRequest(out=out, targets=targets, calibration=calibration))
    return out


def baseline_load_policy(rev: str, work: Path) -> Callable[..., Any]:
    """``load_policy`` of the runtimes package at git revision ``rev``, importable beside today's."""
    data = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "runtimes"], check=True, capture_output=True
    ).stdout
    pkg = work / "baseline_src"
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(pkg, filter="data")
    (pkg / "runtimes").rename(pkg / "baseline_runtimes")
    sys.path.insert(0, str(pkg))
    # load_policy lives in runtimes/load.py since the logging policy; in runtimes/policy.py before
    home = "load" if (pkg / "baseline_runtimes" / "load.py").is_file() else "policy"
    return importlib.import_module(f"baseline_runtimes.{home}").load_policy  # type: ignore[no-any-return]


def measure(
    bundle: Path, model: str, rounds: int, samples: int, batch: int, old: Callable[..., Any] | None
) -> dict[str, float]:
    trace = load_trace(bundle / "trace.npz").obs
    p = load_policy(bundle, model=model, threads=1)
    frames = p.info.frame_stack > 1
    # act() takes the env's observation: a frame-stacked policy gets the newest frame of each stacked one
    obs = [o[-1] if frames else o for o in trace[:256]]
    inputs = [np.ascontiguousarray(o[None]) for o in trace[:256]]
    rows = np.ascontiguousarray(trace[:batch])
    q = old(bundle, model=model, threads=1) if old else None
    variants: dict[str, Callable[[], float]] = {
        "bare model call": lambda: per_call_us(p.run_batch, inputs, samples),
        "act()": lambda: per_call_us(p.act, obs, samples),
        "act_batch per obs": lambda: per_call_us(p.act_batch, [rows], max(samples // batch, 20)) / batch,
        "act_on_input loop per obs": lambda: (
            per_call_us(lambda r: [p.act_on_input(x) for x in r], [rows], max(samples // batch, 20)) / batch
        ),  # fmt: skip
    }
    if q is not None:
        variants["act() at baseline"] = lambda: per_call_us(q.act, obs, samples)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for k, f in variants.items():
            times[k].append(f())
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--baseline-rev", default=None, help="git revision whose act() to time beside today's")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        old = baseline_load_policy(args.baseline_rev, work) if args.baseline_rev else None
        bundles = {n: export(work, n, tuple(sorted({m for b, m in CASES if b == n}))) for n in dict(CASES)}
        results = {
            f"{b} {m}": measure(bundles[b], m, args.rounds, args.samples, args.batch, old) for b, m in CASES
        }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    head = ["model", "bare us", "act() us", "act/bare"]
    head += ["act() at baseline us", "act/baseline"] if old else []
    head += [f"act_batch({args.batch}) us/obs", "act_on_input loop us/obs", "loop/batch"]
    rows = []
    for name, r in results.items():
        row = [
            name,
            f"{r['bare model call']:.1f}",
            f"{r['act()']:.1f}",
            f"{r['act()'] / r['bare model call']:.2f}x",
        ]
        if old:
            row += [f"{r['act() at baseline']:.1f}", f"{r['act()'] / r['act() at baseline']:.2f}x"]
        row += [f"{r['act_batch per obs']:.2f}", f"{r['act_on_input loop per obs']:.1f}",
                f"{r['act_on_input loop per obs'] / r['act_batch per obs']:.1f}x"]  # fmt: skip
        rows.append(row)
    title = (f"runtime API, 1 thread, medians of {args.rounds} interleaved rounds; act_batch vs the same "
             f"{args.batch} observations, one act_on_input() call each (frames: stacked rows)")  # fmt: skip
    table(title, head, rows)


if __name__ == "__main__":
    main()
