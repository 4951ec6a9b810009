"""A field report on disk: ``OUT/field.json`` (the typed report), ``OUT/field.md`` and its PNG plots,
written as one folder, atomically; and read back, validated (``load_field_report``)."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

from quarl_edge.common.figures import pyplot
from quarl_edge.common.markdown import markdown_table
from quarl_edge.outputs import Kind, claim, json_format
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.fsutil import (
    atomic_directory,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
)
from quarl_edge.text import md_cell

from .report import REPORT_FORMAT, FieldReport

JSON_NAME, MD_NAME = "field.json", "field.md"
PLOTS = ("agreement.png", "out_of_range.png", "latency.png")
MAX_REPORT_BYTES = 16 * 2**20


def _is_field_report(path: Path) -> bool:
    return path.is_dir() and json_format(path / JSON_NAME) == REPORT_FORMAT


FIELD_REPORT = Kind("field report", True, _is_field_report, lambda _p: {JSON_NAME, MD_NAME, *PLOTS})


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def markdown(r: FieldReport) -> str:
    """The report as Markdown: every name from a file goes through md_cell (one line, no HTML)."""
    what = (
        "share of actions differing from fp32's" if r.discrete else "p99 of |deployed - fp32|, action units"
    )
    lines = [
        f"# Field report: {md_cell(r.policy)} / {md_cell(r.model)} vs {md_cell(r.reference)}",
        "",
        f"Log `{md_cell(r.logs)}`: {r.records} records in {r.chunks} chunks, {r.sessions} sessions"
        + (f", {r.dropped} dropped on the device" if r.dropped else "")
        + f"; {r.compared} compared.",
        f"Bundle `{md_cell(r.bundle)}` (manifest {r.manifest_sha256[:12]})"
        + (
            f", replayed on the log of manifest {r.logged_manifest_sha256[:12]} ({md_cell(r.logged_model)})"
            if r.replay
            else ""
        )
        + ".",
        "",
    ]
    rows = [
        ["agreement with fp32", f"{r.agreement:.4f}"],
        ["agreement, inside the calibration range", _num(r.agreement_in_range, ".4f")],
        ["agreement, outside it", _num(r.agreement_out_of_range, ".4f")],
        [f"action error ({what})", f"{r.action_error:.4g}"],
        ["action error mean / max", f"{r.action_error_mean:.4g} / {r.action_error_max:.4g}"],
        ["out of the calibration range",
         f"{_pct(r.out_of_range_rate)} (flagged on the device: {_pct(r.logged_out_of_range_rate)})"],
    ]  # fmt: skip
    if r.logged_vs_replayed is not None:
        rows.append(["logged actions vs this host's replay", f"{r.logged_vs_replayed:.4g}"])
    if r.latency is not None:
        lat = r.latency
        rows.append(["act() in the field, p50 / p90 / p99 / max", f"{lat.p50_us:.1f} / {lat.p90_us:.1f} / "
                     f"{lat.p99_us:.1f} / {lat.max_us:.1f} us ({r.logged_model})"])  # fmt: skip
    lines += markdown_table(["figure", "value"], rows)
    if r.out_of_range_features:
        lines += ["", "Out of the calibration range, per feature:", ""]
        lines += markdown_table(["feature", *range(len(r.out_of_range_features))],
                                [["share", *(_pct(x) for x in r.out_of_range_features)]])  # fmt: skip
    lines += ["", "Over time:", ""]
    lines += markdown_table(
        ["from record", "t (s)", "agreement", "action error", "out of range", "act p50 us", "act p99 us"],
        [[b.first_record, f"{b.t_s:.1f}", f"{b.agreement:.4f}", f"{b.action_error:.4g}", _pct(b.out_of_range_rate),
          f"{b.act_p50_us:.1f}", f"{b.act_p99_us:.1f}"] for b in r.over_time],
    )  # fmt: skip
    lines += [""] + [f"![{p}]({p})" for p in r.plots]
    return "\n".join(lines) + "\n"


def _png(fig: Any) -> bytes:
    plt = pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def plots(r: FieldReport) -> dict[str, bytes]:
    plt = pyplot()

    t = [b.t_s for b in r.over_time]
    out = {}
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(t, [b.action_error for b in r.over_time], marker="o", label="action error (mean)")
    ax.plot(t, [b.out_of_range_rate for b in r.over_time], marker="s", label="out of calibration range")
    ax.set_xlabel("time in the log (s)")
    ax.set_title(f"{r.model} vs {r.reference} on the field observations")
    ax.legend()
    out[PLOTS[0]] = _png(fig)
    fig, ax = plt.subplots(figsize=(8, 4))
    n = len(r.out_of_range_features)
    ax.bar(range(n), [100 * x for x in r.out_of_range_features])
    ax.set_xlabel("feature" if n > 1 else "all features (one range)")
    ax.set_ylabel("% of records out of the calibration range")
    out[PLOTS[1]] = _png(fig)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(t, [b.act_p50_us for b in r.over_time], marker="o", label="p50")
    ax.plot(t, [b.act_p99_us for b in r.over_time], marker="s", label="p99")
    ax.set_xlabel("time in the log (s)")
    ax.set_ylabel(f"act() us ({r.logged_model}, in the field)")
    ax.legend()
    out[PLOTS[2]] = _png(fig)
    return out


def write_field_report(r: FieldReport, out: Path, reads: list[tuple[str, Path | None]]) -> FieldReport:
    """``out/field.json``, ``field.md`` and the plots, as one folder written atomically (replacing only a
    field report of ours; never inside the log or the bundle it reads)."""
    claim(out, FIELD_REPORT, reads)
    images = plots(r)
    r = dataclasses.replace(r, plots=tuple(images))
    with atomic_directory(out) as tmp:
        for name, data in images.items():
            atomic_write_bytes(tmp / name, data)
        atomic_write_json(tmp / JSON_NAME, r.to_dict())
        atomic_write_text(tmp / MD_NAME, markdown(r))
    return r


def is_field_report(path: Path) -> bool:
    """A field report folder of ours, or its field.json (the gate reads either)."""
    return _is_field_report(path) or (path.is_file() and json_format(path) == REPORT_FORMAT)


def load_field_report(path: str | Path) -> FieldReport:
    """A field report folder (or its field.json), every field validated; a one-line InputError otherwise."""
    path = Path(path)
    file = path / JSON_NAME if path.is_dir() else path
    fix = "make one with `quarl-edge field report LOGS --bundle B --out DIR`"
    try:
        if file.stat().st_size > MAX_REPORT_BYTES:
            raise InputError(f"{str(file)!r} is too large to be a field report", fix)
        data = json.loads(file.read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise InputError(f"cannot read the field report {str(file)!r} ({type(e).__name__})", fix) from None
    try:
        return FieldReport.from_dict(data)
    except (ValueError, TypeError) as e:
        raise InputError(f"{str(file)!r} is not a valid field report ({str(e)[:160]})", fix) from None
