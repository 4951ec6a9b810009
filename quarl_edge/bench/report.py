"""The bench report as files and text, for one device or a fleet (one device is a fleet of one): write it
(JSON + Markdown beside it), read it back with validation (for the gate), and what `quarl-edge bench`
prints around its table.

A finished fleet of one reads and writes as that device's own report (bench/render.py draws it); a
fleet of two or more as a comparison table across the devices, then each device's report as a section.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quarl_edge.bench import render
from quarl_edge.bench.fleet_result import FLEET_FORMAT, FLEET_VERSION, FleetReport
from quarl_edge.bench.result import FIX, REPORT_FORMAT, REPORT_VERSION, BenchReport
from quarl_edge.common.markdown import markdown_table
from quarl_edge.outputs import Kind, json_format, text_starts_with
from quarl_edge.runtimes.artifact import read_artifact
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.facts import facts_text
from quarl_edge.runtimes.fsutil import atomic_write_json, atomic_write_text
from quarl_edge.text import md_cell
from quarl_edge.typed import load

FLEET_TITLE = "# quarl-edge fleet bench:"
REPORT = Kind("bench report", False, lambda p: json_format(p) in (REPORT_FORMAT, FLEET_FORMAT))
REPORT_MARKDOWN = Kind("bench report Markdown", False, text_starts_with((render.MARKDOWN_TITLE, FLEET_TITLE)))
FLEET_COLUMNS = ("model", "device", "threads", "p50 us", "p99 us", "speedup vs fp32", "reward", "drop", "agree",
                 "fastest")  # fmt: skip
EMULATED_NOTE = (
    "(emulated): latency measured under qemu, not on the board; such a device is the fastest only when "
    "no real device ran the model."
)


# -- reading and writing --------------------------------------------------------------------------------


def as_fleet(report: FleetReport | BenchReport) -> FleetReport:
    """One device's report as the fleet of one it is."""
    return report if isinstance(report, FleetReport) else FleetReport.of_one(report)


def read_report(path: str | Path) -> FleetReport:
    """Load a bench report of one device or a fleet, every number checked; any defect is an InputError
    (exit 2) naming the file."""
    path = Path(path)
    if not path.is_file():
        raise InputError(
            f"report {str(path)!r} does not exist", "write one with `quarl-edge bench --out FILE.json`"
        )
    fleet = json_format(path) == FLEET_FORMAT
    fmt, version = (FLEET_FORMAT, FLEET_VERSION) if fleet else (REPORT_FORMAT, REPORT_VERSION)
    data = read_artifact(path, fmt, version, "bench report", FIX)
    return parse_report(data, f"report {str(path)!r}")


def parse_report(data: object, where: str = "the report") -> FleetReport:
    """A report's JSON (either shape) as the typed report; ``where`` names it in errors."""
    return load(lambda: FleetReport.from_dict(data, where), where, FIX)


def write_report(report: FleetReport | BenchReport, path: str | Path) -> tuple[Path, Path]:
    """The report's JSON and its Markdown beside it (one device's report is written as a fleet of one)."""
    report = as_fleet(report)
    path = Path(path)
    if path.suffix != ".json":
        raise InputError(f"report path {str(path)!r} must end in .json", "e.g. --out reports/policy.json")
    md = path.with_suffix(".md")
    atomic_write_json(path, report.to_dict())
    atomic_write_text(md, markdown(report))
    return path, md


# -- text -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Printed:
    """What `quarl-edge bench` prints: (label, line) pairs before the table (warnings, labelled "warning:",
    and the harness lines), the table, and the lines after it. Plain text: names and warnings come from the
    bundle and the devices."""

    before: list[tuple[str, str]]
    title: str
    columns: tuple[str, ...]
    rows: list[list[str]]
    after: list[str]


def printed(report: FleetReport, out: Path | None) -> Printed:
    """One device: its own table; a fleet: the comparison across the devices."""
    one = report.single
    if one is not None:
        return _printed_one(one, out)
    before: list[tuple[str, str]] = []
    after = [same_seeds_line(report)] + ([EMULATED_NOTE] if report.emulated else [])
    for dev, section in report.sections:
        before += [("warning:", f"{dev}: {name}: {w}") for name, w in render.warnings(section)]
        if render.harness_line(section):
            before.append(("", f"{dev} {render.harness_line(section)}"))
        if section.device.facts.get("machine"):
            after.append(f"{dev}: {facts_text(dict(section.device.facts))}")
    if out is not None and report.failed:
        after.append(f"report: {out} and {out.with_suffix('.md')} (a section per finished device)")
    elif out is not None:
        after.append(f"report: {out} and {out.with_suffix('.md')} (a section per device); "
                     f"next: quarl-edge gate {out} --max-reward-drop 2%")  # fmt: skip
    return Printed(before, title(report), FLEET_COLUMNS, comparison_rows(report), after)


