"""`quarl-edge study actorq`: fp32 vs fp16 vs int8 actors on the same seeds, side by side.

Every (task, seed, precision, update period) is one ActorQ run on one Ray (started once for the study),
in its own folder under ``out/runs/``. Per task and precision the report gives the final return (mean
of the last 10 episodes, mean and std over seeds), the wall time to the target return (first time the
mean of the last 10 episodes reaches it; seeds that never do are counted, not averaged), the speedup of
that time over fp32 actors, and the per-actor inference throughput ratio over fp32. The breakdown figure
stacks each precision's mean actor time per 1000 environment steps at both update periods.

    quarl-edge study actorq --suite quick    # CartPole DQN, 1 seed, tiny budget (a test runs it)
    quarl-edge study actorq --suite paper    # 3 seeds, CartPole DQN + Pendulum D4PG, 2048x3 MLPs: hours
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quarl_edge.runtimes.errors import InputError, MissingDependencyError

STUDY_VERSION = 1
WINDOW = 10
COLUMNS = ("task", "precision", "update period", "final return", "time to target (s)", "reached",
           "speedup vs fp32", "inference vs fp32")  # fmt: skip


@dataclass(frozen=True)
class Task:
    env: str
    algo: str
    steps: int
    target: float
    hidden: tuple[int, ...]
    learning_starts: int = 1_000


@dataclass(frozen=True)
class Suite:
    tasks: tuple[Task, ...]
    seeds: tuple[int, ...]
    precisions: tuple[str, ...] = ("fp32", "fp16", "int8")
    update_periods: tuple[int, int] = (50, 500)
    actors: int = 2


WIDE = (2048, 2048, 2048)
SUITES = {
    # a smoke run: 2,000 steps do not train CartPole, and 50 is above what random play reaches by luck
    "quick": Suite(
        tasks=(Task("CartPole-v1", "dqn", 2_000, 50.0, (120, 84), learning_starts=500),), seeds=(0,)
    ),
    "paper": Suite(
        tasks=(
            Task("CartPole-v1", "dqn", 100_000, 195.0, WIDE),
            Task("Pendulum-v1", "d4pg", 30_000, -250.0, WIDE),
        ),
        seeds=(0, 1, 2),
    ),
}


def final_return(curve: list[dict[str, Any]]) -> float | None:
    returns = [p["return"] for p in curve[-WINDOW:]]
    return statistics.fmean(returns) if returns else None


def time_to_target(curve: list[dict[str, Any]], target: float) -> float | None:
    """Wall seconds at which the mean of the last WINDOW episodes first reaches ``target``."""
    for i in range(len(curve)):
        window = [p["return"] for p in curve[max(0, i + 1 - WINDOW) : i + 1]]
        if len(window) == min(WINDOW, len(curve)) and statistics.fmean(window) >= target:
            return float(curve[i]["wall_s"])
    return None


def run_study(
    suite_name: str, out: Path, address: str | None = None, progress: Callable[[str], None] = print
) -> dict[str, Any]:
    if suite_name not in SUITES:
        raise InputError(f"unknown --suite {suite_name!r}", f"known: {', '.join(SUITES)}")
    suite = SUITES[suite_name]
    try:
        import ray
    except ImportError:
        raise MissingDependencyError("ActorQ runs on Ray", "pip install 'quarl-edge[actorq]'") from None
    from quarl_edge.actorq import d4pg, dqn

    runs: list[dict[str, Any]] = []
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, num_cpus=None if address else suite.actors,
                 include_dashboard=False, log_to_driver=False, configure_logging=False)  # fmt: skip
    try:
        for task in suite.tasks:
            learner = d4pg if task.algo == "d4pg" else dqn
            for seed in suite.seeds:
                for period in suite.update_periods:
                    for precision in suite.precisions:
                        name = f"{task.env}-{task.algo}-{precision}-u{period}-s{seed}"
                        args = learner.Args(env=task.env, out=out / "runs" / name, actors=suite.actors,
                                            actor_precision=precision, update_period=period, steps=task.steps,
                                            seed=seed, hidden=task.hidden, learning_starts=task.learning_starts)  # fmt: skip
                        t = time.perf_counter()
                        log = learner.train(args)  # type: ignore[arg-type]
                        runs.append(_summary(log, task, seed, period, precision, time.perf_counter() - t))
                        progress(
                            f"{name}: final return {runs[-1]['final_return']}, {runs[-1]['run_s']:.1f} s"
                        )
    finally:
        if started:
            ray.shutdown()
    return {"version": STUDY_VERSION, "suite": suite_name, "config": asdict(suite), "runs": runs,
            "rows": _rows(runs, suite)}  # fmt: skip


def _summary(log: dict[str, Any], task: Task, seed: int, period: int, precision: str, run_s: float) -> dict:
    actors = [v for k, v in log["breakdown"].items() if k.startswith("actor") and "seconds" in v]
    per_k = 1000 * len(actors) / max(log["env_steps"], 1)
    fields = sorted({f for a in actors for f in a["seconds"]})
    return {
        "env": task.env, "algo": task.algo, "seed": seed, "update_period": period, "precision": precision,
        "final_return": final_return(log["curve"]),
        "time_to_target_s": time_to_target(log["curve"], task.target),
        "target": task.target,
        "run_s": run_s,
        "env_steps": log["env_steps"],
        "payload_bytes": log["payload_bytes"],
        "inference_throughput": log["inference_throughput"],
        # actor seconds per 1000 env steps of the whole run (each actor ran about 1/len(actors) of them)
        "actor_s_per_1k_steps": {f: per_k * statistics.fmean(a["seconds"][f] for a in actors) for f in fields},
    }  # fmt: skip


def _rows(runs: list[dict[str, Any]], suite: Suite) -> list[dict[str, Any]]:
    rows = []
    for task in suite.tasks:
        for period in suite.update_periods:
            base = None
            for precision in suite.precisions:
                rs = [r for r in runs if (r["env"], r["algo"], r["update_period"], r["precision"])
                      == (task.env, task.algo, period, precision)]  # fmt: skip
                finals = [r["final_return"] for r in rs if r["final_return"] is not None]
                times = [r["time_to_target_s"] for r in rs if r["time_to_target_s"] is not None]
                mean_t = statistics.fmean(times) if times else None
                if precision == "fp32":
                    base = mean_t
                ratios = [r["inference_throughput"]["ratio_vs_fp32"].get(f"{precision}/fp32") for r in rs]
                ratios = [x for x in ratios if x is not None]
                rows.append({
                    "task": f"{task.env} {task.algo}", "precision": precision, "update_period": period,
                    "final_return_mean": statistics.fmean(finals) if finals else None,
                    "final_return_std": statistics.pstdev(finals) if len(finals) > 1 else 0.0,
                    "time_to_target_s": mean_t, "reached": f"{len(times)}/{len(rs)}", "target": task.target,
                    "speedup_vs_fp32": base / mean_t if base and mean_t else None,
                    "inference_vs_fp32": statistics.fmean(ratios) if ratios else 1.0,
                })  # fmt: skip
    return rows


def table_rows(study: dict[str, Any]) -> list[list[str]]:
    def f(x: float | None, spec: str = ".1f") -> str:
        return "—" if x is None else format(x, spec)

    return [
        [r["task"], r["precision"], str(r["update_period"]),
         f"{f(r['final_return_mean'])} ± {f(r['final_return_std'])}", f(r["time_to_target_s"]), r["reached"],
         f(r["speedup_vs_fp32"], ".2f") + "x" if r["speedup_vs_fp32"] else "—",
         f(r["inference_vs_fp32"], ".2f") + "x"]
        for r in study["rows"]
    ]  # fmt: skip


def write_outputs(study: dict[str, Any], out: Path) -> list[Path]:
    """actorq.json, actorq.md and one breakdown PNG per task (temp name, then rename)."""
    from quarl_edge.actorq.plots import plot_study_breakdown

    out.mkdir(parents=True, exist_ok=True)
    files = [out / "actorq.json", out / "actorq.md"]
    tmp = out / "actorq.json.tmp"
    tmp.write_text(json.dumps(study, indent=2))
    os.replace(tmp, files[0])
    targets = ", ".join(sorted({f"{r['task']} {r['target']}" for r in study["rows"]}))
    lines = [f"# ActorQ study ({study['suite']})", "",
             f"Target return per task: {targets}; "
             f"final return = mean of the last {WINDOW} episodes (mean ± std over seeds).", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]  # fmt: skip
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(study)]
    tmp = out / "actorq.md.tmp"
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, files[1])
    for task in {(r["env"], r["algo"]) for r in study["runs"]}:
        path = out / f"breakdown-{task[0]}-{task[1]}.png"
        plot_study_breakdown([r for r in study["runs"] if (r["env"], r["algo"]) == task], path)
        files.append(path)
    return files
