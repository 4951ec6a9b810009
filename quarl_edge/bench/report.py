"""Bench reports: write (JSON + Markdown beside it), read back with validation, render as a table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quarl_edge.bench.run import REPORT_FORMAT, REPORT_VERSION, finite_json
from quarl_edge.outputs import Kind, json_format, text_starts_with
from quarl_edge.parity import parity_line
from quarl_edge.runtimes import schema
from quarl_edge.runtimes.artifact import read_artifact
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.facts import facts_text
from quarl_edge.runtimes.fsutil import atomic_write_json, atomic_write_text
from quarl_edge.text import md_cell

MARKDOWN_TITLE = "# quarl-edge bench:"
REPORT = Kind("bench report", False, lambda p: json_format(p) == REPORT_FORMAT)
REPORT_MARKDOWN = Kind("bench report Markdown", False, text_starts_with(MARKDOWN_TITLE))
COLUMNS = ("model", "size", "p50 us", "p99 us", "speedup", "reward", "drop", "drop 95% CI", "agree")


IN_LOOP_COLUMNS = ("loop p99 us", "loop p99.9 us", "loop max us", "miss")
"""with `bench --hz`: act() inside the closed-loop episodes, and the share of steps over the budget"""
_TIMES = ("p50 us", "p99 us", "speedup", "loop p99 us", "loop p99.9 us", "loop max us", "miss")


def _has_in_loop(report: dict[str, Any]) -> bool:
    return (report.get("settings") or {}).get("hz") is not None


def columns(report: dict[str, Any]) -> tuple[str, ...]:
    """COLUMNS (+ IN_LOOP_COLUMNS with --hz), with the latency columns marked when the device is
    emulated (qemu's time, not the board's)."""
    cols = COLUMNS + (IN_LOOP_COLUMNS if _has_in_loop(report) else ())
    if not (report.get("device") or {}).get("emulated"):
        return cols
    return tuple(f"{c} (emulated)" if c in _TIMES else c for c in cols)


def runtimes_line(report: dict[str, Any]) -> str:
    """Which runtime (and version) ran each model where the bench ran, and the one the bundle was checked
    with when that differs (e.g. an older LiteRT on a board without wheels of the host's)."""
    where = "on the device" if (report.get("device") or {}).get("transport", "local") != "local" else "here"
    by_runtime: dict[str, list[str]] = {}
    for m in report["models"]:
        runtime = str(m.get("runtime") or "?")
        label = m["name"]
        checked = [str(v) for v in (m.get("toolchain") or {}).values()]
        dist = runtime.rsplit(" ", 1)[0]
        other = [v for v in checked if v.rsplit(" ", 1)[0] == dist and v != runtime]
        if other:
            label += f" (bundle checked with {other[0]})"
        by_runtime.setdefault(runtime, []).append(label)
    return f"Runtimes {where}: " + "; ".join(f"{r}: {', '.join(ms)}" for r, ms in by_runtime.items()) + "."


def _f(x: Any, fmt: str = "{:.2f}", none: str = "-") -> str:
    return none if x is None else fmt.format(x + 0.0)  # + 0.0 turns -0.0 into 0.0


def rows(report: dict[str, Any]) -> list[list[str]]:
    out = []
    for m in report["models"]:
        lat = m.get("latency") or {}
        rew = m.get("reward") or {}
        drift = m.get("drift") or {}
        ci = drift.get("rel_ci95") or [None, None]
        agree = m.get("agreement") or {}
        out.append(
            [
                m["name"],
                f"{m['size_bytes'] / 1024:.1f} KiB",
                _f(lat.get("p50_us"), "{:.1f}"),
                _f(lat.get("p99_us"), "{:.1f}"),
                _f(m.get("speedup_p50_vs_ref"), "{:.2f}x"),
                "not measured"
                if report.get("reward_not_measured")
                else f"{_f(rew.get('mean'), '{:.1f}')} ± {_f(rew.get('std'), '{:.1f}')}",
                "ref" if m["name"] == report["reference"] else _f(drift.get("reward_drop_pct"), "{:+.2f}%"),
                "" if None in ci else f"[{-100 * ci[1] + 0.0:+.2f}%, {-100 * ci[0] + 0.0:+.2f}%]",
                _f(agree.get("value"), "{:.3f}", ""),
            ]
        )
        if _has_in_loop(report):
            loop = m.get("in_loop") or {}
            out[-1] += [_f(loop.get(k), "{:.1f}") for k in ("p99_us", "p999_us", "max_us")]
            out[-1].append(_f(None if loop.get("miss_rate") is None else 100 * loop["miss_rate"], "{:.2f}%"))
    return out


def in_loop_line(report: dict[str, Any]) -> str:
    """What the in-loop columns count (with --hz), one line."""
    hz = (report.get("settings") or {}).get("hz")
    if hz is None:
        return ""
    return (f"loop: act() timed inside the closed-loop episodes, between real env steps (env.step not "
            f"counted); miss: share of steps whose act() took over the {1e6 / hz:.1f} us budget of "
            f"{hz:g} Hz; tight-loop p50/p99 beside it are the best case.")  # fmt: skip


def _reading(readings: list[Any], key: str) -> tuple[float, float] | None:
    """A reading's value (max temperature, mean clock) before the loop and after it."""
    vals = []
    for r in (readings[0], readings[-1]) if readings else ():
        v = r.get(key) if isinstance(r, dict) else None
        nums = list(v.values()) if isinstance(v, dict) else v if isinstance(v, list) else []
        nums = [x for x in nums if isinstance(x, int | float) and not isinstance(x, bool)]
        vals.append((max(nums) if key == "temp_c" else sum(nums) / len(nums)) if nums else None)
    return (vals[0], vals[1]) if len(vals) == 2 and None not in vals else None  # type: ignore[return-value]


def sustained_lines(report: dict[str, Any]) -> list[str]:
    """One line per model with `bench --duration`: latency first and last second, temperature, clock,
    throttling before → after, or what the board does not expose."""
    out = []
    for m in report["models"]:
        b = m.get("sustained")
        if not isinstance(b, dict):
            continue
        readings: list[Any] = b["readings"] if isinstance(b.get("readings"), list) else []
        parts = [f"{m['name']} sustained {b.get('duration_s')} s: {b.get('calls')} calls, p50 "
                 f"{_f(b.get('first_p50_us'), '{:.1f}')} → {_f(b.get('last_p50_us'), '{:.1f}')} us "
                 f"(x{_f(b.get('slowdown'), '{:.2f}')})"]  # fmt: skip
        temp, clock = _reading(readings, "temp_c"), _reading(readings, "freq_mhz")
        if temp:
            parts.append(
                f"temperature {temp[0]:.1f} → {temp[1]:.1f} °C (max {_f(b.get('max_temp_c'), '{:.1f}')})"
            )
        if clock:
            parts.append(
                f"clock {clock[0]:.0f} → {clock[1]:.0f} MHz (drop {_f(b.get('clock_drop_pct'), '{:.0f}')}%)"
            )
        if "throttling" not in (b.get("not_exposed") or []):
            parts.append(f"throttling: {', '.join(map(str, b.get('throttle_flags') or [])) or 'none'}")
        hidden = [str(x) for x in b.get("not_exposed") or []]
        if hidden:
            why = " (emulated: the sensors there are the host's)" if b.get("emulated") else ""
            parts.append(f"{', '.join(hidden)} not exposed{why}")
        out.append("; ".join(parts))
    return out


def print_lines(report: dict[str, Any], out: Path | None) -> tuple[list[tuple[str, str]], str, list[str]]:
    """What `quarl-edge bench` prints around its table: (label, line) pairs before (warnings, labelled
    "warning:", and the harness line), the table's title, and the runtimes line and the files written
    after. Plain text: names and warnings come from the bundle and the device."""
    before = [("warning:", f"{m['name']}: {w}") for m in report["models"] for w in m["warnings"]]
    if harness_line(report):
        before.append(("", harness_line(report)))
    dev = report["device"]
    emulated = ", emulated: latency is qemu's, not the board's" if dev.get("emulated") else ""
    threads = report["settings"]["threads"]
    title = f"{report['bundle']['policy']} on {dev['name']} ({threads} thread{emulated})"
    after = [runtimes_line(report)] + ([in_loop_line(report)] if _has_in_loop(report) else [])
    if report.get("reward_not_measured"):
        after.append(f"reward: not measured ({report['reward_not_measured']}); latency and the action error "
                     "against fp32 on the recorded observations were")  # fmt: skip
        after.extend(action_error_lines(report))
    if report.get("source_parity"):
        after.append(parity_line(report["source_parity"]))
    after += sustained_lines(report)
    if dev.get("machine"):
        after.append(f"device: {facts_text(dev)}")
    if out is not None:
        after.append(
            f"report: {out} and {out.with_suffix('.md')}; next: quarl-edge gate {out} --max-reward-drop 2%"
            + (" --max-miss-rate 1%" if _has_in_loop(report) else "")
        )
    return before, title, after


def action_error_lines(report: dict[str, Any]) -> list[str]:
    """Each quantized model's action error against fp32 on the trace, in action units."""
    out = []
    for m in report["models"]:
        a = m.get("agreement") or {}
        if a.get("max_abs_diff") is not None:
            out.append(f"{m['name']}: action error vs fp32 mean {a['mean_abs_diff']:.4g}, p99 {a['p99_abs_diff']:.4g}, "
                       f"max {a['max_abs_diff']:.4g} (action units, {a['samples']} observations)")  # fmt: skip
    return out


def harness_line(report: dict[str, Any]) -> str:
    """The harness's own overhead (connect, cache check / upload, device info, runner start-up), one line."""
    h = report.get("harness") or {}
    start = list((h.get("runner_startup_s") or {}).values())
    parts = []
    if h.get("connect_s") is not None:
        parts.append(f"connect {h['connect_s']:.3f} s")
    if h.get("cache_check_s") is not None:
        sent = h.get("uploaded_bytes") or 0
        what = (
            f"uploaded {sent / 1024:.0f} KiB in {h['upload_s']:.3f} s"
            if sent
            else "nothing uploaded (cached)"
        )
        parts.append(f"cache check {h['cache_check_s']:.3f} s, {what}")
    if h.get("info_s") is not None:
        parts.append(f"device info {h['info_s']:.3f} s")
    if start:
        parts.append(f"runner start-up {sum(start) / len(start):.3f} s per model")
    return "harness: " + "; ".join(parts) if parts else ""


def markdown(report: dict[str, Any]) -> str:
    b, d, s = report["bundle"], report["device"], report["settings"]
    emulated = (
        " (emulated: latency is qemu's emulation of the board, not board latency)"
        if d.get("emulated")
        else ""
    )
    if d.get("machine"):  # facts the device reported about itself (SSH devices)
        emulated += f"; {d['machine']}, {d.get('cpu_model') or '?'}, Python {d.get('python') or '?'}"
    # every name and fact is text from the bundle or the device: md_cell keeps each in its cell / line
    lines = [
        f"{MARKDOWN_TITLE} {md_cell(b['policy'])} ({md_cell(b['algo'])}, {md_cell(b['env'])})",
        "",
        f"Device: **{md_cell(d.get('name', 'local'))}**{md_cell(emulated)}; threads {s['threads']}; "
        f"{s['episodes']} paired episodes (seeds {s['seeds'][0] if s['seeds'] else '-'}..); "
        f"reference **{md_cell(report['reference'])}**.",
        "",
        md_cell(runtimes_line(report)),
        "",
        *([f"Device facts: {md_cell(facts_text(d))}.", ""] if d.get("machine") else []),
        "| " + " | ".join(columns(report)) + " |",
        "|" + "---|" * len(columns(report)),
    ]
    lines += ["| " + " | ".join(md_cell(c) for c in r) + " |" for r in rows(report)]
    sustained = sustained_lines(report)
    if sustained:
        lines += [
            "",
            "Sustained loop (`--duration`), per one-second window:",
            *[f"- {md_cell(x)}" for x in sustained],
        ]
    warn = [f"- {md_cell(m['name'])}: {md_cell(w)}" for m in report["models"] for w in m.get("warnings", [])]
    if warn:
        lines += ["", "Warnings:", *warn]
    if _has_in_loop(report):
        first = [f"{md_cell(m['name'])} {m['first_inference_ms']:.2f} ms" for m in report["models"]
                 if isinstance(m.get("first_inference_ms"), int | float)]  # fmt: skip
        lines += ["", md_cell(in_loop_line(report)), "", "First call after load: " + ", ".join(first) + "."]
    lines += ["", "drift: mean paired reward change vs the reference, as a drop in % of its mean return "
              "(negative = better); agree: exact action match (discrete) or 1 - mean |Δa|/range (continuous)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], path: str | Path) -> tuple[Path, Path]:
    path = Path(path)
    if path.suffix != ".json":
        raise InputError(f"report path {str(path)!r} must end in .json", "e.g. --out reports/policy.json")
    md = path.with_suffix(".md")
    atomic_write_json(path, finite_json(report))
    atomic_write_text(md, markdown(report))
    return path, md


_REQUIRED_MODEL_FIELDS = ("name", "precision", "size_bytes", "latency", "reward", "drift", "agreement")


def read_report(path: str | Path) -> dict[str, Any]:
    """Load a report and check the fields the gate needs; any defect is an InputError (exit 2)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(
            f"report {str(path)!r} does not exist", "write one with `quarl-edge bench --out FILE.json`"
        )
    report = read_artifact(path, REPORT_FORMAT, REPORT_VERSION, "bench report", "re-run `quarl-edge bench`")
    check_report(report, f"report {str(path)!r}")
    return report


def check_report(report: dict[str, Any], where: str) -> None:
    """The fields the gate and the tables read, each of the right type; ``where`` names the report in
    errors (a file, or a device's section of a fleet report)."""
    fix = "re-run `quarl-edge bench`"
    for key in ("reference", "models", "bundle", "device", "settings"):
        if key not in report:
            raise InputError(f"{where} lacks the field {key!r}", fix)
    if not isinstance(report["models"], list) or not report["models"]:
        raise InputError(f"{where} has no models", fix)
    for i, m in enumerate(report["models"]):
        missing = [k for k in _REQUIRED_MODEL_FIELDS if not isinstance(m, dict) or k not in m]
        if missing:
            name = m.get("name", f"#{i}") if isinstance(m, dict) else f"#{i}"
            raise InputError(f"{where}: model {name} lacks the field {missing[0]!r}", fix)
    for key in ("bundle", "device", "settings"):
        schema.obj(report[key], f"{where} {key}", fix)
    if report.get("harness") is not None:
        schema.obj(report["harness"], f"{where} harness", fix)
    for m in report["models"]:
        _check_model(m, where)
    if report["reference"] not in [m["name"] for m in report["models"]]:
        raise InputError(f"{where}: reference model is missing", fix)


# the numbers the gate and the tables read, per model: (block, field); the block may be null
_MODEL_NUMBERS = (("drift", "reward_drop_pct"), ("agreement", "value"), ("latency", "p50_us"), ("latency", "p99_us"),
                  ("reward", "mean"), ("reward", "std"), ("in_loop", "miss_rate"), ("in_loop", "p99_us"),
                  ("in_loop", "p999_us"), ("in_loop", "max_us"), ("in_loop", "hz"), ("sustained", "slowdown"),
                  ("sustained", "clock_drop_pct"), ("sustained", "max_temp_c"))  # fmt: skip


def _check_model(m: dict[str, Any], where: str) -> None:
    fix = "re-run `quarl-edge bench`"
    name = schema.text(m["name"], f"{where}: a model name", fix, 256)
    schema.text(m["precision"], f"{where}: {name} precision", fix, 32)
    size = m["size_bytes"]
    if size is not None:
        schema.number(size, f"{where}: {name} size_bytes", fix)
    for block, key in _MODEL_NUMBERS:
        b = m.get(block)
        if b is None:
            continue
        schema.obj(b, f"{where}: {name} {block}", fix)
        if b.get(key) is not None:
            schema.number(b[key], f"{where}: {name} {block}.{key}", fix, finite=False)
    warnings = m.get("warnings") or []
    if not isinstance(warnings, list):
        raise InputError(f"{where}: {name} warnings is not a list", fix)
    for w in warnings:
        schema.text(w, f"{where}: {name} warning", fix)
