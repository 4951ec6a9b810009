"""A QAT policy as the exporters need it: a plain policy with the effective n-bit weights, plus the
input range each quantized layer learned in training. Resolved once, by the bundle writer."""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch

from quarl_edge.policy.net import Policy, build_policy
from quarl_edge.quant.config import QATConfig
from quarl_edge.quant.qat import fake_quant_weight, qat_layers

Range = tuple[float, float]


@dataclass(frozen=True)
class Deployable:
    plain: Policy
    """the policy without fake quantization; its weights are the QAT policy's effective n-bit weights"""
    qat: QATConfig
    ranges: tuple[Range | None, ...]
    """each quantized layer's learned input range (lo, hi), in layer order; None where none was learned"""


def deployable(policy: Policy) -> Deployable:
    """Resolve a QAT policy (``policy.arch.qat`` set) into a plain policy and its learned ranges."""
    if policy.arch.qat is None:
        raise ValueError("deployable() needs a QAT policy")
    ranges: list[Range | None] = []
    state: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, layer in qat_layers(policy.net):
            state[f"{name}.weight"] = fake_quant_weight(
                layer.weight, layer.qat_bits, layer.qat_per_channel
            ).clone()
            learned = layer.qat_acts and bool(layer.act_seen)
            ranges.append((min(float(layer.act_lo), 0.0), max(float(layer.act_hi), 0.0)) if learned else None)
        for k, v in policy.net.state_dict().items():
            if not k.endswith(("act_lo", "act_hi", "act_seen")) and k not in state:
                state[k] = v.clone()
    plain = build_policy(policy.spec, replace(policy.arch, qat=None), state)
    plain.extra = copy.deepcopy(policy.extra)
    return Deployable(plain, policy.arch.qat, tuple(ranges))
