"""tune's presentation: the candidates table (CLI and ``tune.md``), the Markdown summary and ``tune.png``
(latency vs reward drop, the gate and the choice marked), all read from the typed TuneResult. The files
and the shipped bundle are written by tune/ship.py."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from quarl_edge.common.figures import pyplot, save_png
from quarl_edge.common.markdown import markdown_table
from quarl_edge.outputs import Kind, text_starts_with
from quarl_edge.text import md_cell
from quarl_edge.tune.result import TuneResult

TITLE = "# quarl-edge tune:"
TUNE_MARKDOWN = Kind("tune summary", False, text_starts_with(TITLE))
COLUMNS = ("candidate", "threads", "p50 us", "p99 us", "agree", "drop %", "verdict", "why")
OFFLINE = "action error"
"""the verdict's column instead of "drop %" where the environment cannot run here (reward not measured)"""


def columns(result: TuneResult) -> tuple[str, ...]:
    """COLUMNS, the latency ones marked emulated when the device is (qemu's timing, not the board's)."""
    cols = (
        COLUMNS
        if result.reward_not_measured is None
        else tuple(OFFLINE if c == "drop %" else c for c in COLUMNS)
    )
    if not result.device.emulated:
        return cols
    return tuple(f"{c} (emulated)" if c.endswith(" us") else c for c in cols)


def layer_lines(result: TuneResult) -> list[str]:
    """The per-layer search's evidence: which layers it kept in float and why."""
    out = []
    for ev in result.layer_search:
        ranked = ", ".join(f"{md_cell(k)} {v:.3f}" for k, v in ev.alone)
        steps = "; ".join(f"{md_cell(','.join(fl))} in float {a:.3f}" for fl, a in ev.steps)
        out.append(f"- {md_cell(ev.format)} int8, every layer: agreement {ev.all_int8:.3f} (proxy {ev.proxy:g})"
                   + (f"; sensitivity (agreement with only that layer int8): {ranked}" if ranked else "")
                   + (f"; greedy steps: {steps}" if steps else "") + f": {md_cell(ev.result)}")  # fmt: skip
    return out


def _shown(drop: float | None) -> float | None:
    return None if drop is None else drop + 0.0  # +0.0: no '-0.00' is shown


def table_rows(result: TuneResult) -> list[list[str]]:
    def f(v: Any, spec: str) -> str:
        return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)

    order = sorted(result.candidates, key=lambda r: (r.p50_us is None, r.p50_us or 0))
    offline = result.reward_not_measured is not None
    return [[r.name, f(r.threads, "d"), f(r.p50_us, ".1f"), f(r.p99_us, ".1f"), f(r.agreement, ".3f"),
             f(r.action_error, ".4g") if offline else f(_shown(r.judged_drop), "+.2f"), r.verdict or "not judged",
             r.why or ""] for r in order]  # fmt: skip


def markdown(result: TuneResult) -> str:
    c, d = result.choice, result.device
    emulated = " (emulated: latency is qemu's, not the board's)" if d.emulated else ""
    lines = [f"{TITLE} {md_cell(result.policy)} on {md_cell(d.name)}{emulated}", ""]
    unmeasured, limit = result.reward_not_measured, result.settings.max_action_error
    if c is not None:
        drop = "" if c.drop_pct is None else f", reward drop {c.drop_pct + 0.0:+.2f}%"  # None: not measured
        lines.append(f"Chosen: **{md_cell(c.name)}** at {c.threads} thread(s), p50 {c.p50_us:.1f} us "
                     f"({c.speedup_vs_fp32:.2f}x fp32){drop}: {md_cell(c.why)}; model sha256 {c.sha256}.")  # fmt: skip
    if unmeasured is None:
        gate = f"reward drop <= {result.settings.max_reward_drop_pct:g}%"
    else:
        gate = (f"action error <= {limit:g} against fp32 on the recorded observations (max |Δa| in action units; "
                f"for discrete actions the share of differing actions). Reward: not measured ({md_cell(unmeasured)}): "
                "no episodes ran, nothing is estimated")  # fmt: skip
    lines += [f"Search: {result.search_s} s; {len(result.candidates)} candidates; gate: {gate}.", ""]
    lines += markdown_table(columns(result), table_rows(result))
    layers = layer_lines(result)
    lines += ["", "Per-layer search (from every layer int8):", *layers] if layers else []
    lines += ["", *(f"- {md_cell(n)}" for n in result.notes)] if result.notes else []
    return "\n".join(lines) + "\n"


def plot(result: TuneResult, path: Path) -> Path:
    plt = pyplot()
    offline = result.reward_not_measured is not None

    def judged(r: Any) -> float | None:  # what each row's verdict rests on (all of a close call's episodes)
        return r.action_error if offline else _shown(r.judged_drop)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in result.candidates:
        y = judged(r)
        if r.p50_us is None or y is None:
            continue
        ax.scatter(r.p50_us, y, color="tab:green" if r.verdict == "pass" else "tab:red", s=30)
        ax.annotate(r.name, (r.p50_us, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    c = result.choice
    chosen_y = None if c is None else c.action_error if offline else c.drop_pct
    if c is not None and chosen_y is not None:
        ax.scatter(
            [c.p50_us], [chosen_y], s=160, facecolors="none", edgecolors="black", label=f"chosen: {c.name}"
        )
    limit = result.settings.max_action_error if offline else result.settings.max_reward_drop_pct
    ax.axhline(limit or 0.0, color="grey", linestyle=":", label="gate")
    emulated = " (emulated)" if result.device.emulated else ""
    ax.set_xlabel(f"p50 latency on {result.device.name}{emulated}, us")
    if offline:
        ax.set_ylabel("action error vs fp32 (recorded observations)")
        ax.set_title("tune: judged by action error (environment cannot run here; reward not measured)")
    else:
        ax.set_ylabel("reward drop vs fp32, % (paired seeds)")
        ax.set_title("tune: candidates judged in closed loop")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_png(fig, path, owner="tune")
