"""`quarl-edge demo`: export -> bench -> gate -> tune on the CartPole PPO policy shipped with the package.

The demo prints through a ``Printer`` it is given (the CLI passes its output object, cli/_output.py): a
stage never imports the CLI above it."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from quarl_edge.bench.fleet_result import FleetReport
from quarl_edge.bench.render import columns, rows
from quarl_edge.bench.report import write_report
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.gate import GateConfig, evaluate, write_outputs
from quarl_edge.policy.net import load_checkpoint
from quarl_edge.tune import report as tune_report
from quarl_edge.tune.config import TuneConfig
from quarl_edge.tune.search import run_tune
from quarl_edge.zoo import CALIBRATION, POLICIES

DEMO_POLICY = "cartpole-ppo"


class Printer(Protocol):
    """Where the demo's lines go: log lines (stderr in the CLI) and tables (stdout)."""

    def info(self, msg: str, label: str = "", style: str = "bold") -> None: ...

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None: ...


def shipped_policy(name: str) -> Path:
    return POLICIES / name


def shipped_calibration(name: str) -> Path | None:
    """The shipped calibration_data/<name>.npz (package data), if there is one."""
    path = CALIBRATION / f"{name}.npz"
    return path if path.is_file() else None


def run_demo(out: Path, printer: Printer, episodes: int | None = None) -> int:
    """The demo in ``out``; its exit code (1 when the gate fails). ``episodes``: paired episodes per model
    (None: the bench's default)."""
    policy_dir = shipped_policy(DEMO_POLICY)
    policy = load_checkpoint(policy_dir)
    calib = shipped_calibration(DEMO_POLICY)
    bundle = out / "bundle"
    request = BundleRequest(out=bundle, calibration=calib)
    printer.info(f"{policy_dir.name} -> {bundle} ({', '.join(request.targets)}; calibration {calib or 'recorded now'})",
                 label="1/4 export")  # fmt: skip
    export_bundle(policy, request)
    cfg = BenchConfig() if episodes is None else BenchConfig(episodes=episodes)
    printer.info(f"{cfg.episodes} paired episodes per model, {cfg.threads} thread", label="2/4 bench")
    report = bench(bundle, cfg)
    fleet = FleetReport.of_one(report)  # one device: gate and the writer read it as a fleet of one
    report_path, md = write_report(fleet, out / "report.json")
    printer.table(
        f"{policy.spec.name}: {policy.spec.algo.upper()} on {policy.spec.env.id}, local, {cfg.threads} thread",
        columns(report),
        rows(report),
    )
    gate = GateConfig()
    printer.info(f"--max-reward-drop {gate.max_reward_drop_pct:g}%", label="3/4 gate")
    checks = evaluate(fleet, gate)
    write_outputs(fleet, checks, out / "junit.xml", out / "gate.md")
    failed = [c for c in checks if not c.passed]
    for c in checks:
        printer.info(
            c.message, label="pass" if c.passed else "FAIL", style="green" if c.passed else "bold red"
        )
    printer.info(f"report: {report_path}, {md}; JUnit: {out / 'junit.xml'}")
    _tune(policy_dir, calib, out / "tune", printer)
    return 1 if failed else 0


def _tune(policy_dir: Path, calib: Path | None, out: Path, printer: Printer) -> None:
    """The demo's last step: not the int8 model because it is int8, the fastest one that keeps reward."""
    printer.info("every format, precision, calibration and thread count here, judged by reward (short budget)",
                 label="4/4 tune")  # fmt: skip
    if importlib.util.find_spec("ai_edge_litert") is None or importlib.util.find_spec("litert_torch") is None:
        printer.info("the base install has no LiteRT: this tune searches ONNX only (LiteRT runs this policy 3-7x "
                     "faster than ONNX fp32 here); add it with: .venv/bin/pip install -e '.[tflite]' (pip install "
                     "'quarl-edge[tflite]' outside a checkout)", label="left out", style="yellow")  # fmt: skip
    cfg = TuneConfig(policy=policy_dir, out=out, calibration=calib, episodes=5, confirm_episodes=10,
                     budget_min=3, latency_samples=300)  # fmt: skip
    result = run_tune(cfg, log=printer.info)
    printer.table(
        f"tune {result.policy} on local", tune_report.columns(result), tune_report.table_rows(result)
    )
    c = result.choice
    if c is not None:  # run_tune raises when nothing passes
        printer.info(f"chosen: {c.name} at {c.threads} thread(s), {c.speedup_vs_fp32:.2f}x {result.reference}'s p50, "
                     f"reward drop {(c.drop_pct or 0.0) + 0.0:+.2f}%; its bundle: {out / 'bundle'} "
                     f"(quarl-edge gate {out / 'tune.json'})")  # fmt: skip
