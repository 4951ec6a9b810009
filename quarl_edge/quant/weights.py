"""Uniform n-bit weight quantization in torch (the paper's weight-only PTQ sweep).

Symmetric, zero-point-free: per-tensor for dense layers, per-output-channel for convolutions
(QuaRL, Sec. 3). The quantized weights are written back as floats on the n-bit grid, so the policy runs
unchanged in torch and its reward can be compared with fp32 on the same seeds.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from quarl_edge.policy.net import Policy
from quarl_edge.runtimes.errors import InputError

MIN_BITS, MAX_BITS = 2, 8


def check_bits(bits: int) -> None:
    if not MIN_BITS <= bits <= MAX_BITS:
        raise InputError(f"bit width must be between {MIN_BITS} and {MAX_BITS} (got {bits})", "e.g. --bits 8")


def quantize_tensor(w: torch.Tensor, bits: int, per_channel: bool) -> torch.Tensor:
    """Round ``w`` to the symmetric n-bit grid {-q..q} * scale with q = 2^(bits-1) - 1."""
    check_bits(bits)
    qmax = 2 ** (bits - 1) - 1
    if per_channel:
        amax = w.detach().abs().reshape(w.shape[0], -1).amax(dim=1).reshape(-1, *([1] * (w.dim() - 1)))
    else:
        amax = w.detach().abs().amax()
    scale = torch.clamp(amax, min=1e-12) / qmax
    return torch.clamp(torch.round(w / scale), -qmax, qmax) * scale


def quantize_weights(policy: Policy, bits: int) -> Policy:
    """A copy of ``policy`` whose Linear and Conv2d weights lie on an n-bit grid (biases stay float)."""
    check_bits(bits)
    q = copy.deepcopy(policy)
    with torch.no_grad():
        for m in q.net.modules():
            if isinstance(m, nn.Conv2d):
                m.weight.copy_(quantize_tensor(m.weight, bits, per_channel=True))
            elif isinstance(m, nn.Linear):
                m.weight.copy_(quantize_tensor(m.weight, bits, per_channel=False))
    q.net.eval()
    return q
