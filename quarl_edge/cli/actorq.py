"""`quarl-edge actorq`: a thin command over quarl_edge.actorq.dqn / .d4pg."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from quarl_edge.cli._options import AddressOpt, JsonOpt, SeedOpt, int_list, out_option
from quarl_edge.cli._output import handle_errors, info, print_json
from quarl_edge.runtimes.errors import InputError


def register(app: typer.Typer) -> None:
    app.command("actorq")(handle_errors(actorq))


def actorq(
    env: Annotated[str, typer.Option("--env", help="gymnasium id: CartPole-v1 (dqn), Pendulum-v1 (d4pg)")],
    out: Annotated[Path, out_option("folder for log.json, breakdown.png, curve.png, checkpoint/")],
    algo: Annotated[str, typer.Option("--algo", help="dqn (discrete) or d4pg (continuous)")] = "dqn",
    actors: Annotated[int, typer.Option("--actors", help="Ray actors collecting experience")] = 2,
    actor_precision: Annotated[str, typer.Option("--actor-precision", help="fp32, fp16 or int8")] = "int8",
    actor_runtime: Annotated[str, typer.Option("--actor-runtime", help="onnx, litert, or auto (time both in an actor, keep the faster)")] = "auto",
    update_period: Annotated[int, typer.Option("--update-period", help="actor steps between weight pulls")] = 100,
    address: AddressOpt = None,
    steps: Annotated[int, typer.Option("--steps", help="environment steps over all actors")] = 50_000,
    seed: SeedOpt = 0,
    hidden: Annotated[str | None, typer.Option("--hidden", help="policy MLP widths, e.g. 2048,2048,2048 (paper's large)")] = None,
    critic_hidden: Annotated[str | None, typer.Option("--critic-hidden", help="d4pg: critic MLP widths (default: --hidden's; Acme: 512,512,256)")] = None,
    v_min: Annotated[float | None, typer.Option("--v-min", help="d4pg: lowest value atom (default: known or estimated)")] = None,
    v_max: Annotated[float | None, typer.Option("--v-max", help="d4pg: highest value atom")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="continue from --out/checkpoint")] = False,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """ActorQ: fp32 learner, Ray actors at fp32/fp16/int8, runtime breakdown and learning curve."""
    from quarl_edge.actorq import d4pg, dqn

    learner = d4pg if algo == "d4pg" else dqn
    sizes: dict[str, Any] = {"hidden": int_list(hidden, "--hidden", "2048,2048,2048")} if hidden else {}
    if critic_hidden:
        if algo != "d4pg":
            raise InputError("--critic-hidden sets the D4PG critic's widths", "drop it for --algo dqn")
        sizes["critic_hidden"] = int_list(critic_hidden, "--critic-hidden", "512,512,256")
    if v_min is not None or v_max is not None:
        if algo != "d4pg":
            raise InputError(
                "--v-min/--v-max set the D4PG critic's value support", "drop them for --algo dqn"
            )
        sizes |= {"v_min": v_min, "v_max": v_max}
    args = learner.Args(env=env, out=out, algo=algo, actors=actors, actor_precision=actor_precision, actor_runtime=actor_runtime,
                        update_period=update_period, address=address, steps=steps, seed=seed, resume=resume,
                        **sizes)  # fmt: skip
    args.validate()  # before Ray starts
    log = learner.train(args)  # type: ignore[arg-type]
    if as_json:
        print_json(log.to_dict())
        return
    returns = [p.ret for p in log.curve[-10:]]
    mean = sum(returns) / len(returns) if returns else float("nan")
    info(f"{log.env_steps} env steps, {log.learner_updates} updates, last-10 mean return {mean:.1f}")
    ratios = ", ".join(f"{k} {v:.2f}x" for k, v in log.inference_throughput.ratio_vs_fp32.items())
    if log.actor_runtime is not None:
        choice = log.actor_runtime
        info(f"actor runtime {choice.chosen} ({choice.why}); per-actor inference throughput on it "
             f"{ratios or 'fp32 only'}")  # fmt: skip
    if log.energy is not None:
        e = log.energy
        roles = ", ".join(f"{k} {v:.1f}" for k, v in e.cpu_s.items())
        info(f"energy {e.joules:.0f} J ({e.source}) over {e.wall_s:.1f} s wall; CPU s: {roles}")
        if e.assumption:
            info(e.assumption)
    info(f"payload {dict(log.payload_bytes)}; wrote {out}/log.json, breakdown.png, curve.png")
