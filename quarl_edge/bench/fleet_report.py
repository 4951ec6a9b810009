"""Fleet reports (`bench --device a,b,c`): every device's own bench report as a section, one comparison
table across them, written as JSON + Markdown beside it and read back with validation (for the gate).

The comparison has one row per model and device: latency p50/p99 there, reward, the drift and speed-up
against that device's own fp32 run, and per model the fastest device. An emulated device's latency is
qemu's, not a board's: its rows say so, and it is the fastest only when no real device ran the model.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from quarl_edge import __version__
from quarl_edge.bench.report import check_report, harness_line, markdown
from quarl_edge.bench.run import finite_json
from quarl_edge.outputs import Kind, json_format, text_starts_with
from quarl_edge.runtimes import schema
from quarl_edge.runtimes.artifact import read_artifact
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.facts import facts_text
from quarl_edge.runtimes.fsutil import atomic_write_json, atomic_write_text
from quarl_edge.text import md_cell

FLEET_FORMAT = "quarl-edge/fleet-report"
FLEET_VERSION = 1
MARKDOWN_TITLE = "# quarl-edge fleet bench:"
FLEET_REPORT = Kind("fleet report", False, lambda p: json_format(p) == FLEET_FORMAT)
FLEET_MARKDOWN = Kind("fleet report Markdown", False, text_starts_with(MARKDOWN_TITLE))
COLUMNS = ("model", "device", "threads", "p50 us", "p99 us", "speedup vs fp32", "reward", "drop", "agree",
           "fastest")  # fmt: skip
EMULATED_NOTE = (
    "(emulated): latency measured under qemu, not on the board; such a device is the fastest only when "
    "no real device ran the model."
)


@dataclass(frozen=True)
class ComparisonRow:
    """One model on one device, against that device's own fp32 reference."""

    model: str
    device: str
    emulated: bool
    threads: int | None
    runtime: str | None
    p50_us: float | None
    p99_us: float | None
    speedup_vs_fp32: float | None
    """the device's fp32 p50 / this model's p50 there"""
    reward_mean: float | None
    reward_drop_pct: float | None
    """mean paired reward drop vs the device's fp32, in % of its mean return (None: the reference)"""
    drift_abs: float | None
    agreement: float | None
    fastest: bool
    """the lowest p50 for this model across the fleet (emulated devices only when no real one ran it;
    never when only one device has the model)"""


def _num(block: Any, key: str) -> float | None:
    v = block.get(key) if isinstance(block, dict) else None
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def comparison(devices: list[str], sections: dict[str, dict[str, Any]]) -> list[ComparisonRow]:
    """The rows, by model (the first section's order) then device (the fleet's order)."""
    order: list[str] = []
    for dev in devices:
        for m in (sections.get(dev) or {}).get("models", []):
            if m["name"] not in order:
                order.append(m["name"])
    rows: list[ComparisonRow] = []
    for name in order:
        group: list[ComparisonRow] = []
        for dev in devices:
            report = sections.get(dev)
            m = next((x for x in (report or {}).get("models", []) if x["name"] == name), None)
            if report is None or m is None:
                continue
            group.append(ComparisonRow(
                model=name, device=dev, emulated=bool(report["device"].get("emulated")),
                threads=m.get("threads"), runtime=m.get("runtime"),
                p50_us=_num(m.get("latency"), "p50_us"), p99_us=_num(m.get("latency"), "p99_us"),
                speedup_vs_fp32=_num(m, "speedup_p50_vs_ref"), reward_mean=_num(m.get("reward"), "mean"),
                reward_drop_pct=_num(m.get("drift"), "reward_drop_pct"), drift_abs=_num(m.get("drift"), "abs"),
                agreement=_num(m.get("agreement"), "value"), fastest=False,
            ))  # fmt: skip
        timed = [r for r in group if r.p50_us is not None]
        real = [r for r in timed if not r.emulated]
        # one device alone (the others failed) is no comparison: nothing is marked
        best = min(real or timed, key=lambda r: r.p50_us or 0.0) if len(timed) > 1 else None
        rows += [ComparisonRow(**{**asdict(r), "fastest": r is best}) for r in group]
    return rows


