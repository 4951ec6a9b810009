"""Per-actor inference throughput of ActorQ's broadcast models, every runtime x precision side by side in
one run: CartPole's Q-network at the default size (4-120-84-2) and the paper's large policy (4-2048x3-2),
Pendulum's D4PG actor (3-256-256-1), and the DM Control D4PG actors at Acme's policy size (256x3) for
the dmc suite's tasks. One thread, batch 1, opened exactly as an actor opens it; all models of a case
are timed in interleaved rounds; prints calls/s, the ratio over ONNX Runtime fp32 and over the fastest
fp32, the payload size, and which runtime `--actor-runtime auto` would pick per precision.

    .venv/bin/python benchmarks/actorq_inference.py [--calls N] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from quarl_edge.actorq.broadcast import PRECISIONS, quantize_broadcast
from quarl_edge.actorq.d4pg import Actor
from quarl_edge.actorq.dqn import QNetwork
from quarl_edge.actorq.sessions import available_runtimes
from quarl_edge.actorq.throughput import inference_throughput
from quarl_edge.cli._output import table

ACME = (256, 256, 256)
CASES = {  # name: (observation size, hidden widths, action dimensions; None = a 2-action Q-network)
    "CartPole DQN 120,84": (4, (120, 84), None),
    "CartPole DQN 2048x3": (4, (2048, 2048, 2048), None),
    "Pendulum D4PG actor 256,256": (3, (256, 256), 1),
    "DMC cartpole-balance actor 256x3": (5, ACME, 1),
    "DMC walker-stand actor 256x3": (24, ACME, 6),
    "DMC cheetah-run actor 256x3": (17, ACME, 6),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=None, help="per round (default: ~50 ms)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    obs_rng = np.random.default_rng(0)
    runtimes = available_runtimes()
    results = {}
    for name, (n_obs, hidden, n_act) in CASES.items():
        obs = obs_rng.standard_normal((256, n_obs)).astype(np.float32)
        if n_act is None:
            state, squash = QNetwork(n_obs, 2, hidden).state_dict(), None
        else:
            actor = Actor(n_obs, np.full(n_act, -1.0, np.float32), np.full(n_act, 1.0, np.float32), hidden)
            state, squash = actor.mlp_state(), actor.squash()
        payloads = {
            f"{r}/{p}": quantize_broadcast(state, p, obs, 0, squash, r) for r in runtimes for p in PRECISIONS
        }
        tp = inference_throughput({k: m.model for k, m in payloads.items()}, obs, a.calls, a.rounds,
                                  runtimes={k: m.runtime for k, m in payloads.items()})  # fmt: skip
        calls = dict(tp.calls_per_s)
        best_fp32 = max(calls[f"{r}/fp32"] for r in runtimes)
        results[name] = {
            "calls_per_s": calls,
            "vs_onnx_fp32": {k: v / calls["onnx/fp32"] for k, v in calls.items()}
            if "onnx" in runtimes
            else {},
            "vs_fastest_fp32": {k: v / best_fp32 for k, v in calls.items()},
            "auto_picks": {p: max(runtimes, key=lambda r, p=p: calls[f"{r}/{p}"]) for p in PRECISIONS},
            "payload_bytes": {k: m.nbytes for k, m in payloads.items()},
        }
    if a.json:
        print(json.dumps(results, indent=2))
        return
    rows = []
    for name, res in results.items():
        for key, v in res["calls_per_s"].items():
            runtime, precision = key.split("/")
            pick = "auto" if res["auto_picks"][precision] == runtime else ""
            rows.append([name, runtime, precision, f"{v:,.0f}", f"{res['vs_onnx_fp32'].get(key, 0):.2f}x",
                         f"{res['vs_fastest_fp32'][key]:.2f}x", f"{res['payload_bytes'][key] / 1e3:,.1f} kB", pick])  # fmt: skip
    table(
        "ActorQ per-actor inference (1 thread, batch 1)",
        ("policy", "runtime", "precision", "calls/s", "vs ORT fp32", "vs fastest fp32", "payload", "auto"),
        rows,
    )


if __name__ == "__main__":
    main()
