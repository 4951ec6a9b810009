"""The `quarl-edge` command line: thin commands over the library (train, record, export, bench, gate, demo)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Annotated

import typer

from quarl_edge import __version__
from quarl_edge.actorq.command import actorq as actorq_command
from quarl_edge.cli_devices import HostOpt, IdentityOpt, PortOpt, UserOpt, devices_app, overrides
from quarl_edge.cli_emulate import register as register_emulator
from quarl_edge.output import handle_errors, info, print_json, table

app = typer.Typer(
    name="quarl-edge",
    help="Quantize RL policies for edge boards and prove, with numbers CI can gate on, that they keep their reward.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
register_emulator(devices_app)  # `devices emulate rpi4 up|down|status` and `devices setup`
app.add_typer(devices_app, name="devices")

PolicyOpt = Annotated[Path, typer.Option("--policy", "-p", help="checkpoint folder or SB3 / RL Zoo .zip")]
EnvOpt = Annotated[str | None, typer.Option("--env", help="environment id (for .zip files that do not say)")]
AlgoOpt = Annotated[str | None, typer.Option("--algo", help="algorithm of a .zip when it cannot be inferred")]
VecNormOpt = Annotated[
    Path | None, typer.Option("--vecnormalize", help="SB3 VecNormalize .pkl to bake into the graph")
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="print the result as JSON on stdout (logs go to stderr)")
]


def _version(value: bool) -> None:
    if value:
        print(f"quarl-edge {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    debug: Annotated[
        bool, typer.Option("--debug", help="show tracebacks instead of one-line errors")
    ] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True)] = False,
) -> None:
    if debug:
        os.environ["QUARL_EDGE_DEBUG"] = "1"


@app.command()
@handle_errors
def envs(as_json: JsonOpt = False) -> None:
    """List the built-in environments and their preprocessing."""
    from quarl_edge.envs import BUILTIN, env_config

    rows = []
    for e in BUILTIN.values():
        cfg = env_config(e.id)
        rows.append(
            [e.id, e.family, e.default_model, e.extra or "-", ", ".join(w.name for w in cfg.wrappers) or "-"]
        )
    if as_json:
        print_json([dict(zip(["id", "family", "model", "extra", "wrappers"], r, strict=True)) for r in rows])
    else:
        table(
            "built-in environments (any other gymnasium id works too)",
            ["id", "family", "model", "extra", "wrappers"],
            rows,
        )


@app.command()
@handle_errors
def train(
    env: Annotated[str, typer.Option("--env", help="environment id, e.g. CartPole-v1 or ALE/Pong-v5")],
    algo: Annotated[str, typer.Option("--algo", help="ppo, a2c, dqn, ddpg, td3 or sac")],
    out: Annotated[Path, typer.Option("--out", help="checkpoint folder to write")],
    steps: Annotated[
        int | None, typer.Option("--steps", help="environment steps (default: per env/algo)")
    ] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    model: Annotated[str | None, typer.Option("--model", help="mlp or nature_cnn (default: per env)")] = None,
    net_arch: Annotated[str | None, typer.Option("--net-arch", help="hidden sizes, e.g. 64,64")] = None,
    eval_episodes: Annotated[int, typer.Option("--eval-episodes")] = 10,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every", help="save every N steps")] = 0,
    resume: Annotated[
        bool, typer.Option("--resume", help="continue from the last checkpoint in --out")
    ] = False,
    keep_best: Annotated[
        int,
        typer.Option(
            "--keep-best",
            help="score N episodes at every checkpoint and end with the best weights (needs --checkpoint-every)",
        ),
    ] = 0,
    qat_bits: Annotated[
        int | None, typer.Option("--qat-bits", help="quantization-aware training, N bits (2..8)")
    ] = None,
    quant_delay: Annotated[
        int, typer.Option("--quant-delay", help="fp32 steps before fake quantization")
    ] = 0,
    qat_activations: Annotated[
        bool, typer.Option("--qat-activations/--no-qat-activations", help="also fake-quantize activations")
    ] = True,
    as_json: JsonOpt = False,
) -> None:
    """Train a policy (Stable-Baselines3; fp32, or quantization-aware with --qat-bits) and save a checkpoint."""
    from quarl_edge.qat import QATConfig
    from quarl_edge.runtimes.errors import InputError
    from quarl_edge.trainer import TrainConfig
    from quarl_edge.trainer import train as run_train

    arch = None
    if net_arch:
        try:
            arch = tuple(int(x) for x in net_arch.split(",") if x.strip())
        except ValueError:
            raise InputError(
                f"--net-arch {net_arch!r} is not a list of sizes", "e.g. --net-arch 64,64"
            ) from None
    qat = (
        QATConfig(bits=qat_bits, delay=quant_delay, activations=qat_activations)
        if qat_bits is not None
        else None
    )
    cfg = TrainConfig(env=env, algo=algo.lower(), out=out, steps=steps, seed=seed, model=model, net_arch=arch,
                      eval_episodes=eval_episodes, checkpoint_every=checkpoint_every, resume=resume, qat=qat,
                      keep_best=keep_best)  # fmt: skip
    policy = run_train(cfg)
    t = policy.spec.train
    if as_json:
        print_json({"out": str(out), "spec": policy.spec.to_dict()})
        return
    if "selection" in t:
        sel = t["selection"]
        info(f"--keep-best: final weights scored {sel['final']['mean']:.1f}, best checkpoint "
             f"{(sel['best'] or {}).get('mean', float('nan')):.1f}; kept step {t['selected_step']}")  # fmt: skip
    info(f"saved {out} ({t.get('steps')} steps, {t.get('wall_s')} s); "
         f"return {t.get('eval_return_mean', float('nan')):.1f} ± {t.get('eval_return_std', float('nan')):.1f}")  # fmt: skip
    info(f"next: quarl-edge record --policy {out} --out calibration_data/{out.name}.npz")


@app.command()
@handle_errors
def record(
    policy: PolicyOpt,
    out: Annotated[Path, typer.Option("--out", help="trace file to write (.npz)")],
    episodes: Annotated[int, typer.Option("--episodes")] = 10,
    epsilon: Annotated[
        float, typer.Option("--epsilon", help="exploration noise for calibration coverage")
    ] = 0.1,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    max_steps: Annotated[int | None, typer.Option("--max-steps", help="cap per episode")] = None,
    max_samples: Annotated[int | None, typer.Option("--max-samples", help="cap on recorded steps")] = None,
    env: EnvOpt = None,
    algo: AlgoOpt = None,
    vecnormalize: VecNormOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Record rollouts (observations, actions, rewards, episode boundaries, seeds) as calibration data."""
    from quarl_edge.loading import load_policy
    from quarl_edge.record import RecordConfig
    from quarl_edge.record import record as run_record
    from quarl_edge.runtimes.errors import InputError
    from quarl_edge.runtimes.trace import save_trace

    if out.suffix != ".npz":
        raise InputError(
            f"--out {str(out)!r} must end in .npz", f"e.g. --out calibration_data/{out.stem}.npz"
        )
    cfg = RecordConfig(
        episodes=episodes, epsilon=epsilon, seed=seed, max_steps=max_steps, max_samples=max_samples
    )
    pol = load_policy(policy, env, algo, vecnormalize)
    trace = run_record(pol, cfg)
    save_trace(trace, out)
    summary = {"out": str(out), "samples": trace.samples, "episodes": trace.episodes, "sha256": trace.sha256,
               "mean_return": float(trace.episode_returns().mean())}  # fmt: skip
    if as_json:
        print_json(summary)
    else:
        info(
            f"recorded {trace.samples} steps in {trace.episodes} episodes to {out} (sha256 {trace.sha256[:12]})"
        )
        info(
            f"next: quarl-edge export --policy {policy} --calibration {out} --to onnx-fp32,onnx-int8 --out bundles/NAME"
        )


