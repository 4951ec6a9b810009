"""Per-actor inference throughput: the broadcast models of each precision timed side by side.

An actor runs its policy one observation at a time on one thread, so that is what is timed: batch 1,
one thread, opened exactly as `Actor._pull` opens it (sessions.open_model). Models are timed in
interleaved rounds so machine noise hits each alike; the median round wins. Used by the learner at the
start of a run to pick the actors' runtime (``--actor-runtime auto``) and at its end (both inside a live
Ray actor: `Actor.benchmark`), and by benchmarks/actorq_inference.py.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any

import numpy as np

from quarl_edge.actorq.broadcast import StateDict, quantize_broadcast
from quarl_edge.actorq.result import RuntimeChoice, Throughput
from quarl_edge.actorq.sessions import available_runtimes, open_model


def inference_throughput(
    models: dict[str, bytes],
    obs: np.ndarray,
    calls: int | None = None,
    rounds: int = 5,
    runtimes: dict[str, str] | None = None,
) -> Throughput:
    """Batch-1 calls per second per model, and each model's ratio over the one labelled ``fp32``
    (``int8/fp32``). ``runtimes`` maps a label to its runtime (default: onnx for every model).

    ``calls`` per round defaults to what fills ~50 ms for the slowest model (a 5 us MLP timed over a
    millisecond is all scheduler noise on a loaded machine)."""
    runners = {p: open_model((runtimes or {}).get(p, "onnx"), m) for p, m in models.items()}
    obs = np.ascontiguousarray(obs, dtype=np.float32)
    slowest = 0.0
    for run in runners.values():  # warm-up: first calls allocate
        t = time.perf_counter()
        for r in obs[:10]:
            run(np.ascontiguousarray(r.reshape(1, -1)))
        slowest = max(slowest, (time.perf_counter() - t) / 10)
    calls = calls or int(min(max(0.05 / max(slowest, 1e-7), 50), 20_000))
    rows = [np.ascontiguousarray(obs[i % len(obs)].reshape(1, -1)) for i in range(calls)]
    per_round: dict[str, list[float]] = {p: [] for p in runners}
    for _ in range(rounds):
        for p, run in runners.items():
            t = time.perf_counter()
            for r in rows:
                run(r)
            per_round[p].append(calls / (time.perf_counter() - t))
    calls_per_s = {p: statistics.median(v) for p, v in per_round.items()}
    base = calls_per_s.get("fp32")
    ratios = {f"{p}/fp32": v / base for p, v in calls_per_s.items() if p != "fp32"} if base else {}
    return Throughput(calls_per_s=calls_per_s, calls=calls, ratio_vs_fp32=ratios)


def actor_throughput(
    handle: Any,
    state_dict: StateDict,
    precision: str,
    calib_obs: np.ndarray | None,
    squash: Any = None,
    runtime: str = "onnx",
) -> Throughput:
    """Time fp32, int8 and the run's ``precision`` of the final weights on the run's ``runtime`` inside
    one live Ray actor."""
    variants = {p: (p, runtime) for p in dict.fromkeys(("fp32", "int8", precision))}
    return replace(_in_actor(handle, variants, state_dict, calib_obs, squash), runtime=runtime)


def _in_actor(handle: Any, variants: dict[str, tuple[str, str]], state_dict: StateDict,
              calib_obs: np.ndarray | None, squash: Any) -> Throughput:  # fmt: skip
    """Each labelled (precision, runtime) payload of the weights, timed side by side in a live Ray actor."""
    import ray

    boxes = {label: [ray.put(quantize_broadcast(state_dict, p, calib_obs, -1, squash, r))]
             for label, (p, r) in variants.items()}  # fmt: skip
    return ray.get(handle.benchmark.remote(boxes))


def choose_runtime(
    handle: Any,
    state_dict: StateDict,
    precision: str,
    calib_obs: np.ndarray | None,
    squash: Any = None,
) -> RuntimeChoice:
    """``--actor-runtime auto``: the payload at ``precision`` on every installed runtime, timed side by side
    inside one live Ray actor; the fastest is ``chosen``."""
    runtimes = available_runtimes()
    if len(runtimes) == 1:
        return RuntimeChoice(runtimes[0], {}, "the only actor runtime installed")
    variants = {r: (precision, r) for r in runtimes}
    measured = dict(_in_actor(handle, variants, state_dict, calib_obs, squash).calls_per_s)
    chosen = max(measured, key=lambda r: measured[r])
    return RuntimeChoice(chosen, measured, f"fastest {precision} actor measured at the start")
