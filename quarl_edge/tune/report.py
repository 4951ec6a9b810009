"""tune's outputs: ``DIR/tune.json`` (a bench report of the choice against fp32, so `quarl-edge gate`
reads it, plus a ``tune`` block with every candidate), ``tune.md``, ``tune.png`` (latency vs reward
drop, the gate and the choice marked) and ``DIR/bundle/`` (the choice and its fp32 reference)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from quarl_edge.bench.report import REPORT
from quarl_edge.bench.run import BenchConfig, bench, finite_json
from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.outputs import BUNDLE, Kind, claim, text_starts_with
from quarl_edge.runtimes.errors import QuarlError
from quarl_edge.runtimes.fsutil import atomic_write_json, atomic_write_text
from quarl_edge.study._common import markdown_table
from quarl_edge.text import md_cell
from quarl_edge.tune.candidates import Candidate

TITLE = "# quarl-edge tune:"
TUNE_MARKDOWN = Kind("tune summary", False, text_starts_with(TITLE))
COLUMNS = ("candidate", "threads", "p50 us", "p99 us", "agree", "drop %", "verdict", "why")


def columns(result: dict[str, Any]) -> tuple[str, ...]:
    """COLUMNS, the latency ones marked emulated when the device is (qemu's timing, not the board's)."""
    if not result["device"].get("emulated"):
        return COLUMNS
    return tuple(f"{c} (emulated)" if c.endswith(" us") else c for c in COLUMNS)


def layer_lines(result: dict[str, Any]) -> list[str]:
    """The per-layer search's evidence: which layers it kept in float and why."""
    out = []
    for ev in result.get("layer_search") or []:
        ranked = ", ".join(f"{md_cell(k)} {v:.3f}" for k, v in ev["alone"].items())
        steps = "; ".join(
            f"{md_cell(','.join(st['float_layers']))} in float {st['agreement']:.3f}" for st in ev["steps"]
        )
        out.append(f"- {md_cell(ev['format'])} int8, every layer: agreement {ev['all_int8']:.3f} (proxy {ev['proxy']:g})"
                   + (f"; sensitivity (agreement with only that layer int8): {ranked}" if ranked else "")
                   + (f"; greedy steps: {steps}" if steps else "") + f": {md_cell(ev.get('result', ''))}")  # fmt: skip
    return out


class NothingPasses(QuarlError):
    """No candidate passes the gate: exit 1 (like a failed gate), the closest ones named."""

    exit_code = 1


def _judged_drop(r: dict[str, Any]) -> float | None:
    """The drop the verdict rests on (all episodes of a close call); +0.0 so no '-0.00' is shown."""
    d = r.get("confirm_drop_pct", r.get("drop_pct"))
    return None if d is None else d + 0.0


def table_rows(result: dict[str, Any]) -> list[list[str]]:
    def f(v: Any, spec: str) -> str:
        return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)

    order = sorted(result["candidates"], key=lambda r: (r.get("p50_us") is None, r.get("p50_us") or 0))
    return [[r["name"], f(r.get("threads"), "d"), f(r.get("p50_us"), ".1f"), f(r.get("p99_us"), ".1f"),
             f(r.get("agreement"), ".3f"), f(_judged_drop(r), "+.2f"), r.get("verdict", "not judged"),
             r.get("why") or ""] for r in order]  # fmt: skip


