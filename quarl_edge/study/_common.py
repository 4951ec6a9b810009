"""The studies' shared core (Ray: quarl_edge/parallel.py): one validation of suites, episodes and bit widths,
env availability, the row a study fills in as it runs, and one writer for the JSON / Markdown / CSV tables.

Every study has the same two calls: ``run_study(config, progress=None) -> study`` (a typed result,
study/result.py or the ActorQ study's; its JSON is the committed format) and ``write_outputs(study, out)
-> files``.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from quarl_edge.common.limits import check_paired_episodes
from quarl_edge.outputs import Kind, claim
from quarl_edge.runtimes.errors import InputError, QuarlError
from quarl_edge.runtimes.fsutil import atomic_write_json, atomic_write_text
from quarl_edge.stats import mean_std, paired_drift
from quarl_edge.study.result import VariantResult, variant_result
from quarl_edge.typed import to_json

Progress = Callable[[str], None]
MIN_BITS, MAX_BITS = 2, 8


def say(progress: Progress | None) -> Progress:
    return progress or (lambda _msg: None)


# ---- validation (before Ray starts) ------------------------------------------------------------------


def check_suite(suite: str, known: Iterable[str]) -> None:
    known = tuple(known)
    if suite not in known:
        raise InputError(f"unknown suite {suite!r}", f"choose {', '.join(known[:-1])} or {known[-1]}")


def check_episodes(episodes: int | None, flag: str = "--episodes") -> None:
    if episodes is not None:
        check_paired_episodes(episodes, flag)


def check_bits(bits: Sequence[int] | None, what: str = "weight-only bits") -> None:
    for b in bits or ():
        if not MIN_BITS <= b <= MAX_BITS:
            raise InputError(f"bit width {b} out of range", f"{what} are {MIN_BITS}..{MAX_BITS}")


def unavailable(policy_dir: Path, env_id: str) -> str | None:
    """Why a zoo policy cannot be studied here (its checkpoint is missing, its env does not make), or None."""
    from quarl_edge.policy.registry import env_config
    from quarl_edge.runtimes.envs import make_env

    if not (policy_dir / "policy.json").is_file():
        return f"zoo file missing: {policy_dir.name}/policy.json"
    try:
        make_env(env_config(env_id)).close()
    except QuarlError as e:
        return f"environment not available: {e}"
    return None


# ---- the result row ----------------------------------------------------------------------------------


@dataclass
class Row:
    policy: str
    env: str
    algo: str
    variant: str
    bits: int | None
    returns: list[float] = field(default_factory=list)
    skipped: str | None = None
    actions: np.ndarray | None = None
    """actions on the policy's recorded calibration states (for the fidelity column)"""
    action_range: float | None = None
    """mean width of the action bounds (continuous actions); None for discrete"""
    note: str | None = None
    """shown in the table's note column (e.g. a zoo file that was missing and how the study made do)"""

    def fidelity(self, ref: np.ndarray | None) -> tuple[str, float] | None:
        """Discrete: ("agreement_pct", share of recorded states where the greedy action equals fp32's).
        Continuous: ("action_err_pct", mean |action - fp32 action| in % of the action range)."""
        if ref is None or self.actions is None or np.shape(ref) != np.shape(self.actions):
            return None
        if self.action_range is None:
            return "agreement_pct", 100.0 * float(np.mean(self.actions == ref))
        err = float(np.mean(np.abs(self.actions.astype(np.float64) - ref)))
        return "action_err_pct", 100.0 * err / self.action_range

    def summary(
        self, fp32: list[float] | None, rand: list[float] | None, ref_actions: np.ndarray | None = None
    ) -> VariantResult:
        """The row of the results: the returns, and against fp32's on the same seeds the drop
        (stats.paired_drift), the fidelity and the normalized return."""
        if self.skipped or not self.returns:
            return variant_result(self.policy, self.env, self.algo, self.variant, self.bits, [],
                                  skipped=self.skipped, note=self.note)  # fmt: skip
        normalized = None
        if fp32 and rand:
            f_mean, r_mean = float(np.mean(fp32)), float(np.mean(rand))
            m = mean_std(self.returns)[0]
            normalized = (m - r_mean) / (f_mean - r_mean) if f_mean != r_mean else None
        return variant_result(
            self.policy, self.env, self.algo, self.variant, self.bits, self.returns, note=self.note,
            drift=paired_drift(fp32, self.returns) if fp32 else None,
            fidelity=self.fidelity(ref_actions) if self.variant != "fp32" else None, normalized=normalized,
        )  # fmt: skip


# ---- writers -------------------------------------------------------------------------------------------

STUDY_TITLES = ("# PTQ study", "# QAT vs PTQ", "# ActorQ study")


def _is_study_json(path: Path) -> bool:
    try:
        data = json.loads(path.read_bytes()) if path.stat().st_size < 2**26 else None
    except (OSError, ValueError, RecursionError):
        return False
    if not isinstance(data, dict):
        return False
    fmt = data.get("format")
    # actorq.json of earlier versions carries no format field: recognised by its keys
    return (isinstance(fmt, str) and fmt.startswith("quarl-edge/study")) or {"suite", "runs", "rows"} <= set(
        data
    )


def _starts_with(prefixes: Sequence[str]) -> Callable[[Path], bool]:
    def recognise(path: Path) -> bool:
        try:
            with path.open("rb") as f:
                head = f.read(256)
        except OSError:
            return False
        return any(head.startswith(p.encode()) for p in prefixes)

    return recognise


def claim_output(path: Path, kind: str) -> Path:
    """A study writes only over its own files: ``kind`` json or md (a csv's ``header`` is checked by
    write_tables, a PNG by common.figures); anything else of the same name is refused in one line
    (quarl_edge.outputs)."""
    recognisers: dict[str, Callable[[Path], bool]] = {
        "json": _is_study_json,
        "md": _starts_with(STUDY_TITLES),
    }
    return claim(path, Kind(f"study {kind}", False, recognisers[kind]), name=f"the study's {path.name!r}")


def write_tables(
    out: Path,
    stem: str,
    study: Any,
    markdown: str,
    csv_header: Sequence[str],
    csv_rows: Iterable[Sequence[Any]],
) -> list[Path]:
    """``out/<stem>.json`` (the study: a typed result, as its JSON; non-finite numbers as null), ``.md``
    and ``.csv``, each atomic."""
    csv_kind = Kind("study csv", False, _starts_with([",".join(csv_header)]))
    claim_output(out / f"{stem}.json", "json"), claim_output(out / f"{stem}.md", "md")
    claim(out / f"{stem}.csv", csv_kind, name=f"the study's {stem}.csv")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / f"{stem}.json", to_json(study))
    atomic_write_text(out / f"{stem}.md", markdown)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(list(csv_header))
    w.writerows(csv_rows)
    atomic_write_text(out / f"{stem}.csv", buf.getvalue())
    return [out / f"{stem}.json", out / f"{stem}.md", out / f"{stem}.csv"]