def _printed_one(one: BenchReport, out: Path | None) -> Printed:
    before = [("warning:", f"{name}: {w}") for name, w in render.warnings(one)]
    before += [("", render.harness_line(one))] if render.harness_line(one) else []
    device = one.device
    emulated = ", emulated: latency is qemu's, not the board's" if device.emulated else ""
    heading = f"{one.bundle.policy} on {device.name} ({one.settings.threads} thread{emulated})"
    after = [render.runtimes_line(one)] + ([render.in_loop_line(one)] if one.has_in_loop else [])
    after += render.sustained_lines(one)
    after += render.not_measured_lines(one)
    after += [one.source_parity.line()] if one.source_parity else []
    after += [f"device: {facts_text(dict(device.facts))}"] if device.facts.get("machine") else []
    if out is not None:
        after.append(f"report: {out} and {out.with_suffix('.md')}; next: quarl-edge gate {out} --max-reward-drop 2%"
                     + (" --max-miss-rate 1%" if one.has_in_loop else ""))  # fmt: skip
    return Printed(before, heading, render.columns(one), render.rows(one), after)


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else fmt.format(x + 0.0)  # + 0.0 turns -0.0 into 0.0


def comparison_rows(report: FleetReport) -> list[list[str]]:
    """The comparison across the devices as table cells (terminal and Markdown)."""
    ref = report.reference
    return [[r.model, r.device + (" (emulated)" if r.emulated else ""), "-" if r.threads is None else str(r.threads),
             _f(r.p50_us, "{:.1f}"), _f(r.p99_us, "{:.1f}"), _f(r.speedup_vs_fp32, "{:.2f}x"),
             _f(r.reward_mean, "{:.1f}"), "ref" if r.model == ref else _f(r.reward_drop_pct, "{:+.2f}%"),
             "" if r.model == ref else _f(r.agreement, "{:.3f}"), "fastest" if r.fastest else ""]
            for r in report.comparison()]  # fmt: skip


def title(report: FleetReport) -> str:
    return f"{report.bundle.policy} on a fleet of {len(report.devices)}: {', '.join(report.devices)}"


def same_seeds_line(report: FleetReport) -> str:
    s = report.settings
    first = f" (seeds {s.seeds[0]}..{s.seeds[-1]})" if s.seeds else ""
    return f"same seeds on every device: {s.episodes} paired episodes per model{first}"


def failed_lines(report: FleetReport) -> list[str]:
    """One line per device that did not finish: its error and what was kept."""
    return [f"{dev} did not finish: {f.error}" + (f"; its finished work is kept in {f.partial}" if f.partial else "")
            for dev, f in report.failed.items()]  # fmt: skip


def markdown(report: FleetReport | BenchReport) -> str:
    """The report's Markdown: one device's own, or the fleet's comparison then a section per device."""
    report = as_fleet(report)
    one = report.single
    if one is not None:
        return render.markdown(one)
    b = report.bundle
    lines = [
        f"{FLEET_TITLE} {md_cell(b.policy)} ({md_cell(b.algo)}, {md_cell(b.env)})",
        "",
        f"{md_cell(title(report))}; {md_cell(same_seeds_line(report))}; reference **{md_cell(report.reference)}** "
        "on each device.",
        "",
        "## Comparison",
        "",
        *markdown_table(FLEET_COLUMNS, comparison_rows(report)),
        "",
        "speedup vs fp32 and drop: against the fp32 model on the same device; fastest: the lowest p50 for "
        "that model across the fleet.",
    ]
    if report.emulated:
        lines += ["", md_cell(EMULATED_NOTE)]
    if report.failed:
        lines += [
            "",
            "## Devices that did not finish",
            "",
            *(f"- {md_cell(x)}" for x in failed_lines(report)),
        ]
    for dev, section in report.sections:
        body = render.markdown(section).split("\n", 2)[
            2
        ]  # its own title line is replaced by the device's heading
        lines += ["", f"## Device {md_cell(dev)}", "", body.rstrip("\n")]
    return "\n".join(lines) + "\n"
