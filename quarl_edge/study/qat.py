"""`quarl-edge study qat`: reward vs bits, post-training quantization (PTQ) vs quantization-aware
training (QAT), per task, on the same paired seeds; Markdown, CSV, JSON and a PNG plot.

PTQ is the weight-only n-bit sweep of the fp32 zoo policy (as in ``study ptq``). QAT trains the same
algorithm with the same hyperparameters and seed from scratch with ``--qat-bits n`` and evaluates the
checkpoint on its n-bit grid in torch. Trainings and evaluations are Ray tasks (local Ray by default).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quarl_edge.common.figures import pyplot, save_png
from quarl_edge.common.markdown import markdown_table
from quarl_edge.parallel import Job, Workers, pool
from quarl_edge.quant.config import MAX_BITS, QATConfig
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.study._common import (
    Progress,
    Row,
    check_bits,
    check_episodes,
    check_suite,
    say,
    unavailable,
    write_tables,
)
from quarl_edge.study._evaluate import evaluate_task
from quarl_edge.study.result import BitsPoint, QATFinding, QATStudy, VariantResult

KEEP_FRACTION = 0.9  # the paper's claim: QAT keeps >= 90% of fp32 where PTQ does not
SCOPE_TEXT = {
    "all": "every layer fake-quantized, critics and value heads too",
    "actor": "only the exported network fake-quantized, critics and value heads fp32",
}


@dataclass(frozen=True)
class QATTask:
    name: str
    """zoo policy name: its fp32 checkpoint is the PTQ source and the reference"""
    env: str
    algo: str
    steps: int | None = None
    """QAT training steps; None: the zoo policy's own"""
    bits: tuple[int, ...] | None = None
    """bit widths for this task (None: the suite's); --bits overrides both"""


QUICK = (QATTask("cartpole-ppo", "CartPole-v1", "ppo", steps=2048),)
PAPER = (
    QATTask("cartpole-ppo", "CartPole-v1", "ppo"),
    QATTask("pendulum-sac", "Pendulum-v1", "sac"),
    # the long trainings: one QAT run per bit width is an hour or more each on 2 cores, so only the
    # widths around PTQ's knee and 8 bits
    QATTask("lunarlander-dqn", "LunarLander-v3", "dqn", bits=(4,)),
    QATTask("halfcheetah-td3", "HalfCheetah-v5", "td3", bits=(4,)),
    QATTask("pong-dqn", "ALE/Pong-v5", "dqn", bits=(4,)),
    # DM Control (the paper's ActorQ setting), where 4-bit weight-only PTQ keeps only about half the return
    QATTask("walker-stand-sac", "dm_control/walker-stand-v0", "sac", bits=(4,)),
)


