"""`quarl-edge inspect POLICY`: what was detected in a policy and what will be exported, before any export."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from quarl_edge.cli._options import AlgoOpt, CalibrationOpt, EnvOpt, IoOpt, JsonOpt, VecNormOpt
from quarl_edge.cli._output import handle_errors, print_json, table


def register(app: typer.Typer) -> None:
    app.command("inspect")(handle_errors(inspect))


def inspect(
    policy: Annotated[Path, typer.Argument(help="checkpoint folder, SB3 / sb3-contrib / RL Zoo .zip or folder, rsl_rl model_N.pt, or .onnx")],
    env: EnvOpt = None,
    algo: AlgoOpt = None,
    vecnormalize: VecNormOpt = None,
    io: IoOpt = None,
    calibration: CalibrationOpt = None,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """Source format, algorithm, spaces, layers, recurrent state, normalization and masks of a policy."""
    from quarl_edge.inspect import inspect_policy, lines

    ins = inspect_policy(
        policy, env_id=env, algo=algo, vecnormalize=vecnormalize, io=io, calibration=calibration
    )
    if as_json:
        print_json(ins.to_dict())
        return
    table(f"inspect {policy}", ["", ""], [[k, v] for k, v in lines(ins)])
