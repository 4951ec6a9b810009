"""`quarl-edge study ptq`'s outputs: the table (terminal and Markdown), the CSV, the JSON and the plots."""

from __future__ import annotations

import math
from pathlib import Path

from quarl_edge.common.markdown import markdown_table
from quarl_edge.study._common import write_tables
from quarl_edge.study.ptq import RUNTIME_VARIANTS
from quarl_edge.study.result import PTQFinding, PTQStudy, VariantResult

COLUMNS = ("policy", "variant", "mean", "std", "drop %", "drop 95% CI", "normalized", "fidelity", "note")
FINDING_COLUMNS = ("policy", "sweet spot bits", "onnx-int8 drop %", "tflite-int8 drop %", "onnx-fp16 drop %",
                   "keeps reward")  # fmt: skip


def _fidelity_text(s: VariantResult) -> str:
    if s.agreement_pct is not None:
        return f"agree {s.agreement_pct:.1f}%"
    if s.action_err_pct is not None:
        return f"err {s.action_err_pct:.2f}%"
    return ""


def table_rows(study: PTQStudy) -> list[list[str]]:
    rows = []
    for s in study.results:
        if s.skipped or s.mean is None or s.std is None:
            rows.append([s.policy, s.variant, "-", "-", "-", "-", "-", "-", f"skipped: {s.skipped}"])
            continue
        lo, hi = s.drop_ci95_pct or (None, None)
        rows.append([
            s.policy, s.variant, f"{s.mean:.1f}", f"{s.std:.1f}",
            "ref" if s.variant == "fp32" else f"{(math.nan if s.drop_pct is None else s.drop_pct) + 0.0:+.2f}",
            f"[{lo + 0.0:+.2f}, {hi + 0.0:+.2f}]" if lo is not None and hi is not None else "",
            f"{s.normalized:.3f}" if s.normalized is not None else "",
            _fidelity_text(s),
            s.note or "",
        ])  # fmt: skip
    return rows


def _verdict(study: PTQStudy, f: PTQFinding, v: str) -> str:
    """A runtime variant's keeps-reward verdict, and the re-check's on more episodes after a NO."""
    c = f.confirmed.get(v)
    if c is None:
        return f"{v}: {'yes' if f.keeps_reward[v] else 'NO'}"
    return (f"{v}: NO on {study.episodes} eps, {'yes' if c.keeps_reward else 'NO'} on {c.episodes} "
            f"({c.drop_pct + 0.0:+.2f}%)")  # fmt: skip


def markdown(study: PTQStudy) -> str:
    lines = [
        f"# PTQ study ({study.suite} suite)",
        "",
        f"{study.episodes} paired episodes per variant (seeds {study.seeds[0]}..{study.seeds[-1]}); "
        "drop = mean paired return change vs fp32 in % of |fp32 mean| (negative = better); "
        "normalized = (R - R_random) / (R_fp32 - R_random); fidelity = on the policy's recorded states, the share "
        "of greedy actions equal to fp32's (discrete) or the mean action error in % of the action range (continuous).",
        "",
    ]
    lines += markdown_table(COLUMNS, table_rows(study))
    lines += ["", "## Sweet spot (fewest weight bits within 2% of fp32) and int8 drift", "",
              "sweet spot = fewest weight-only bits such that every width from there up to 8 keeps reward within 2%.", "",
              "keeps reward = drop ≤ 2% of |fp32 mean|, or the mean inside fp32's own 95% interval. "
              f"A NO is re-checked on {study.confirm_episodes} more paired episodes (fp32 and the variant, "
              "fresh seeds) and the verdict on all of them is shown beside it.", ""]  # fmt: skip

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v + 0.0:+.2f}"

    def row(f: PTQFinding) -> list[object]:
        d = f.drop_pct
        verdict = ", ".join(_verdict(study, f, v) for v in RUNTIME_VARIANTS if v in f.keeps_reward)
        return [f.policy, f.sweet_spot_bits or "-", fmt(d.get("onnx-int8")), fmt(d.get("tflite-int8")),
                fmt(d.get("onnx-fp16")), verdict or "-"]  # fmt: skip

    lines += markdown_table(FINDING_COLUMNS, [row(f) for f in study.findings])
    return "\n".join(lines) + "\n"


CSV_COLUMNS = ("policy", "env", "algo", "variant", "bits", "mean", "std", "episodes", "drop_pct", "normalized",
               "agreement_pct", "action_err_pct", "skipped", "note")  # fmt: skip


def write_outputs(study: PTQStudy, out: Path) -> list[Path]:
    from quarl_edge.study.plots import plot_drift, plot_reward_vs_bits

    rows = [[getattr(s, c) if c not in ("skipped", "note") else getattr(s, c) or "" for c in CSV_COLUMNS]
            for s in study.results]  # fmt: skip
    files = write_tables(out, "ptq", study, markdown(study), CSV_COLUMNS, rows)
    return files + [
        plot_reward_vs_bits(study, out / "ptq_reward_vs_bits.png"),
        plot_drift(study, out / "ptq_int8_drift.png"),
    ]
