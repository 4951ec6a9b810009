"""{ONNX Runtime, LiteRT} x {fp32, int8} latency at 1 thread, side by side in one run, for the CartPole
MLP and a Pong-shaped Nature-CNN (4x84x84 uint8). Models are timed in interleaved rounds so machine noise
hits every variant alike; the table reports medians over rounds, the fp32/int8 ratio per runtime and
each model against ONNX Runtime at the same precision. Needs the tflite extra.

    .venv/bin/python benchmarks/latency.py [--rounds 5] [--samples 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.cli._output import table
from quarl_edge.policy.net import NetArch, build_policy, load_checkpoint
from quarl_edge.policy.sb3 import base_spec
from quarl_edge.record import RecordConfig, record
from quarl_edge.runtimes.runner import PolicyRunner
from quarl_edge.runtimes.trace import load_trace, save_trace

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("onnx-fp32", "onnx-int8", "tflite-fp32", "tflite-int8")
FORMATS = {"onnx": "ONNX Runtime", "tflite": "LiteRT"}


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


def summarize(r: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per format: fp32/int8 p50 and size, int8 speedup, and p50 ratios against ONNX Runtime."""
    out = {}
    for fmt in FORMATS:
        f32, i8 = r[f"{fmt}-fp32"], r[f"{fmt}-int8"]
        out[fmt] = {
            "fp32_p50_us": f32["p50_us"],
            "int8_p50_us": i8["p50_us"],
            "speedup_int8_vs_fp32": f32["p50_us"] / i8["p50_us"],
            "fp32_speedup_vs_onnx": r["onnx-fp32"]["p50_us"] / f32["p50_us"],
            "int8_speedup_vs_onnx": r["onnx-int8"]["p50_us"] / i8["p50_us"],
            "fp32_size_bytes": f32["size_bytes"],
            "int8_size_bytes": i8["size_bytes"],
            "size_ratio_fp32_vs_int8": f32["size_bytes"] / i8["size_bytes"],
        }
    return out


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
    summary = {name: {"models": r, **summarize(r)} for name, r in results.items()}
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    rows = [
        [name, FORMATS[fmt], f"{s[fmt]['fp32_p50_us']:.1f}", f"{s[fmt]['int8_p50_us']:.1f}",
         f"{s[fmt]['speedup_int8_vs_fp32']:.2f}x", f"{s[fmt]['fp32_speedup_vs_onnx']:.2f}x",
         f"{s[fmt]['int8_speedup_vs_onnx']:.2f}x", f"{s[fmt]['fp32_size_bytes'] / 1024:.0f} KiB",
         f"{s[fmt]['int8_size_bytes'] / 1024:.0f} KiB", f"{s[fmt]['size_ratio_fp32_vs_int8']:.2f}x"]
        for name, s in summary.items()
        for fmt in FORMATS
    ]  # fmt: skip
    table(
        f"1 thread, median p50 of {args.rounds} interleaved rounds x {args.samples} single inferences",
        ["policy", "runtime", "fp32 p50 us", "int8 p50 us", "int8 speedup", "fp32 vs ORT", "int8 vs ORT",
         "fp32 size", "int8 size", "size ratio"],
        rows,
    )  # fmt: skip


if __name__ == "__main__":
    main()
