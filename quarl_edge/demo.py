"""`quarl-edge demo`: export -> bench -> gate on the CartPole PPO policy shipped with the package."""

from __future__ import annotations

from pathlib import Path

from quarl_edge.bench.fleet_result import FleetReport
from quarl_edge.bench.render import columns, rows
from quarl_edge.bench.report import write_report
from quarl_edge.bench.run import BenchConfig, bench
from quarl_edge.bundle import BundleRequest, export_bundle
from quarl_edge.cli._output import info, table
from quarl_edge.gate import GateConfig, evaluate, write_outputs
from quarl_edge.policy.net import load_checkpoint
from quarl_edge.zoo import CALIBRATION, POLICIES

DEMO_POLICY = "cartpole-ppo"


def shipped_policy(name: str) -> Path:
    return POLICIES / name


def shipped_calibration(name: str) -> Path | None:
    """The shipped calibration_data/<name>.npz (package data), if there is one."""
    path = CALIBRATION / f"{name}.npz"
    return path if path.is_file() else None


def run_demo(out: Path, episodes: int = 20) -> int:
    policy_dir = shipped_policy(DEMO_POLICY)
    policy = load_checkpoint(policy_dir)
    calib = shipped_calibration(DEMO_POLICY)
    bundle = out / "bundle"
    info(
        f"{policy_dir.name} -> {bundle} (onnx fp32, fp16, int8; calibration {calib or 'recorded now'})",
        label="1/4 export",
    )
    export_bundle(
        policy, BundleRequest(out=bundle, targets=("onnx-fp32", "onnx-fp16", "onnx-int8"), calibration=calib)
    )
    info(f"{episodes} paired episodes per model, 1 thread", label="2/4 bench")
    report = bench(bundle, BenchConfig(episodes=episodes))
    fleet = FleetReport.of_one(report)  # one device: gate and the writer read it as a fleet of one
    report_path, md = write_report(fleet, out / "report.json")
    table(
        f"{policy.spec.name}: {policy.spec.algo.upper()} on {policy.spec.env.id}, local, 1 thread",
        columns(report),
        rows(report),
    )
    info("--max-reward-drop 2%", label="3/4 gate")
    checks = evaluate(fleet, GateConfig(max_reward_drop_pct=2.0))
    write_outputs(fleet, checks, out / "junit.xml", out / "gate.md")
    failed = [c for c in checks if not c.passed]
    for c in checks:
        info(c.message, label="pass" if c.passed else "FAIL", style="green" if c.passed else "bold red")
    info(f"report: {report_path}, {md}; JUnit: {out / 'junit.xml'}")
    _tune(policy_dir, calib, out / "tune")
    return 1 if failed else 0


def _tune(policy_dir: Path, calib: Path | None, out: Path) -> None:
    """The demo's last step: not the int8 model because it is int8, the fastest one that keeps reward."""
    from quarl_edge.tune.config import TuneConfig
    from quarl_edge.tune.report import columns, table_rows
    from quarl_edge.tune.search import run_tune

    info("every format, precision, calibration and thread count here, judged by reward (short budget)",
         label="4/4 tune")  # fmt: skip
    cfg = TuneConfig(policy=policy_dir, out=out, calibration=calib, episodes=5, confirm_episodes=10,
                     budget_min=3, latency_samples=300)  # fmt: skip
    result = run_tune(cfg, log=info)
    table(f"tune {result.policy} on local", columns(result), table_rows(result))
    c = result.choice
    if c is not None:  # run_tune raises when nothing passes
        info(f"chosen: {c.name} at {c.threads} thread(s), {c.speedup_vs_fp32:.2f}x {result.reference}'s p50, reward "
             f"drop {(c.drop_pct or 0.0) + 0.0:+.2f}%; its bundle: {out / 'bundle'} (quarl-edge gate {out / 'tune.json'})")  # fmt: skip
