"""Per-actor inference throughput of ActorQ's broadcast models, fp32 vs fp16 vs int8, side by side in one
run: CartPole's Q-network at the default size (4-120-84-2) and the paper's large policy (4-2048x3-2), and
Pendulum's D4PG actor (3-256-256-1, tanh-scaled). One thread, batch 1, exactly as an actor runs it;
precisions are timed in interleaved rounds; prints calls/s, the ratio over fp32 and the payload size.

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
from quarl_edge.actorq.throughput import inference_throughput
from quarl_edge.cli._output import table

CASES = {
    "CartPole DQN 120,84": (4, (120, 84), None),
    "CartPole DQN 2048x3": (4, (2048, 2048, 2048), None),
    "Pendulum D4PG actor 256,256": (3, (256, 256), 1),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=None, help="per round (default: ~50 ms)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    obs_rng = np.random.default_rng(0)
    results = {}
    for name, (n_obs, hidden, n_act) in CASES.items():
        obs = obs_rng.standard_normal((256, n_obs)).astype(np.float32)
        if n_act is None:
            state, squash = QNetwork(n_obs, 2, hidden).state_dict(), None
        else:
            actor = Actor(n_obs, np.full(n_act, -2.0, np.float32), np.full(n_act, 2.0, np.float32), hidden)
            state, squash = actor.mlp_state(), actor.squash()
        payloads = {p: quantize_broadcast(state, p, obs, 0, squash) for p in PRECISIONS}
        tp = inference_throughput({p: m.model for p, m in payloads.items()}, obs, a.calls, a.rounds)
        tp["payload_bytes"] = {p: m.nbytes for p, m in payloads.items()}
        results[name] = tp
    if a.json:
        print(json.dumps(results, indent=2))
        return
    rows = []
    for name, tp in results.items():
        for p in PRECISIONS:
            ratio = tp["ratio_vs_fp32"].get(f"{p}/fp32", 1.0)
            rows.append([name, p, f"{tp['calls_per_s'][p]:,.0f}", f"{ratio:.2f}x",
                         f"{tp['payload_bytes'][p] / 1e3:,.1f} kB"])  # fmt: skip
    table(
        "ActorQ per-actor inference (1 thread, batch 1)",
        ("policy", "precision", "calls/s", "vs fp32", "payload"),
        rows,
    )


if __name__ == "__main__":
    main()
