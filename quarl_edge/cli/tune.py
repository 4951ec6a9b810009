"""`quarl-edge tune`: the fastest model that keeps reward, chosen on the device (quarl_edge.tune)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from quarl_edge.cli._defaults import given
from quarl_edge.cli._options import (
    AddressOpt,
    AlgoOpt,
    EnvOpt,
    HostOpt,
    IdentityOpt,
    IoOpt,
    JsonOpt,
    NoRayOpt,
    PolicyOpt,
    PortOpt,
    UserOpt,
    VecNormOpt,
    WorkersOpt,
    name_list,
    out_option,
    overrides,
)
from quarl_edge.cli._output import handle_errors, info, print_json, progress_bar, table
from quarl_edge.tune.config import TuneConfig


def _default(name: str) -> str:
    """The config's default, for the help text (the CLI's own default is "not given")."""
    value = TuneConfig.__dataclass_fields__[name].default
    return f"{value:g}" if isinstance(value, float) else str(value)


def register(app: typer.Typer) -> None:
    app.command("tune")(handle_errors(tune))


def tune(
    policy: PolicyOpt,
    out: Annotated[Path, out_option("folder for tune.json/.md/.png and bundle/ (the chosen model)")],
    device: Annotated[str | None, typer.Option("--device", help=f"device profile name (default: {_default('device')})")] = None,
    max_reward_drop: Annotated[str | None, typer.Option("--max-reward-drop", help=f"in % of |fp32's mean return|: 2% or the fraction 0.02 (default {_default('max_reward_drop_pct')}%)")] = None,
    min_agreement: Annotated[float | None, typer.Option("--min-agreement", help="0..1; also the per-layer proxy")] = None,
    max_p99_ms: Annotated[float | None, typer.Option("--max-p99-ms", help="largest p99 latency in ms on the device")] = None,
    max_action_error: Annotated[float | None, typer.Option("--max-action-error", help="the verdict when the policy's environment cannot run here: largest action error vs fp32 on the --calibration observations (max |Δa|; discrete: share of differing actions)")] = None,
    budget_min: Annotated[float | None, typer.Option("--budget-min", help=f"stop with the best so far after M minutes (default {_default('budget_min')})")] = None,
    calibration: Annotated[Path | None, typer.Option("--calibration", help="recorded rollouts (.npz)")] = None,
    episodes: Annotated[int | None, typer.Option("--episodes", help=f"paired closed-loop episodes per candidate (default {_default('episodes')})")] = None,
    max_threads: Annotated[int | None, typer.Option("--max-threads", help="default: the device's cores")] = None,
    kinds: Annotated[str | None, typer.Option("--kinds", help="candidate families, e.g. int8-layers (default: all)")] = None,
    host: HostOpt = None,
    user: UserOpt = None,
    port: PortOpt = None,
    identity: IdentityOpt = None,
    env: EnvOpt = None,
    algo: AlgoOpt = None,
    vecnormalize: VecNormOpt = None,
    io: IoOpt = None,
    workers: WorkersOpt = None,
    no_ray: NoRayOpt = False,
    address: AddressOpt = None,
    sign: Annotated[Path | None, typer.Option("--sign", help="ed25519 private key: sign the candidates and the shipped bundle (for boards that accept only signed bundles)")] = None,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """Search formats, precisions, calibrations, float layers and threads on the device; keep the fastest that passes."""
    from quarl_edge.common.limits import parse_percent

    # every limit is checked here, before the policy is loaded: TuneConfig is light (no torch, no Ray)
    drop = None if max_reward_drop is None else parse_percent(max_reward_drop, "--max-reward-drop")
    cfg = TuneConfig(policy=policy, out=out, overrides=overrides(host, user, port, identity), min_agreement=min_agreement,
                     max_p99_ms=max_p99_ms, max_action_error=max_action_error, calibration=calibration, max_threads=max_threads, env=env, algo=algo,
                     vecnormalize=vecnormalize, io=io, ray=False if no_ray else None, address=address, kinds=name_list(kinds), sign_key=sign,
                     **given(device=device, max_reward_drop_pct=drop, budget_min=budget_min, episodes=episodes, workers=workers))  # fmt: skip
    if sign is not None:  # a bad key is refused before the search, not after it
        from quarl_edge.runtimes.signing import load_private_key

        load_private_key(sign)

    from quarl_edge.tune.report import columns, table_rows
    from quarl_edge.tune.search import STAGES, run_tune

    with progress_bar("tune", STAGES) as advance:
        result = run_tune(cfg, log=info, stage=advance)
    if as_json:
        print_json(result.to_dict())
        return
    emulated = " (emulated)" if result.device.emulated else ""
    table(f"tune {result.policy} on {result.device.name}{emulated}", columns(result), table_rows(result))
    c = result.choice
    if c is not None:
        info(f"chosen: {c.name} at {c.threads} thread(s), {c.speedup_vs_fp32:.2f}x fp32's p50 (model sha256 "
             f"{c.sha256[:12]}); search {result.search_s} s; next: quarl-edge gate {out / 'tune.json'}")  # fmt: skip
