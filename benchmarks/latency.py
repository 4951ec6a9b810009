"""fp32 vs int8 ONNX latency at 1 thread, side by side in one run, for the CartPole MLP and a
Pong-shaped Nature-CNN (4x84x84 uint8). Models are timed in interleaved rounds so machine noise hits
every variant alike; the table reports medians over rounds and the fp32/int8 ratio.

    .venv/bin/python benchmarks/latency.py [--rounds 5] [--samples 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from quarl_edge.export import BundleRequest, export_bundle
from quarl_edge.output import table
from quarl_edge.policies import NetArch, build_policy, load_checkpoint
from quarl_edge.record import RecordConfig, record
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.trace import load_trace, save_trace
from quarl_edge.sb3 import base_spec

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("onnx-fp32", "onnx-int8")


def pong_cnn_bundle(work: Path) -> Path:
    torch.manual_seed(0)
    spec = base_spec("ALE/Pong-v5", "dqn", name="pong-nature-cnn", source="benchmark (random init)")
    arch = NetArch(
        model="nature_cnn", hidden=(), activation="relu", out_dim=6, head="argmax", scale_uint8=True
    )
    policy = build_policy(spec, arch)
    calib = record(policy, RecordConfig(episodes=1, epsilon=1.0, max_samples=300))
    save_trace(calib, work / "pong.npz")
    out = work / "pong-cnn"
    export_bundle(policy, BundleRequest(out=out, targets=MODELS, calibration=work / "pong.npz"))
    return out


def cartpole_bundle(work: Path) -> Path:
    policy = load_checkpoint(ROOT / "quarl_edge/assets/policies/cartpole-ppo")
    out = work / "cartpole-mlp"
    export_bundle(
        policy, BundleRequest(out=out, targets=MODELS, calibration=ROOT / "calibration_data/cartpole-ppo.npz")
    )
    return out


def measure(bundle: Path, rounds: int, samples: int) -> dict[str, dict[str, float]]:
    runners = {m: PolicyRunner(bundle, m, threads=1) for m in MODELS}
    obs = load_trace(bundle / "trace.npz").obs
    p50s: dict[str, list[float]] = {m: [] for m in MODELS}
    means: dict[str, list[float]] = {m: [] for m in MODELS}
    for _ in range(rounds):
        for m, r in runners.items():
            st = r.latency(obs, samples=samples, warmup=50)
            p50s[m].append(st.p50_us)
            means[m].append(st.mean_us)
    size = {m: runners[m].entry.size_bytes for m in MODELS}
    return {
        m: {
            "p50_us": statistics.median(p50s[m]),
            "mean_us": statistics.median(means[m]),
            "size_bytes": size[m],
        }
        for m in MODELS
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        results = {
            "CartPole MLP (4-64-64-2)": measure(cartpole_bundle(work), args.rounds, args.samples),
            "Pong Nature-CNN (4x84x84 uint8)": measure(pong_cnn_bundle(work), args.rounds, args.samples),
        }
    summary = {
        name: {**r, "speedup_int8_vs_fp32": r["onnx-fp32"]["p50_us"] / r["onnx-int8"]["p50_us"],
               "size_ratio_fp32_vs_int8": r["onnx-fp32"]["size_bytes"] / r["onnx-int8"]["size_bytes"]}
        for name, r in results.items()
    }  # fmt: skip
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    rows = [
        [name, f"{s['onnx-fp32']['p50_us']:.1f}", f"{s['onnx-int8']['p50_us']:.1f}", f"{s['speedup_int8_vs_fp32']:.2f}x",
         f"{s['onnx-fp32']['size_bytes'] / 1024:.0f} KiB", f"{s['onnx-int8']['size_bytes'] / 1024:.0f} KiB",
         f"{s['size_ratio_fp32_vs_int8']:.2f}x"]
        for name, s in summary.items()
    ]  # fmt: skip
    table(
        f"ONNX Runtime, 1 thread, median p50 of {args.rounds} interleaved rounds x {args.samples} inferences",
        ["policy", "fp32 p50 us", "int8 p50 us", "int8 speedup", "fp32 size", "int8 size", "size ratio"],
        rows,
    )


if __name__ == "__main__":
    main()
