"""SB3's CombinedExtractor (MultiInputPolicy over a Dict of image and vector keys) on the flat vector the
runtime hands the graph: the deployed policy flattens the env's dict in the manifest's key order (images
as their raw pixel values, runtimes.modelio.DictInput), and the graph slices each key back out: an image
reshaped as the env returns it, transposed to channels first where SB3's VecTransposeImage transposes
it, divided by 255 (SB3's ``normalize_images``) and run through its own Nature CNN; a vector as it is.
The features are concatenated in that same key order, the Dict space's own (sorted by gymnasium), which
is the order SB3's extractor iterates. One model input keeps every exporter and runtime as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from quarl_edge.runtimes.envs import DICT_OBS
from quarl_edge.runtimes.errors import InputError
from quarl_edge.runtimes.modelio import IMAGE_KINDS, VECTOR, DictInput
from quarl_edge.runtimes.spec import WrapperConfig


def nature_cnn(channels: int) -> nn.Sequential:
    """The Nature-DQN convolutions (SB3's NatureCNN.cnn); its input is at least 36x36."""
    return nn.Sequential(
        nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(),
        nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
        nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
        nn.Flatten(),
    )  # fmt: skip


def key_kind(space: Any) -> str:
    """A Dict entry's kind by SB3's rules: an image is a 3-D uint8 Box bounded 0..255 (``is_image_space``);
    it is channels first when its first dimension is the smallest (``is_image_space_channels_first``),
    else VecTransposeImage transposes it from height-width-channels."""
    shape = tuple(getattr(space, "shape", None) or ())
    low, high = getattr(space, "low", None), getattr(space, "high", None)
    if (len(shape) == 3 and np.dtype(getattr(space, "dtype", None)) == np.uint8
            and np.all(low == 0) and np.all(high == 255)):  # fmt: skip
        return "image_chw" if int(np.argmin(shape)) == 0 else "image_hwc"
    return VECTOR


@dataclass(frozen=True)
class KeyPart:
    key: str
    shape: tuple[int, ...]
    """as the env returns it"""
    kind: str

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def chw(self) -> tuple[int, ...]:
        return (self.shape[2], self.shape[0], self.shape[1]) if self.kind == "image_hwc" else self.shape


def key_parts(wrappers: tuple[WrapperConfig, ...]) -> tuple[KeyPart, ...]:
    """The entries of the policy's ``dict_obs`` preprocessing, in order (() when it has none)."""
    w = next((w for w in wrappers if w.name == DICT_OBS), None)
    if w is None:
        return ()
    d = DictInput(w.kwargs)  # validated as the runtime validates it
    return tuple(KeyPart(k, s, kind) for k, s, kind in zip(d.keys, d.shapes, d.kinds, strict=True))


class CombinedFeatures(nn.Module):
    """flat [N, D] -> the concatenated features of every key, as SB3's CombinedExtractor computes them."""

    def __init__(self, parts: tuple[KeyPart, ...], cnn_features: int, scale_uint8: bool) -> None:
        super().__init__()
        if not any(p.kind in IMAGE_KINDS for p in parts):
            raise InputError("a combined (image + vector) model without an image key", "use the mlp model")
        self.parts, self.scale = parts, scale_uint8
        self.cnns, self.cnn_fcs = nn.ModuleList(), nn.ModuleList()
        self.out_dim = 0
        for p in parts:
            if p.kind == VECTOR:
                self.out_dim += p.size
                continue
            cnn = nature_cnn(p.chw[0])
            if min(p.chw[1:]) < 36:
                raise InputError(f"the image key {p.key!r} is {list(p.shape)}: the Nature CNN needs 36x36 or more",
                                 "SB3's CombinedExtractor cannot have been trained on it either")  # fmt: skip
            with torch.no_grad():
                n_flat = int(cnn(torch.zeros(1, *p.chw)).shape[1])
            self.cnns.append(cnn)
            self.cnn_fcs.append(nn.Sequential(nn.Linear(n_flat, cnn_features), nn.ReLU()))
            self.out_dim += cnn_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, start, image = [], 0, 0
        for p in self.parts:
            part = x[:, start : start + p.size]
            start += p.size
            if p.kind == VECTOR:
                out.append(part)
                continue
            im = part.reshape(-1, *p.shape)
            if p.kind == "image_hwc":
                im = im.permute(0, 3, 1, 2)
            if self.scale:
                im = im / 255.0
            out.append(self.cnn_fcs[image](self.cnns[image](im)))
            image += 1
        return torch.cat(out, dim=1)
