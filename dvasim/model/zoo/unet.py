"""U-Net (Ronneberger et al., 2015): 4 down-sampling and 4 up-sampling levels, 64..1024 channels.

Operators, in order (27 for 4 levels): ``enc{k}.conv1``, ``enc{k}.conv2`` (3x3 conv + ReLU; the second one
saves its output as the skip tensor of level ``k``), ``pool{k}`` (2x2/2 max-pool) for ``k = 1..4``;
``mid.conv1``, ``mid.conv2`` (the 1024-channel bottom); for ``k = 4..1``: ``dec{k}.up`` (2x2/2 transposed
conv halving the channels), ``dec{k}.conv1`` (concatenation with skip ``k`` + 3x3 conv + ReLU), ``dec{k}.conv2``;
finally ``out`` (1x1 conv to ``n_classes`` = 2 maps).

Deviation from the original paper, as in most re-implementations: the 3x3 convolutions are padded ("same")
so the output has the input's size and no cropping is needed. No BatchNorm (as in the original).
The carry is ``(x, skips)`` with ``skips`` a tuple of the saved encoder tensors, so any cut works.

Full: 64..1024 channels at ``image_size`` = 256 (3-channel input). Small: 8..128 channels at 64x64.
"""

from __future__ import annotations

import torch
from torch import nn

from dvasim.model.zoo.base import ZooModel, init_cnn_weights

FULL_IMAGE_SIZE = 256


def _split(carry):
    if isinstance(carry, tuple):
        return carry
    return carry, ()


class Conv(nn.Module):
    """3x3 conv + ReLU. ``push`` saves the output as a skip; ``concat`` first concatenates the last skip."""

    def __init__(self, cin: int, cout: int, push: bool = False, concat: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.push, self.concat = push, concat

    def forward(self, carry):
        x, skips = _split(carry)
        if self.concat:
            x = torch.cat([skips[-1], x], dim=1)
            skips = skips[:-1]
        y = torch.relu(self.conv(x))
        return (y, skips + (y,)) if self.push else (y, skips)


class Pool(nn.Module):
    def forward(self, carry):
        x, skips = carry
        return nn.functional.max_pool2d(x, 2), skips


class Up(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cout, 2, stride=2)

    def forward(self, carry):
        x, skips = carry
        return self.up(x), skips


class Out(nn.Module):
    def __init__(self, cin: int, n_classes: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, n_classes, 1)

    def forward(self, carry):
        x, _skips = carry
        return self.conv(x)


def build_unet(name: str, variant: str, image_size: int | None = None) -> ZooModel:
    base, size = (64, FULL_IMAGE_SIZE) if variant == "full" else (8, 64)
    size = image_size or size
    if size % 16:
        raise ValueError(f"unet image_size must be a multiple of 16, got {size}")
    n_classes = 2
    ops: list[tuple[str, nn.Module]] = []
    cin = 3
    for k in range(1, 5):
        c = base * 2 ** (k - 1)
        ops += [
            (f"enc{k}.conv1", Conv(cin, c)),
            (f"enc{k}.conv2", Conv(c, c, push=True)),
            (f"pool{k}", Pool()),
        ]
        cin = c
    ops += [("mid.conv1", Conv(cin, base * 16)), ("mid.conv2", Conv(base * 16, base * 16))]
    cin = base * 16
    for k in range(4, 0, -1):
        c = base * 2 ** (k - 1)
        ops += [
            (f"dec{k}.up", Up(cin, c)),
            (f"dec{k}.conv1", Conv(2 * c, c, concat=True)),
            (f"dec{k}.conv2", Conv(c, c)),
        ]
        cin = c
    ops.append(("out", Out(cin, n_classes)))
    for _, m in ops:
        init_cnn_weights(m)
    cfg = dict(base_width=base, image_size=size, n_classes=n_classes, levels=4)
    return ZooModel(name=name, variant=variant, input_kind="image", ops=ops, config=cfg)
