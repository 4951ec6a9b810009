"""C policies (issue 31) side by side with the other runtimes, per zoo MLP policy, in one run:

- ``act()`` through the runtime API (load_policy, 1 thread) for c-int8, c-fp32, tflite-int8, tflite-fp32,
  onnx-int8, onnx-fp32, in a torch-free worker process (as on a board), models interleaved per round;
- torch ``predict`` on the fp32 module in this process (SB3-style: one observation in, a no-grad forward,
  numpy out; SB3's own ``model.predict`` too where benchmarks/tune_vs_sb3.py maps the policy: PPO/DQN
  with discrete actions);
- a pure C loop timing ``qe_policy_act`` alone (the trace's observations cycled, compiled with the
  runtime's compiler and flags; the fastest of the rounds);
- sizes: the compiled shared object vs the .tflite / .onnx files.

Ratios: c-int8 act() against the fastest of ONNX Runtime and LiteRT (goal >= 2x), pure C per call
(goal <= 0.5 us for CartPole and Pendulum). Medians over rounds.

    nice .venv/bin/python benchmarks/c_policy.py [--policies a,b] [--work DIR] [--rounds 5] [--samples 2000]
        [--json] [--markdown]

With ``--device NAME`` (e.g. rpi4-emu) the runtime rows come from ``quarl-edge bench`` on that device
(the model call's p50, not act()) and the pure C loop from the emitted example built there
(tests/test_c_emulated.py does the same); an emulated board's numbers are marked emulated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from _timing import per_call_us  # benchmarks/ (this script's folder) is on sys.path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("c-int8", "c-fp32", "tflite-int8", "tflite-fp32", "onnx-int8", "onnx-fp32")
HARNESS = r"""
#define _POSIX_C_SOURCE 199309L
#include "HEADER"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static long long now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }
int main(int argc, char **argv) {
    long rows = atol(argv[2]), calls = atol(argv[3]); int rounds = atoi(argv[4]);
    float *obs = malloc(sizeof(float) * QE_POLICY_OBS_SIZE * rows);
    FILE *f = fopen(argv[1], "rb");
    if (!f || fread(obs, sizeof(float) * QE_POLICY_OBS_SIZE, rows, f) != (size_t)rows) return 2;
    volatile float sink = 0;
#if !QE_POLICY_DISCRETE
    float act[QE_POLICY_ACTION_SIZE];
#endif
    for (int r = 0; r < rounds; ++r) {
        long long t0 = now();
        for (long k = 0; k < calls; ++k) {
            const float *o = obs + (k % rows) * QE_POLICY_OBS_SIZE;
#if QE_POLICY_DISCRETE
            sink += (float)qe_policy_act(o);
#else
            qe_policy_act(o, act); sink += act[0];
#endif
        }
        printf("%.2f\n", (double)(now() - t0) / (double)calls);
    }
    return 0;
}
"""


def zoo_mlps() -> list[str]:
    from quarl_edge.zoo import load_zoo

    return [e.name for e in load_zoo() if e.model == "mlp"]


def export(work: Path, name: str) -> Path:
    from quarl_edge.bundle import BundleRequest, export_bundle
    from quarl_edge.policy.net import load_checkpoint

    out = work / name
    if (out / "manifest.json").is_file():
        return out
    policy = load_checkpoint(ROOT / "quarl_edge/assets/policies" / name)
    export_bundle(
        policy, BundleRequest(out=out, targets=MODELS, calibration=ROOT / "calibration_data" / f"{name}.npz")
    )
    return out


# ---- the torch-free worker ---------------------------------------------------------------------------


def worker(bundle: Path, rounds: int, samples: int) -> dict[str, Any]:
    from quarl_edge.runtimes import load_policy
    from quarl_edge.runtimes.c import read_c, shared_object
    from quarl_edge.runtimes.ccompiler import BASE_FLAGS, find_compiler
    from quarl_edge.runtimes.manifest import load_manifest
    from quarl_edge.runtimes.trace import load_trace

    obs = load_trace(bundle / "trace.npz").obs.astype(np.float32)
    inputs = [np.ascontiguousarray(o) for o in obs[:256]]
    manifest = load_manifest(bundle)
    policies = {
        m: load_policy(bundle, model=m, threads=1)
        for m in MODELS
        if any(e.name == m for e in manifest.models)
    }
    for p in policies.values():
        for x in inputs:
            p.act(x)
    times: dict[str, list[float]] = {m: [] for m in policies}
    for r in range(rounds):
        order = list(policies) if r % 2 == 0 else list(reversed(policies))
        for m in order:
            times[m].append(per_call_us(policies[m].act, inputs, samples))
    out: dict[str, Any] = {
        "act_us": {m: statistics.median(v) for m, v in times.items()},
        "pure_c_ns": {},
        "size": {},
    }
    compiler = find_compiler()
    for m in ("c-int8", "c-fp32"):
        entry = manifest.model(m)
        text, program = read_c(bundle / entry.file)
        so, built = shared_object(text, program)
        out["size"][m] = so.stat().st_size
        out["built_by"] = built
        with tempfile.TemporaryDirectory() as tmp:
            t = Path(tmp)
            (t / "obs.f32").write_bytes(np.ascontiguousarray(obs.reshape(len(obs), -1)).tobytes())
            (t / "h.c").write_text(HARNESS.replace("HEADER", program.header))
            exe = t / "bench"
            flags = built.split()[1:]
            assert compiler is not None
            subprocess.run([*compiler.command, *BASE_FLAGS[:3], *flags, f"-I{bundle}", "-o", str(exe),
                            str(t / "h.c"), str(bundle / entry.file), "-lm"], check=True, capture_output=True)  # fmt: skip
            r = subprocess.run([str(exe), str(t / "obs.f32"), str(len(obs)), "200000", str(max(rounds, 5))],
                               check=True, capture_output=True, text=True)  # fmt: skip
            # the fastest round: a loop of 200,000 calls on a shared machine is only ever slowed down
            out["pure_c_ns"][m] = min(float(x) for x in r.stdout.split())
    for e in manifest.models:
        if e.format != "c":
            out["size"][e.name] = e.size_bytes
    return out


# ---- host side: torch predict, SB3 predict -----------------------------------------------------------


def torch_rows(name: str, bundle: Path, rounds: int, samples: int) -> dict[str, float]:
    import torch

    from quarl_edge.policy.net import load_checkpoint
    from quarl_edge.runtimes.trace import load_trace

    torch.set_num_threads(1)
    obs = load_trace(bundle / "trace.npz").obs.astype(np.float32)
    inputs = [np.ascontiguousarray(o) for o in obs[:256]]
    policy = load_checkpoint(ROOT / "quarl_edge/assets/policies" / name)
    fns: dict[str, Any] = {"torch predict": policy.act}
    try:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from tune_vs_sb3 import sb3_model

        model, _ = sb3_model(ROOT / "quarl_edge/assets/policies" / name)
        fns["SB3 predict"] = lambda o: model.predict(o, deterministic=True)
    except SystemExit:  # not a policy SB3's PPO/DQN classes map
        pass
    out: dict[str, list[float]] = {k: [] for k in fns}
    for f in fns.values():
        for x in inputs[:50]:
            f(x)
    for _ in range(rounds):
        for k, f in fns.items():
            out[k].append(per_call_us(f, inputs, samples))
    return {k: statistics.median(v) for k, v in out.items()}


def run(names: list[str], work: Path, rounds: int, samples: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name in names:
        bundle = export(work, name)
        r = subprocess.run([sys.executable, __file__, "--worker", str(bundle), "--rounds", str(rounds),
                            "--samples", str(samples)], check=True, capture_output=True, text=True)  # fmt: skip
        res = json.loads(r.stdout.strip().splitlines()[-1])
        res["act_us"].update(torch_rows(name, bundle, rounds, samples))
        results[name] = res
        print(f"[{name}] {json.dumps(res['act_us'])}", file=sys.stderr, flush=True)
    return results


def rows(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    head = ["policy", *(f"{m} us" for m in MODELS), "torch us", "SB3 us", "c-int8 vs fastest ORT/LiteRT",
            "pure C int8 ns", "pure C fp32 ns", "c-int8 .so KiB", "c-fp32 .so KiB", "tflite-int8 KiB",
            "onnx-int8 KiB"]  # fmt: skip
    out = []
    for name, r in results.items():
        a = r["act_us"]
        fastest = min(a[m] for m in ("tflite-int8", "tflite-fp32", "onnx-int8", "onnx-fp32") if m in a)
        sb3 = a.get("SB3 predict")
        out.append([name, *(f"{a[m]:.2f}" if m in a else "-" for m in MODELS), f"{a['torch predict']:.1f}",
                    f"{sb3:.1f}" if sb3 else "-", f"{fastest / a['c-int8']:.2f}x",
                    f"{r['pure_c_ns']['c-int8']:.0f}", f"{r['pure_c_ns']['c-fp32']:.0f}",
                    *(f"{r['size'][m] / 1024:.1f}" if m in r["size"] else "-"
                      for m in ("c-int8", "c-fp32", "tflite-int8", "onnx-int8"))])  # fmt: skip
    return head, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policies", default=None, help="comma-separated zoo names (default: every zoo MLP)")
    ap.add_argument("--work", type=Path, default=None, help="keep the bundles here (a rerun reuses them)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/c.md)")
    ap.add_argument("--worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.rounds, args.samples)))
        return
    names = args.policies.split(",") if args.policies else zoo_mlps()
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
        results = run(names, args.work, args.rounds, args.samples)
        (args.work / "c_policy.json").write_text(json.dumps(results, indent=2))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            results = run(names, Path(tmp), args.rounds, args.samples)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    head, body = rows(results)
    if args.markdown:
        print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
        for row in body:
            print("| " + " | ".join(row) + " |")
        return
    from quarl_edge.cli._output import table

    table(
        f"C policies vs the runtimes, act() through load_policy, 1 thread, medians of {args.rounds} rounds",
        head,
        body,
    )


if __name__ == "__main__":
    main()
