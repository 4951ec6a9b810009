"""Weight-only n-bit quantization: values on the grid, per-channel for convs, range checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from quarl_edge.policy.net import load_checkpoint
from quarl_edge.quant.weights import quantize_tensor, quantize_weights
from quarl_edge.runtimes.errors import InputError


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_per_tensor_grid_has_at_most_2q_plus_1_levels(bits: int) -> None:
    w = torch.randn(64, 32)
    q = quantize_tensor(w, bits, per_channel=False)
    levels = torch.unique(q)
    assert len(levels) <= 2**bits - 1
    scale = w.abs().max() / (2 ** (bits - 1) - 1)
    assert torch.allclose(levels / scale, torch.round(levels / scale), atol=1e-4)
    assert (q - w).abs().max() <= scale / 2 + 1e-6


def test_per_channel_scales_each_output_channel() -> None:
    w = torch.randn(8, 4, 3, 3) * torch.arange(1, 9).reshape(8, 1, 1, 1)
    q = quantize_tensor(w, 2, per_channel=True)
    for c in range(8):  # 2 bits symmetric: {-1, 0, 1} x the channel's own scale
        assert len(torch.unique(q[c])) <= 3
        assert torch.isclose(q[c].abs().max(), w[c].abs().max())


def test_quantize_weights_keeps_original_and_changes_copy(cartpole_policy: Path) -> None:
    policy = load_checkpoint(cartpole_policy)
    before = policy.net.out.weight.clone()
    q2 = quantize_weights(policy, 2)
    assert torch.equal(policy.net.out.weight, before)
    assert len(torch.unique(q2.net.out.weight)) <= 3
    obs = np.random.default_rng(0).normal(size=(256, 4)).astype(np.float32)
    assert np.mean(quantize_weights(policy, 8).predict(obs) == policy.predict(obs)) > 0.95


@pytest.mark.parametrize("bits", [1, 9])
def test_bits_out_of_range_are_refused(bits: int) -> None:
    with pytest.raises(InputError, match="between 2 and 8"):
        quantize_tensor(torch.ones(3), bits, per_channel=False)
