"""tune's choice vs Stable-Baselines3 `model.predict` vs ONNX fp32, per-call latency side by side in one run,
for three zoo policies: CartPole PPO (MLP 64-64 tanh), LunarLander DQN (MLP 256-256 relu) and Pong DQN
(Nature-CNN on 4x84x84 uint8).

For each policy: `quarl-edge tune` on the local device (or an earlier tune folder, `--tuned NAME=DIR`); an
SB3 PPO / DQN of the same architecture holding our fp32 weights (the inverse of policy/sb3.py's import
mapping), checked against the ONNX fp32 model on the recorded trace states; then single-observation calls
from the trace at 1 thread in interleaved rounds: SB3 `model.predict(obs, deterministic=True)` in this
process (torch at 1 thread), ONNX fp32 and tune's choice (at the threads tune chose) through PolicyRunner
in a torch-free worker process, as on the board. The table reports medians over rounds.

    nice .venv/bin/python benchmarks/tune_vs_sb3.py [--work DIR] [--tuned NAME=DIR ...] [--rounds 5]
        [--samples 1000] [--json]

With --work the tune folders stay in WORK/NAME (a rerun reuses every measurement of tune's cache) and the
results are also written to WORK/tune_vs_sb3.json (with p99s and each round's p50).

This file is also that worker (`--worker`): only numpy and quarl_edge.runtimes are imported at the top,
torch, SB3 and the tune search inside the host-side functions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quarl_edge.runtimes.fsutil import atomic_write_json
from quarl_edge.runtimes.runner import LatencyStats, PolicyRunner
from quarl_edge.runtimes.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
POLICIES = ("cartpole-ppo", "lunarlander-dqn", "pong-dqn")
REFERENCE = "onnx-fp32"
WARMUP = 50
TIMED_OBS = 256  # the observations cycled through, as PolicyRunner.latency does


def timing_batches(obs: np.ndarray) -> list[np.ndarray]:
    return [np.ascontiguousarray(obs[i : i + 1]) for i in range(min(obs.shape[0], TIMED_OBS))]


# ---- the torch-free worker: ONNX fp32 and tune's choice through PolicyRunner --------------------------


def worker(bundle: Path, trace_path: Path, models: list[str]) -> None:
    """Load each ``MODEL@THREADS`` of ``bundle``; answer ``replay`` with the reference's actions on the
    trace and ``round N`` with each model's latency over N calls (order alternating per round)."""
    runners = {m: PolicyRunner(bundle, m.split("@")[0], threads=int(m.split("@")[1])) for m in models}
    trace = load_trace(trace_path)
    # ORT in a process that has torch loaded runs ~25% slower here, and the board has no torch
    assert "torch" not in sys.modules, "the timing worker imported torch"
    print(json.dumps({"ready": True}), flush=True)
    rounds = 0
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "replay":
            actions = runners[models[0]].replay(trace).actions
            print(json.dumps({"actions": actions.tolist()}), flush=True)
        elif cmd[0] == "round":
            order = models if rounds % 2 == 0 else models[::-1]
            stats = {m: runners[m].latency(trace.obs, samples=int(cmd[1]), warmup=WARMUP) for m in order}
            print(json.dumps({m: [s.p50_us, s.p99_us] for m, s in stats.items()}), flush=True)
            rounds += 1
    assert "torch" not in sys.modules, "the timing worker imported torch while timing"


class Worker:
    def __init__(self, bundle: Path, trace: Path, models: list[str]) -> None:
        cmd = [sys.executable, __file__, "--worker", str(bundle), str(trace), *models]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ask("")  # waits for "ready"

    def ask(self, line: str) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if line:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        if not reply:
            raise RuntimeError(f"the timing worker exited (code {self.proc.wait()})")
        return json.loads(reply)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        if self.proc.wait() != 0:
            raise RuntimeError(f"the timing worker failed (code {self.proc.returncode})")


# ---- the host side: tune, the SB3 model, SB3 timing ------------------------------------------------


