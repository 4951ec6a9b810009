"""The pipeline's verbs, one thin command each: envs, train, record, export, bench, gate, demo.

Each command imports its library inside (torch for most: ~4 s), so that `--help` and a refused flag
answer at once. An option the user does not give is None, and the config's own default stands; the help
shows it, read from the config (cli/_defaults.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from quarl_edge.bench.config import BenchConfig
from quarl_edge.cli import _output
from quarl_edge.cli._defaults import default, given, source_default
from quarl_edge.cli._options import (
    AlgoOpt,
    EnvOpt,
    HostOpt,
    IdentityOpt,
    IoOpt,
    JsonOpt,
    PolicyOpt,
    PortOpt,
    QatActivationsOpt,
    QatScopeOpt,
    UserOpt,
    VecNormOpt,
    int_list,
    name_list,
    out_option,
    overrides,
)
from quarl_edge.cli._output import handle_errors, info, print_json, progress_bars, table
from quarl_edge.common.limits import MAX_REWARD_DROP_PCT, parse_percent
from quarl_edge.quant.config import QATConfig
from quarl_edge.runtimes.errors import QuarlError

if TYPE_CHECKING:
    from quarl_edge.bench.fleet_result import FleetReport
    from quarl_edge.gate import Check

RECORD, EXPORT, TRAIN = ("quarl_edge.record", "RecordConfig"), ("quarl_edge.exporters.base", "ExportConfig"), \
    ("quarl_edge.train.trainer", "TrainConfig")  # fmt: skip
MaxStepsOpt = Annotated[int | None, typer.Option("--max-steps", help="cap per episode")]


def register(app: typer.Typer) -> None:
    for command in (envs, train, record, export, bench, gate, demo):
        app.command()(handle_errors(command))


def envs(as_json: JsonOpt = False) -> None:
    """List the built-in environments and their preprocessing."""
    from quarl_edge.policy.registry import BUILTIN, DMC_PREFIX, dmc_entries, env_config
    from quarl_edge.runtimes.envs import FLATTEN_DICT
    from quarl_edge.runtimes.errors import MissingDependencyError

    columns = ["id", "family", "model", "extra", "wrappers"]
    rows = [[e.id, e.family, e.default_model, e.extra or "-",
             ", ".join(w.name for w in env_config(e.id).wrappers) or "-"] for e in BUILTIN.values()]  # fmt: skip
    try:  # the suite's tasks, listed by dm_control itself; their flattening is known without making each
        rows += [[e.id, e.family, e.default_model, e.extra or "-", FLATTEN_DICT] for e in dmc_entries()]
    except MissingDependencyError:
        rows.append([f"{DMC_PREFIX}<domain>-<task>-v0", "dmc", "mlp", "dmc (not installed)", FLATTEN_DICT])
    if as_json:
        print_json([dict(zip(columns, r, strict=True)) for r in rows])
    else:
        table("built-in environments (any other gymnasium id works too)", columns, rows)


def train(
    env: Annotated[str, typer.Option("--env", help="environment id, e.g. CartPole-v1 or ALE/Pong-v5")],
    algo: Annotated[str, typer.Option("--algo", help="ppo, a2c, dqn, ddpg, td3 or sac")],
    out: Annotated[Path, out_option("checkpoint folder to write")],
    steps: Annotated[int | None, typer.Option("--steps", help="environment steps (default: per env/algo)")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help=f"default {source_default(*TRAIN, 'seed')}")] = None,
    model: Annotated[str | None, typer.Option("--model", help="mlp or nature_cnn (default: per env)")] = None,
    net_arch: Annotated[str | None, typer.Option("--net-arch", help="hidden sizes, e.g. 64,64")] = None,
    eval_episodes: Annotated[int | None, typer.Option("--eval-episodes", help=f"default {source_default(*TRAIN, 'eval_episodes')}")] = None,
    checkpoint_every: Annotated[int | None, typer.Option("--checkpoint-every", help=f"save every N steps (default {source_default(*TRAIN, 'checkpoint_every')}: only at the end)")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="continue from the last checkpoint in --out")] = False,
    keep_best: Annotated[int | None, typer.Option("--keep-best", help=f"score N episodes at every checkpoint and end with the best weights (needs --checkpoint-every; default {source_default(*TRAIN, 'keep_best')}: off)")] = None,
    qat_bits: Annotated[int | None, typer.Option("--qat-bits", help="quantization-aware training, N bits (2..8)")] = None,
    quant_delay: Annotated[int | None, typer.Option("--quant-delay", help=f"fp32 steps before fake quantization (default {default(QATConfig, 'delay')})")] = None,
    qat_activations: QatActivationsOpt = None,
    qat_scope: QatScopeOpt = None,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """Train a policy (Stable-Baselines3; fp32, or quantization-aware with --qat-bits) and save a checkpoint."""
    from quarl_edge.runtimes.errors import InputError
    from quarl_edge.train.trainer import TrainConfig, summary_lines
    from quarl_edge.train.trainer import train as run_train

    if qat_bits is None and qat_scope is not None:
        raise InputError("--qat-scope applies to quantization-aware training", "add e.g. --qat-bits 4")
    qat = (
        QATConfig(bits=qat_bits, **given(delay=quant_delay, activations=qat_activations, scope=qat_scope))
        if qat_bits is not None
        else None
    )
    cfg = TrainConfig(env=env, algo=algo.lower(), out=out, steps=steps, model=model,
                      net_arch=int_list(net_arch, "--net-arch", "64,64"), resume=resume, qat=qat,
                      **given(seed=seed, eval_episodes=eval_episodes, checkpoint_every=checkpoint_every,
                              keep_best=keep_best))  # fmt: skip
    policy = run_train(cfg)
    if as_json:
        print_json({"out": str(out), "spec": policy.spec.to_dict()})
        return
    for line in summary_lines(policy, out):
        info(line)
    info(
        f"next: quarl-edge record --policy {_q(out)} --out {_q(Path('calibration_data') / (out.name + '.npz'))}"
    )


def record(
    policy: PolicyOpt,
    out: Annotated[Path, out_option("trace file to write (.npz)")],
    episodes: Annotated[int | None, typer.Option("--episodes", help=f"default {source_default(*RECORD, 'episodes')}")] = None,
    epsilon: Annotated[float | None, typer.Option("--epsilon", help=f"exploration noise for calibration coverage (default {source_default(*RECORD, 'epsilon')})")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help=f"first episode seed (default {source_default(*RECORD, 'seed')})")] = None,
    max_steps: MaxStepsOpt = None,
    max_samples: Annotated[int | None, typer.Option("--max-samples", help="cap on recorded steps")] = None,
    env: EnvOpt = None,
    algo: AlgoOpt = None,
    vecnormalize: VecNormOpt = None,
    io: IoOpt = None,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """Record rollouts (observations, actions, rewards, episode boundaries, seeds) as calibration data."""
    from quarl_edge.policy.load import load_policy
    from quarl_edge.record import RecordConfig, record_to_file

    cfg = RecordConfig(**given(episodes=episodes, epsilon=epsilon, seed=seed, max_steps=max_steps,
                               max_samples=max_samples))  # fmt: skip
    reads = [("policy", policy), ("VecNormalize file", vecnormalize), ("I/O description", io)]
    trace = record_to_file(load_policy(policy, env, algo, vecnormalize, io=io), cfg, out, reads)
    if as_json:
        print_json({"out": str(out), "samples": trace.samples, "episodes": trace.episodes, "sha256": trace.sha256,
                    "mean_return": float(trace.episode_returns().mean())})  # fmt: skip
        return
    info(f"recorded {trace.samples} steps in {trace.episodes} episodes to {out} (sha256 {trace.sha256[:12]})")
    # the env is in the calibration file's metadata: the export finds it there without --env
    flags = _flags(("--algo", algo), ("--vecnormalize", vecnormalize), ("--io", io))
    info(f"next: quarl-edge export --policy {_q(policy)}{flags} --calibration {_q(out)} --to onnx-fp32,onnx-int8 "
         f"--out {_q(Path('bundles') / _stem(policy))}")  # fmt: skip


def _q(value: object) -> str:
    import shlex

    return shlex.quote(str(value))


def _flags(*pairs: tuple[str, object | None]) -> str:
    """`` --flag value`` for each option the user gave, quoted for the shell, so a hint runs as printed."""
    return "".join(f" {flag} {_q(value)}" for flag, value in pairs if value is not None)


def _stem(policy: Path) -> str:
    return (policy.stem if policy.suffix else policy.name) or "policy"


def export(
    policy: PolicyOpt,
    out: Annotated[Path, out_option("bundle folder to write")],
    to: Annotated[str | None, typer.Option("--to", help=f"comma-separated targets, of: onnx-fp32, onnx-fp16, onnx-int8, onnx-int4, tflite-fp32, tflite-fp16, tflite-int8, c-fp32, c-int8 (default {source_default('quarl_edge.bundle', 'BundleRequest', 'targets').replace(',', ', ')})")] = None,
    calibration: Annotated[list[Path] | None, typer.Option("--calibration", help="recorded rollouts (.npz), observations a robot logged (np.savez obs=..., episode_ids=...) where the env cannot run here, or a field log folder (`field pull`); repeat to merge several")] = None,
    method: Annotated[str | None, typer.Option("--method", help=f"int8 calibration: minmax, percentile, entropy (default {source_default(*EXPORT, 'calibration_method')})")] = None,
    percentile: Annotated[float | None, typer.Option("--percentile", help=f"the range kept by --method percentile, in % (default {source_default(*EXPORT, 'percentile')})")] = None,
    per_channel: Annotated[bool | None, typer.Option("--per-channel/--per-tensor", help="default: CNNs only, TFLite all")] = None,
    full_int8: Annotated[bool, typer.Option("--full-int8", help="int8 of every layer: by default int8 keeps the output layer, and for vector observations the input layer, in float")] = False,
    env: EnvOpt = None,
    algo: AlgoOpt = None,
    vecnormalize: VecNormOpt = None,
    io: IoOpt = None,
    sign: Annotated[Path | None, typer.Option("--sign", help="ed25519 private key (ssh-keygen -t ed25519 -N '' -f KEY): sign the manifest")] = None,
    c_prebuilt: Annotated[str | None, typer.Option("--c-prebuilt", help="c-* models: also cross-compile a shared object for these machines (aarch64, x86_64, armv7l; comma-separated)")] = None,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """Export ONNX, TFLite (fp32 / fp16 / int8) and C (fp32 / int8) models into a bundle with a manifest."""
    from quarl_edge.bundle import BundleRequest, export_bundle
    from quarl_edge.exporters.base import ExportConfig
    from quarl_edge.exporters.targets import resolve_targets
    from quarl_edge.policy.load import load_policy

    cfg = ExportConfig(per_channel=per_channel, float_io_layers=not full_int8,
                       c_prebuilt=tuple(m.strip() for m in (c_prebuilt or "").split(",") if m.strip()),
                       **given(calibration_method=method and method.lower(), percentile=percentile))  # fmt: skip
    targets = given(targets=None if to is None else tuple(resolve_targets(to)))
    recorded = next((c for c in calibration or [] if c.is_file()), None)  # its env_id, if the policy has none
    pol = load_policy(policy, env, algo, vecnormalize, io=io, calibration=recorded)
    reads = (
        ("policy", policy),
        ("VecNormalize file", vecnormalize),
        ("I/O description", io),
        ("signing key", sign),
    )
    manifest = export_bundle(
        pol,
        BundleRequest(
            out=out,
            calibration=calibration[0] if calibration else None,
            more_calibration=tuple(calibration[1:]) if calibration else (),
            config=cfg,
            reads=reads,
            sign_key=sign,
            **targets,
        ),  # fmt: skip
        log=info,
    )
    if as_json:
        print_json(manifest.to_dict())
        return
    rows = [[m.name, m.file, f"{m.size_bytes / 1024:.1f} KiB", m.sha256[:12]] for m in manifest.models]
    table(f"bundle {out}", ["model", "file", "size", "sha256"], rows)
    if sign is not None:
        from quarl_edge.runtimes.signing import signed_by

        info(
            f"signed by {signed_by(out)} (manifest.sig); boards that trust it: quarl-edge devices trust-key DEVICE KEY.pub"
        )
    info(f"next: quarl-edge bench --bundle {_q(out)} --out {_q(Path('reports') / (out.name + '.json'))}")


def bench(
    bundle: Annotated[Path, typer.Option("--bundle", help="bundle folder")],
    device: Annotated[str, typer.Option("--device", help="device profile name; a comma list (local,rpi4) benches a fleet at once into one report")] = "local",
    episodes: Annotated[int | None, typer.Option("--episodes", help=f"paired episodes per model (default {default(BenchConfig, 'episodes')})")] = None,
    seed: Annotated[int | None, typer.Option("--seed", help=f"first episode seed (default {default(BenchConfig, 'seed')})")] = None,
    threads: Annotated[int | None, typer.Option("--threads", help="default: the device profile's default_threads")] = None,
    oversubscribe: Annotated[bool, typer.Option("--oversubscribe", help="allow --threads above the device's cores")] = False,
    env_on_host: Annotated[bool, typer.Option("--env-on-host", help="env here, only the policy on the device (per step over the link)")] = False,
    latency_samples: Annotated[int | None, typer.Option("--latency-samples", help=f"timed inferences per model, after warm-up (default {default(BenchConfig, 'latency_samples')})")] = None,
    max_steps: MaxStepsOpt = None,
    models: Annotated[str | None, typer.Option("--models", help="comma-separated subset of models")] = None,
    trace: Annotated[Path | None, typer.Option("--trace", help="replay trace (default: the bundle's)")] = None,
    out: Annotated[Path | None, out_option("report .json (a .md is written beside it)")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="finish an interrupted bench (its --out .partial.json)")] = False,
    hz: Annotated[float | None, typer.Option("--hz", help="control rate: time act() inside the episodes, count steps over the 1/HZ budget")] = None,
    duration: Annotated[str | None, typer.Option("--duration", help="per model, a sustained loop this long (60s, 2m) with the board's temperature, clock, throttling")] = None,
    host: HostOpt = None,
    user: UserOpt = None,
    port: PortOpt = None,
    identity: IdentityOpt = None,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """Latency, size, memory and paired-seed reward drift of every model in a bundle, here or on a device."""
    from quarl_edge.bench.device import model_count
    from quarl_edge.bench.fleet import FleetRequest, bench_fleet, parse_devices
    from quarl_edge.bench.report import printed
    from quarl_edge.bench.transport import Event
    from quarl_edge.runtimes.sustained import parse_duration

    cfg = BenchConfig(max_steps=max_steps, models=name_list(models), trace=trace, oversubscribe=oversubscribe, hz=hz,
                      duration_s=None if duration is None else parse_duration(duration), env_on_host=env_on_host,
                      **given(episodes=episodes, seed=seed, threads=threads, latency_samples=latency_samples))  # fmt: skip
    # one device is a fleet of one (bench/fleet.py): every device at once, one report
    req = FleetRequest(bundle, parse_devices(device), cfg, threads is not None, out, resume)
    per_device = model_count(bundle, cfg) * (cfg.episodes + 1)
    with progress_bars(dict.fromkeys(req.devices, per_device)) as advance:

        def on_event(dev: str, ev: Event) -> None:
            if ev.get("event") in ("episode", "latency"):
                advance(dev, f"{dev} {ev.get('model', '')}")

        result = bench_fleet(req, overrides(host, user, port, identity), progress=on_event, log=info)
    shown = printed(result.report, out)
    for label, line in shown.before:
        info(line, label=label, style="yellow")
    if as_json:
        print_json(result.report.to_dict())
    else:
        table(shown.title, shown.columns, shown.rows)
        for line in shown.after:
            info(line)
    error = result.error(out)
    if error is not None:
        raise error


def gate(
    report: Annotated[Path, typer.Argument(help="bench report .json (one device or a fleet), or a field report folder")],
    max_reward_drop: Annotated[str | None, typer.Option("--max-reward-drop", help=f"largest mean reward drop vs fp32, in % of |fp32's mean return|: 2% or the fraction 0.02 (a bare number above 1 is refused); a bench report's default: {MAX_REWARD_DROP_PCT:g}%")] = None,
    min_agreement: Annotated[float | None, typer.Option("--min-agreement", help="0..1")] = None,
    max_p99_ms: Annotated[float | None, typer.Option("--max-p99-ms", help="largest tight-loop p99 latency in ms, every model")] = None,
    max_miss_rate: Annotated[str | None, typer.Option("--max-miss-rate", help="largest share of closed-loop steps over the budget of `bench --hz`: 1% or the fraction 0.01")] = None,
    max_action_error: Annotated[float | None, typer.Option("--max-action-error", help="largest action error vs fp32, in action units (discrete: share of differing actions): on a bench report max |Δa| on the trace (for reports whose reward was not measured), on a field report the p99 on the robot's observations")] = None,
    max_out_of_range: Annotated[str | None, typer.Option("--max-out-of-range", help="a field report's: largest share of observations outside the calibration range: 5% or the fraction 0.05")] = None,
    junit: Annotated[Path | None, typer.Option("--junit", help="write JUnit XML here")] = None,
    markdown: Annotated[Path | None, typer.Option("--markdown", help="write a Markdown summary here")] = None,
    as_json: JsonOpt = False,
) -> None:  # fmt: skip
    """Exit 0 when every quantized model passes the thresholds, 1 when one fails, 2 for unusable input.
    A fleet report (`bench --device a,b`): every device's models, each failure naming its device. A field
    report (`field report`): the deployed model's action error and out-of-range rate in the field."""
    from quarl_edge.bench.fleet_result import FleetReport
    from quarl_edge.bench.report import read_report
    from quarl_edge.field.gate import evaluate_field, refuse_thresholds
    from quarl_edge.field.render import is_field_report, load_field_report
    from quarl_edge.gate import (
        GateConfig,
        Gated,
        check_columns,
        check_rows,
        evaluate,
        verdict_json,
        write_outputs,
    )
    from quarl_edge.tune.verify import read_tune_json

    field = is_field_report(report)
    drop = None if max_reward_drop is None else parse_percent(max_reward_drop, "--max-reward-drop")
    # GateConfig's default drop applies to a bench report; a field report measured no reward
    drop_given = {"max_reward_drop_pct": drop} if drop is not None or field else {}
    cfg = GateConfig(min_agreement=min_agreement, max_p99_ms=max_p99_ms,
                     max_miss_rate_pct=None if max_miss_rate is None else parse_percent(max_miss_rate, "--max-miss-rate"),
                     max_action_error=max_action_error,
                     max_out_of_range_pct=None if max_out_of_range is None else parse_percent(max_out_of_range, "--max-out-of-range"),
                     **drop_given)  # fmt: skip
    data: Gated
    if field:
        data = load_field_report(report)
        checks = evaluate_field(data, cfg)
    else:
        refuse_thresholds(cfg, field=False)
        data = read_report(report)
        # a tune.json: its tune block, and the shipped bundle beside it, checked too
        tuned = read_tune_json(report)
        checks = evaluate(data, cfg)
    write_outputs(data, checks, junit, markdown, reads=[("report", report)])
    failed = [c for c in checks if not c.passed]
    if as_json:
        print_json(verdict_json(data, checks))
    else:
        table(f"gate {report}", check_columns(data), check_rows(data, checks))
    for c in failed:
        info(c.message, label="FAIL", style="bold red")
    if failed:
        raise typer.Exit(1)
    if not isinstance(data, FleetReport):
        info("the deployed model is within the thresholds on the field's observations", label="PASS",
             style="bold green")  # fmt: skip
        return
    where = f" on every device ({', '.join(data.devices)})" if len(data.devices) > 1 else ""
    info(f"every quantized model is within the thresholds{where}", label="PASS", style="bold green")
    for line in _after_gate(report, data, checks, tuned is not None):
        info(line)