def fastest(rows: list[ComparisonRow]) -> dict[str, str]:
    """Per model, the device with the lowest p50 (see ComparisonRow.fastest)."""
    return {r.model: r.device for r in rows if r.fastest}


def fleet_report(devices: list[str], sections: dict[str, dict[str, Any]], failed: dict[str, dict[str, Any]],
                 bundle: dict[str, Any], settings: dict[str, Any], reference: str) -> dict[str, Any]:  # fmt: skip
    """The fleet report (JSON-able): ``sections`` the finished devices' own reports, ``failed`` per device
    that did not finish: its error and the partial file keeping its results."""
    rows = comparison(devices, sections)
    return {
        "format": FLEET_FORMAT,
        "schema_version": FLEET_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "tool_version": __version__,
        "bundle": bundle,
        "settings": settings,
        "reference": reference,
        "devices": list(devices),
        "complete": not failed,
        "reports": {d: sections[d] for d in devices if d in sections},
        "failed": {d: failed[d] for d in devices if d in failed},
        "comparison": {"rows": [asdict(r) for r in rows], "fastest": fastest(rows)},
    }


# -- rendering ----------------------------------------------------------------------------------------


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else fmt.format(x + 0.0)  # + 0.0 turns -0.0 into 0.0


def rows(report: dict[str, Any]) -> list[list[str]]:
    """The comparison as table cells (terminal and Markdown)."""
    ref = report["reference"]
    out = []
    for r in comparison(report["devices"], report["reports"]):
        out.append([
            r.model, r.device + (" (emulated)" if r.emulated else ""), "-" if r.threads is None else str(r.threads),
            _f(r.p50_us, "{:.1f}"), _f(r.p99_us, "{:.1f}"), _f(r.speedup_vs_fp32, "{:.2f}x"),
            _f(r.reward_mean, "{:.1f}"), "ref" if r.model == ref else _f(r.reward_drop_pct, "{:+.2f}%"),
            "" if r.model == ref else _f(r.agreement, "{:.3f}"), "fastest" if r.fastest else "",
        ])  # fmt: skip
    return out


def title(report: dict[str, Any]) -> str:
    return (
        f"{report['bundle']['policy']} on a fleet of {len(report['devices'])}: {', '.join(report['devices'])}"
    )


def same_seeds_line(report: dict[str, Any]) -> str:
    s = report["settings"]
    seeds = s.get("seeds") or []
    first = f" (seeds {seeds[0]}..{seeds[-1]})" if seeds else ""
    return f"same seeds on every device: {s['episodes']} paired episodes per model{first}"


def failed_lines(report: dict[str, Any]) -> list[str]:
    """One line per device that did not finish: its error and what was kept."""
    out = []
    for dev, f in report["failed"].items():
        kept = f"; its finished work is kept in {f['partial']}" if f.get("partial") else ""
        out.append(f"{dev} did not finish: {f.get('error')}{kept}")
    return out


def print_lines(report: dict[str, Any], out: Path | None) -> tuple[list[tuple[str, str]], str, list[str]]:
    """What `quarl-edge bench --device a,b` prints around its table: (label, line) pairs before (each
    device's warnings and harness line), the title, and the lines after (the emulated note, each device's
    facts, the files written). Plain text: names and warnings come from the bundle and the devices."""
    before: list[tuple[str, str]] = []
    after = [same_seeds_line(report)] + ([EMULATED_NOTE] if has_emulated(report) else [])
    for dev, section in report["reports"].items():
        before += [("warning:", f"{dev}: {m['name']}: {w}") for m in section["models"] for w in m["warnings"]]
        if harness_line(section):
            before.append(("", f"{dev} {harness_line(section)}"))
        if section["device"].get("machine"):
            after.append(f"{dev}: {facts_text(section['device'])}")
    if out is not None and report["failed"]:
        after.append(f"report: {out} and {out.with_suffix('.md')} (a section per finished device)")
    elif out is not None:
        after.append(f"report: {out} and {out.with_suffix('.md')} (a section per device); "
                     f"next: quarl-edge gate {out} --max-reward-drop 2%")  # fmt: skip
    return before, title(report), after


