"""The CI gate: thresholds on reward drop, action agreement, p99 latency and deadline misses.

Exit codes: 0 every quantized model passes, 1 one fails (named, with the margin), 2 unusable input:
a report with nothing to check (only the fp32 reference), a number outside its meaning (an agreement
outside [0, 1], a negative or non-finite latency or size, a non-finite drift: refused when the report is
read, bench.report.read_report), a model without a name or with a name used twice, a reference that is
not fp32, a fleet report that is incomplete or lacks a device, a threshold that is not a finite number
in its range.

One device is a fleet of one: a fleet report (`bench --device a,b`) is gated device by device, and the
table, the JUnit file (a testsuite per device) and the Markdown name the device of every check; one
device's report reads as before, without a device column.

A field report (`quarl-edge field report`: the deployed model vs fp32 on the robot's own observations) is
gated on its action error and out-of-calibration-range rate (quarl_edge.field.gate); the same table, JUnit
and Markdown.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from quarl_edge.bench.fleet_result import FleetReport
from quarl_edge.bench.result import BenchReport, ModelResult
from quarl_edge.common.limits import (
    MAX_REWARD_DROP_PCT,
    check_max_action_error,
    check_max_miss_rate,
    check_max_out_of_range,
    check_max_p99_ms,
    check_max_reward_drop,
    check_min_agreement,
)
from quarl_edge.common.markdown import markdown_table
from quarl_edge.field.report import FieldReport
from quarl_edge.outputs import Kind, claim, text_starts_with
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.fsutil import atomic_write_text
from quarl_edge.text import clean, md_cell

SUITE = "quarl-edge gate"
MARKDOWN_TITLE = "## quarl-edge gate:"
_OUR_JUNIT = re.compile(rb"<testsuites[^>]*>\s*<testsuite name=\"quarl-edge gate")


def _is_our_junit(path: Path) -> bool:
    try:
        with path.open("rb") as f:
            return bool(_OUR_JUNIT.search(f.read(4096)))
    except OSError:
        return False


JUNIT = Kind("gate JUnit file", False, _is_our_junit)
MARKDOWN = Kind("gate Markdown summary", False, text_starts_with(MARKDOWN_TITLE))


@dataclass(frozen=True)
class GateConfig:
    max_reward_drop_pct: float | None = MAX_REWARD_DROP_PCT
    """largest allowed mean reward drop vs fp32, in % of the fp32 mean return"""
    min_agreement: float | None = None
    """smallest allowed action agreement with fp32 on the recorded trace (0..1)"""
    max_p99_ms: float | None = None
    """largest allowed p99 single-inference latency, milliseconds"""
    max_miss_rate_pct: float | None = None
    """largest allowed share of closed-loop steps whose act() exceeded the `bench --hz` budget, in %"""
    max_action_error: float | None = None
    """largest allowed action error vs fp32: on a bench report, on the recorded observations, max |Δa| in
    action units for continuous actions, the share of differing actions for discrete ones (reports whose
    reward was not measured, because the environment cannot run here, are gated by this); on a field
    report, on the robot's own observations (continuous: p99 of |deployed - fp32| in action units)"""
    max_out_of_range_pct: float | None = None
    """a field report's largest allowed share of observations outside the calibration range, in %"""

    def __post_init__(self) -> None:
        # one check per limit, shared with tune (common/limits.py): inf or nan would turn a check off
        # while it reports "pass"
        for value, check in ((self.max_reward_drop_pct, check_max_reward_drop), (self.min_agreement, check_min_agreement),
                             (self.max_p99_ms, check_max_p99_ms), (self.max_miss_rate_pct, check_max_miss_rate),
                             (self.max_action_error, check_max_action_error),
                             (self.max_out_of_range_pct, check_max_out_of_range)):  # fmt: skip
            if value is not None:
                check(value)


@dataclass(frozen=True)
class Check:
    model: str
    name: str
    passed: bool
    value: float | None
    limit: float
    message: str
    device: str = ""
    """the device of a fleet report ("" for one device: its messages do not name it)"""
    unit: str = ""
    """of value and limit: "%" (a share in percent), "ms", or "" (a fraction of one, or action units)"""


def check_gateable(report: FleetReport) -> None:
    """Refuse a report the gate cannot judge (InputError): passing it would be a false green. Its numbers
    were checked when it was read (bench.report.read_report); here what the gate itself needs."""
    if report.failed:
        why = "; ".join(f"{dev} did not finish ({f.error})" for dev, f in report.failed.items())
        raise InputError(f"the fleet report is incomplete: {why}",
                         "finish it with the same `quarl-edge bench --device ...` command and --resume")  # fmt: skip
    for dev, section in report.sections:
        if len(section.models) < 2:
            on = f" on {dev}" if len(report.devices) > 1 else ""
            raise InputError(
                f"nothing to check{on}: the report holds only the fp32 reference {section.reference!r}",
                "bench the quantized models too (drop --models, or list them: --models onnx-int8)",
            )


