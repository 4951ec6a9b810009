"""`quarl-edge study actorq`: fp32 vs fp16 vs int8 actors on the same seeds, side by side.

Every (task, seed, precision, update period) is one ActorQ run on one Ray (started once for the study),
in its own folder under ``out/runs/``; a run whose ``log.json`` is already there with the same arguments
is reused, so an interrupted study continues where it stopped. Per task and precision the report gives
the final return (mean of the last 10 episodes; mean and std over seeds) and whether it lies within the
seed-to-seed spread of fp32's, the wall time to the target return (first time the mean of the last 10
episodes reaches it; seeds that never do are counted, not averaged), the speedup of that time over fp32
actors, and the per-actor inference throughput ratio over fp32. Figures: per task the learning curves
(one line per precision, mean over seeds, min-max band) and the paper's breakdown bars.

    quarl-edge study actorq --suite quick        # CartPole DQN, 1 seed, tiny budget (a test runs it)
    quarl-edge study actorq --suite convergence  # 3 seeds: CartPole DQN, Pendulum D4PG (~20 min on 2 cores)
    quarl-edge study actorq --suite speed        # 2 seeds, CartPole DQN with 2048x3 MLPs (~1 h on 2 cores)
    quarl-edge study actorq --suite paper        # both
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quarl_edge.actorq.result import ActorQLog, ActorQStudy, CurvePoint, RunSummary, StudyRow, read_log
from quarl_edge.common.markdown import markdown_table
from quarl_edge.parallel import import_ray, start_ray
from quarl_edge.runtimes.fsutil import atomic_write_json, atomic_write_text
from quarl_edge.study._common import Progress, check_suite, claim_output, say
from quarl_edge.typed import to_json

WINDOW = 10
COLUMNS = ("task", "precision", "seeds", "update period", "final return", "vs fp32", "time to target (s)", "reached",
           "speedup vs fp32", "env steps/s", "steps/s vs fp32", "inference vs fp32", "energy to target (J)",
           "energy fp32/this (paper, int8: 1.9x-3.8x)")  # fmt: skip


@dataclass(frozen=True)
class Task:
    env: str
    algo: str
    steps: int
    target: float
    hidden: tuple[int, ...]
    seeds: tuple[int, ...] = (0, 1, 2)
    precisions: tuple[str, ...] = ("fp32", "fp16", "int8")
    update_periods: tuple[int, ...] = (100,)
    learning_starts: int = 1_000
    actor_runtime: str = "auto"
    """onnx, litert or auto (the faster, timed in a live actor at each run's start)"""
    overrides: tuple[tuple[str, Any], ...] = ()
    """learner Args fields set for this task, e.g. (("learning_rate", 1e-4),)"""
    name: str = ""
    """distinguishes two tasks on the same env, algorithm and widths"""

    @property
    def label(self) -> str:
        return " ".join(x for x in (self.env, self.algo, "x".join(map(str, self.hidden)), self.name) if x)


@dataclass(frozen=True)
class Suite:
    tasks: tuple[Task, ...]
    actors: int = 2


WIDE = (2048, 2048, 2048)
# The paper suites' committed results (docs/results/actorq.md) ran every precision on ONNX Runtime.
CONVERGENCE = (
    Task("CartPole-v1", "dqn", 50_000, 195.0, (120, 84), actor_runtime="onnx"),
    Task("Pendulum-v1", "d4pg", 30_000, -250.0, (256, 256), actor_runtime="onnx"),
)
SPEED = (
    # the paper's figure: where actor time goes at two update periods (short runs, one seed)
    Task("CartPole-v1", "dqn", 5_000, 150.0, WIDE, seeds=(0,), update_periods=(50, 500), name="breakdown",
         overrides=(("learning_rate", 1e-4), ("batch_size", 64)), actor_runtime="onnx"),
    # two seeds: one 2048x3 run takes 8-16 min on the 2-core machine (fp32 actors are the slow side)
    Task("CartPole-v1", "dqn", 40_000, 150.0, WIDE, seeds=(0, 1), precisions=("fp32", "int8"),
         overrides=(("learning_rate", 1e-4), ("batch_size", 64)), actor_runtime="onnx"),
)  # fmt: skip
# The DeepMind Control Suite, D4PG, at the network sizes of the paper's own ActorQ code
# (harvard-edge/QuaRL, actorQ/d4pg/utils.py make_networks): critic (512, 512, 256), policy (256, 256, 256)
# by default -- Acme's D4PG sizes -- and (2048, 2048, 2048) as its run script and README pass it
# (--model_str; the argparse default is 4096x3). Ours are plain ReLU MLPs (the paper's policy MLP uses
# tanh, its critic is Acme's LayerNormMLP). From Acme's D4PGConfig: batch 256, n-step 5, discount 0.99,
# exploration sigma 0.3, samples_per_insert 32 (one update of 256 per 8 inserted steps: train_frequency
# 8). Not Acme's: learning rate 3e-4 (its 1e-4 needs more steps than two cores give), soft target
# updates (tau 0.005). Three tasks of rising env cost (cartpole 5 obs / 1 action, walker 24 / 6, cheetah
# 17 / 6 with a heavier MuJoCo step). cartpole's budget and target follow a pilot run here (int8 actors,
# 50k steps: last-10 mean 767, 840 at the end); walker's and cheetah's are first guesses (a target no
# seed reaches shows as 0/3, never as a speedup).
ACME_POLICY, ACME_CRITIC = (256, 256, 256), (512, 512, 256)
ACME_D4PG = (("critic_hidden", ACME_CRITIC), ("batch_size", 256), ("n_step", 5), ("gamma", 0.99),
             ("exploration_noise", 0.3), ("train_frequency", 8), ("learning_rate", 3e-4))  # fmt: skip
DMC_TASKS = (
    ("cartpole-balance", 100_000, 800.0),
    ("walker-stand", 200_000, 600.0),
    ("cheetah-run", 300_000, 250.0),
)
DMC = tuple(
    Task(f"dm_control/{name}-v0", "d4pg", steps, target, ACME_POLICY, learning_starts=5_000,
         overrides=ACME_D4PG, name="critic-512x512x256")
    for name, steps, target in DMC_TASKS
)  # fmt: skip
# The paper run script's 2048x3 policy: one update of this policy at batch 256 takes ~0.3-0.5 s on one
# core here (measured: 542 ms on the loaded machine, vs 42 ms at 256x3), so these runs are short (20k
# steps: ~900 updates at the paper's samples_per_insert of 16, its run script's spi), one seed: they
# measure where the time goes and the end-to-end speed (env steps/s), not convergence.
DMC_LARGE = tuple(
    Task(f"dm_control/{name}-v0", "d4pg", 20_000, target, WIDE, seeds=(0,), learning_starts=5_000,
         overrides=(*ACME_D4PG[:-2], ("train_frequency", 16), ACME_D4PG[-1]), name="critic-512x512x256")
    for name, _, target in DMC_TASKS
)  # fmt: skip
# dmc-quick: the same shape scaled down, for make test (3,000 steps: a few 1,000-step episodes, no learning)
DMC_QUICK = Task("dm_control/cartpole-balance-v0", "d4pg", 3_000, 300.0, (32, 32, 32), seeds=(0,),
                 learning_starts=500, overrides=(("critic_hidden", (64, 64, 32)), ("batch_size", 32),
                                                 ("train_frequency", 8), ("n_step", 3)), name="critic-64x64x32")  # fmt: skip
SUITES = {
    # a smoke run: 2,000 steps do not train CartPole, and 50 is above what random play reaches by luck
    "quick": Suite(
        tasks=(
            Task(
                "CartPole-v1",
                "dqn",
                2_000,
                50.0,
                (120, 84),
                seeds=(0,),
                update_periods=(50, 500),
                learning_starts=500,
            ),
        )  # fmt: skip
    ),
    "convergence": Suite(tasks=CONVERGENCE),
    # the short 2048x3 runs first: one sitting finishes them, and they show where the time goes
    "dmc": Suite(tasks=DMC_LARGE + DMC),
    "dmc-quick": Suite(tasks=(DMC_QUICK,)),
    "speed": Suite(tasks=SPEED),
    "paper": Suite(tasks=CONVERGENCE + SPEED),
}


def final_return(curve: Sequence[CurvePoint]) -> float | None:
    returns = [p.ret for p in curve[-WINDOW:]]
    return statistics.fmean(returns) if returns else None


def time_to_target(curve: Sequence[CurvePoint], target: float, key: str = "wall_s") -> float | None:
    """Wall seconds (or the curve's ``key``: ``energy_j``, joules so far) at which the mean of the last
    WINDOW episodes first reaches ``target``."""
    for i in range(len(curve)):
        window = [p.ret for p in curve[max(0, i + 1 - WINDOW) : i + 1]]
        if len(window) == min(WINDOW, len(curve)) and statistics.fmean(window) >= target:
            value = getattr(curve[i], key)  # logs written before energy accounting have no energy_j
            return None if value is None else float(value)
    return None


@dataclass(frozen=True)
class ActorQStudyConfig:
    suite: str = "quick"
    out: Path = Path("out/study-actorq")
    """runs go to out/runs/<run>/ (a finished run with the same arguments is reused)"""
    address: str | None = None
    """Ray cluster address; None starts a local Ray (only when a run has to be trained)"""
    finished_only: bool = False
    """train nothing: tables and plots from the runs already finished in out/runs (a long suite's
    results so far); the others are listed as not run yet"""

    def __post_init__(self) -> None:
        check_suite(self.suite, SUITES)


def run_study(cfg: ActorQStudyConfig, progress: Progress | None = None) -> ActorQStudy:
    suite_name, out, address, progress = cfg.suite, cfg.out, cfg.address, say(progress)
    suite = SUITES[suite_name]
    ray = import_ray("ActorQ", "")
    from quarl_edge.actorq.learners import learner_args, train  # torch (~4 s): after the cheap checks

    runs: list[RunSummary] = []
    missing: list[str] = []
    started = False
    try:
        for task, seed, period, precision in _order(suite):
            name = f"{_slug(task.label)}-{precision}-u{period}-s{seed}"
            # resume=True: a run interrupted mid-way continues from its last checkpoint (same settings)
            args = learner_args(task.algo, env=task.env, out=out / "runs" / name, actors=suite.actors,
                                actor_precision=precision, actor_runtime=task.actor_runtime, update_period=period,
                                steps=task.steps, seed=seed, hidden=task.hidden, learning_starts=task.learning_starts,
                                resume=True, **dict(task.overrides))  # fmt: skip
            log, reused = _reusable(args), True
            t = time.perf_counter()
            if log is None and cfg.finished_only:
                missing.append(name)
                continue
            if log is None:
                if not started and not ray.is_initialized():
                    start_ray(
                        address, suite.actors
                    )  # quarl_edge/parallel.py: without Ray's and JAX's notices
                    started = True
                progress(f"{name}: running ({task.steps:,} env steps)")
                log, reused = train(args), False
            run_s = (log.breakdown["learner"].wall_s or 0.0) if reused else time.perf_counter() - t
            runs.append(_summary(log, task, seed, period, precision, run_s))
            final = runs[-1].final_return
            progress(f"{name}: final return {'—' if final is None else f'{final:.1f}'}, "
                     f"{runs[-1].run_s:.1f} s{' (reused)' if reused else ''}")  # fmt: skip
    finally:
        if started:
            ray.shutdown()
    if missing:
        progress(f"{len(missing)} of {len(missing) + len(runs)} runs not run yet (--finished-only)")
    return ActorQStudy(suite=suite_name, config=to_json(asdict(suite)), runs=tuple(runs), rows=tuple(_rows(runs, suite)),
                       not_run=tuple(missing))  # fmt: skip


def _order(suite: Suite) -> list[tuple[Task, int, int, str]]:
    """Every run of the suite, seed-major: each task's first seed before any task's second, so an
    interrupted suite has one seed of every task first; precisions stay interleaved (fp32, fp16, int8
    of one seed back to back, so each sees similar machine load)."""
    runs = [(i, j, task, seed, period, precision)
            for i, task in enumerate(suite.tasks) for j, seed in enumerate(task.seeds)
            for period in task.update_periods for precision in task.precisions]  # fmt: skip
    runs.sort(key=lambda r: (r[1], r[0]))  # stable: periods and precisions keep their order
    return [(task, seed, period, precision) for _, _, task, seed, period, precision in runs]


def _reusable(args: Any) -> ActorQLog | None:
    """The finished run's log when ``args.out/log.json`` was written with these arguments, else None (a
    log whose numbers are outside their meaning is refused in one line: it is never summarized)."""
    log = read_log(args.out / "log.json")
    if log is None:
        return None
    want = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(args).items()}
    saved = {"actor_runtime": "onnx", **log.args}  # logs from before the choice ran ONNX Runtime
    if "v_min" in want:  # D4PG: compare the value support the runs used, however it was given
        from quarl_edge.actorq.d4pg import support

        if want["v_min"] is None:
            want["v_min"], want["v_max"], _ = support(args)
        kept = log.learner.get("support")
        if saved.get("v_min") is None and isinstance(kept, dict):
            saved["v_min"], saved["v_max"] = kept.get("v_min"), kept.get("v_max")
    same = all(
        json.dumps(saved.get(k)) == json.dumps(v) for k, v in want.items() if k not in ("resume", "extra")
    )
    return log if same and log.env_steps >= args.steps else None


