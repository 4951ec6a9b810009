"""`quarl-edge study ptq`: every zoo policy at fp32, fp16, int8 ONNX, int8 TFLite and weight-only n-bit
(n = 2..8) on the same paired seeds; Markdown, CSV, JSON and PNG plots.

Each (policy, variant) evaluation is a job of quarl_edge/parallel.py: in this process one after another by
default, side by side with ``workers`` > 1 (Ray tasks, or local processes), on a Ray cluster with ``address``.
Runtime variants run through the device runner (runtimes/), torch variants through the PolicyNet.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quarl_edge.parallel import Job, Pool, Workers, pool
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.stats import mean_ci95
from quarl_edge.study._common import (
    Progress,
    Row,
    check_bits,
    check_episodes,
    check_suite,
    unavailable,
)
from quarl_edge.study._evaluate import evaluate_task
from quarl_edge.study.result import Confirmation, PTQFinding, PTQStudy, VariantResult
from quarl_edge.zoo import ZooEntry, suite

RUNTIME_VARIANTS = ("onnx-fp16", "onnx-int8", "tflite-int8")
DRIFT_LIMIT_PCT = 2.0


@dataclass(frozen=True)
class StudyConfig:
    suite: str = "quick"
    episodes: int | None = None
    """paired episodes per variant (default: 5 for quick, 20 for paper)"""
    bits: tuple[int, ...] | None = None
    """weight-only bit widths (default: 2, 4, 8 for quick, 2..8 for paper)"""
    seed: int = 2000
    workers: int = 1
    """evaluations side by side (1: in this process, one after another)"""
    ray: bool | None = None
    """None: Ray for more than one worker when it is installed; False: local processes"""
    address: str | None = None
    """a Ray cluster for the evaluations"""
    out: Path = Path("out/study-ptq")
    policies: tuple[str, ...] | None = None
    """restrict to these zoo names"""
    confirm_episodes: int | None = None
    """extra paired episodes that re-check an int8 gate failure (default: 0 for quick, 100 for paper)"""
    zoo: Path | None = None
    """a user zoo folder (`quarl-edge zoo add --zoo DIR`); None is the built-in zoo"""

    def __post_init__(self) -> None:
        check_suite(self.suite, ("quick", "paper"))
        check_episodes(self.episodes)
        if self.confirm_episodes is not None and self.confirm_episodes < 0:
            raise InputError("--confirm-episodes must be 0 or more", "e.g. --confirm-episodes 100")
        check_bits(self.bits)
        self.parallel  # noqa: B018 (--workers / --no-ray / --address checked before any work)

    @property
    def parallel(self) -> Workers:
        return Workers(self.workers, self.ray, self.address)

    @property
    def n_episodes(self) -> int:
        return self.episodes or (5 if self.suite == "quick" else 20)

    @property
    def bit_list(self) -> tuple[int, ...]:
        return self.bits or ((2, 4, 8) if self.suite == "quick" else (2, 3, 4, 5, 6, 7, 8))

    @property
    def seeds(self) -> list[int]:
        return list(range(self.seed, self.seed + self.n_episodes))

    @property
    def confirm_seeds(self) -> list[int]:
        """Fresh seeds after the main ones, for re-checking a gate failure."""
        n = (
            self.confirm_episodes
            if self.confirm_episodes is not None
            else (0 if self.suite == "quick" else 100)
        )
        start = self.seed + self.n_episodes
        return list(range(start, start + n))


# ---- driver -------------------------------------------------------------------------------------------


def _export(entry: ZooEntry, work: Path) -> tuple[Path | None, dict[str, str]]:
    """Bundle with every runtime variant that can be exported here; reasons for the others."""
    from quarl_edge.bundle import BundleRequest, export_bundle
    from quarl_edge.exporters.base import EXPORTERS
    from quarl_edge.exporters.targets import load_builtin
    from quarl_edge.policy.net import load_checkpoint

    load_builtin()
    skipped: dict[str, str] = {}
    targets = ["onnx-fp32"]
    for v in RUNTIME_VARIANTS:
        if v in EXPORTERS:
            targets.append(v)
        else:
            skipped[v] = f"exporter {v} not available (install quarl-edge[tflite])"
    calib = entry.calibration if entry.calibration.is_file() else None
    out = work / entry.name
    export_bundle(
        load_checkpoint(entry.path), BundleRequest(out=out, targets=tuple(targets), calibration=calib)
    )
    return out, skipped


def _action_range(entry: ZooEntry) -> float | None:
    """Mean width of the policy's action bounds; None for discrete actions (or an unreadable entry)."""
    try:
        space = json.loads((entry.path / "policy.json").read_text())["spec"]["action_space"]
    except (OSError, ValueError, KeyError):
        return None
    if space.get("kind") == "discrete":
        return None
    low, high = np.broadcast_arrays(np.asarray(space["low"], float), np.asarray(space["high"], float))
    width = high - low
    return float(np.mean(width[np.isfinite(width)])) if np.isfinite(width).any() else 1.0


