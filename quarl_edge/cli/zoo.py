"""`quarl-edge zoo list|add`: the policy zoo the studies run on (built-in, or a folder of your own)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from quarl_edge.cli._options import AlgoOpt, EnvOpt, JsonOpt, VecNormOpt, ZooOpt
from quarl_edge.cli._output import handle_errors, info, print_json, table

zoo_app = typer.Typer(help="The policy zoo: trained fp32 policies the studies run on.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    zoo_app.command("list")(handle_errors(zoo_list))
    zoo_app.command("add")(handle_errors(zoo_add))
    app.add_typer(zoo_app, name="zoo")


def zoo_list(zoo: ZooOpt = None, as_json: JsonOpt = False) -> None:
    """The zoo's policies: env, algorithm, steps, fp32 return, suites, and whether the files are here."""
    from quarl_edge.zoo import load_zoo

    entries = load_zoo(zoo)
    if as_json:
        print_json([{**e.to_dict(), "present": e.present} for e in entries])
        return
    rows = [[e.name, e.env, e.algo, e.model, str(e.steps), f"{e.fp32_return_mean:.1f} ± {e.fp32_return_std:.1f}",
             ",".join(e.suites), "yes" if e.present else "MISSING"] for e in entries]  # fmt: skip
    table("policy zoo", ("name", "env", "algo", "model", "steps", "fp32 return", "suites", "files"), rows)


def zoo_add(
    policy: Annotated[Path, typer.Option("--policy", "-p", help="finished `quarl-edge train` output folder, or an SB3 .zip")],
    name: Annotated[str, typer.Option("--name", help="zoo name, e.g. halfcheetah-td3")],
    suite: Annotated[list[str] | None, typer.Option("--suite", help="quick and/or paper")] = None,
    episodes: Annotated[int, typer.Option("--episodes", help="fp32 evaluation episodes (>= 20)")] = 20,
    max_samples: Annotated[int | None, typer.Option("--max-samples", help="calibration samples (default 5000; images 1000)")] = None,
    zoo: ZooOpt = None,
    env: EnvOpt = None,
    algo: AlgoOpt = None,
    vecnormalize: VecNormOpt = None,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """Evaluate a trained policy, record its calibration rollouts and index it in the zoo."""
    from quarl_edge.zoo import add

    entry = add(policy, name, tuple(suite or ["paper"]), episodes, max_samples, zoo=zoo, progress=info,
                env_id=env, algo=algo, vecnormalize=vecnormalize)  # fmt: skip
    if as_json:
        print_json(entry.to_dict())
        return
    info(f"added {entry.name}: {entry.env} {entry.algo}, fp32 return {entry.fp32_return_mean:.1f} "
         f"± {entry.fp32_return_std:.1f} over {entry.fp32_episodes} episodes")  # fmt: skip
