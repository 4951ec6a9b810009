"""The CI gate: thresholds on reward drop, action agreement, p99 latency and deadline misses.

Exit codes: 0 every quantized model passes, 1 one fails (named, with the margin), 2 unusable input:
a report with nothing to check (only the fp32 reference), a model without a name or with a name
used twice, a reference that is not fp32, a threshold that is not a finite number.

A fleet report (`bench --device a,b`) is gated device by device (evaluate_fleet): each device's section
as one report, a device whose bench did not finish as a failure; the table, the JUnit file (a testsuite
per device) and the Markdown name the device of every check.
"""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    max_reward_drop_pct: float | None = 2.0
    """largest allowed mean reward drop vs fp32, in % of the fp32 mean return"""
    min_agreement: float | None = None
    """smallest allowed action agreement with fp32 on the recorded trace (0..1)"""
    max_p99_ms: float | None = None
    """largest allowed p99 single-inference latency, milliseconds"""
    max_miss_rate_pct: float | None = None
    """largest allowed share of closed-loop steps whose act() exceeded the `bench --hz` budget, in %"""
    max_action_error: float | None = None
    """largest allowed action error vs fp32 on the recorded observations: max |Δa| in action units for
    continuous actions, the share of differing actions for discrete ones (reports whose reward was not
    measured, because the environment cannot run here, are gated by this)"""

    def __post_init__(self) -> None:
        # inf (or nan, which compares false both ways) would turn the check off while it reports "pass"
        for flag, value, example in (("--max-reward-drop", self.max_reward_drop_pct, "2%"),
                                     ("--min-agreement", self.min_agreement, "0.95"),
                                     ("--max-p99-ms", self.max_p99_ms, "5"),
                                     ("--max-miss-rate", self.max_miss_rate_pct, "1%"),
                                     ("--max-action-error", self.max_action_error, "0.05")):  # fmt: skip
            if value is not None and not math.isfinite(value):
                raise InputError(f"{flag} must be a finite number (got {value})", f"e.g. {flag} {example}")
        if self.max_reward_drop_pct is not None and self.max_reward_drop_pct < 0:
            raise InputError("--max-reward-drop must be >= 0", "e.g. --max-reward-drop 2%")
        if self.min_agreement is not None and not 0 <= self.min_agreement <= 1:
            raise InputError("--min-agreement must be between 0 and 1", "e.g. --min-agreement 0.95")
        if self.max_p99_ms is not None and self.max_p99_ms <= 0:
            raise InputError("--max-p99-ms must be positive", "e.g. --max-p99-ms 5")
        if self.max_action_error is not None and self.max_action_error < 0:
            raise InputError("--max-action-error must be >= 0", "e.g. --max-action-error 0.05")
        if self.max_miss_rate_pct is not None and not 0 <= self.max_miss_rate_pct <= 100:
            raise InputError("--max-miss-rate must be between 0% and 100%", "e.g. --max-miss-rate 1%")


def parse_percent(text: str) -> float:
    """'2%', '2' -> 2.0 (percent)."""
    t = text.strip().rstrip("%").strip()
    try:
        return float(t)
    except ValueError:
        raise InputError(f"not a percentage: {text!r}", "write it like 2% or 2.5") from None


@dataclass(frozen=True)
class Check:
    model: str
    name: str
    passed: bool
    value: float | None
    limit: float
    message: str


def check_gateable(report: dict[str, Any]) -> None:
    """Refuse a report the gate cannot judge (InputError): passing it would be a false green."""
    names = [m.get("name") for m in report["models"]]
    for n in names:
        if not isinstance(n, str) or not n.strip():
            raise InputError(f"the report has a model without a name ({n!r})", "re-run `quarl-edge bench`")
        if names.count(n) > 1:
            raise InputError(
                f"the report names the model {n!r} twice: one of them would go unchecked",
                "re-export the bundle with unique model names and re-run `quarl-edge bench`",
            )
    ref = next((m for m in report["models"] if m["name"] == report["reference"]), None)
    if ref is None:
        raise InputError(
            f"the report's reference {report['reference']!r} is not one of its models",
            "re-run `quarl-edge bench`",
        )
    if ref.get("precision") != "fp32":
        raise InputError(
            f"the report's reference {ref['name']!r} is {ref.get('precision')!r}, not fp32: drops measured "
            "against it say nothing about the fp32 policy",
            "bench a bundle with an fp32 model (export --to onnx-fp32,...)",
        )
    if len(names) < 2:
        raise InputError(
            f"nothing to check: the report holds only the fp32 reference {ref['name']!r}",
            "bench the quantized models too (drop --models, or list them: --models onnx-int8)",
        )