def _summary(log: ActorQLog, task: Task, seed: int, period: int, precision: str, run_s: float) -> RunSummary:
    actors = log.actors
    per_k = 1000 * len(actors) / max(log.env_steps, 1)
    fields = sorted({f for a in actors for f in a.seconds or {}})
    learner = log.breakdown["learner"]
    wall = max(learner.wall_s or 0.0, 1e-9)
    return RunSummary(
        task=task.label, env=task.env, algo=task.algo, hidden=tuple(task.hidden), seed=seed, update_period=period,
        precision=precision, final_return=final_return(log.curve),
        time_to_target_s=time_to_target(log.curve, task.target),
        energy_to_target_j=time_to_target(log.curve, task.target, "energy_j"), energy=log.energy,
        target=task.target, run_s=run_s, env_steps=log.env_steps, steps_per_s=steps_per_s(log.curve),
        payload_bytes=log.payload_bytes, inference_throughput=log.inference_throughput,
        # actor seconds per 1000 env steps of the whole run (each actor ran about 1/len(actors) of them)
        actor_s_per_1k_steps={f: per_k * statistics.fmean((a.seconds or {}).get(f, 0.0) for a in actors) for f in fields},
        learner_share={f: v / wall for f, v in (learner.seconds or {}).items()},
        curve=tuple((p.env_steps, p.wall_s, p.ret) for p in log.curve),
    )  # fmt: skip


