"""Hand-made bench report JSON for the gate's tests: complete and valid unless a test breaks it on purpose
(the gate reads only reports whose every number has its meaning: bench/result.py)."""

from __future__ import annotations

from typing import Any

from quarl_edge.bench.result import EXACT_MATCH, REPORT_FORMAT


def model_json(name: str, precision: str, drop: float | None = 0.5, agreement: float = 0.99,
               p99_us: float = 10.0) -> dict[str, Any]:  # fmt: skip
    """A model of CartPole's shape: 3 paired episodes; ``drop=None``: the reference (no drift, no agreement)."""
    rets = [500.0, 480.0, 490.0]
    return {
        "name": name, "format": "onnx", "precision": precision, "runtime": "onnxruntime 1.32.0", "toolchain": {},
        "threads": 1, "size_bytes": 100, "size_ratio_vs_ref": 1.0, "load_ms": 1.0, "first_inference_ms": 0.1,
        "peak_rss_mb": 50.0,
        "latency": {"count": 100, "p50_us": p99_us / 2, "p90_us": p99_us / 1.5, "p99_us": p99_us, "mean_us": p99_us / 2,
                    "std_us": 0.1, "min_us": p99_us / 4, "max_us": p99_us * 2, "throughput_per_s": 2e5 / p99_us},
        "speedup_p50_vs_ref": 1.0,
        "reward": {"mean": 490.0, "std": 8.2, "episodes": 3, "per_episode": rets, "seeds": [1000, 1001, 1002]},
        "drift": None if drop is None else {"paired_episodes": 3, "abs": -4.9 * drop, "abs_ci95": [-10.0 * drop, 0.0],
                                            "rel": -drop / 100, "rel_ci95": [-0.02 * drop, 0.0], "reward_drop_pct": drop},
        "agreement": None if drop is None else {"metric": EXACT_MATCH, "value": agreement, "samples": 200},
        "warnings": [],
    }  # fmt: skip


def report_json(
    *models: dict[str, Any], reference: str = "onnx-fp32", device: str = "local"
) -> dict[str, Any]:
    return {
        "format": REPORT_FORMAT, "schema_version": 1, "created": "2025-01-01T00:00:00+00:00", "tool_version": "0",
        "bundle": {"path": "bundles/cartpole-ppo", "manifest_sha256": "0" * 64, "policy": "cartpole-ppo",
                   "env": "CartPole-v1", "algo": "ppo"},
        "device": {"name": device, "transport": "local", "emulated": False},
        "settings": {"episodes": 3, "seeds": [1000, 1001, 1002], "threads": 1, "latency_samples": 100, "warmup": 5,
                     "hz": None, "duration_s": None},
        "reference": reference, "models": list(models), "harness": {"transport": "local", "runner_startup_s": {}},
        "resumed": None,
    }  # fmt: skip


NORMAL = report_json(model_json("onnx-fp32", "fp32", None), model_json("onnx-fp16", "fp16"),
                     model_json("onnx-int8", "int8"))  # fmt: skip
