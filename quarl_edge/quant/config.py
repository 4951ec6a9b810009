"""The QAT settings of a policy: one frozen, typed config for the trainer, the checkpoint and the exporters.

It sits below policy/ and train/ (both import it, it imports neither), so a QAT checkpoint loads, and
the bundle writer reads its bit width, without training code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.schema import JSONObject

MIN_BITS, MAX_BITS = 2, 8
# all: every Linear/Conv2d of the SB3 policy (actor, critics, value heads, target networks); actor: only
# the layers of the exported network, so critics, value heads and targets learn in fp32.
QAT_SCOPES = ("all", "actor")


@dataclass(frozen=True)
class QATConfig:
    bits: int
    """weight and activation bit width, 2..8"""
    delay: int = 0
    """environment steps of fp32 training before fake quantization switches on"""
    activations: bool = True
    """also fake-quantize each quantized layer's input activations"""
    ema_decay: float = 0.99
    layers: int | None = None
    """how many layers were fake-quantized (recorded in the checkpoint after conversion)"""
    scope: str = "all"
    """which layers of the SB3 policy train fake-quantized: all, or only the exported network's (actor)"""

    def __post_init__(self) -> None:
        if (
            not isinstance(self.bits, int)
            or isinstance(self.bits, bool)
            or not MIN_BITS <= self.bits <= MAX_BITS
        ):
            raise InputError(
                f"--qat-bits must be between {MIN_BITS} and {MAX_BITS} (got {self.bits})", "e.g. --qat-bits 8"
            )
        if not isinstance(self.delay, int) or self.delay < 0:
            raise InputError(f"--quant-delay must be >= 0 (got {self.delay})", "e.g. --quant-delay 10000")
        if not isinstance(self.ema_decay, float | int) or not 0.0 < self.ema_decay < 1.0:
            raise InputError("the EMA decay must be in (0, 1)", "e.g. 0.99")
        if self.scope not in QAT_SCOPES:
            raise InputError(
                f"unknown --qat-scope {str(self.scope)[:40]!r}", f"choose {' or '.join(QAT_SCOPES)}"
            )

    @property
    def learned_int8_ranges(self) -> bool:
        """8-bit weights and activations: int8 export takes the ranges learned in training."""
        return self.bits == 8 and self.activations

    def to_dict(self) -> JSONObject:
        d = asdict(self)
        if d["layers"] is None:
            del d["layers"]
        return d

    @classmethod
    def from_dict(cls, d: Any) -> QATConfig:
        """From a checkpoint's ``arch.qat`` (extra keys such as ``active`` are ignored)."""
        if not isinstance(d, dict):
            raise InputError("the checkpoint's arch.qat is not an object", "re-train or re-export the policy")
        known = {k: d[k] for k in ("bits", "delay", "activations", "ema_decay", "layers", "scope") if k in d}
        if not isinstance(known.get("activations", True), bool):
            raise InputError("the checkpoint's arch.qat.activations is not true/false", "re-train the policy")
        try:
            return cls(**known)
        except TypeError as e:
            raise InputError(f"the checkpoint's arch.qat is malformed ({e})", "re-train the policy") from None