def has_emulated(report: dict[str, Any]) -> bool:
    return any(bool(r["device"].get("emulated")) for r in report["reports"].values())


def fleet_markdown(report: dict[str, Any]) -> str:
    b = report["bundle"]
    lines = [
        f"{MARKDOWN_TITLE} {md_cell(b['policy'])} ({md_cell(b['algo'])}, {md_cell(b['env'])})",
        "",
        f"{md_cell(title(report))}; {md_cell(same_seeds_line(report))}; reference **{md_cell(report['reference'])}** "
        "on each device.",
        "",
        "## Comparison",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
        *("| " + " | ".join(md_cell(c) for c in r) + " |" for r in rows(report)),
        "",
        "speedup vs fp32 and drop: against the fp32 model on the same device; fastest: the lowest p50 for "
        "that model across the fleet.",
    ]
    if has_emulated(report):
        lines += ["", md_cell(EMULATED_NOTE)]
    if report["failed"]:
        lines += [
            "",
            "## Devices that did not finish",
            "",
            *(f"- {md_cell(x)}" for x in failed_lines(report)),
        ]
    for dev, section in report["reports"].items():
        body = markdown(section).split("\n", 2)[2]  # its own title line is replaced by the device's heading
        lines += ["", f"## Device {md_cell(dev)}", "", body.rstrip("\n")]
    return "\n".join(lines) + "\n"


def write_fleet_report(report: dict[str, Any], path: Path) -> tuple[Path, Path]:
    md = path.with_suffix(".md")
    atomic_write_json(path, finite_json(report))
    atomic_write_text(md, fleet_markdown(report))
    return path, md


# -- reading ------------------------------------------------------------------------------------------


def is_fleet_report(path: Path) -> bool:
    return json_format(path) == FLEET_FORMAT


def read_fleet_report(path: Path) -> dict[str, Any]:
    """Load a fleet report and check what the gate reads: every device's section as a bench report
    (bench.report.check_report), every device either finished or failed; any defect is an InputError."""
    fix = "re-run `quarl-edge bench --device ...`"
    where = f"fleet report {str(path)!r}"
    data = read_artifact(path, FLEET_FORMAT, FLEET_VERSION, "fleet report", fix)
    for key in ("bundle", "settings", "reports", "failed"):
        schema.obj(data.get(key), f"{where} {key}", fix)
    devices = schema.strings(data.get("devices"), f"{where} devices", fix)
    if not devices:
        raise InputError(f"{where} has no devices", fix)
    if len(set(devices)) != len(devices):
        raise InputError(f"{where} lists a device twice: one of them would go unchecked", fix)
    schema.text(data.get("reference"), f"{where} reference", fix, 256)
    for dev in devices:
        section, failure = data["reports"].get(dev), data["failed"].get(dev)
        if (section is None) == (failure is None):
            raise InputError(f"{where}: device {dev!r} is neither finished nor failed (or both)", fix)
        if section is not None:
            check_report(schema.obj(section, f"{where} device {dev!r}", fix), f"{where} device {dev!r}")
        else:
            schema.text(schema.obj(failure, f"{where} failed {dev!r}", fix).get("error"),
                        f"{where} failed {dev!r} error", fix)  # fmt: skip
    extra = sorted((set(data["reports"]) | set(data["failed"])) - set(devices))
    if extra:
        raise InputError(f"{where} has a section for {extra[0]!r}, which is not one of its devices", fix)
    return data
