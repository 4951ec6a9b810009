"""`quarl-edge field pull|report`: a board's field logs to the host, and what they say about the deployed
model (devices/field.py, quarl_edge/field/)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

from quarl_edge.cli._options import HostOpt, IdentityOpt, JsonOpt, PortOpt, UserOpt, out_option, overrides
from quarl_edge.cli._output import handle_errors, info, print_json, table

field_app = typer.Typer(
    help="Field logs (load_policy(..., log_dir=...) on a board): pull them, report the deployed model vs fp32.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    field_app.command("pull")(handle_errors(pull))
    field_app.command("report")(handle_errors(report))
    app.add_typer(field_app, name="field")


def pull(
    device: Annotated[str, typer.Option("--device", help="an SSH board's profile name")],
    out: Annotated[Path | None, out_option("folder of pulled logs (default: field-logs/DEVICE)")] = None,
    remote: Annotated[str | None, typer.Option("--from", help="the board's log folder, or a folder of them (default: ~/.local/share/quarl-edge/field)")] = None,
    as_json: JsonOpt = False,
    host: HostOpt = None,
    user: UserOpt = None,
    port: PortOpt = None,
    identity: IdentityOpt = None,
) -> None:  # fmt: skip
    """Fetch a board's field logs over SSH (resumable: what is here with the board's sha256 is kept)."""
    from quarl_edge.devices.field import FIELD_ROOT
    from quarl_edge.devices.field import pull as run

    target = out or Path("field-logs") / device
    r = run(device, target, remote or FIELD_ROOT, overrides(host, user, port, identity), log=info)
    if as_json:
        print_json({"device": r.device, "remote": r.remote, "logs": [asdict(g) for g in r.logs]})
        return
    rows = [[g.name, g.policy, g.model, str(g.records), str(g.chunks), str(g.fetched), str(g.kept), str(g.gone),
             f"{g.bytes / 2**20:.2f} MiB"] for g in r.logs]  # fmt: skip
    table(f"field logs of {r.device} ({r.remote}) in {target}",
          ["log", "policy", "model", "records", "chunks", "fetched", "kept", "rotated away", "fetched size"], rows)  # fmt: skip
    first = r.logs[0]
    info(f"next: quarl-edge field report {first.local} --bundle BUNDLE --out reports/field-{first.name}")


def report(
    logs: Annotated[Path, typer.Argument(help="a field log folder (pulled, or written here)")],
    bundle: Annotated[Path, typer.Option("--bundle", help="the bundle the log was written with (or, with --replay, another of that policy)")],
    out: Annotated[Path | None, out_option("report folder: field.json, field.md, PNG plots (default: reports/field-LOGNAME)")] = None,
    model: Annotated[str | None, typer.Option("--model", help="the model to evaluate (default: the logged one)")] = None,
    replay: Annotated[bool, typer.Option("--replay", help="evaluate another bundle of the policy on the logged observations (e.g. a re-export calibrated on them)")] = False,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """The deployed model vs the bundle's fp32 on the field observations: agreement, action error over time,
    out-of-range rate per feature, act() latency in the field."""
    from quarl_edge.field.render import write_field_report
    from quarl_edge.field.report import field_report

    out = out or Path("reports") / f"field-{logs.resolve().name}"
    r = field_report(logs, bundle, model, replay)
    r = write_field_report(r, out, [("field log", logs), ("bundle", bundle)])
    if as_json:
        print_json(r.to_dict())
        return
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    rows = [["agreement with fp32", f"{r.agreement:.4f}"],
            ["  inside / outside the calibration range", f"{_f(r.agreement_in_range)} / {_f(r.agreement_out_of_range)}"],
            ["action error" + (" (share differing)" if r.discrete else " (p99, action units)"), f"{r.action_error:.4g}"],
            ["out of the calibration range", pct(r.out_of_range_rate)],
            ["act() in the field p50 / p99", "-" if r.latency is None else f"{r.latency.p50_us:.1f} / {r.latency.p99_us:.1f} us"]]  # fmt: skip
    table(f"{r.policy} {r.model} vs {r.reference} on {r.compared} field records" + (" (replay)" if r.replay else ""),
          ["figure", "value"], rows)  # fmt: skip
    info(f"wrote {out}/field.json, field.md and {len(r.plots)} plots")
    info(f"next: quarl-edge gate {out} --max-action-error X --max-out-of-range 5%")


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"