def steps_per_s(curve: Sequence[CurvePoint]) -> float | None:
    """End-to-end env steps per wall second up to the last finished episode (a resumed run's curve
    times continue from its checkpoint, so this spans both parts): the speed figure of a run whose
    target is out of reach."""
    if not curve or curve[-1].wall_s <= 0:
        return None
    return float(curve[-1].env_steps / curve[-1].wall_s)


def within_spread(a: list[float], b: list[float]) -> bool | None:
    """Do the two sets of final returns agree within the seed-to-seed spread? (|mean difference| is at
    most the larger of the two standard deviations, or the ranges overlap.)"""
    if len(a) < 2 or len(b) < 2:  # one seed has no spread to compare against
        return None
    spread = max(statistics.pstdev(a) if len(a) > 1 else 0.0, statistics.pstdev(b) if len(b) > 1 else 0.0)
    overlap = min(max(a), max(b)) >= max(min(a), min(b))
    return abs(statistics.fmean(a) - statistics.fmean(b)) <= spread or overlap


def _rows(runs: list[RunSummary], suite: Suite) -> list[StudyRow]:
    rows = []
    for task in suite.tasks:
        for period in task.update_periods:
            base_t: float | None = None
            base_e: float | None = None
            base_sps: float | None = None
            base_finals: list[float] = []
            for precision in task.precisions:
                rs = [
                    r
                    for r in runs
                    if (r.task, r.update_period, r.precision) == (task.label, period, precision)
                ]
                if not rs:  # not run yet (a --finished-only table of a suite under way)
                    continue
                finals = [r.final_return for r in rs if r.final_return is not None]
                times = [r.time_to_target_s for r in rs if r.time_to_target_s is not None]
                mean_t = statistics.fmean(times) if times else None
                joules = [r.energy_to_target_j for r in rs if r.energy_to_target_j is not None]
                mean_e = statistics.fmean(joules) if joules else None
                speeds = [r.steps_per_s for r in rs if r.steps_per_s]
                mean_sps = statistics.fmean(speeds) if speeds else None
                if precision == "fp32":
                    base_t, base_e, base_finals, base_sps = mean_t, mean_e, finals, mean_sps
                found = [r.inference_throughput.ratio_vs_fp32.get(f"{precision}/fp32") for r in rs]
                ratios = [x for x in found if x is not None]
                rows.append(StudyRow(
                    task=task.label, precision=precision, update_period=period,
                    seeds=tuple(sorted(r.seed for r in rs)),
                    final_return_mean=statistics.fmean(finals) if finals else None,
                    final_return_std=statistics.pstdev(finals) if len(finals) > 1 else 0.0,
                    final_returns=tuple(finals),
                    within_fp32_spread=None if precision == "fp32" else within_spread(finals, base_finals),
                    time_to_target_s=mean_t, reached=f"{len(times)}/{len(rs)}", target=task.target,
                    speedup_vs_fp32=base_t / mean_t if base_t and mean_t else None,
                    steps_per_s=mean_sps,
                    steps_per_s_vs_fp32=mean_sps / base_sps if mean_sps and base_sps else None,
                    energy_to_target_j=mean_e,
                    energy_ratio_fp32=base_e / mean_e if base_e and mean_e else None,
                    energy_source=",".join(sorted({r.energy.source for r in rs if r.energy})),
                    inference_vs_fp32=statistics.fmean(ratios) if ratios else 1.0,
                    learner_update_share=statistics.fmean(r.learner_share.get("learner_update", 0.0) for r in rs),
                ))  # fmt: skip
    return rows


