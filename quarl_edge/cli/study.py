"""`quarl-edge study ptq|qat|actorq`: the paper's experiments, each a thin command over quarl_edge.study.

Each command imports its study inside (they load numpy, and torch when they run); an option not given
is None and the study config's default stands, shown in the help from its source (cli/_defaults.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from quarl_edge.cli._defaults import given, source_default
from quarl_edge.cli._options import (
    AddressOpt,
    JsonOpt,
    NoRayOpt,
    QatActivationsOpt,
    QatScopeOpt,
    WorkersOpt,
    ZooOpt,
    int_list,
    name_list,
    out_option,
)
from quarl_edge.cli._output import handle_errors, info, print_json, table

PTQ, QAT, ACTORQ = (("quarl_edge.study.ptq", "StudyConfig"), ("quarl_edge.study.qat", "QATStudyConfig"),
                    ("quarl_edge.study.actorq", "ActorQStudyConfig"))  # fmt: skip

study_app = typer.Typer(help="The paper's experiments: tables and plots.", no_args_is_help=True)
EpisodesOpt = Annotated[int | None, typer.Option("--episodes", help="paired episodes per variant")]


def register(app: typer.Typer) -> None:
    study_app.command("ptq")(handle_errors(study_ptq))
    study_app.command("qat")(handle_errors(study_qat))
    study_app.command("actorq")(handle_errors(study_actorq))
    app.add_typer(study_app, name="study")


def _show(study: Any, files: list[Path], as_json: bool, title: str, module: Any) -> None:
    """The studies' common output: JSON alone on stdout, or the table and the files written."""
    if as_json:
        print_json(study.to_dict())
        return
    episodes = f", {study.episodes} paired episodes" if hasattr(study, "episodes") else ""
    table(title + episodes, module.COLUMNS, module.table_rows(study))
    info("wrote " + ", ".join(str(f) for f in files))


def study_ptq(
    suite: Annotated[str | None, typer.Option("--suite", help="quick (CI) or paper (every zoo policy); default: quick, or paper with --zoo (zoo add's default suite)")] = None,
    episodes: EpisodesOpt = None,
    bits: Annotated[str | None, typer.Option("--bits", help="weight-only bit widths, e.g. 2,3,4,8")] = None,
    policies: Annotated[str | None, typer.Option("--policies", help="comma-separated zoo names")] = None,
    confirm_episodes: Annotated[int | None, typer.Option("--confirm-episodes", help="more paired episodes to re-check an int8 gate failure (default: 0 quick, 100 paper)")] = None,
    workers: WorkersOpt = None,
    no_ray: NoRayOpt = False,
    address: AddressOpt = None,
    out: Annotated[Path | None, out_option(f"folder for ptq.md/.csv/.json and PNG plots (default {source_default(*PTQ, 'out')})")] = None,
    zoo: ZooOpt = None,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """PTQ of every zoo policy: fp32, fp16, int8 ONNX/TFLite and weight-only 2..8 bits, same seeds."""
    from quarl_edge.study import ptq, ptq_report

    cfg = ptq.StudyConfig(episodes=episodes, bits=int_list(bits, "--bits", "2,4,8"), address=address,
                          policies=name_list(policies), confirm_episodes=confirm_episodes, zoo=zoo,
                          **given(suite=suite or ("paper" if zoo else None), out=out, workers=workers, ray=False if no_ray else None))  # fmt: skip
    study = ptq.run_study(cfg, progress=info)
    _show(study, ptq_report.write_outputs(study, cfg.out), as_json, f"PTQ study ({cfg.suite})", ptq_report)


def study_qat(
    suite: Annotated[str | None, typer.Option("--suite", help=f"quick (CI: CartPole PPO) or paper (every task; default {source_default(*QAT, 'suite')})")] = None,
    episodes: EpisodesOpt = None,
    bits: Annotated[str | None, typer.Option("--bits", help="bit widths, e.g. 2,4,8")] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="override the QAT training steps")] = None,
    policies: Annotated[str | None, typer.Option("--policies", help="comma-separated task names")] = None,
    qat_activations: QatActivationsOpt = None,
    qat_scope: QatScopeOpt = None,
    workers: WorkersOpt = None,
    no_ray: NoRayOpt = False,
    address: AddressOpt = None,
    out: Annotated[Path, out_option("folder for qat.md/.csv/.json and the PNG plot")] = Path("out/study-qat"),
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """PTQ vs QAT per task and bit width: reward vs bits on the same seeds, table and plot."""
    from quarl_edge.study import qat

    cfg = qat.QATStudyConfig(episodes=episodes, bits=int_list(bits, "--bits", "2,4,8"), steps=steps, address=address,
                             policies=name_list(policies), out=out,
                             **given(suite=suite, activations=qat_activations, scope=qat_scope, workers=workers,
                                     ray=False if no_ray else None))  # fmt: skip
    study = qat.run_study(cfg, progress=info)
    _show(study, qat.write_outputs(study, out), as_json, f"QAT vs PTQ ({cfg.suite})", qat)


def study_actorq(
    suite: Annotated[str | None, typer.Option("--suite", help=f"quick (CI, ~1 min), convergence (3 seeds), speed (2048x3), paper (both), dmc (DM Control D4PG at Acme's sizes), dmc-quick (CI); default {source_default(*ACTORQ, 'suite')}")] = None,
    address: AddressOpt = None,
    out: Annotated[Path | None, out_option(f"folder for actorq.md/.json, breakdown PNGs, runs/ (default {source_default(*ACTORQ, 'out')})")] = None,
    finished_only: Annotated[bool, typer.Option("--finished-only", help="train nothing: the table and plots from the runs already finished in --out")] = False,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """ActorQ: fp32 vs fp16 vs int8 actors on the same seeds; time to target and final return."""
    from quarl_edge.study import actorq

    cfg = actorq.ActorQStudyConfig(
        address=address, finished_only=finished_only, **given(suite=suite, out=out)
    )
    study = actorq.run_study(cfg, progress=info)
    _show(study, actorq.write_outputs(study, cfg.out), as_json, f"ActorQ study ({cfg.suite})", actorq)