@app.command()
@handle_errors
def export(
    policy: PolicyOpt,
    out: Annotated[Path, typer.Option("--out", help="bundle folder to write")],
    to: Annotated[
        str, typer.Option("--to", help="comma-separated, of {onnx,tflite}-{fp32,fp16,int8}")
    ] = "onnx-fp32,onnx-fp16,onnx-int8",
    calibration: Annotated[
        Path | None, typer.Option("--calibration", help="recorded rollouts (.npz)")
    ] = None,
    method: Annotated[
        str, typer.Option("--method", help="int8 calibration: minmax, percentile, entropy")
    ] = "minmax",
    percentile: Annotated[float, typer.Option("--percentile")] = 99.999,
    per_channel: Annotated[
        bool | None, typer.Option("--per-channel/--per-tensor", help="default: CNNs only, TFLite all")
    ] = None,
    full_int8: Annotated[
        bool, typer.Option("--full-int8", help="quantize the input and output layers too")
    ] = False,
    env: EnvOpt = None,
    algo: AlgoOpt = None,
    vecnormalize: VecNormOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Export ONNX and TFLite fp32 / fp16 / int8 models into a bundle with a manifest."""
    from quarl_edge.export import BundleRequest, export_bundle
    from quarl_edge.exporters.base import ExportConfig, resolve_targets
    from quarl_edge.loading import load_policy

    cfg = ExportConfig(
        calibration_method=method.lower(),
        percentile=percentile,
        per_channel=per_channel,
        float_io_layers=not full_int8,
    )
    targets = tuple(resolve_targets(to))
    pol = load_policy(policy, env, algo, vecnormalize)
    if calibration is None:
        info("no --calibration given: recording 10 episodes for calibration")
    manifest = export_bundle(
        pol, BundleRequest(out=out, targets=targets, calibration=calibration, config=cfg)
    )
    if as_json:
        print_json(manifest.to_dict())
        return
    rows = [[m.name, m.file, f"{m.size_bytes / 1024:.1f} KiB", m.sha256[:12]] for m in manifest.models]
    table(f"bundle {out}", ["model", "file", "size", "sha256"], rows)
    info(f"next: quarl-edge bench --bundle {out} --out reports/{out.name}.json")


@app.command()
@handle_errors
def bench(
    bundle: Annotated[Path, typer.Option("--bundle", help="bundle folder")],
    device: Annotated[str, typer.Option("--device", help="device profile name")] = "local",
    episodes: Annotated[int, typer.Option("--episodes", help="paired episodes per model")] = 20,
    seed: Annotated[int, typer.Option("--seed", help="first episode seed")] = 1000,
    threads: Annotated[int | None, typer.Option("--threads", help="default: the device's")] = None,
    latency_samples: Annotated[int, typer.Option("--latency-samples")] = 1000,
    max_steps: Annotated[int | None, typer.Option("--max-steps", help="cap per episode")] = None,
    models: Annotated[str | None, typer.Option("--models", help="comma-separated subset of models")] = None,
    trace: Annotated[
        Path | None, typer.Option("--trace", help="replay trace (default: the bundle's)")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="report .json (a .md is written beside it)")
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="finish an interrupted bench (its --out .partial.json)")
    ] = False,
    host: HostOpt = None,
    user: UserOpt = None,
    port: PortOpt = None,
    identity: IdentityOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Latency, size, memory and paired-seed reward drift of every model in a bundle, here or on a device."""
    from quarl_edge.bench import BenchConfig
    from quarl_edge.bench import bench as run_bench
    from quarl_edge.devices.profiles import load_profile, transport_for
    from quarl_edge.report import columns, harness_line, rows, runtimes_line, write_report
    from quarl_edge.resume import partial_path
    from quarl_edge.runtimes.errors import InputError
    from quarl_edge.runtimes.manifest import load_manifest

    profile = load_profile(device, overrides(host, user, port, identity))
    if out is not None and out.suffix != ".json":
        raise InputError(f"--out {str(out)!r} must end in .json", "e.g. --out reports/policy.json")
    if resume and out is None:
        raise InputError(
            "--resume needs the --out of the interrupted bench", "e.g. --out reports/policy.json --resume"
        )
    threads = profile.default_threads if threads is None else threads
    cfg = BenchConfig(episodes=episodes, seed=seed, threads=threads, latency_samples=latency_samples,
                      max_steps=max_steps, models=tuple(models.split(",")) if models else None, trace=trace)  # fmt: skip
    manifest = load_manifest(bundle)
    partial = partial_path(out) if out is not None else None
    if partial is not None and partial.is_file() and not resume:
        info(f"starting over: {partial} (from an interrupted bench) is replaced; --resume would continue it")
    transport = transport_for(profile)
    device_info = {"name": profile.name, "transport": profile.transport, "emulated": profile.emulated}
    run = functools.partial(run_bench, partial=partial, resume=resume)
    try:
        report = _bench_with_progress(
            run, bundle, cfg, len(cfg.models or manifest.models), device_info, transport
        )
    finally:
        close = getattr(transport, "close", None)
        if close is not None:
            close()
    for m in report["models"]:
        for w in m["warnings"]:
            info(f"[yellow]warning:[/] {m['name']}: {w}")
    if out is not None:
        write_report(report, out)
    if harness_line(report):
        info(harness_line(report))
    if as_json:
        print_json(report)
        return
    emulated = ", emulated: latency is qemu's, not the board's" if report["device"].get("emulated") else ""
    table(
        f"{report['bundle']['policy']} on {report['device']['name']} ({threads} thread{emulated})",
        columns(report),
        rows(report),
    )
    info(runtimes_line(report))
    if out is not None:
        info(f"report: {out} and {out.with_suffix('.md')}; next: quarl-edge gate {out} --max-reward-drop 2%")


def _bench_with_progress(run_bench, bundle, cfg, n_models, device, transport):  # type: ignore[no-untyped-def]
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from quarl_edge.output import err

    total = n_models * (cfg.episodes + 1)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True) as bar:  # fmt: skip
        task = bar.add_task("bench", total=total)

        def on_event(ev):  # type: ignore[no-untyped-def]
            if ev.get("event") in ("episode", "latency"):
                bar.update(task, advance=1, description=f"bench {ev.get('model', '')}")

        return run_bench(bundle, cfg, device=device, transport=transport, progress=on_event)


