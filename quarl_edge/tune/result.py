"""tune's result, typed: what run_tune returns and what tune.json's ``tune`` block holds (schema_version 1).

A frozen dataclass of the records in tune/records.py, checked as a whole when made and when read back:
the choice is a candidate that passed, its numbers and sha256 are its row's, it is never slower than the
fp32 reference and keeps the reward limit it was chosen under, and the shipped bundle holds exactly the
bytes that were measured. Dicts only at the JSON edge (``to_dict`` / ``from_dict``); the JSON keys are
those of the earlier untyped result, plus ``schema_version``, ``inputs``, ``shipped`` and a ``sha256``
per model."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from quarl_edge.runtimes import schema
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.schema import JSONObject
from quarl_edge.tune.records import (
    FIX,
    CandidateRow,
    Choice,
    Inputs,
    LayerEvidence,
    Shipped,
    TuneDevice,
    TuneSettings,
)

TUNE_FORMAT = "quarl-edge/tune"
TUNE_VERSION = 1
_TOL = 1e-6


@dataclass(frozen=True)
class TuneResult:
    policy: str
    env: str
    calibration: str
    inputs: Inputs
    device: TuneDevice
    reference: str
    candidates: tuple[CandidateRow, ...]
    choice: Choice | None
    settings: TuneSettings
    notes: tuple[str, ...] = ()
    search_s: float = 0.0
    reused_measurements: int = 0
    layer_search: tuple[LayerEvidence, ...] = ()
    bundle: str = ""
    """the candidates bundle in tune's cache (every candidate's model file); not part of tune.json"""
    shipped: Shipped | None = None
    files: tuple[str, ...] = ()
    """the files written (tune.json, tune.md, tune.png, the bundle); not part of tune.json"""
    reward_not_measured: str | None = None
    """why no episodes ran (the policy's environment cannot run here, as a bench report says it): every
    verdict rests on the action error on the recorded observations, and no reward is estimated"""

    def __post_init__(self) -> None:
        _check(self)

    def row(self, name: str) -> CandidateRow:
        for r in self.candidates:
            if r.name == name:
                return r
        raise InputError(f"tune result has no candidate {name[:80]!r}", FIX)

    def to_dict(self) -> JSONObject:
        return {"format": TUNE_FORMAT, "schema_version": TUNE_VERSION, "policy": self.policy, "env": self.env,
                "calibration": self.calibration, "inputs": self.inputs.to_dict(), "device": self.device.to_dict(),
                "reference": self.reference, "candidates": [r.to_dict() for r in self.candidates],
                "choice": self.choice.to_dict() if self.choice else None, "bundle": self.bundle,
                "settings": self.settings.to_dict(), "notes": list(self.notes), "search_s": self.search_s,
                "reused_measurements": self.reused_measurements,
                "layer_search": [e.to_dict() for e in self.layer_search],
                "shipped": self.shipped.to_dict() if self.shipped else None, "files": list(self.files),
                **({} if self.reward_not_measured is None else {"reward_not_measured": self.reward_not_measured})}  # fmt: skip

    def tune_block(self) -> dict[str, Any]:
        """tune.json's ``tune`` block: the result without what is local to this run's machine."""
        return {k: v for k, v in self.to_dict().items() if k not in ("bundle", "files")}

    @classmethod
    def from_dict(cls, d: Any, where: str = "tune result") -> TuneResult:
        d = schema.obj(d, where, FIX)
        if d.get("format") != TUNE_FORMAT:
            raise InputError(f"{where} is not a quarl-edge tune result", FIX)
        version = d.get("schema_version")
        if version != TUNE_VERSION:
            older = (
                isinstance(version, int)
                and not isinstance(version, bool)
                and version < TUNE_VERSION
                or version is None
            )
            raise InputError(f"{where} has schema_version {str(version)[:20]}, this quarl-edge reads {TUNE_VERSION}",
                             f"{FIX} (it was written before tune.json named the sha256 of what it measured)"
                             if older else "upgrade quarl-edge")  # fmt: skip
        try:
            cands = d["candidates"]
            if not isinstance(cands, list) or not 1 <= len(cands) <= 4096:
                raise InputError(f"{where} candidates is not a list of 1 to 4096", FIX)
            layers, notes = d.get("layer_search") or [], d.get("notes") or []
            return cls(
                schema.text(d["policy"], f"{where} policy", FIX, 256), schema.text(d["env"], f"{where} env", FIX, 256),
                schema.text(d["calibration"], f"{where} calibration", FIX), Inputs.from_dict(d["inputs"]),
                TuneDevice.from_dict(d["device"]), schema.text(d["reference"], f"{where} reference", FIX, 256),
                tuple(CandidateRow.from_dict(r, f"{where} candidate #{i}") for i, r in enumerate(cands)),
                None if d.get("choice") is None else Choice.from_dict(d["choice"]), TuneSettings.from_dict(d["settings"]),
                schema.strings(notes, f"{where} notes", FIX, 1024), d.get("search_s", 0.0), d.get("reused_measurements", 0),
                tuple(LayerEvidence.from_dict(e) for e in (layers if isinstance(layers, list) else [None])),
                schema.text(d.get("bundle") or "", f"{where} bundle", FIX),
                None if d.get("shipped") is None else Shipped.from_dict(d["shipped"]),
                schema.strings(d.get("files") or [], f"{where} files", FIX, 64),
                _opt_text(d.get("reward_not_measured"), f"{where} reward_not_measured"),
            )  # fmt: skip
        except schema.MALFORMED as e:
            raise InputError(
                f"malformed {where} (bad or missing field: {type(e).__name__}: {str(e)[:120]})", FIX
            ) from None


def _opt_text(v: Any, where: str) -> str | None:
    return None if v is None else schema.text(v, where, FIX, 400)


def _check(r: TuneResult) -> None:
    """What holds between the records of a result that was really measured."""
    if schema.number(r.search_s, "search_s", FIX) < 0:
        raise InputError("tune result search_s is negative", FIX)
    schema.integer(r.reused_measurements, "reused_measurements", FIX, 0)
    names = [c.name for c in r.candidates]
    twice = next((n for n in names if names.count(n) > 1), None)
    if twice is not None:
        raise InputError(f"tune result names the candidate {twice!r} twice", FIX)
    ref = r.row(r.reference)
    if ref.candidate.precision != "fp32":
        raise InputError(f"tune result's reference {r.reference!r} is not an fp32 model", FIX)
    if r.reward_not_measured is not None:
        _opt_text(r.reward_not_measured, "tune result reward_not_measured")
        if r.settings.max_action_error is None:
            raise InputError("tune result did not measure the reward and names no action-error limit", FIX)
        reward = next(
            (x.name for x in r.candidates if x.drop_pct is not None or x.confirm_drop_pct is not None), None
        )
        if reward is not None or (r.choice is not None and r.choice.drop_pct is not None):
            raise InputError(f"tune result says the reward was not measured, yet gives a reward drop "
                             f"({reward or 'its choice'})", FIX)  # fmt: skip
    c = r.choice
    if c is not None:
        _check_choice(r, c, r.row(c.name), ref)
    if r.shipped is not None:
        if c is None:
            raise InputError("tune result ships a bundle but names no choice", FIX)
        expected = {n: r.row(n).sha256 for n in {r.reference, c.name}}
        if dict(r.shipped.models) != expected:
            raise InputError("tune result's shipped bundle does not hold exactly the models it measured "
                             "(the choice and its fp32 reference, with the sha256s measured)", FIX)  # fmt: skip


def _check_choice(r: TuneResult, c: Choice, row: CandidateRow, ref: CandidateRow) -> None:
    where = f"tune result's choice {c.name!r}"
    if row.verdict != "pass":
        raise InputError(f"{where} did not pass (its verdict is {row.verdict or 'none'!r})", FIX)
    if c.sha256 != row.sha256:
        raise InputError(f"{where} names a model (sha256 {c.sha256[:12]}) other than the one measured "
                         f"({row.sha256[:12]})", FIX)  # fmt: skip
    if (c.threads, c.p50_us, c.p99_us) != (row.threads, row.p50_us, row.p99_us):
        raise InputError(f"{where} has threads/p50/p99 other than those measured for it", FIX)
    if ref.p50_us is None or c.p50_us > ref.p50_us * (1 + _TOL):
        raise InputError(f"{where} is slower than the fp32 reference it was measured against", FIX)
    if not math.isclose(c.speedup_vs_fp32, ref.p50_us / c.p50_us, rel_tol=_TOL):
        raise InputError(f"{where}'s speedup is not the reference's p50 over its own", FIX)
    limit = r.settings.max_p99_ms
    if limit is not None and c.p99_us > limit * 1000 * (1 + _TOL):
        raise InputError(f"{where}'s p99 is above the --max-p99-ms it was chosen under", FIX)
    if r.reward_not_measured is not None:
        _check_action_error(r, c, row)
        return
    if c.name == r.reference:
        return
    drop = row.judged_drop
    if (
        drop is None
        or c.episodes is None
        or c.drop_pct is None
        or not math.isclose(c.drop_pct, drop, rel_tol=_TOL, abs_tol=1e-9)
    ):
        raise InputError(f"{where} has a reward drop other than the one judged for it", FIX)
    if c.drop_pct > r.settings.max_reward_drop_pct:
        raise InputError(f"{where}'s reward drop {c.drop_pct:+.2f}% is above the limit it was chosen under "
                         f"({r.settings.max_reward_drop_pct:g}%)", FIX)  # fmt: skip
    if r.settings.min_agreement is not None and (
        row.agreement is None or row.agreement < r.settings.min_agreement
    ):
        raise InputError(f"{where}'s agreement is below the --min-agreement it was chosen under", FIX)


def _check_action_error(r: TuneResult, c: Choice, row: CandidateRow) -> None:
    """A choice made where the environment cannot run here: its action error is its row's, in the limit."""
    where = f"tune result's choice {c.name!r}"
    if c.name == r.reference:
        return
    limit = r.settings.max_action_error
    err = row.action_error
    if (
        err is None
        or c.action_error is None
        or not math.isclose(c.action_error, err, rel_tol=_TOL, abs_tol=1e-12)
    ):
        raise InputError(f"{where} has an action error other than the one measured for it", FIX)
    if limit is None or c.action_error > limit:
        raise InputError(f"{where}'s action error {c.action_error:.4g} is above the limit it was chosen under "
                         f"({limit})", FIX)  # fmt: skip
