"""One device's bench report as text: its table (terminal and Markdown), the lines around it, its Markdown.

Plain text: names, warnings and facts come from the bundle and the device; md_cell keeps each in its
Markdown cell or line. The report as a whole (a fleet, or one device) is bench/report.py.
"""

from __future__ import annotations

from quarl_edge.bench.result import BenchReport, ModelResult
from quarl_edge.common.markdown import markdown_table
from quarl_edge.runtimes.facts import facts_text
from quarl_edge.runtimes.thermal import ThermalReading
from quarl_edge.text import md_cell

MARKDOWN_TITLE = "# quarl-edge bench:"
DEFINITIONS = (
    "drop: the mean paired reward change vs the reference, in % of |the reference's mean return|; positive = "
    "worse whatever the sign of the returns (-200 -> -210 is a drop of +5%), and with a reference mean of 0 "
    "in hundredths of a reward unit. agree: the share of equal actions (discrete), or 1 - mean |Δa| / action "
    "range, each dimension's error capped at its whole range (continuous), on the bundle's recorded trace."
)
"""how the report's drop and agreement are defined, said once in every Markdown report (docs/usage.md too)"""
COLUMNS = ("model", "size", "p50 us", "p99 us", "speedup", "reward", "drop", "drop 95% CI", "agree")
IN_LOOP_COLUMNS = ("loop p50 us", "loop p99 us", "loop max us", "no warm-up p50 / p99 us", "miss")
"""with `bench --hz`: act() inside the closed-loop episodes paced at the rate (with the loop runner's warm-up;
beside it, the steps without), and the share of warmed-up steps over the budget"""
_TIMES = ("p50 us", "p99 us", "speedup", *IN_LOOP_COLUMNS)


def columns(report: BenchReport) -> tuple[str, ...]:
    """COLUMNS (+ IN_LOOP_COLUMNS with --hz), with the latency columns marked when the device is
    emulated (qemu's time, not the board's)."""
    cols = COLUMNS + (IN_LOOP_COLUMNS if report.has_in_loop else ())
    if not report.device.emulated:
        return cols
    return tuple(f"{c} (emulated)" if c in _TIMES else c for c in cols)


def runtimes_line(report: BenchReport) -> str:
    """Which runtime (and version) ran each model where the bench ran, and the one the bundle was checked
    with when that differs (e.g. an older LiteRT on a board without wheels of the host's)."""
    where = "on the device" if report.device.remote else "here"
    by_runtime: dict[str, list[str]] = {}
    for m in report.models:
        label = m.name
        dist = m.runtime.rsplit(" ", 1)[0]
        other = [v for v in m.toolchain.values() if v.rsplit(" ", 1)[0] == dist and v != m.runtime]
        if other:
            label += f" (bundle checked with {other[0]})"
        by_runtime.setdefault(m.runtime, []).append(label)
    return f"Runtimes {where}: " + "; ".join(f"{r}: {', '.join(ms)}" for r, ms in by_runtime.items()) + "."


def _f(x: float | None, fmt: str = "{:.2f}", none: str = "-") -> str:
    return none if x is None else fmt.format(x + 0.0)  # + 0.0 turns -0.0 into 0.0


def _row(report: BenchReport, m: ModelResult) -> list[str]:
    lat, drift = m.latency, m.drift
    lo, hi = drift.drop_ci95_pct if drift else (None, None)
    row = [
        m.name,
        f"{m.size_bytes / 1024:.1f} KiB",
        _f(lat.p50_us if lat else None, "{:.1f}"),
        _f(lat.p99_us if lat else None, "{:.1f}"),
        _f(m.speedup_p50_vs_ref, "{:.2f}x"),
        "not measured"
        if report.reward_not_measured
        else f"{_f(m.reward.mean, '{:.1f}')} ± {_f(m.reward.std, '{:.1f}')}",
        "ref" if m.name == report.reference else _f(drift.reward_drop_pct if drift else None, "{:+.2f}%"),
        "" if lo is None or hi is None else f"[{lo + 0.0:+.2f}%, {hi + 0.0:+.2f}%]",
        _f(m.agreement.value if m.agreement else None, "{:.3f}", ""),
    ]
    if report.has_in_loop:
        loop = m.in_loop
        row += [_f(getattr(loop, k) if loop else None, "{:.1f}") for k in ("p50_us", "p99_us", "max_us")]
        cold = (loop.no_warmup_p50_us, loop.no_warmup_p99_us) if loop else (None, None)
        row.append("-" if cold[0] is None else f"{_f(cold[0], '{:.1f}')} / {_f(cold[1], '{:.1f}')}")
        row.append(_f(100 * loop.miss_rate if loop else None, "{:.2f}%"))
    return row


def rows(report: BenchReport) -> list[list[str]]:
    return [_row(report, m) for m in report.models]


def in_loop_line(report: BenchReport) -> str:
    """What the in-loop columns count (with --hz), one line."""
    hz = report.settings.hz
    if hz is None:
        return ""
    loops = [m.in_loop for m in report.models if m.in_loop is not None]
    paced = loops and all(x.paced for x in loops)
    how = (f"paced at {hz:g} Hz in the loop runner (real idle time between steps; OS settings applied: "
           f"{', '.join(loops[0].os_settings) or 'none'}), with its warm-up before every other step: 'loop' "
           "over those, 'no warm-up' over the others; " if paced else "")  # fmt: skip
    overruns = sum(x.overruns for x in loops)
    return (f"loop: act() timed inside the closed-loop episodes, {how}env.step not counted; miss: share of "
            f"warmed-up steps whose act() took over the {1e6 / hz:.1f} us budget"
            + (f"; {overruns} steps overran the period (act + env.step), each followed by a skip, never a burst"
               if overruns else "") + "; tight-loop p50/p99 beside it are the best case.")  # fmt: skip


