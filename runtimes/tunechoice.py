"""The choice `quarl-edge tune` made for a bundle, as its manifest records it (``tune``): the model, the
thread count and the device it was measured on, and the evidence. Written by quarl_edge/tune/ship.py;
typed here, on the device side, so ``load_policy`` and deploy read it checked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import schema
from .adapters import MAX_THREADS
from .errors import InputError
from .schema import JSONObject

FIX = "re-run `quarl-edge tune`"
WHERE = "bundle manifest tune"
MAX_NAME = 256
MAX_MEASURED = 16


@dataclass(frozen=True)
class TuneChoice:
    chosen: str
    """the model tune chose (a model of the bundle: choose_model checks that against the models)"""
    threads: int
    """the thread count it was measured at, what ``load_policy(threads="tune")`` opens it with"""
    device: str
    """the device profile it was chosen on (a bundle loaded or deployed elsewhere warns)"""
    emulated: bool | None = None
    """whether that device was an emulated board (qemu: its latency is not the board's)"""
    evidence: JSONObject | None = None
    """the chosen candidate's row, as tune wrote it (quarl_edge.tune.records.Choice, which checks it)"""
    policy_sha256: str | None = None
    """the policy it was tuned from"""
    measured: tuple[tuple[str, str], ...] | None = None
    """(model, sha256) of each model shipped, the bytes that were measured"""

    def __post_init__(self) -> None:
        w = WHERE
        schema.text(self.chosen, f"{w}.chosen", FIX, MAX_NAME)
        schema.integer(self.threads, f"{w}.threads", FIX, 1, MAX_THREADS)
        schema.text(self.device, f"{w}.device", FIX, MAX_NAME)
        if self.emulated is not None and not isinstance(self.emulated, bool):
            raise InputError(f"{w}.emulated is not true or false ({str(self.emulated)[:24]!r})", FIX)
        if self.evidence is not None:
            schema.obj(self.evidence, f"{w}.evidence", FIX)
        if self.policy_sha256 is not None:
            schema.text(self.policy_sha256, f"{w}.policy_sha256", FIX, 64)
        if self.measured is not None:
            if len(self.measured) > MAX_MEASURED:
                raise InputError(f"{w}.measured names more than {MAX_MEASURED} models", FIX)
            for name, sha in self.measured:
                schema.text(name, f"{w}.measured model", FIX, MAX_NAME)
                schema.text(sha, f"{w}.measured[{name[:64]!r}]", FIX, 64)

    def to_dict(self) -> JSONObject:
        optional = {"emulated": self.emulated, "evidence": self.evidence, "policy_sha256": self.policy_sha256,
                    "measured": None if self.measured is None else dict(self.measured)}  # fmt: skip
        return {"chosen": self.chosen, "threads": self.threads, "device": self.device,
                **{k: v for k, v in optional.items() if v is not None}}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Any) -> TuneChoice:
        """The block as read, every field checked (when made): a bad one is one InputError naming it."""
        d = schema.obj(d, WHERE, FIX)
        measured = d.get("measured")
        if measured is not None:
            measured = tuple(schema.obj(measured, f"{WHERE}.measured", FIX).items())
        return cls(chosen=d.get("chosen"), threads=d.get("threads"), device=d.get("device"),
                   emulated=d.get("emulated"), evidence=d.get("evidence"), policy_sha256=d.get("policy_sha256"),
                   measured=measured)  # fmt: skip
