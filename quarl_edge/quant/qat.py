"""Quantization-aware training: fake quantization with straight-through gradients, after a delay.

Weights are quantized symmetrically to n bits (per-output-channel for convolutions, per-tensor for
dense layers); the input activations of every quantized layer are quantized affinely to n bits over a
range tracked by an exponential moving average during training. Before ``delay`` environment steps
everything runs in fp32 (ranges are still tracked, so they are warm when quantization switches on).

Layers are converted in place (their class is swapped for a QAT subclass), so the parameters and an
optimizer that already holds them are untouched: SB3 policies are wrapped, not forked.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from quarl_edge.quant.config import QATConfig
from quarl_edge.runtimes.errors import InputError

# Layer types that hold no weights to quantize and pass through unchanged
_PASSTHROUGH = (
    nn.ReLU, nn.Tanh, nn.ELU, nn.LeakyReLU, nn.Identity, nn.Flatten, nn.Sequential, nn.ModuleList,
    nn.ModuleDict, nn.Softmax, nn.Dropout,
)  # fmt: skip


class QATClock:
    """Shared step counter: a training callback advances it; layers read whether QAT is on."""

    def __init__(self, delay: int) -> None:
        self.delay = delay
        self.step = 0

    @property
    def active(self) -> bool:
        return self.step >= self.delay


def _round_ste(x: torch.Tensor) -> torch.Tensor:
    """round() whose gradient is the identity (straight-through); plain round when no grad is needed."""
    if not torch.is_grad_enabled() or not x.requires_grad:
        return torch.round(x)
    return _RoundSTE.apply(x)  # type: ignore[no-any-return]


class _RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return torch.round(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad  # straight-through


def fake_quant_weight(w: torch.Tensor, bits: int, per_channel: bool) -> torch.Tensor:
    """Symmetric n-bit fake quantization; gradients pass straight through the rounding."""
    qmax = 2 ** (bits - 1) - 1
    if per_channel:
        amax = w.detach().abs().reshape(w.shape[0], -1).amax(dim=1).reshape(-1, *([1] * (w.dim() - 1)))
    else:
        amax = w.detach().abs().max()  # amax() without dims does not export to ONNX
    scale = torch.clamp(amax, min=1e-8) / qmax
    return torch.clamp(_round_ste(w / scale), -qmax, qmax) * scale


def fake_quant_act(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, bits: int) -> torch.Tensor:
    """Affine n-bit fake quantization over [lo, hi] (which always contains 0); STE inside the range."""
    lo = torch.clamp(lo, max=0.0)
    hi = torch.clamp(hi, min=0.0)
    levels = 2**bits - 1
    scale = torch.clamp(hi - lo, min=1e-8) / levels
    zero = torch.round(-lo / scale)
    q = torch.clamp(_round_ste(x / scale) + zero, 0, levels)
    return (q - zero) * scale


class _QATMixin:
    """Adds fake quantization to a Linear/Conv2d whose class is swapped at conversion."""

    qat_bits: int
    qat_per_channel: bool
    qat_acts: bool
    qat_decay: float
    qat_clock: QATClock
    act_lo: torch.Tensor
    act_hi: torch.Tensor
    act_seen: torch.Tensor
    weight: torch.Tensor
    training: bool

    def qat_setup(self, cfg: QATConfig, clock: QATClock, per_channel: bool) -> None:
        self.qat_bits = cfg.bits
        self.qat_per_channel = per_channel
        self.qat_acts = cfg.activations
        self.qat_decay = cfg.ema_decay
        self.qat_clock = clock
        dev = self.weight.device
        self.register_buffer("act_lo", torch.zeros((), device=dev))  # type: ignore[attr-defined]
        self.register_buffer("act_hi", torch.zeros((), device=dev))  # type: ignore[attr-defined]
        self.register_buffer("act_seen", torch.zeros((), dtype=torch.bool, device=dev))  # type: ignore[attr-defined]

    def _track(self, x: torch.Tensor) -> None:
        lo, hi = x.detach().amin(), x.detach().amax()
        if not bool(self.act_seen):
            self.act_lo.copy_(lo)
            self.act_hi.copy_(hi)
            self.act_seen.fill_(True)
        else:
            d = self.qat_decay
            self.act_lo.mul_(d).add_((1 - d) * lo)
            self.act_hi.mul_(d).add_((1 - d) * hi)

    def qat_input(self, x: torch.Tensor) -> torch.Tensor:
        if not self.qat_acts:
            return x
        if self.training:
            self._track(x)
            if self.qat_clock.active and bool(self.act_seen):
                return fake_quant_act(x, self.act_lo, self.act_hi, self.qat_bits)
            return x
        if not self.qat_clock.active:
            return x
        # no Python branch on a tensor here, so the deployed policy exports (torch.export) as a graph
        return torch.where(self.act_seen, fake_quant_act(x, self.act_lo, self.act_hi, self.qat_bits), x)

    def qat_weight(self) -> torch.Tensor:
        if self.qat_clock.active:
            return fake_quant_weight(self.weight, self.qat_bits, self.qat_per_channel)
        return self.weight


class QATLinear(_QATMixin, nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(self.qat_input(x), self.qat_weight(), self.bias)


class QATConv2d(_QATMixin, nn.Conv2d):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(self.qat_input(x), self.qat_weight(), self.bias)


def convert(module: nn.Module, cfg: QATConfig, clock: QATClock, path: str = "") -> int:
    """Turn every Linear/Conv2d under ``module`` into its QAT twin, in place; returns the count.

    Any other layer with parameters is refused with its name: it would silently train in fp32.
    """
    return sum(
        convert_layer(child, cfg, clock, f"{path}.{name}" if path else name)
        for name, child in module.named_children()
    )


def convert_layer(layer: nn.Module, cfg: QATConfig, clock: QATClock, name: str) -> int:
    """``layer`` itself if it is a Linear/Conv2d, else the layers under it (see convert)."""
    if type(layer) is nn.Linear:
        layer.__class__ = QATLinear
        layer.qat_setup(cfg, clock, per_channel=False)  # type: ignore[attr-defined,operator]
        return 1
    if type(layer) is nn.Conv2d:
        layer.__class__ = QATConv2d
        layer.qat_setup(cfg, clock, per_channel=True)  # type: ignore[attr-defined,operator]
        return 1
    if isinstance(layer, (QATLinear, QATConv2d)):
        return 1
    if any(True for _ in layer.parameters(recurse=False)) and not isinstance(layer, _PASSTHROUGH):
        raise InputError(
            f"QAT does not support the layer {name!r} ({type(layer).__name__})",
            "QAT handles Linear and Conv2d layers (MLP and Nature-CNN policies)",
        )
    return convert(layer, cfg, clock, name)


def qat_layers(module: nn.Module) -> list[tuple[str, _QATMixin]]:
    return [(name, m) for name, m in module.named_modules() if isinstance(m, (QATLinear, QATConv2d))]
