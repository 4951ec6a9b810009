"""`quarl-edge gate FIELD_REPORT --max-action-error X --max-out-of-range R%`: the field report's checks.

A field report has no reward and no bench latency: the bench's thresholds (--max-reward-drop,
--max-p99-ms, --max-miss-rate) do not apply to it and are refused when given, as --max-out-of-range is for a bench
report; --min-agreement and --max-action-error apply to both (here: on the field's observations)."""

from __future__ import annotations

from quarl_edge.gate import Check, GateConfig
from quarl_edge.runtimes.errors import InputError

from .report import FieldReport

BENCH_ONLY = (("--max-reward-drop", "max_reward_drop_pct"), ("--max-p99-ms", "max_p99_ms"),
              ("--max-miss-rate", "max_miss_rate_pct"))  # fmt: skip
FIELD_ONLY = (("--max-out-of-range", "max_out_of_range_pct"),)


def refuse_thresholds(cfg: GateConfig, field: bool) -> None:
    """A threshold the report cannot answer is the user's mistake, not a silent pass (InputError)."""
    wrong = BENCH_ONLY if field else FIELD_ONLY
    given = [flag for flag, attr in wrong if getattr(cfg, attr) is not None]
    if given:
        what = ("a field report (it has no reward or bench latency)" if field
                else "a bench report (they are a field report's: `quarl-edge field report`)")  # fmt: skip
        raise InputError(f"{given[0]} does not apply to {what}",
                         "use --max-action-error / --max-out-of-range / --min-agreement on a field report, the "
                         "others on a bench report")  # fmt: skip


def evaluate_field(report: FieldReport, cfg: GateConfig) -> list[Check]:
    """The field report's checks, in the order of the flags; a config with none is an InputError."""
    refuse_thresholds(cfg, field=True)
    if cfg.max_action_error is None and cfg.max_out_of_range_pct is None and cfg.min_agreement is None:
        raise InputError("nothing to check on a field report",
                         "pass --max-action-error, --max-out-of-range or --min-agreement")  # fmt: skip
    m, checks = report.model, []
    if cfg.max_action_error is not None:
        limit, err = cfg.max_action_error, report.action_error
        what = "share of actions differing from fp32" if report.discrete else "action error p99 vs fp32"
        ok = err <= limit
        checks.append(Check(m, "field_action_error", ok, err, limit,
                            f"{m}: {what} on {report.compared} field observations {err:.4g} "
                            f"{'<=' if ok else '>'} {limit:g}" + ("" if ok else f" (over by {err - limit:.4g})")))  # fmt: skip
    if cfg.max_out_of_range_pct is not None:
        limit = cfg.max_out_of_range_pct
        if report.out_of_range_rate is None:
            checks.append(Check(m, "field_out_of_range", False, None, limit,
                                f"{m}: the bundle records no calibration range to count against"))  # fmt: skip
        else:
            pct = 100.0 * report.out_of_range_rate
            ok = pct <= limit
            checks.append(Check(m, "field_out_of_range", ok, pct, limit,
                                f"{m}: {pct:.2f}% of the field observations outside the calibration range "
                                f"({'<=' if ok else '>'} {limit:g}%)", unit="%"))  # fmt: skip
    if cfg.min_agreement is not None:
        limit, agree = cfg.min_agreement, report.agreement
        ok = agree >= limit
        checks.append(Check(m, "field_agreement", ok, agree, limit,
                            f"{m}: agreement with fp32 in the field {agree:.4f} {'>=' if ok else '<'} {limit:g}"))  # fmt: skip
    return checks