def evaluate(report: FleetReport, cfg: GateConfig) -> list[Check]:
    """Every check on every non-reference model of every device (the fp32 reference is checked for latency
    only), in the fleet's order; an unusable report is an InputError (check_gateable)."""
    check_gateable(report)
    fleet = len(report.devices) > 1
    checks: list[Check] = []
    for dev, section in report.sections:
        if cfg.max_miss_rate_pct is not None:
            check_in_loop(section)
        for m in section.models:
            label = f"{dev}: {m.name}" if fleet else m.name
            checks += [
                replace(c, device=dev if fleet else "")
                for c in _model_checks(
                    m, label, m.name == section.reference, cfg, section.reward_not_measured
                )
            ]
    return checks


def _model_checks(
    m: ModelResult, label: str, is_ref: bool, cfg: GateConfig, unmeasured: str | None = None
) -> list[Check]:
    """``label`` names the model in messages (with its device in a fleet); ``unmeasured``: why the report
    ran no episodes (its environment cannot run here): the action error then stands in for the reward."""
    checks: list[Check] = []
    if (
        cfg.max_reward_drop_pct is not None
        and not is_ref
        and not (unmeasured and cfg.max_action_error is not None)
    ):
        limit = cfg.max_reward_drop_pct
        if m.drift is None and unmeasured:
            checks.append(Check(m.name, "reward_drop", False, None, limit,
                                f"{label}: reward not measured ({unmeasured}); gate it with --max-action-error"))  # fmt: skip
        elif m.drift is None:
            checks.append(
                Check(
                    m.name,
                    "reward_drop",
                    False,
                    None,
                    limit,
                    f"{label}: no paired episodes to measure reward drop",
                    unit="%",
                )
            )
        else:
            drop = m.drift.reward_drop_pct
            ok = drop <= limit
            checks.append(Check(m.name, "reward_drop", ok, drop, limit,
                                f"{label}: reward drop {drop + 0.0:+.2f}% {'<=' if ok else '>'} {limit:g}%"
                                + ("" if ok else f" (over by {drop - limit:.2f} points)"), unit="%"))  # fmt: skip
    if cfg.min_agreement is not None and not is_ref:
        limit = cfg.min_agreement
        if m.agreement is None:
            checks.append(
                Check(
                    m.name, "agreement", False, None, limit, f"{label}: no trace replay to measure agreement"
                )
            )
        else:
            agree = m.agreement.value
            ok = agree >= limit
            checks.append(Check(m.name, "agreement", ok, agree, limit,
                                f"{label}: agreement {agree:.4f} {'>=' if ok else '<'} {limit:g}"
                                + ("" if ok else f" (short by {limit - agree:.4f})")))  # fmt: skip
    if cfg.max_action_error is not None and not is_ref:
        checks.append(_action_error_check(m, label, cfg.max_action_error, unmeasured))
    if cfg.max_p99_ms is not None:
        limit = cfg.max_p99_ms
        if m.latency is None:
            checks.append(
                Check(m.name, "p99_latency", False, None, limit, f"{label}: no latency measured", unit="ms")
            )
        else:
            ms = m.latency.p99_us / 1000
            ok = ms <= limit
            checks.append(Check(m.name, "p99_latency", ok, ms, limit,
                                f"{label}: p99 {ms:.3f} ms {'<=' if ok else '>'} {limit:g} ms", unit="ms"))  # fmt: skip
    if cfg.max_miss_rate_pct is not None and m.in_loop is not None:
        loop, limit = m.in_loop, cfg.max_miss_rate_pct
        rate = 100.0 * loop.miss_rate
        ok = rate <= limit
        checks.append(Check(m.name, "deadline_miss_rate", ok, rate, limit,
                            f"{label}: {loop.over_budget} of {loop.steps} steps over the {loop.budget_us:.1f} us "
                            f"budget ({rate:.2f}% {'<=' if ok else '>'} {limit:g}%)", unit="%"))  # fmt: skip
    return checks


def _action_error_check(m: ModelResult, label: str, limit: float, unmeasured: str | None) -> Check:
    a = m.agreement
    if a is None:
        return Check(
            m.name,
            "action_error",
            False,
            None,
            limit,
            f"{label}: no trace replay to measure the action error",
        )
    err, what = a.action_error()
    ok = err <= limit
    why = " (reward not measured: the environment cannot run here)" if unmeasured else ""
    return Check(m.name, "action_error", ok, err, limit,
                 f"{label}: action error {what} {err:.4g} {'<=' if ok else '>'} {limit:g}{why}")  # fmt: skip


def check_in_loop(report: BenchReport) -> None:
    """--max-miss-rate needs every model's in-loop block (`bench --hz`): without it the gate cannot judge."""
    for m in report.models:
        if m.in_loop is None:
            raise InputError(
                f"the report has no in-loop latency for {m.name!r}, so --max-miss-rate has nothing to check",
                "bench with a control rate: `quarl-edge bench --bundle B --hz 50 --out REPORT.json`",
            )