def evaluate(report: dict[str, Any], cfg: GateConfig) -> list[Check]:
    """Every check on every non-reference model (the fp32 reference is checked for latency only);
    an unusable report is an InputError (check_gateable)."""
    check_gateable(report)
    if cfg.max_miss_rate_pct is not None:
        check_in_loop(report)
    checks: list[Check] = []
    for m in report["models"]:
        name, is_ref = m["name"], m["name"] == report["reference"]
        unmeasured = report.get("reward_not_measured")
        if (
            cfg.max_reward_drop_pct is not None
            and not is_ref
            and unmeasured
            and cfg.max_action_error is not None
        ):
            pass  # reward not measured (no env here): the action error stands in, and says so below
        elif cfg.max_reward_drop_pct is not None and not is_ref:
            drop = (m.get("drift") or {}).get("reward_drop_pct")
            if drop is None and unmeasured:
                checks.append(Check(name, "reward_drop", False, None, cfg.max_reward_drop_pct,
                                    f"{name}: reward not measured ({unmeasured}); gate it with --max-action-error"))  # fmt: skip
            elif drop is None:
                checks.append(Check(name, "reward_drop", False, None, cfg.max_reward_drop_pct,
                                    f"{name}: no paired episodes to measure reward drop"))  # fmt: skip
            else:
                ok = drop <= cfg.max_reward_drop_pct
                checks.append(Check(name, "reward_drop", ok, drop, cfg.max_reward_drop_pct,
                                    f"{name}: reward drop {drop + 0.0:+.2f}% "
                                    f"{'<=' if ok else '>'} {cfg.max_reward_drop_pct:g}%"
                                    + ("" if ok else f" (over by {drop - cfg.max_reward_drop_pct:.2f} points)")))  # fmt: skip
        if cfg.min_agreement is not None and not is_ref:
            agree = (m.get("agreement") or {}).get("value")
            if agree is None:
                checks.append(Check(name, "agreement", False, None, cfg.min_agreement,
                                    f"{name}: no trace replay to measure agreement"))  # fmt: skip
            else:
                ok = agree >= cfg.min_agreement
                checks.append(Check(name, "agreement", ok, agree, cfg.min_agreement,
                                    f"{name}: agreement {agree:.4f} {'>=' if ok else '<'} {cfg.min_agreement:g}"
                                    + ("" if ok else f" (short by {cfg.min_agreement - agree:.4f})")))  # fmt: skip
        if cfg.max_action_error is not None and not is_ref:
            checks.append(_action_error_check(name, m.get("agreement"), cfg.max_action_error, unmeasured))
        if cfg.max_p99_ms is not None:
            p99 = (m.get("latency") or {}).get("p99_us")
            if p99 is None:
                checks.append(
                    Check(name, "p99_latency", False, None, cfg.max_p99_ms, f"{name}: no latency measured")
                )
            else:
                ms = p99 / 1000
                ok = ms <= cfg.max_p99_ms
                checks.append(Check(name, "p99_latency", ok, ms, cfg.max_p99_ms,
                                    f"{name}: p99 {ms:.3f} ms {'<=' if ok else '>'} {cfg.max_p99_ms:g} ms"))  # fmt: skip
        if cfg.max_miss_rate_pct is not None:
            checks.append(_miss_check(name, m.get("in_loop"), cfg.max_miss_rate_pct))
    return checks


def _action_error_check(name: str, agreement: Any, limit: float, unmeasured: str | None) -> Check:
    a = agreement or {}
    if a.get("max_abs_diff") is not None:
        err, what = float(a["max_abs_diff"]), "max |Δa|"
    elif a.get("value") is not None:  # discrete: the share of steps whose action differs
        err, what = 1.0 - float(a["value"]), "differing actions"
    else:
        return Check(
            name, "action_error", False, None, limit, f"{name}: no trace replay to measure the action error"
        )
    ok = err <= limit
    why = " (reward not measured: the environment cannot run here)" if unmeasured else ""
    return Check(name, "action_error", ok, err, limit,
                 f"{name}: action error {what} {err:.4g} {'<=' if ok else '>'} {limit:g}{why}")  # fmt: skip


