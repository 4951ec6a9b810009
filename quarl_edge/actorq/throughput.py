"""Per-actor inference throughput: the broadcast models of each precision timed side by side.

An actor runs its policy one observation at a time on one thread, so that is what is timed: batch 1,
``intra_op_num_threads=1``, the same ONNX Runtime session options as `Actor._pull`. Precisions are timed
in interleaved rounds so machine noise hits each alike; the median round wins. Used by the learner at
the end of a run (inside a live Ray actor: `Actor.benchmark`) and by benchmarks/actorq_inference.py.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np


def session(model: bytes) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def inference_throughput(
    models: dict[str, bytes], obs: np.ndarray, calls: int | None = None, rounds: int = 5
) -> dict[str, Any]:
    """Batch-1 calls per second per precision, and each precision's ratio over fp32 (``int8/fp32``).

    ``calls`` per round defaults to what fills ~50 ms for the slowest model (a 5 us MLP timed over a
    millisecond is all scheduler noise on a loaded machine)."""
    sessions = {p: session(m) for p, m in models.items()}
    name = {p: s.get_inputs()[0].name for p, s in sessions.items()}
    obs = np.ascontiguousarray(obs, dtype=np.float32)
    slowest = 0.0
    for p, s in sessions.items():  # warm-up: first calls allocate
        t = time.perf_counter()
        for r in obs[:10]:
            s.run(None, {name[p]: r.reshape(1, -1)})
        slowest = max(slowest, (time.perf_counter() - t) / 10)
    calls = calls or int(min(max(0.05 / max(slowest, 1e-7), 50), 20_000))
    rows = [obs[i % len(obs)].reshape(1, -1) for i in range(calls)]
    per_round: dict[str, list[float]] = {p: [] for p in sessions}
    for _ in range(rounds):
        for p, s in sessions.items():
            t = time.perf_counter()
            for r in rows:
                s.run(None, {name[p]: r})
            per_round[p].append(calls / (time.perf_counter() - t))
    out: dict[str, Any] = {
        "calls_per_s": {p: statistics.median(v) for p, v in per_round.items()},
        "calls": calls,
    }
    if "fp32" in out["calls_per_s"]:
        base = out["calls_per_s"]["fp32"]
        out["ratio_vs_fp32"] = {f"{p}/fp32": v / base for p, v in out["calls_per_s"].items() if p != "fp32"}
    return out


def actor_throughput(
    handle: Any,
    state_dict: dict[str, Any],
    precision: str,
    calib_obs: np.ndarray | None,
    squash: Any = None,
) -> dict[str, Any]:
    """Time fp32, int8 and the run's ``precision`` of the final weights inside one live Ray actor."""
    import ray

    from quarl_edge.actorq.broadcast import quantize_broadcast

    precisions = dict.fromkeys(("fp32", "int8", precision))
    boxes = {p: [ray.put(quantize_broadcast(state_dict, p, calib_obs, -1, squash))] for p in precisions}
    return ray.get(handle.benchmark.remote(boxes))