@dataclass(frozen=True)
class QATStudyConfig:
    suite: str = "quick"
    episodes: int | None = None
    """paired episodes per variant (default: 3 for quick, 20 for paper)"""
    bits: tuple[int, ...] | None = None
    """bit widths (default: 2 and 8 for quick, 2..8 for paper)"""
    steps: int | None = None
    """override every task's QAT training steps"""
    policies: tuple[str, ...] | None = None
    """restrict to these tasks (zoo names) of the suite"""
    activations: bool = QATConfig.activations
    """QAT also fake-quantizes activations (False: weight-only QAT, like the weight-only PTQ sweep)"""
    scope: str = QATConfig.scope
    """all: every layer trains fake-quantized (critics, value heads, targets too); actor: only the
    exported network's, so what learns the values stays fp32 (QAT_SCOPES)"""
    delay_fraction: float = 0.25
    """quantization delay as a fraction of the training steps"""
    seed: int = 2000
    workers: int = 1
    """trainings and evaluations side by side (1: in this process, one after another)"""
    ray: bool | None = None
    """None: Ray for more than one worker when it is installed; False: local processes"""
    address: str | None = None
    """a Ray cluster for the trainings and evaluations"""
    out: Path | None = None
    """keep the QAT trainings in ``out/runs/<task>-qat<bits>`` and reuse a finished one with the same
    settings (an interrupted paper run continues); None: a temporary folder"""

    def __post_init__(self) -> None:
        check_suite(self.suite, ("quick", "paper"))
        check_episodes(self.episodes)
        check_bits(self.bits, "QAT and PTQ bits")
        QATConfig(bits=MAX_BITS, scope=self.scope)  # an unknown --qat-scope fails here, before Ray starts
        if self.steps is not None and self.steps < 64:
            raise InputError(f"--steps must be at least 64 (got {self.steps})", "e.g. --steps 20000")
        if not 0.0 <= self.delay_fraction < 1.0:
            raise InputError("the delay fraction must be in [0, 1)", "e.g. 0.25")
        _ = self.tasks  # an unknown --policies name fails here, before Ray starts
        self.parallel  # noqa: B018 (--workers / --no-ray / --address too)

    @property
    def parallel(self) -> Workers:
        return Workers(self.workers, self.ray, self.address)

    @property
    def tasks(self) -> tuple[QATTask, ...]:
        tasks = QUICK if self.suite == "quick" else PAPER
        if not self.policies:
            return tasks
        unknown = [p for p in self.policies if p not in {t.name for t in tasks}]
        if unknown:
            raise InputError(f"no task {unknown[0]!r} in suite {self.suite}",
                             f"known: {', '.join(t.name for t in tasks)}")  # fmt: skip
        return tuple(t for t in tasks if t.name in self.policies)

    @property
    def n_episodes(self) -> int:
        return self.episodes or (3 if self.suite == "quick" else 20)

    @property
    def bit_list(self) -> tuple[int, ...]:
        return self.bits or ((2, 8) if self.suite == "quick" else (2, 3, 4, 5, 6, 7, 8))

    def task_bits(self, task: QATTask) -> tuple[int, ...]:
        return self.bits or task.bits or self.bit_list

    @property
    def seeds(self) -> list[int]:
        return list(range(self.seed, self.seed + self.n_episodes))


@dataclass(frozen=True)
class Trained:
    """A QAT training's checkpoint folder, or why there is none."""

    path: str | None = None
    skipped: str | None = None


def train_task(env: str, algo: str, steps: int, seed: int, qat: dict[str, Any], out: str) -> Trained:
    """One QAT training (a Ray task) with ``qat`` (QATConfig.to_dict(): plain data for Ray)."""
    import torch

    from quarl_edge.train.trainer import TrainConfig, train

    torch.set_num_threads(1)
    try:
        cfg = TrainConfig(env=env, algo=algo, out=Path(out), steps=steps, seed=seed, eval_episodes=1,
                          qat=QATConfig.from_dict(qat))  # fmt: skip
        train(cfg)
    except QuarlError as e:
        return Trained(skipped=str(e))
    except ImportError as e:
        return Trained(skipped=f"not installed: {e}")
    return Trained(path=out)


def _check(task: QATTask) -> tuple[Any, str | None]:
    from quarl_edge.zoo import load_zoo

    entry = next((e for e in load_zoo() if e.name == task.name), None)
    if entry is None:
        return None, f"zoo policy missing: {task.name} (train it, see zoo.json)"
    reason = unavailable(entry.path, entry.env)
    return (None, reason) if reason else (entry, None)


def _trained(path: Path, steps: int, seed: int, want: QATConfig) -> bool:
    """Is there a finished QAT checkpoint at ``path`` from the same training settings?"""
    import json

    try:
        train = json.loads((path / "policy.json").read_text())["spec"]["train"]
    except (OSError, ValueError, KeyError):
        return False
    qat = {"activations": True, "scope": "all", **(train.get("qat") or {})}  # older checkpoints: the defaults
    return (not train.get("partial") and train.get("seed") == seed and train.get("steps", 0) >= steps
            and all(qat.get(k) == getattr(want, k) for k in ("bits", "delay", "activations", "scope")))  # fmt: skip


def run_name(task: str, bits: int, activations: bool, scope: str) -> str:
    """``<task>-qat<bits>[-weights][-actor]``: the folder of one QAT training under out/runs."""
    return f"{task}-qat{bits}{'' if activations else '-weights'}{'' if scope == 'all' else f'-{scope}'}"