@dataclass(frozen=True)
class Tuned:
    folder: Path
    choice: str
    threads: int
    report: dict[str, Any]
    """tune.json's ``tune`` block"""

    @classmethod
    def read(cls, folder: Path) -> Tuned:
        from quarl_edge.tune.verify import read_tune_json

        # checked as gate checks it: the choice benched, the bundle beside it the one tune.json names
        result = read_tune_json(folder / "tune.json")
        if result is None or result.choice is None:
            raise SystemExit(f"{folder}/tune.json is a bench report without tune's choice")
        choice = result.choice
        if result.reference != REFERENCE:
            raise SystemExit(
                f"{folder}: tune's reference is {result.reference}, this benchmark needs {REFERENCE}"
            )
        return cls(folder, choice.name, choice.threads, result.tune_block())


def tune(name: str, out: Path) -> Tuned:
    from quarl_edge.tune.search import TuneConfig, run_tune

    cfg = TuneConfig(policy=ROOT / "quarl_edge/assets/policies" / name, out=out,
                     calibration=ROOT / "calibration_data" / f"{name}.npz", episodes=10, budget_min=20)  # fmt: skip
    run_tune(cfg, log=lambda m: print(f"[tune {name}] {m}", file=sys.stderr, flush=True))
    return Tuned.read(out)


def sb3_model(checkpoint: Path) -> tuple[Any, list[str]]:
    """An SB3 PPO / DQN of the checkpoint's architecture holding its fp32 weights, and the SB3 tensors
    that do not come from the checkpoint (none of them enters ``predict``)."""
    import gymnasium as gym
    import stable_baselines3 as sb3
    import torch
    from torch import nn

    from quarl_edge.policy.net import ACTIVATIONS, load_checkpoint
    from quarl_edge.runtimes.envs import bounds

    policy = load_checkpoint(checkpoint)
    spec, arch = policy.spec, policy.arch
    if arch.obs_norm or arch.qat or arch.head != "argmax" or spec.algo not in ("ppo", "dqn"):
        raise SystemExit(f"{checkpoint}: only plain PPO / DQN policies with discrete actions are mapped here")
    low, high = bounds(spec.observation_space)
    dtype = np.dtype(spec.observation_space.dtype)

    class SpacesOnly(gym.Env[np.ndarray, np.int64]):
        """Carries the spaces SB3 builds its networks for; never reset or stepped."""

        observation_space = gym.spaces.Box(low.astype(dtype), high.astype(dtype), dtype=dtype)
        action_space = gym.spaces.Discrete(int(spec.action_space.n or 0))

    cnn = arch.model == "nature_cnn"
    act_fn: type[nn.Module] = ACTIVATIONS[arch.activation]
    kwargs: dict[str, Any] = {"activation_fn": act_fn, "normalize_images": arch.scale_uint8}
    if cnn:
        kwargs["features_extractor_kwargs"] = {"features_dim": arch.cnn_features}
    # the inverse of policy/sb3.py: our module name -> SB3's
    if spec.algo == "ppo":
        kwargs["net_arch"] = {"pi": list(arch.hidden), "vf": list(arch.hidden)}
        fx, hidden, out = "features_extractor.", "mlp_extractor.policy_net.", "action_net."
        # a shared CNN extractor is one module under three names in SB3's state dict
        extra: dict[str, tuple[str, ...]] = (
            {fx: ("pi_features_extractor.", "vf_features_extractor.")} if cnn else {}
        )
        algo: Any = sb3.PPO
        algo_kwargs: dict[str, Any] = {"n_steps": 8, "batch_size": 8}
    else:
        kwargs["net_arch"] = list(arch.hidden)
        fx, hidden, out = "q_net.features_extractor.", "q_net.q_net.", f"q_net.q_net.{2 * len(arch.hidden)}."
        extra = {"q_net.": ("q_net_target.",)}  # the target network, a copy (not used by predict)
        algo, algo_kwargs = sb3.DQN, {"buffer_size": 1, "learning_starts": 0}
    model = algo("CnnPolicy" if cnn else "MlpPolicy", SpacesOnly(), policy_kwargs=kwargs, device="cpu",
                 seed=0, verbose=0, **algo_kwargs)  # fmt: skip
    names = {"out.": out, "cnn_fc.0.": f"{fx}linear.0."}
    names.update({f"cnn.{i}.": f"{fx}cnn.{i}." for i in (0, 2, 4)})
    names.update({f"mlp.{2 * j}.": f"{hidden}{2 * j}." for j in range(len(arch.hidden))})
    target = model.policy.state_dict()
    untouched = set(target)
    for key, tensor in policy.net.state_dict().items():
        prefix, leaf = key.rsplit(".", 1)
        mapped = [names[f"{prefix}."] + leaf]
        mapped += [b + mapped[0][len(a) :] for a, bs in extra.items() if mapped[0].startswith(a) for b in bs]
        for m in mapped:
            if target[m].shape != tensor.shape:
                raise SystemExit(f"{key} {list(tensor.shape)} does not fit SB3's {m} {list(target[m].shape)}")
            target[m] = tensor.detach().clone()
            untouched.discard(m)
    model.policy.load_state_dict(target, strict=True)
    model.policy.set_training_mode(False)
    torch.set_num_threads(1)
    return model, sorted(untouched)


