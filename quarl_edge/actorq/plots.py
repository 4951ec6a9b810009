"""ActorQ figures: the runtime breakdown as stacked bars (one per role) and the learning curves."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from quarl_edge.actorq.result import ActorQLog, RunSummary
from quarl_edge.common.figures import pyplot, save_png


def plot_breakdown(log: ActorQLog, path: Path) -> None:
    plt = pyplot()
    roles = {k: v.seconds for k, v in log.breakdown.items() if v.seconds is not None}
    fields = sorted({f for v in roles.values() for f in v})
    fig, ax = plt.subplots(figsize=(1.2 * len(roles) + 4, 4))
    bottom = [0.0] * len(roles)
    for f in fields:
        vals = [v.get(f, 0.0) for v in roles.values()]
        ax.bar(list(roles), vals, bottom=bottom, label=f)
        bottom = [b + x for b, x in zip(bottom, vals, strict=True)]
    a = log.args
    ax.set_title(f"ActorQ {a['env']}: {a['actor_precision']} actors, update period {a['update_period']}")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    save_png(fig, path, owner="ActorQ", dpi=100, tight=False)


def plot_curve(log: ActorQLog, path: Path) -> None:
    plt = pyplot()
    c = log.curve
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
    a1.plot([p.wall_s for p in c], [p.ret for p in c], ".", ms=3)
    a1.set_xlabel("wall time (s)")
    a2.plot([p.env_steps for p in c], [p.ret for p in c], ".", ms=3)
    a2.set_xlabel("environment steps")
    a1.set_ylabel("episodic return")
    fig.tight_layout()
    save_png(fig, path, owner="ActorQ", dpi=100, tight=False)


def plot_study_breakdown(runs: list[RunSummary], path: Path) -> None:
    """The paper's figure: actor seconds per 1000 env steps, stacked by field, per precision, grouped by
    update period (the mean over seeds)."""
    plt = pyplot()
    keys = list(dict.fromkeys((r.update_period, r.precision) for r in runs))
    fields = sorted({f for r in runs for f in r.actor_s_per_1k_steps})
    mean: dict[tuple[int, str], dict[str, float]] = {}
    for k in keys:
        rs = [r.actor_s_per_1k_steps for r in runs if (r.update_period, r.precision) == k]
        mean[k] = {f: sum(r.get(f, 0.0) for r in rs) / len(rs) for f in fields}
    labels = [f"{p}\nu={u}" for u, p in keys]
    fig, ax = plt.subplots(figsize=(1.1 * len(keys) + 4, 4))
    bottom = [0.0] * len(keys)
    for f in fields:
        vals = [mean[k][f] for k in keys]
        ax.bar(labels, vals, bottom=bottom, label=f)
        bottom = [b + x for b, x in zip(bottom, vals, strict=True)]
    # two lines: a DM Control task label is as wide as the figure
    ax.set_title(
        f"ActorQ {runs[0].task}\nactor time by precision and update period",
        fontsize=10,
    )
    ax.set_ylabel("actor seconds per 1000 env steps")
    ax.legend(fontsize=7, bbox_to_anchor=(1.01, 1), loc="upper left")
    fig.tight_layout()
    save_png(fig, path, owner="ActorQ", dpi=100, tight=False)


def plot_study_curves(runs: list[RunSummary], path: Path) -> None:
    """Learning curves per precision: the rolling mean of the last 10 episodes, mean over seeds with a
    min-max band, against environment steps (left) and wall time (right); the target return dashed."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for precision in dict.fromkeys(r.precision for r in runs):
        rs = [r for r in runs if r.precision == precision and r.curve]
        if not rs:
            continue
        for ax, col in zip(axes, (0, 1), strict=True):
            end = min(max(p[col] for p in r.curve) for r in rs)
            grid = np.linspace(0, end, 200)
            ys = []
            for r in rs:
                c = np.asarray(r.curve, dtype=float)
                rolling = np.convolve(c[:, 2], np.ones(10), "full")[: len(c)] / np.minimum(
                    np.arange(1, len(c) + 1), 10
                )
                ys.append(np.interp(grid, c[:, col], rolling))
            y = np.asarray(ys)
            line = ax.plot(grid, y.mean(0), label=f"{precision} actors ({len(rs)} seeds)")[0]
            ax.fill_between(grid, y.min(0), y.max(0), color=line.get_color(), alpha=0.2)
    for ax, xlabel in zip(axes, ("environment steps", "wall time (s)"), strict=True):
        ax.axhline(runs[0].target, color="gray", ls="--", lw=1, label="target")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("return (mean of last 10 episodes)")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"ActorQ {runs[0].task}\nlearning curves by actor precision", fontsize=10)
    fig.tight_layout()
    save_png(fig, path, owner="ActorQ", dpi=100, tight=False)