def run_study(cfg: StudyConfig, progress: Progress | None = None) -> PTQStudy:
    entries = suite(cfg.suite, cfg.zoo)
    if not entries:
        where = f"zoo {str(cfg.zoo)!r}" if cfg.zoo else "the zoo"
        other = "paper" if cfg.suite == "quick" else "quick"
        raise InputError(
            f"{where} has no policy in suite {cfg.suite}",
            f"try --suite {other}, or add policies with `quarl-edge zoo add --suite {cfg.suite}`",
        )
    if cfg.policies:
        known = {e.name for e in entries}
        unknown = [p for p in cfg.policies if p not in known]
        if unknown:
            raise InputError(
                f"no zoo policy {unknown[0]!r} in suite {cfg.suite}", f"known: {', '.join(sorted(known))}"
            )
        entries = [e for e in entries if e.name in cfg.policies]
    seeds = cfg.seeds
    rows: list[Row] = []
    pending: list[tuple[Row, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="quarl-study-") as work,
        pool(cfg.parallel) as jobs,
    ):
        for entry in entries:
            act_range = _action_range(entry)  # read once per policy

            def row(
                variant: str, bits: int | None = None, e: ZooEntry = entry, ar: float | None = act_range
            ) -> Row:
                return Row(e.name, e.env, e.algo, variant, bits, action_range=ar)

            reason = unavailable(entry.path, entry.env)
            if reason:
                rows.append(Row(entry.name, entry.env, entry.algo, "all", None, skipped=reason))
                if progress:
                    progress(f"skip {entry.name}: {reason}")
                continue
            if progress:
                progress(f"export {entry.name}")
            try:
                bundle, skipped = _export(entry, Path(work))
            except Exception as e:  # noqa: BLE001 - one policy's export failure must not end the study
                msg = str(e) if isinstance(e, QuarlError) else f"{type(e).__name__}: {e}"
                bundle, skipped = None, {v: f"export failed: {msg}" for v in RUNTIME_VARIANTS}
            calib = entry.calibration
            trace = str(calib) if calib.is_file() else None
            no_calib = None if trace else (f"zoo file missing: {calib.parent.name}/{calib.name}; int8 "
                                           "calibrated on rollouts recorded on the fly, fidelity not measured")  # fmt: skip
            for variant, bits in [("fp32", None), ("random", None)] + [(f"w{b}", b) for b in cfg.bit_list]:
                r = row(variant, bits)
                r.note = no_calib if variant == "fp32" else None
                pending.append(
                    (r, jobs.submit(evaluate_task, "torch", str(entry.path), variant, bits, seeds, trace))
                )
            for v in RUNTIME_VARIANTS:
                r = row(v, 16 if v.endswith("fp16") else 8)
                r.note = no_calib if v.endswith("int8") else None
                if v in skipped or bundle is None:
                    r.skipped = skipped.get(v, "export failed")
                    rows.append(r)
                else:
                    pending.append(
                        (r, jobs.submit(evaluate_task, "runtime", str(bundle), v, None, seeds, trace))
                    )
        for i, (r, job) in enumerate(pending):
            res = job.result()
            r.returns, r.skipped, r.actions = res.returns, res.skipped, res.actions
            rows.append(r)
            if progress:
                progress(f"[{i + 1}/{len(pending)}] {r.policy} {r.variant}")
        checkpoints = {e.name: e.path for e in entries}
        confirmations = _confirm(rows, cfg, jobs, Path(work), checkpoints, progress)
    return summarize(rows, cfg, confirmations)