def run_study(cfg: QATStudyConfig, progress: Progress | None = None) -> QATStudy:
    """Run the study (trainings and evaluations as jobs of quarl_edge/parallel.py: in this process by
    default, side by side with ``workers``); see QATStudyConfig.out for reuse."""
    log = say(progress)
    seeds = cfg.seeds
    rows: list[Row] = []
    with (
        tempfile.TemporaryDirectory(prefix="quarl-study-qat-") as tmp,
        pool(cfg.parallel) as jobs,
    ):
        work = Path(cfg.out) / "runs" if cfg.out is not None else Path(tmp)
        evals: list[tuple[Row, Job]] = []
        trainings: list[tuple[Row, Job | Trained]] = []
        for task in cfg.tasks:
            entry, reason = _check(task)
            if reason:
                rows.append(Row(task.name, task.env, task.algo, "all", None, skipped=reason))
                log(f"skip {task.name}: {reason}")
                continue
            steps = cfg.steps or task.steps or entry.steps
            for variant, bits in [("fp32", None), ("random", None)] + [
                (f"ptq{b}", b) for b in cfg.task_bits(task)
            ]:
                ref = jobs.submit(evaluate_task, "torch", str(entry.path), variant, bits, seeds)
                evals.append((Row(task.name, entry.env, entry.algo, variant, bits), ref))
            for b in cfg.task_bits(task):
                qat = QATConfig(bits=b, delay=int(steps * cfg.delay_fraction), activations=cfg.activations,
                                scope=cfg.scope)  # fmt: skip
                path = work / run_name(task.name, b, cfg.activations, cfg.scope)
                row = Row(task.name, entry.env, entry.algo, f"qat{b}", b)
                if _trained(path, steps, entry.seed, qat):
                    trainings.append((row, Trained(path=str(path))))
                    continue
                ref = jobs.submit(
                    train_task, entry.env, entry.algo, steps, entry.seed, qat.to_dict(), str(path)
                )
                trainings.append((row, ref))
            log(f"{task.name}: {len(cfg.task_bits(task))} QAT trainings of {steps} steps")
        for row, training in trainings:
            res = training if isinstance(training, Trained) else training.result()
            if res.path is None:
                row.skipped = res.skipped
                rows.append(row)
            else:  # bits=None: the QAT checkpoint already runs on its n-bit grid
                evals.append((row, jobs.submit(evaluate_task, "torch", res.path, "qat", None, seeds)))
            log(f"trained {row.policy} {row.variant}")
        for row, job in evals:
            res = job.result()
            row.returns, row.skipped = res.returns, res.skipped
            rows.append(row)
    return summarize(rows, cfg)


def summarize(rows: list[Row], cfg: QATStudyConfig) -> QATStudy:
    by_task: dict[str, dict[str, Row]] = {}
    for r in rows:
        by_task.setdefault(r.policy, {})[r.variant] = r
    results: list[VariantResult] = []
    findings: list[QATFinding] = []
    for task, variants in by_task.items():
        fp32, rand = variants.get("fp32"), variants.get("random")
        ref = fp32.returns if fp32 and not fp32.skipped else None
        rnd = rand.returns if rand and not rand.skipped else None
        summaries = {v: r.summary(ref if v != "fp32" else None, rnd) for v, r in variants.items()}
        results += summaries.values()

        def norm(v: str, s: dict[str, VariantResult] = summaries) -> float | None:
            return s[v].normalized if v in s else None

        bits = sorted({r.bits for r in variants.values() if r.bits is not None})
        per_bits = [BitsPoint(b, norm(f"ptq{b}"), norm(f"qat{b}")) for b in bits]
        claim = [
            p.bits
            for p in per_bits
            if p.qat is not None and p.ptq is not None and p.qat >= KEEP_FRACTION > p.ptq
        ]
        findings.append(QATFinding(task, tuple(per_bits), tuple(claim)))
    return QATStudy(suite=cfg.suite, episodes=cfg.n_episodes, seeds=tuple(cfg.seeds), bits=tuple(cfg.bit_list),
                    keep_fraction=KEEP_FRACTION, results=tuple(results), findings=tuple(findings),
                    qat_activations=cfg.activations, qat_scope=cfg.scope)  # fmt: skip