def passed(checks: list[Check]) -> bool:
    return all(c.passed for c in checks)


Gated = FleetReport | FieldReport
"""what the gate reads: a bench report (a fleet of one or more devices) or a field report"""


def _devices(report: Gated) -> tuple[str, ...]:
    return tuple(report.devices) if isinstance(report, FleetReport) else ("field",)


def _policy(report: Gated) -> str:
    return report.bundle.policy if isinstance(report, FleetReport) else f"{report.policy} in the field"


def check_rows(report: Gated, checks: list[Check]) -> list[list[str]]:
    """The gate's table: (device,) model, check, value, limit, result, each number with its unit (shares in
    %, latency in us as bench shows it); the device column for a fleet only."""
    return [[*([c.device] if len(_devices(report)) > 1 else []), c.model, c.name,
             "-" if c.value is None else shown(c.value, c.unit), shown(c.limit, c.unit, limit=True),
             "pass" if c.passed else "FAIL"]
            for c in checks]  # fmt: skip


def shown(value: float, unit: str, limit: bool = False) -> str:
    """A check's number as the table prints it: ``-1.448e-06 %``, ``812.3 us`` (from ms), ``0.9925``."""
    if unit == "ms":  # bench reports latency in us: the same unit here
        us = 1000 * value
        return f"{us:g} us" if limit else f"{us:.1f} us"
    text = f"{value:g}" if limit else f"{value:.4g}"
    return f"{text} %" if unit == "%" else text


def check_columns(report: Gated) -> list[str]:
    return [*(["device"] if len(_devices(report)) > 1 else []), "model", "check", "value", "limit", "result"]


def verdict_json(report: Gated, checks: list[Check]) -> dict[str, object]:
    """`gate --json`: the verdict, every check, and per device its own."""
    all_devices = _devices(report)

    def as_json(c: Check) -> dict[str, object]:
        return {k: v for k, v in asdict(c).items() if k != "device" or len(all_devices) > 1}

    devices = {
        dev: [c for c in checks if c.device == (dev if len(all_devices) > 1 else "")] for dev in all_devices
    }
    return {"passed": passed(checks), "checks": [as_json(c) for c in checks],
            "devices": {dev: {"passed": passed(cs), "checks": [as_json(c) for c in cs]} for dev, cs in devices.items()}}  # fmt: skip


def junit_xml(report: Gated, checks: list[Check]) -> str:
    """One testsuite per device (named for its policy, and its device in a fleet), one testcase per checked
    model and check (classname: the model, name: the check), in the JUnit XSD's shape (testsuites >
    testsuite[@tests] > testcase[@name] > failure[@message, @type]). Names and messages are cleaned of
    control characters, which XML 1.0 cannot hold even escaped."""
    fleet = len(_devices(report)) > 1
    root = ET.Element("testsuites", {"tests": str(len(checks)), "failures": str(sum(not c.passed for c in checks)),
                                     "errors": "0"})  # fmt: skip
    for dev in _devices(report):
        mine = [c for c in checks if c.device == (dev if fleet else "")]
        name = f"{SUITE} {_policy(report)}" + (f" on {dev}" if fleet else "")
        suite = ET.SubElement(root, "testsuite", {"name": clean(name), "tests": str(len(mine)),
                                                  "failures": str(sum(not c.passed for c in mine)), "errors": "0"})  # fmt: skip
        for c in mine:
            case = ET.SubElement(suite, "testcase", {"name": clean(c.name), "classname": clean(c.model)})
            if not c.passed:
                ET.SubElement(
                    case, "failure", {"message": clean(c.message), "type": "threshold"}
                ).text = clean(c.message)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def markdown_summary(report: Gated, checks: list[Check]) -> str:
    """The verdict and the table of checks (with a device column for a fleet)."""
    devices = _devices(report)
    on = f" on {', '.join(md_cell(d) for d in devices)}" if len(devices) > 1 else ""
    cols = check_columns(report)
    lines = [
        f"{MARKDOWN_TITLE} {'PASS' if passed(checks) else 'FAIL'} ({md_cell(_policy(report))}{on})",
        "",
    ]
    rows = [[*row[:-1], "pass" if row[-1] == "pass" else "**FAIL**"] for row in check_rows(report, checks)]
    lines += markdown_table(cols, rows)
    return "\n".join(lines) + "\n"


def write_outputs(
    report: Gated,
    checks: list[Check],
    junit: Path | None,
    md: Path | None,
    reads: Iterable[tuple[str, Path | None]] = (),
) -> None:
    """Write the JUnit file and the Markdown summary; both targets are checked (outputs.claim) before
    either is written, and neither may be one of ``reads`` (the report)."""
    reads = list(reads)
    if junit:
        claim(junit, JUNIT, reads, flag="--junit")
    if md:
        claim(md, MARKDOWN, reads, flag="--markdown")
    if junit:
        atomic_write_text(junit, junit_xml(report, checks))
    if md:
        atomic_write_text(md, markdown_summary(report, checks))