def _confirm(
    rows: list[Row],
    cfg: StudyConfig,
    jobs: Pool,
    work: Path,
    checkpoints: dict[str, Path],
    progress: Callable[[str], None] | None,
) -> list[Confirmation]:
    """Re-check each runtime variant's gate failure (int8, and fp16) on ``cfg.confirm_seeds`` more
    paired episodes (fp32 from ``checkpoints[policy]``, the variant from its bundle in ``work``): a rare
    catastrophic episode (a flipped HalfCheetah, say) can sink a 20-episode mean for fp32's own reasons.
    The verdict on all episodes together is reported next to the first one."""
    extra = cfg.confirm_seeds
    if not extra:
        return []
    prelim = summarize(rows, cfg)
    failing = [(f.policy, v) for f in prelim.findings for v, ok in f.keeps_reward.items() if not ok]
    if not failing:
        return []
    first = {(r.policy, r.variant): r for r in rows}
    refs: dict[tuple[str, str], Job] = {}
    for policy, variant in failing:
        if (policy, "fp32") not in refs:
            refs[(policy, "fp32")] = jobs.submit(
                evaluate_task, "torch", str(checkpoints[policy]), "fp32", None, extra
            )
        refs[(policy, variant)] = jobs.submit(
            evaluate_task, "runtime", str(work / policy), variant, None, extra
        )
    if progress:
        progress(f"re-checking {len(failing)} gate failure(s) on {len(extra)} more episodes each")
    more = {k: job.result() for k, job in refs.items()}
    out = []
    for policy, variant in failing:
        f32, var = more[(policy, "fp32")], more[(policy, variant)]
        if f32.skipped or var.skipped:
            continue
        was = first[(policy, variant)]
        fp32 = Row(
            policy, was.env, was.algo, "fp32", None, returns=first[(policy, "fp32")].returns + f32.returns
        )
        row = Row(policy, was.env, was.algo, variant, was.bits, returns=was.returns + var.returns)
        s = row.summary(fp32.returns, None)
        _, lo, hi = mean_ci95(fp32.returns)
        if s.mean is None or s.drop_pct is None or s.drop_ci95_pct is None:
            continue
        out.append(Confirmation(policy=policy, variant=variant, episodes=len(row.returns),
                                fp32_mean=float(np.mean(fp32.returns)), mean=s.mean, drop_pct=s.drop_pct,
                                drop_ci95_pct=s.drop_ci95_pct, keeps_reward=keeps_reward(s, lo, hi)))  # fmt: skip
    return out


def _order(r: Row) -> tuple[int, int]:
    fixed = {"fp32": 0, "onnx-fp16": 1, "onnx-int8": 2, "tflite-int8": 3, "random": 20, "all": 30}
    return (fixed.get(r.variant, 10), -(r.bits or 0))


def sweet_spot(ok: dict[int, bool]) -> int | None:
    """Fewest weight bits such that every width from there up keeps reward (within 2% of fp32);
    None when the widest one tried already does not. A lucky pass below a failure does not count."""
    best = None
    for bits in sorted(ok, reverse=True):
        if not ok[bits]:
            break
        best = bits
    return best


def keeps_reward(s: VariantResult, fp32_lo: float, fp32_hi: float) -> bool:
    """The gate of the acceptance list: within 2% of fp32, or inside fp32's own 95% interval."""
    return bool((s.drop_pct is not None and s.drop_pct <= DRIFT_LIMIT_PCT)
                or (math.isfinite(fp32_lo) and s.mean is not None and s.mean >= fp32_lo))  # fmt: skip


def summarize(rows: list[Row], cfg: StudyConfig, confirmations: list[Confirmation] | None = None) -> PTQStudy:
    by_policy: dict[str, dict[str, Row]] = {}
    for r in sorted(rows, key=_order):
        by_policy.setdefault(r.policy, {})[r.variant] = r
    results: list[VariantResult] = []
    for variants in by_policy.values():
        fp32 = variants.get("fp32")
        rand = variants.get("random")
        ref = fp32.returns if fp32 and not fp32.skipped else None
        rnd = rand.returns if rand and not rand.skipped else None
        ref_actions = fp32.actions if fp32 and not fp32.skipped else None
        for r in variants.values():
            results.append(r.summary(ref if r.variant != "fp32" else None, rnd, ref_actions))
    findings = []
    for policy in by_policy:
        mine = [s for s in results if s.policy == policy]
        ok = {s.bits: s.drop_pct <= DRIFT_LIMIT_PCT for s in mine
              if s.variant.startswith("w") and s.drop_pct is not None and s.bits is not None}  # fmt: skip
        runtime = [s for s in mine if s.variant in RUNTIME_VARIANTS]
        fp32 = by_policy[policy].get("fp32")
        _, f_lo, f_hi = mean_ci95(fp32.returns) if fp32 and fp32.returns else (math.nan, math.nan, math.nan)
        findings.append(PTQFinding(
            policy=policy,
            sweet_spot_bits=sweet_spot(ok),
            weight_bits_ok={str(b): v for b, v in sorted(ok.items())},
            drop_pct={s.variant: s.drop_pct for s in runtime},
            keeps_reward={s.variant: keeps_reward(s, f_lo, f_hi) for s in runtime if s.mean is not None},
            fp32_ci95=(f_lo if math.isfinite(f_lo) else None, f_hi if math.isfinite(f_hi) else None),
            confirmed={c.variant: c for c in confirmations or [] if c.policy == policy},
        ))  # fmt: skip
    return PTQStudy(suite=cfg.suite, zoo=str(cfg.zoo) if cfg.zoo else "built-in", episodes=cfg.n_episodes,
                    seeds=tuple(cfg.seeds), bits=tuple(cfg.bit_list), drift_limit_pct=DRIFT_LIMIT_PCT,
                    confirm_episodes=len(cfg.confirm_seeds), results=tuple(results), findings=tuple(findings))  # fmt: skip