def sb3_round(model: Any, batches: list[np.ndarray], samples: int) -> LatencyStats:
    single = [b[0] for b in batches]  # predict is called with one observation, as an env loop does
    for i in range(WARMUP):
        model.predict(single[i % len(single)], deterministic=True)
    out = np.empty(samples, dtype=np.int64)
    clock, predict = time.perf_counter_ns, model.predict
    for i in range(samples):
        obs = single[i % len(single)]
        t0 = clock()
        predict(obs, deterministic=True)
        out[i] = clock() - t0
    return LatencyStats.from_ns(out)


def measure(name: str, tuned: Tuned, rounds: int, samples: int) -> dict[str, Any]:
    calibration = ROOT / "calibration_data" / f"{name}.npz"
    trace = load_trace(calibration)
    model, untouched = sb3_model(ROOT / "quarl_edge/assets/policies" / name)
    # what the worker times, by MODEL@THREADS; a choice at more threads is also timed at 1, like SB3
    timed = {REFERENCE: f"{REFERENCE}@1", "choice": f"{tuned.choice}@{tuned.threads}"}
    if tuned.threads != 1:
        timed["choice_1_thread"] = f"{tuned.choice}@1"
    w = Worker(tuned.folder / "bundle", calibration, list(dict.fromkeys(timed.values())))
    try:
        onnx_actions = np.asarray(w.ask("replay")["actions"])
        sb3_actions, _ = model.predict(trace.obs, deterministic=True)
        agreement = float(np.mean(np.asarray(sb3_actions).reshape(-1) == onnx_actions.reshape(-1)))
        print(f"[{name}] SB3 predict vs ONNX fp32 action agreement on {len(onnx_actions)} trace states: "
              f"{agreement:.4f}", file=sys.stderr, flush=True)  # fmt: skip
        batches = timing_batches(trace.obs)
        per: dict[str, list[list[float]]] = {k: [] for k in ("sb3", *timed)}
        load = os.getloadavg()[0]  # the machine is shared: other work inflates every column alike
        for r in range(rounds):
            # SB3 first on even rounds, the runtimes first on odd ones: drift hits both alike
            for step in ("sb3", "runtimes") if r % 2 == 0 else ("runtimes", "sb3"):
                if step == "sb3":
                    st = sb3_round(model, batches, samples)
                    per["sb3"].append([st.p50_us, st.p99_us])
                else:
                    got = w.ask(f"round {samples}")
                    for k, m in timed.items():
                        per[k].append(got[m])
    finally:
        w.close()
    med: dict[str, dict[str, Any]] = {k: {"p50_us": statistics.median(v[0] for v in vs), "p99_us": statistics.median(v[1] for v in vs),
               "rounds_p50_us": [v[0] for v in vs]} for k, vs in per.items()}  # fmt: skip
    row = next(r for r in tuned.report["candidates"] if r["name"] == tuned.choice)
    verdict = tuned.report["choice"]
    return {
        "choice": tuned.choice, "choice_threads": tuned.threads, "tune_folder": str(tuned.folder),
        "choice_tune_p50_us": verdict.get("p50_us"), "choice_agreement": row.get("agreement"),
        "choice_drop_pct": verdict.get("drop_pct"), "choice_episodes": verdict.get("episodes"),
        "sb3_predict": med["sb3"], "onnx_fp32": med[REFERENCE], "tune_choice": med["choice"],
        "tune_choice_1_thread": med.get("choice_1_thread"),
        "choice_vs_sb3": med["sb3"]["p50_us"] / med["choice"]["p50_us"],
        "choice_vs_onnx_fp32": med[REFERENCE]["p50_us"] / med["choice"]["p50_us"],
        "onnx_fp32_vs_sb3": med["sb3"]["p50_us"] / med[REFERENCE]["p50_us"],
        "sb3_vs_onnx_fp32_agreement": agreement, "agreement_states": int(len(onnx_actions)),
        "sb3_tensors_not_from_checkpoint": untouched, "loadavg_1min_before": load,
        "loadavg_1min_after": os.getloadavg()[0],
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--work", type=Path, default=None, help="tune folders go to WORK/NAME (default: a temp dir)"
    )
    ap.add_argument("--tuned", action="append", default=[], metavar="NAME=DIR", help="reuse a tune folder")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(Path(a.worker[0]), Path(a.worker[1]), a.worker[2:])
        return
    given = dict(t.split("=", 1) for t in a.tuned)
    unknown = sorted(set(given) - set(POLICIES))
    if unknown:
        ap.error(f"--tuned {unknown[0]}: the policies are {', '.join(POLICIES)}")
    with tempfile.TemporaryDirectory() as tmp:
        work = a.work or Path(tmp)
        tuned = {n: Tuned.read(Path(given[n])) if n in given else tune(n, work / n) for n in POLICIES}
        results = {n: measure(n, tuned[n], a.rounds, a.samples) for n in POLICIES}
    if a.work:
        atomic_write_json(a.work / "tune_vs_sb3.json", results)
    if a.json:
        print(json.dumps(results, indent=2))
        return
    from quarl_edge.cli._output import table

    rows = [[n, f"{r['choice']} @{r['choice_threads']}t", f"{r['sb3_predict']['p50_us']:.1f}",
             f"{r['onnx_fp32']['p50_us']:.1f}", f"{r['tune_choice']['p50_us']:.1f}", f"{r['choice_vs_sb3']:.1f}x",
             f"{r['choice_vs_onnx_fp32']:.2f}x", f"{r['sb3_vs_onnx_fp32_agreement']:.4f}"]
            for n, r in results.items()]  # fmt: skip
    table(
        f"per-call p50 us, 1 thread (the choice at tune's threads), median of {a.rounds} interleaved rounds"
        f" x {a.samples} single observations",
        ["policy", "tune's choice", "SB3 predict", "ONNX fp32", "choice", "choice vs SB3", "choice vs ONNX fp32",
         "SB3 = ONNX fp32 actions"],
        rows,
    )  # fmt: skip
    for n, r in results.items():
        if r["tune_choice_1_thread"]:
            one = r["tune_choice_1_thread"]["p50_us"]
            print(f"{n}: tune's choice at 1 thread (as SB3 runs): p50 {one:.1f} us, "
                  f"{r['sb3_predict']['p50_us'] / one:.1f}x SB3, {r['onnx_fp32']['p50_us'] / one:.2f}x ONNX fp32")  # fmt: skip
        if r["sb3_tensors_not_from_checkpoint"]:
            print(f"{n}: SB3 tensors not in our checkpoint (left at SB3's init; predict does not use them): "
                  f"{r['sb3_tensors_not_from_checkpoint']}", file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    main()