def table_rows(study: ActorQStudy) -> list[list[str]]:
    def f(x: float | None, spec: str = ".1f") -> str:
        return "—" if x is None else format(x, spec)

    verdict = {None: "— (1 seed)", True: "within spread", False: "OUTSIDE spread"}
    return [
        [r.task, r.precision, ",".join(map(str, r.seeds or ())) or "—", str(r.update_period),
         f"{f(r.final_return_mean)} ± {f(r.final_return_std)}",
         verdict[r.within_fp32_spread] if r.precision != "fp32" else "ref",
         f(r.time_to_target_s), r.reached,
         f(r.speedup_vs_fp32, ".2f") + "x" if r.speedup_vs_fp32 else "—",
         f(r.steps_per_s, ".0f"),
         f(r.steps_per_s_vs_fp32, ".2f") + "x" if r.steps_per_s_vs_fp32 else "—",
         f(r.inference_vs_fp32, ".2f") + "x",
         f(r.energy_to_target_j, ".0f"),
         f(r.energy_ratio_fp32, ".2f") + "x" if r.energy_ratio_fp32 else "—"]
        for r in study.rows
    ]  # fmt: skip


def energy_note(runs: Sequence[RunSummary]) -> str:
    """How the energy columns were obtained: measured (RAPL) or estimated, with the assumption."""
    reports = [r.energy for r in runs if r.energy]
    if not reports:
        return "Energy: not recorded (runs logged before energy accounting)."
    sources = sorted({e.source for e in reports})
    assumptions = sorted({e.assumption for e in reports if e.assumption})
    return (f"Energy to target = joules so far when the target is first reached ({', '.join(sources)}): "
            + ("RAPL package counters, measured. " if "rapl" in sources else "")
            + " ".join(assumptions))  # fmt: skip