# ---- outputs ------------------------------------------------------------------------------------------

COLUMNS = ("task", "bits", "PTQ mean", "PTQ normalized", "QAT mean", "QAT normalized", "fp32 mean", "note")


def table_rows(study: QATStudy) -> list[list[str]]:
    def get(task: str, variant: str) -> VariantResult | None:
        return next((s for s in study.results if s.policy == task and s.variant == variant), None)

    def fmt(v: float | None, spec: str = ".1f") -> str:
        return "-" if v is None else format(v, spec)

    rows = []
    for f in study.findings:
        task = f.task
        whole = get(task, "all")
        if whole is not None and whole.skipped:
            rows.append([task, "-", "-", "-", "-", "-", "-", f"skipped: {whole.skipped}"])
            continue
        fp32 = get(task, "fp32")
        for b in [p.bits for p in f.normalized]:
            p, q = get(task, f"ptq{b}"), get(task, f"qat{b}")
            note = "; ".join(
                f"{k} skipped: {s.skipped}" for k, s in (("PTQ", p), ("QAT", q)) if s and s.skipped
            )
            if b in f.qat_keeps_where_ptq_breaks_bits:
                note = (note + "; " if note else "") + "QAT keeps >= 90%, PTQ does not"
            rows.append([task, str(b), fmt(p.mean if p else None), fmt(p.normalized if p else None, ".3f"),
                         fmt(q.mean if q else None), fmt(q.normalized if q else None, ".3f"),
                         fmt(fp32.mean if fp32 else None), note])  # fmt: skip
    return rows


def markdown(study: QATStudy) -> str:
    lines = [
        f"# QAT vs PTQ ({study.suite} suite)",
        "",
        f"{study.episodes} paired episodes per variant (seeds {study.seeds[0]}..{study.seeds[-1]}). "
        "PTQ: weight-only n-bit of the fp32 zoo policy. QAT: trained from scratch with --qat-bits n "
        f"({'weights and activations' if study.qat_activations in (None, True) else 'weights only'}; "
        f"{SCOPE_TEXT[study.qat_scope or 'all']}; "
        "same algorithm, hyperparameters, seed). normalized = (R - R_random) / (R_fp32 - R_random).",
        "",
    ]
    lines += markdown_table(COLUMNS, table_rows(study))
    return "\n".join(lines) + "\n"


def plot(study: QATStudy, path: Path) -> Path:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, f in enumerate(study.findings):
        c = colors[i % len(colors)]
        for kind, style in (("ptq", "--"), ("qat", "-")):
            pts = [(p.bits, getattr(p, kind)) for p in f.normalized if getattr(p, kind) is not None]
            if pts:  # square PTQ, round QAT: a single bit width has no line to tell them apart
                ax.plot([b for b, _ in pts], [v for _, v in pts], style, marker="s" if kind == "ptq" else "o", color=c,
                        label=f"{f.task} {kind.upper()}")  # fmt: skip
    ax.axhline(1.0, color="black", linewidth=1, label="fp32 reference")
    ax.axhline(study.keep_fraction, color="grey", linestyle=":", linewidth=1, label="90% of fp32")
    ax.set_xlabel("bits")
    ax.set_ylabel("normalized return  (R - R_random) / (R_fp32 - R_random)")
    ax.set_title(f"PTQ vs QAT: reward vs bits ({study.suite} suite, {study.episodes} paired episodes)")
    ax.set_xticks(sorted({p.bits for f in study.findings for p in f.normalized}) or study.bits)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3)
    return save_png(fig, path)


CSV_COLUMNS = ("task", "env", "algo", "variant", "bits", "mean", "std", "episodes", "normalized", "skipped")


def write_outputs(study: QATStudy, out: Path) -> list[Path]:
    keys = ("policy",) + CSV_COLUMNS[1:]
    rows = [[getattr(s, k) if k != "skipped" else s.skipped or "" for k in keys] for s in study.results]
    files = write_tables(out, "qat", study, markdown(study), CSV_COLUMNS, rows)
    return files + [plot(study, out / "qat_reward_vs_bits.png")]