def _miss_check(name: str, loop: Any, limit: float) -> Check:
    rate = 100.0 * loop["miss_rate"]
    ok = rate <= limit
    return Check(name, "deadline_miss_rate", ok, rate, limit,
                 f"{name}: {loop['over_budget']} of {loop['steps']} steps over the {loop['budget_us']:.1f} us "
                 f"budget ({rate:.2f}% {'<=' if ok else '>'} {limit:g}%)")  # fmt: skip


def check_in_loop(report: dict[str, Any]) -> None:
    """--max-miss-rate needs every model's in-loop block (`bench --hz`): without it the gate cannot judge."""
    for m in report["models"]:
        loop = m.get("in_loop")
        if not isinstance(loop, dict) or not all(
            isinstance(loop.get(k), int | float) and not isinstance(loop.get(k), bool)
            for k in ("miss_rate", "over_budget", "steps", "budget_us")
        ):
            raise InputError(
                f"the report has no in-loop latency for {m['name']!r}, so --max-miss-rate has nothing to check",
                "bench with a control rate: `quarl-edge bench --bundle B --hz 50 --out REPORT.json`",
            )
        if not (0 <= loop["miss_rate"] <= 1 and 0 <= loop["over_budget"] <= loop["steps"]):  # nan fails too
            raise InputError(f"the report's in-loop figures for {m['name']!r} are not a share of steps",
                             "re-run `quarl-edge bench --hz`")  # fmt: skip


def check_rows(checks: list[Check]) -> list[list[str]]:
    """The gate's table: model, check, value, limit, result."""
    return [[c.model, c.name, "-" if c.value is None else f"{c.value:.4g}", f"{c.limit:g}",
             "pass" if c.passed else "FAIL"] for c in checks]  # fmt: skip


def junit_xml(report: dict[str, Any], checks: list[Check]) -> str:
    """One testcase per checked model and check (classname: the model, name: the check), in the
    JUnit XSD's shape (testsuites > testsuite[@tests] > testcase[@name] > failure[@message, @type]).
    Names and messages are cleaned of control characters, which XML 1.0 cannot hold even escaped."""
    failures = str(sum(not c.passed for c in checks))
    tests = str(len(checks))
    root = ET.Element("testsuites", {"tests": tests, "failures": failures, "errors": "0"})
    suite = ET.SubElement(root, "testsuite", {"name": clean(f"{SUITE} {report['bundle'].get('policy', '')}"),
                                              "tests": tests, "failures": failures, "errors": "0"})  # fmt: skip
    for c in checks:
        case = ET.SubElement(suite, "testcase", {"name": clean(c.name), "classname": clean(c.model)})
        if not c.passed:
            failure = ET.SubElement(case, "failure", {"message": clean(c.message), "type": "threshold"})
            failure.text = clean(c.message)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def markdown_summary(report: dict[str, Any], checks: list[Check]) -> str:
    ok = all(c.passed for c in checks)
    lines = [
        f"{MARKDOWN_TITLE} {'PASS' if ok else 'FAIL'} ({md_cell(report['bundle'].get('policy', ''))})",
        "",
        "| model | check | value | limit | result |",
        "|---|---|---|---|---|",
    ]
    for c in checks:
        v = "-" if c.value is None else f"{c.value:.4g}"
        cells = (md_cell(c.model), md_cell(c.name), v, f"{c.limit:g}", "pass" if c.passed else "**FAIL**")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_outputs(
    report: dict[str, Any],
    checks: list[Check],
    junit: Path | None,
    md: Path | None,
    reads: Iterable[tuple[str, Path | None]] = (),
) -> None:
    """Write the JUnit file and the Markdown summary; both targets are checked (outputs.claim) before
    either is written, and neither may be one of ``reads`` (the report)."""
    _write(junit, md, lambda: junit_xml(report, checks), lambda: markdown_summary(report, checks), reads)


def _write(junit: Path | None, md: Path | None, junit_text: Callable[[], str], md_text: Callable[[], str],
           reads: Iterable[tuple[str, Path | None]]) -> None:  # fmt: skip
    reads = list(reads)
    if junit:
        claim(junit, JUNIT, reads, flag="--junit")
    if md:
        claim(md, MARKDOWN, reads, flag="--markdown")
    if junit:
        atomic_write_text(junit, junit_text())
    if md:
        atomic_write_text(md, md_text())