def _reading(readings: list[ThermalReading], key: str) -> tuple[float, float] | None:
    """A reading's value (max temperature, mean clock) before the loop and after it."""
    vals: list[float] = []
    for r in (readings[0], readings[-1]) if readings else ():
        if key == "temp_c" and r.temp_c:
            vals.append(max(r.temp_c.values()))
        elif key == "freq_mhz" and r.freq_mhz:
            vals.append(sum(r.freq_mhz) / len(r.freq_mhz))
    return (vals[0], vals[1]) if len(vals) == 2 else None


def sustained_lines(report: BenchReport) -> list[str]:
    """One line per model with `bench --duration`: latency first and last second, temperature, clock,
    throttling before → after, or what the board does not expose."""
    out = []
    for m in report.models:
        b = m.sustained
        if b is None:
            continue
        parts = [f"{m.name} sustained {b.duration_s} s: {b.calls} calls, p50 {b.first_p50_us:.1f} → "
                 f"{b.last_p50_us:.1f} us (x{b.slowdown:.2f})"]  # fmt: skip
        temp, clock = _reading(b.readings, "temp_c"), _reading(b.readings, "freq_mhz")
        if temp:
            parts.append(f"temperature {temp[0]:.1f} → {temp[1]:.1f} °C (max {_f(b.max_temp_c, '{:.1f}')})")
        if clock:
            parts.append(
                f"clock {clock[0]:.0f} → {clock[1]:.0f} MHz (drop {_f(b.clock_drop_pct, '{:.0f}')}%)"
            )
        if "throttling" not in b.not_exposed:
            parts.append(f"throttling: {', '.join(b.throttle_flags) or 'none'}")
        if b.not_exposed:
            why = " (emulated: the sensors there are the host's)" if b.emulated else ""
            parts.append(f"{', '.join(b.not_exposed)} not exposed{why}")
        out.append("; ".join(parts))
    return out


def harness_line(report: BenchReport) -> str:
    """The harness's own overhead (connect, cache check / upload, device info, runner start-up), one line."""
    h = report.harness
    if h is None:
        return ""
    start = list(h.runner_startup_s.values())
    parts = []
    if h.connect_s is not None:
        parts.append(f"connect {h.connect_s:.3f} s")
    if h.cache_check_s is not None:
        sent = h.uploaded_bytes or 0
        what = (
            f"uploaded {sent / 1024:.0f} KiB in {h.upload_s or 0.0:.3f} s"
            if sent
            else "nothing uploaded (cached)"
        )
        parts.append(f"cache check {h.cache_check_s:.3f} s, {what}")
    if h.info_s is not None:
        parts.append(f"device info {h.info_s:.3f} s")
    if start:
        parts.append(f"runner start-up {sum(start) / len(start):.3f} s per model")
    return "harness: " + "; ".join(parts) if parts else ""


def warnings(report: BenchReport) -> list[tuple[str, str]]:
    """(model, warning) for every model's warnings."""
    return [(m.name, w) for m in report.models for w in m.warnings]


def markdown(report: BenchReport) -> str:
    """One device's report in Markdown: its title, the device, the table, the notes."""
    b, d, s = report.bundle, report.device, report.settings
    emulated = (
        " (emulated: latency is qemu's emulation of the board, not board latency)" if d.emulated else ""
    )
    facts = dict(d.facts)
    if facts.get("machine"):  # facts the device reported about itself (SSH devices)
        emulated += (
            f"; {facts['machine']}, {facts.get('cpu_model') or '?'}, Python {facts.get('python') or '?'}"
        )
    lines = [
        f"{MARKDOWN_TITLE} {md_cell(b.policy)} ({md_cell(b.algo)}, {md_cell(b.env)})",
        "",
        f"Device: **{md_cell(d.name)}**{md_cell(emulated)}; threads {s.threads}; "
        f"{s.episodes} paired episodes (seeds {s.seeds[0] if s.seeds else '-'}..); "
        f"reference **{md_cell(report.reference)}**.",
        "",
        md_cell(runtimes_line(report)),
        "",
        *([f"Device facts: {md_cell(facts_text(facts))}.", ""] if facts.get("machine") else []),
        *markdown_table(columns(report), rows(report)),
    ]
    sustained = sustained_lines(report)
    if sustained:
        lines += [
            "",
            "Sustained loop (`--duration`), per one-second window:",
            *[f"- {md_cell(x)}" for x in sustained],
        ]
    warn = [f"- {md_cell(name)}: {md_cell(w)}" for name, w in warnings(report)]
    if warn:
        lines += ["", "Warnings:", *warn]
    if report.has_in_loop:
        first = [f"{md_cell(m.name)} {m.first_inference_ms:.2f} ms" for m in report.models]
        lines += ["", md_cell(in_loop_line(report)), "", "First call after load: " + ", ".join(first) + "."]
    lines += ["", DEFINITIONS]
    return "\n".join(lines) + "\n"


def not_measured_lines(report: BenchReport) -> list[str]:
    """A report whose reward was not measured (no env here): why, and each model's action error."""
    if not report.reward_not_measured:
        return []
    out = [f"reward: not measured ({report.reward_not_measured}); latency and the action error against fp32 "
           "on the recorded observations were"]  # fmt: skip
    for m in report.models:
        a = m.agreement
        if a is not None and a.max_abs_diff is not None:
            out.append(f"{m.name}: action error vs fp32 mean {_f(a.mean_abs_diff, '{:.4g}')}, p99 "
                       f"{_f(a.p99_abs_diff, '{:.4g}')}, max {a.max_abs_diff:.4g} (action units, {a.samples} observations)")  # fmt: skip
    return out