def markdown(result: dict[str, Any]) -> str:
    c, d = result["choice"], result["device"]
    emulated = " (emulated: latency is qemu's, not the board's)" if d.get("emulated") else ""
    lines = [f"{TITLE} {md_cell(str(result['policy']))} on {md_cell(d['name'])}{emulated}", "",
             f"Chosen: **{md_cell(c['name'])}** at {c['threads']} thread(s), p50 {c['p50_us']:.1f} us "
             f"({c['speedup_vs_fp32']:.2f}x fp32), reward drop {(c['drop_pct'] or 0) + 0.0:+.2f}%: {md_cell(c['why'] or '')}.",
             f"Search: {result['search_s']} s; {len(result['candidates'])} candidates; gate: reward drop <= "
             f"{result['settings']['max_reward_drop_pct']:g}%.", ""]  # fmt: skip
    lines += markdown_table(columns(result), [[md_cell(x) for x in r] for r in table_rows(result)])
    layers = layer_lines(result)
    lines += ["", "Per-layer search (from every layer int8):", *layers] if layers else []
    lines += ["", *(f"- {md_cell(n)}" for n in result["notes"])] if result.get("notes") else []
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from quarl_edge.study.plots import _save

    fig, ax = plt.subplots(figsize=(7, 4.5))
    judged = [r for r in result["candidates"] if r.get("p50_us") and r.get("drop_pct") is not None]
    for r in judged:  # the drop each verdict rests on (all of a close call's episodes)
        color = "tab:green" if r.get("verdict") == "pass" else "tab:red"
        drop = float(_judged_drop(r) or 0.0)
        ax.scatter(r["p50_us"], drop, color=color, s=30)
        ax.annotate(r["name"], (r["p50_us"], drop), fontsize=7, xytext=(3, 3), textcoords="offset points")
    c = result["choice"]
    ax.scatter([c["p50_us"]], [c.get("drop_pct") or 0.0], s=160, facecolors="none", edgecolors="black",
               label=f"chosen: {c['name']}")  # fmt: skip
    ax.axhline(result["settings"]["max_reward_drop_pct"], color="grey", linestyle=":", label="gate")
    emulated = " (emulated)" if result["device"].get("emulated") else ""
    ax.set_xlabel(f"p50 latency on {result['device']['name']}{emulated}, us")
    ax.set_ylabel("reward drop vs fp32, % (paired seeds)")
    ax.set_title("tune: candidates judged in closed loop")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def write_outputs(
    result: dict[str, Any], cfg: Any, policy: Any, device: dict[str, Any], transport: Any
) -> list[Path]:
    """The choice benched once more against fp32 on every seed its verdict used (so `gate tune.json`
    judges what tune judged), the files, the bundle."""
    out: Path = cfg.out
    if result["choice"] is None:
        closest = sorted((r for r in result["candidates"] if r.get("drop_pct") is not None),
                         key=lambda r: r["drop_pct"])[:3]  # fmt: skip
        names = "; ".join(f"{r['name']}: {r['why']}" for r in closest) or "no candidate was judged"
        raise NothingPasses(f"no candidate passes the gate (closest: {names})",
                            "loosen --max-reward-drop / --max-p99-ms, or give a larger --budget-min")  # fmt: skip
    files = [claim(out / "tune.json", REPORT), claim(out / "tune.md", TUNE_MARKDOWN, name="tune.md"),
             out / "tune.png", claim(out / "bundle", BUNDLE, name="the tuned bundle")]  # fmt: skip
    c = result["choice"]
    models = () if c["name"] == result["reference"] else (c["name"],)
    episodes = c.get("episodes") or cfg.episodes  # the first seeds and a close call's fresh ones follow on
    report = bench(Path(result["bundle"]), BenchConfig(episodes=episodes, seed=cfg.seed, threads=c["threads"],
                                                        latency_samples=cfg.latency_samples, models=models),
                   device=device, transport=transport).to_dict()  # fmt: skip
    report["tune"] = {k: v for k, v in result.items() if k != "bundle"}
    atomic_write_json(files[0], finite_json(report))
    atomic_write_text(files[1], markdown(result))
    plot(result, files[2])
    cand = next(Candidate.from_dict(r) for r in result["candidates"] if r["name"] == c["name"])
    variants = () if c["name"] == result["reference"] else (cand.variant(),)
    tune_block = {"chosen": c["name"], "threads": c["threads"], "device": device["name"],
                  "emulated": device.get("emulated", False), "evidence": c}  # fmt: skip
    export_bundle(policy, BundleRequest(out=files[3], targets=(result["reference"],), variants=variants,
                                        calibration=Path(result["calibration"]), tune=tune_block))  # fmt: skip
    return files