# -- a fleet report (`bench --device a,b`): every device's section gated, each named ------------------


@dataclass(frozen=True)
class DeviceVerdict:
    device: str
    checks: list[Check]
    error: str | None = None
    """the bench did not finish on this device (the fleet report's ``failed``): nothing there can pass"""

    @property
    def passed(self) -> bool:
        return self.error is None and all(c.passed for c in self.checks)


def evaluate_fleet(fleet: dict[str, Any], cfg: GateConfig) -> list[DeviceVerdict]:
    """Every device's section through :func:`evaluate`; a device that did not finish fails; a section
    the gate cannot judge is an InputError naming its device."""
    out = []
    for dev in fleet["devices"]:
        section = fleet["reports"].get(dev)
        if section is None:
            out.append(DeviceVerdict(dev, [], str(fleet["failed"][dev].get("error"))))
            continue
        try:
            out.append(DeviceVerdict(dev, evaluate(section, cfg)))
        except InputError as e:
            raise InputError(f"device {dev!r}: {e.problem}", e.fix) from None
    return out


def fleet_check_rows(verdicts: list[DeviceVerdict]) -> list[list[str]]:
    """The fleet gate's table: device, model, check, value, limit, result."""
    rows = []
    for v in verdicts:
        if v.error is not None:
            rows.append([v.device, "-", "bench finished", "-", "-", "FAIL"])
        rows += [[v.device, *r] for r in check_rows(v.checks)]
    return rows


def fleet_failures(verdicts: list[DeviceVerdict]) -> list[str]:
    """One message per failure, each naming its device."""
    out = []
    for v in verdicts:
        if v.error is not None:
            out.append(f"{v.device}: the bench did not finish there ({v.error})")
        out += [f"{v.device}: {c.message}" for c in v.checks if not c.passed]
    return out


def fleet_junit_xml(fleet: dict[str, Any], verdicts: list[DeviceVerdict]) -> str:
    """One testsuite per device (named for it), one testcase per model and check as for one report; a
    device that did not finish has one failed testcase, ``bench``."""
    policy = fleet["bundle"].get("policy", "")
    counts = [(len(v.checks) + (v.error is not None), sum(not c.passed for c in v.checks) + (v.error is not None))
              for v in verdicts]  # fmt: skip
    root = ET.Element("testsuites", {"tests": str(sum(t for t, _ in counts)),
                                     "failures": str(sum(f for _, f in counts)), "errors": "0"})  # fmt: skip
    for v, (tests, failures) in zip(verdicts, counts, strict=True):
        suite = ET.SubElement(root, "testsuite", {"name": clean(f"{SUITE} {policy} on {v.device}"),
                                                  "tests": str(tests), "failures": str(failures), "errors": "0"})  # fmt: skip
        if v.error is not None:
            case = ET.SubElement(suite, "testcase", {"name": "bench", "classname": clean(v.device)})
            message = clean(f"{v.device}: the bench did not finish there ({v.error})")
            ET.SubElement(case, "failure", {"message": message, "type": "incomplete"}).text = message
        for c in v.checks:
            case = ET.SubElement(suite, "testcase", {"name": clean(c.name), "classname": clean(c.model)})
            if not c.passed:
                message = clean(f"{v.device}: {c.message}")
                ET.SubElement(case, "failure", {"message": message, "type": "threshold"}).text = message
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def fleet_markdown_summary(fleet: dict[str, Any], verdicts: list[DeviceVerdict]) -> str:
    ok = all(v.passed for v in verdicts)
    devices = ", ".join(md_cell(v.device) for v in verdicts)
    lines = [
        f"{MARKDOWN_TITLE} {'PASS' if ok else 'FAIL'} ({md_cell(fleet['bundle'].get('policy', ''))} on {devices})",
        "",
        "| device | model | check | value | limit | result |",
        "|---|---|---|---|---|---|",
    ]
    for row in fleet_check_rows(verdicts):
        cells = [md_cell(c) for c in row[:-1]] + ["pass" if row[-1] == "pass" else "**FAIL**"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_fleet_outputs(fleet: dict[str, Any], verdicts: list[DeviceVerdict], junit: Path | None, md: Path | None,
                        reads: Iterable[tuple[str, Path | None]] = ()) -> None:  # fmt: skip
    _write(junit, md, lambda: fleet_junit_xml(fleet, verdicts), lambda: fleet_markdown_summary(fleet, verdicts),
           reads)  # fmt: skip