def _slug(label: str) -> str:
    return label.replace(" ", "-").replace("/", "-")  # dm_control/... is one folder and file name


def write_outputs(study: ActorQStudy, out: Path) -> list[Path]:
    """actorq.json, actorq.md, and per task a breakdown and a learning-curve PNG (each atomic)."""
    from quarl_edge.actorq.plots import plot_study_breakdown, plot_study_curves

    files = [claim_output(out / "actorq.json", "json"), claim_output(out / "actorq.md", "md")]
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(files[0], study.to_dict())
    targets = ", ".join(sorted({f"{r.task}: {r.target}" for r in study.rows}))
    lines = [f"# ActorQ study ({study.suite})", "",
             f"Target return per task: {targets}; "
             f"final return = mean of the last {WINDOW} episodes (mean ± std over seeds); "
             "'within spread': |mean difference| <= the larger seed-to-seed std, or the seeds' ranges overlap.",
             "", energy_note(study.runs), ""]  # fmt: skip
    lines += markdown_table(COLUMNS, table_rows(study))
    if study.not_run:
        lines += ["", f"Not run yet ({len(study.not_run)} of the suite's runs; `--finished-only` wrote this "
                  "table from the finished ones): " + ", ".join(f"`{n}`" for n in study.not_run)]  # fmt: skip
    atomic_write_text(files[1], "\n".join(lines) + "\n")
    for label in dict.fromkeys(r.task for r in study.runs):
        runs = [r for r in study.runs if r.task == label]
        for kind, plot in (("breakdown", plot_study_breakdown), ("curves", plot_study_curves)):
            path = out / f"{kind}-{_slug(label)}.png"
            plot(runs, path)
            files.append(path)
    return files