@app.command()
@handle_errors
def gate(
    report: Annotated[Path, typer.Argument(help="bench report .json")],
    max_reward_drop: Annotated[str, typer.Option("--max-reward-drop", help="e.g. 2%")] = "2%",
    min_agreement: Annotated[float | None, typer.Option("--min-agreement", help="0..1")] = None,
    max_p99_ms: Annotated[float | None, typer.Option("--max-p99-ms")] = None,
    junit: Annotated[Path | None, typer.Option("--junit", help="write JUnit XML here")] = None,
    markdown: Annotated[Path | None, typer.Option("--markdown", help="write a Markdown summary here")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Exit 0 when every quantized model passes the thresholds, 1 when one fails, 2 for unusable input."""
    from quarl_edge.gate import GateConfig, evaluate, parse_percent, write_outputs
    from quarl_edge.report import read_report

    cfg = GateConfig(max_reward_drop_pct=parse_percent(max_reward_drop), min_agreement=min_agreement,
                     max_p99_ms=max_p99_ms)  # fmt: skip
    data = read_report(report)
    checks = evaluate(data, cfg)
    write_outputs(data, checks, junit, markdown)
    failed = [c for c in checks if not c.passed]
    if as_json:
        print_json({"passed": not failed, "checks": [c.__dict__ for c in checks]})
    else:
        rows = [[c.model, c.name, "-" if c.value is None else f"{c.value:.4g}", f"{c.limit:g}",
                 "pass" if c.passed else "FAIL"] for c in checks]  # fmt: skip
        table(f"gate {report}", ["model", "check", "value", "limit", "result"], rows)
    for c in failed:
        info(f"[bold red]FAIL[/] {c.message}")
    if failed:
        raise typer.Exit(1)
    info("[bold green]PASS[/] every quantized model is within the thresholds")


@app.command()
@handle_errors
def demo(
    out: Annotated[Path, typer.Option("--out", help="work folder for the bundle and report")] = Path(
        "out/demo"
    ),
    episodes: Annotated[int, typer.Option("--episodes")] = 20,
) -> None:
    """Export -> bench -> gate on the shipped CartPole PPO policy, and print the comparison."""
    from quarl_edge.demo import run_demo

    code = run_demo(out, episodes)
    raise typer.Exit(code)


def _parse_bits(bits: str | None) -> tuple[int, ...] | None:
    from quarl_edge.runtimes.errors import InputError

    try:
        return tuple(int(b) for b in bits.split(",")) if bits else None
    except ValueError:
        raise InputError(f"--bits {bits!r} is not a list of integers", "e.g. --bits 2,4,8") from None


def _show_study(study, files, as_json, title, columns, table_rows) -> None:  # type: ignore[no-untyped-def]
    """The studies' common output: JSON alone on stdout, or the table and the files written."""
    if as_json:
        print_json(study)
        return
    table(f"{title}, {study['episodes']} paired episodes", columns, table_rows(study))
    info("wrote " + ", ".join(str(f) for f in files))


ZooOpt = Annotated[
    Path | None, typer.Option("--zoo", help="a zoo folder of your own (default: the built-in zoo)")
]
zoo_app = typer.Typer(help="The policy zoo: trained fp32 policies the studies run on.", no_args_is_help=True)
app.add_typer(zoo_app, name="zoo")


@zoo_app.command("list")
@handle_errors
def zoo_list(zoo: ZooOpt = None, as_json: JsonOpt = False) -> None:
    """The zoo's policies: env, algorithm, steps, fp32 return, suites, and whether the files are here."""
    from quarl_edge.zoo import load_zoo

    entries = load_zoo(zoo)
    if as_json:
        print_json([{**e.to_dict(), "present": (e.path / "policy.json").is_file()} for e in entries])
        return
    rows = [[e.name, e.env, e.algo, e.model, str(e.steps), f"{e.fp32_return_mean:.1f} ± {e.fp32_return_std:.1f}",
             ",".join(e.suites), "yes" if (e.path / "policy.json").is_file() else "MISSING"] for e in entries]  # fmt: skip
    table("policy zoo", ("name", "env", "algo", "model", "steps", "fp32 return", "suites", "files"), rows)


@zoo_app.command("add")
@handle_errors
def zoo_add(
    policy: Annotated[
        Path, typer.Option("--policy", "-p", help="finished `quarl-edge train` output folder, or an SB3 .zip")
    ],
    name: Annotated[str, typer.Option("--name", help="zoo name, e.g. halfcheetah-td3")],
    suite: Annotated[list[str] | None, typer.Option("--suite", help="quick and/or paper")] = None,
    episodes: Annotated[int, typer.Option("--episodes", help="fp32 evaluation episodes (>= 20)")] = 20,
    max_samples: Annotated[
        int | None, typer.Option("--max-samples", help="calibration samples (default 5000; images 1000)")
    ] = None,
    zoo: ZooOpt = None,
    env: EnvOpt = None,
    algo: AlgoOpt = None,
    vecnormalize: VecNormOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate a trained policy, record its calibration rollouts and index it in the zoo."""
    from quarl_edge.zoo import add

    entry = add(policy, name, tuple(suite or ["paper"]), episodes, max_samples, zoo=zoo, progress=info,
                env_id=env, algo=algo, vecnormalize=vecnormalize)  # fmt: skip
    if as_json:
        print_json(entry.to_dict())
        return
    info(f"added {entry.name}: {entry.env} {entry.algo}, fp32 return {entry.fp32_return_mean:.1f} "
         f"± {entry.fp32_return_std:.1f} over {entry.fp32_episodes} episodes")  # fmt: skip


study_app = typer.Typer(help="The paper's experiments: tables and plots.", no_args_is_help=True)
app.add_typer(study_app, name="study")


@study_app.command("ptq")
@handle_errors
def study_ptq(
    suite: Annotated[
        str | None,
        typer.Option(
            "--suite",
            help="quick (CI) or paper (every zoo policy); default: quick, or paper with --zoo "
            "(zoo add's default suite)",
        ),
    ] = None,
    episodes: Annotated[int | None, typer.Option("--episodes", help="paired episodes per variant")] = None,
    bits: Annotated[str | None, typer.Option("--bits", help="weight-only bit widths, e.g. 2,3,4,8")] = None,
    policies: Annotated[str | None, typer.Option("--policies", help="comma-separated zoo names")] = None,
    confirm_episodes: Annotated[
        int | None,
        typer.Option(
            "--confirm-episodes",
            help="more paired episodes to re-check an int8 gate failure (default: 0 quick, 100 paper)",
        ),  # fmt: skip
    ] = None,
    address: Annotated[
        str | None, typer.Option("--address", help="Ray cluster address (default: local Ray)")
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="folder for ptq.md/.csv/.json and PNG plots")] = Path(
        "out/study-ptq"
    ),
    zoo: ZooOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """PTQ of every zoo policy: fp32, fp16, int8 ONNX/TFLite and weight-only 2..8 bits, same seeds."""
    from quarl_edge.study.ptq import COLUMNS as STUDY_COLUMNS
    from quarl_edge.study.ptq import StudyConfig, run_study, table_rows, write_outputs

    bit_list = _parse_bits(bits)
    suite = suite or ("paper" if zoo else "quick")
    cfg = StudyConfig(suite=suite, episodes=episodes, bits=bit_list, address=address, out=out,
                      policies=tuple(policies.split(",")) if policies else None,
                      confirm_episodes=confirm_episodes, zoo=zoo)  # fmt: skip
    study = run_study(cfg, progress=info)
    _show_study(study, write_outputs(study, out), as_json, f"PTQ study ({suite})", STUDY_COLUMNS, table_rows)


@study_app.command("qat")
@handle_errors
def study_qat(
    suite: Annotated[
        str, typer.Option("--suite", help="quick (CI: CartPole PPO) or paper (every task)")
    ] = "quick",
    episodes: Annotated[int | None, typer.Option("--episodes", help="paired episodes per variant")] = None,
    bits: Annotated[str | None, typer.Option("--bits", help="bit widths, e.g. 2,4,8")] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="override the QAT training steps")] = None,
    policies: Annotated[str | None, typer.Option("--policies", help="comma-separated task names")] = None,
    qat_activations: Annotated[
        bool, typer.Option("--qat-activations/--no-qat-activations", help="QAT also quantizes activations")
    ] = True,
    address: Annotated[
        str | None, typer.Option("--address", help="Ray cluster address (default: local Ray)")
    ] = None,
    out: Annotated[Path, typer.Option("--out", help="folder for qat.md/.csv/.json and the PNG plot")] = Path(
        "out/study-qat"
    ),
    as_json: JsonOpt = False,
) -> None:
    """PTQ vs QAT per task and bit width: reward vs bits on the same seeds, table and plot."""
    from quarl_edge.study.qat import COLUMNS as QAT_COLUMNS
    from quarl_edge.study.qat import QATStudyConfig, run_study, table_rows, write_outputs

    bit_list = _parse_bits(bits)
    cfg = QATStudyConfig(suite=suite, episodes=episodes, bits=bit_list, steps=steps, address=address,
                         policies=tuple(policies.split(",")) if policies else None,
                         activations=qat_activations)  # fmt: skip
    study = run_study(cfg, progress=info, out=out)
    _show_study(study, write_outputs(study, out), as_json, f"QAT vs PTQ ({suite})", QAT_COLUMNS, table_rows)


@study_app.command("actorq")
@handle_errors
def study_actorq(
    suite: Annotated[
        str,
        typer.Option(
            "--suite", help="quick (CI, ~1 min), convergence (3 seeds), speed (2048x3), paper (both)"
        ),
    ] = "quick",
    address: Annotated[
        str | None, typer.Option("--address", help="Ray cluster address (default: local Ray)")
    ] = None,
    out: Annotated[
        Path, typer.Option("--out", help="folder for actorq.md/.json, breakdown PNGs, runs/")
    ] = Path("out/study-actorq"),
    as_json: JsonOpt = False,
) -> None:
    """ActorQ: fp32 vs fp16 vs int8 actors on the same seeds; time to target and final return."""
    from quarl_edge.actorq.study import COLUMNS as AQ_COLUMNS
    from quarl_edge.actorq.study import run_study as run_aq_study
    from quarl_edge.actorq.study import table_rows as aq_rows
    from quarl_edge.actorq.study import write_outputs as write_aq

    study = run_aq_study(suite, out, address, progress=info)
    files = write_aq(study, out)
    if as_json:
        print_json(study)
        return
    table(f"ActorQ study ({suite})", AQ_COLUMNS, aq_rows(study))
    info("wrote " + ", ".join(str(f) for f in files))


app.command("actorq")(actorq_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