def _after_gate(report: Path, data: FleetReport, checks: list[Check], tuned: bool) -> list[str]:
    """The next commands after a pass, each runnable as printed from the folder the bundle was exported
    in: deploy the tuned bundle; or tune (when the bundle's source policy and calibration file are here)
    and deploy the fastest model that passed."""
    import math

    from quarl_edge.runtimes.manifest import load_manifest

    board = data.devices[0] if len(data.devices) == 1 and data.devices[0] != "local" else None
    to = f" --device {_q(board)}" if board else " --device NAME"
    pick = "" if board else "   (NAME: a board of `quarl-edge devices list`)"
    if tuned:
        return [f"next: quarl-edge deploy --bundle {_q(report.parent / 'bundle')}{to}{pick}"]
    bundle = Path(data.bundle.path)
    lines = []
    try:
        manifest = load_manifest(bundle)
    except QuarlError:
        return []
    names = [manifest.policy.train.get("imported_from"), manifest.policy.source.partition(":")[2]]
    source = next((Path(n) for n in names if isinstance(n, str) and n and Path(n).is_file()), None)
    calibration = (manifest.calibration or {}).get("file")
    # no environment here: tune judges by the action error, at the limit this gate passed
    limit = next((c.limit for c in checks if c.name == "action_error"), None)
    offline = manifest.policy.env.family == "external"
    if (
        source is not None
        and calibration
        and Path(calibration).is_file()
        and (limit is not None or not offline)
    ):
        lines.append(f"next: quarl-edge tune --policy {_q(source)} --calibration {_q(calibration)}"
                     f"{f' --max-action-error {limit:g}' if offline else ''}"
                     f"{f' --device {_q(board)}' if board else ''} --out {_q(Path('tune') / bundle.name)}"
                     f"   (the fastest model {'within that action error' if offline else 'that keeps the reward'}, on the "
                     "board with --device NAME)")  # fmt: skip
    passed_models = {c.model for c in checks} - {c.model for c in checks if not c.passed}
    fastest = min((m for r in data.reports.values() for m in r.models if m.name in passed_models),
                  key=lambda m: m.latency.p50_us if m.latency else math.inf, default=None)  # fmt: skip
    if fastest is not None:
        lines.append(f"{'or' if lines else 'next'}: quarl-edge deploy --bundle {_q(bundle)} --model "
                     f"{_q(fastest.name)}{to}{pick}")  # fmt: skip
    return lines


def demo(
    out: Annotated[Path, out_option("work folder for the bundle and report")] = Path("out/demo"),
    episodes: Annotated[int | None, typer.Option("--episodes", help=f"paired episodes per model (default {default(BenchConfig, 'episodes')})")] = None,
) -> None:  # fmt: skip
    """Export -> bench -> gate -> tune on the shipped CartPole PPO policy, and print the comparison."""
    from quarl_edge.demo import run_demo

    raise typer.Exit(run_demo(out, _output, episodes))
