"""`quarl-edge actorq`: a thin command over quarl_edge.actorq (the learners by name: actorq/learners.py).

The learners import torch (~4 s), so the command imports them inside; an option not given is None and
the learner's own default stands (D4PG's 20,000 steps, DQN's 50,000), shown in the help from their
source (cli/_defaults.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from quarl_edge.cli._defaults import given, source_default
from quarl_edge.cli._options import AddressOpt, JsonOpt, int_list, out_option
from quarl_edge.cli._output import handle_errors, info, print_json

if TYPE_CHECKING:
    from quarl_edge.actorq.loop import ActorQArgs

LOOP, DQN, D4PG = (("quarl_edge.actorq.loop", "ActorQArgs"), ("quarl_edge.actorq.dqn", "Args"),
                   ("quarl_edge.actorq.d4pg", "Args"))  # fmt: skip


def register(app: typer.Typer) -> None:
    app.command("actorq")(handle_errors(actorq))


def actorq(
    env: Annotated[str, typer.Option("--env", help="gymnasium id: CartPole-v1 (dqn), Pendulum-v1 (d4pg)")],
    out: Annotated[Path, out_option("folder for log.json, breakdown.png, curve.png, checkpoint/")],
    algo: Annotated[str, typer.Option("--algo", help="dqn (discrete) or d4pg (continuous)")] = "dqn",
    actors: Annotated[int | None, typer.Option("--actors", help=f"Ray actors collecting experience (default {source_default(*LOOP, 'actors')})")] = None,
    actor_precision: Annotated[str | None, typer.Option("--actor-precision", help=f"fp32, fp16 or int8 (default {source_default(*LOOP, 'actor_precision')})")] = None,
    actor_runtime: Annotated[str | None, typer.Option("--actor-runtime", help=f"onnx, litert, or auto (time both in an actor, keep the faster; default {source_default(*LOOP, 'actor_runtime')})")] = None,
    update_period: Annotated[int | None, typer.Option("--update-period", help=f"actor steps between weight pulls (default {source_default(*LOOP, 'update_period')})")] = None,
    address: AddressOpt = None,
    steps: Annotated[int | None, typer.Option("--steps", help=f"environment steps over all actors (default: dqn {source_default(*DQN, 'steps')}, d4pg {source_default(*D4PG, 'steps')})")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help=f"default {source_default(*LOOP, 'seed')}")] = None,
    hidden: Annotated[str | None, typer.Option("--hidden", help=f"policy MLP widths, e.g. 2048,2048,2048 (paper's large; default: dqn {source_default(*DQN, 'hidden')}, d4pg {source_default(*D4PG, 'hidden')})")] = None,
    critic_hidden: Annotated[str | None, typer.Option("--critic-hidden", help="d4pg: critic MLP widths (default: --hidden's; Acme: 512,512,256)")] = None,
    v_min: Annotated[float | None, typer.Option("--v-min", help="d4pg: lowest value atom (default: known or estimated)")] = None,
    v_max: Annotated[float | None, typer.Option("--v-max", help="d4pg: highest value atom")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="continue from --out/checkpoint")] = False,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """ActorQ: fp32 learner, Ray actors at fp32/fp16/int8, runtime breakdown and learning curve."""
    from quarl_edge.actorq.learners import train

    args = actorq_args(env, out, algo, actors, actor_precision, actor_runtime, update_period, address, steps, seed,
                       hidden, critic_hidden, v_min, v_max, resume)  # fmt: skip
    args.validate()  # before Ray starts
    log = train(args)
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


def actorq_args(env: str, out: Path, algo: str, actors: int | None, actor_precision: str | None,
                actor_runtime: str | None, update_period: int | None, address: str | None, steps: int | None,
                seed: int | None, hidden: str | None, critic_hidden: str | None, v_min: float | None,
                v_max: float | None, resume: bool) -> ActorQArgs:  # fmt: skip
    """The learner's Args the command runs: the options given over the learner's own defaults."""
    from quarl_edge.actorq.learners import learner_args

    return learner_args(algo, env=env, out=out, address=address, resume=resume, **given(
        actors=actors, actor_precision=actor_precision, actor_runtime=actor_runtime, update_period=update_period,
        steps=steps, seed=seed, hidden=int_list(hidden, "--hidden", "2048,2048,2048"),
        critic_hidden=int_list(critic_hidden, "--critic-hidden", "512,512,256"), v_min=v_min, v_max=v_max))  # fmt: skip
