"""LinkNet (Chaurasia & Culurciello, 2017): ResNet-18 encoder, light decoders linked by additions.

Operators, in order: ``init.conv`` (7x7/2 conv 3->64 + BN + ReLU), ``init.pool`` (3x3/2 max-pool);
encoder ``enc{k}`` (k = 1..4, 64/128/256/512 channels, two basic blocks each, encoders 2..4 down-sample):
per block ``.down`` (1x1/2 projection + BN, first block of encoders 2..4), ``.conv1`` (3x3 + BN + ReLU),
``.conv2`` (3x3 + BN, residual add, ReLU; the last block of encoders 1..3 also saves its output as a skip);
decoder ``dec{k}`` (k = 4..1, m -> n channels): ``.conv1`` (1x1 m -> m/4 + BN + ReLU), ``.full`` (3x3
transposed conv, stride 2 except in decoder 1, + BN + ReLU), ``.conv2`` (1x1 m/4 -> n + BN + ReLU, then
plus the skip of encoder k-1); head ``final.full1`` (3x3/2 transposed conv 64->32 + BN + ReLU),
``final.conv`` (3x3 32->32 + BN + ReLU), ``final.full2`` (2x2/2 transposed conv 32 -> n_classes).

The carry is ``(x, identity_or_None, skips)`` so the model can be cut between any two operators.
Full: ResNet-18 widths at ``image_size`` = 256. Small: widths / 4 at 64x64.
"""

from __future__ import annotations

import torch
from torch import nn

from dvasim.model.zoo.base import ZooModel, init_cnn_weights

FULL_IMAGE_SIZE = 256


def _split(carry):
    if isinstance(carry, tuple):
        return carry
    return carry, None, ()


def conv_bn(cin, cout, k, stride=1):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, padding=k // 2, bias=False), nn.BatchNorm2d(cout))


def full_bn(cin, cout, stride):
    return nn.Sequential(
        nn.ConvTranspose2d(cin, cout, 3, stride, padding=1, output_padding=stride - 1, bias=False),
        nn.BatchNorm2d(cout),
    )


class InitConv(nn.Module):
    def __init__(self, cout):
        super().__init__()
        self.conv = conv_bn(3, cout, 7, 2)

    def forward(self, x):
        return torch.relu(self.conv(x)), None, ()


class Pool(nn.Module):
    def forward(self, carry):
        x, idn, skips = carry
        return nn.functional.max_pool2d(x, 3, 2, padding=1), idn, skips


class Down(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.proj = conv_bn(cin, cout, 1, 2)

    def forward(self, carry):
        x, _, skips = carry
        return x, self.proj(x), skips


class BlockConv1(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv = conv_bn(cin, cout, 3, stride)

    def forward(self, carry):
        x, idn, skips = carry
        return torch.relu(self.conv(x)), (x if idn is None else idn), skips


class BlockConv2(nn.Module):
    def __init__(self, c, push):
        super().__init__()
        self.conv = conv_bn(c, c, 3)
        self.push = push

    def forward(self, carry):
        h, idn, skips = carry
        y = torch.relu(self.conv(h) + idn)
        return y, None, (skips + (y,) if self.push else skips)


class Pointwise(nn.Module):
    """1x1 conv + BN + ReLU; with ``add_skip`` the last saved skip is added (and popped)."""

    def __init__(self, cin, cout, add_skip=False):
        super().__init__()
        self.conv = conv_bn(cin, cout, 1)
        self.add_skip = add_skip

    def forward(self, carry):
        x, _, skips = carry
        y = torch.relu(self.conv(x))
        if self.add_skip:
            y, skips = y + skips[-1], skips[:-1]
        return y, None, skips


class Full(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv = full_bn(cin, cout, stride)

    def forward(self, carry):
        x, _, skips = carry
        return torch.relu(self.conv(x)), None, skips


class Conv3(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = conv_bn(cin, cout, 3)

    def forward(self, carry):
        x, _, skips = carry
        return torch.relu(self.conv(x)), None, skips


class FinalFull(nn.Module):
    def __init__(self, cin, n_classes):
        super().__init__()
        self.conv = nn.ConvTranspose2d(cin, n_classes, 2, stride=2)

    def forward(self, carry):
        x, _, _skips = carry
        return self.conv(x)


def build_linknet(name: str, variant: str, image_size: int | None = None) -> ZooModel:
    base, size = (64, FULL_IMAGE_SIZE) if variant == "full" else (16, 64)
    size = image_size or size
    if size % 32:
        raise ValueError(f"linknet image_size must be a multiple of 32, got {size}")
    n_classes = 2
    widths = [base, base * 2, base * 4, base * 8]
    ops: list[tuple[str, nn.Module]] = [("init.conv", InitConv(base)), ("init.pool", Pool())]
    cin = base
    for k, c in enumerate(widths, start=1):
        for b in range(2):
            p = f"enc{k}.b{b}"
            stride = 2 if (k > 1 and b == 0) else 1
            if stride == 2:
                ops.append((f"{p}.down", Down(cin, c)))
            ops += [
                (f"{p}.conv1", BlockConv1(cin, c, stride)),
                (f"{p}.conv2", BlockConv2(c, push=(b == 1 and k < 4))),
            ]
            cin = c
    for k in range(4, 0, -1):
        m = widths[k - 1]
        n = widths[k - 2] if k > 1 else base
        ops += [
            (f"dec{k}.conv1", Pointwise(m, m // 4)),
            (f"dec{k}.full", Full(m // 4, m // 4, stride=2 if k > 1 else 1)),
            (f"dec{k}.conv2", Pointwise(m // 4, n, add_skip=k > 1)),
        ]
    ops += [
        ("final.full1", Full(base, base // 2, stride=2)),
        ("final.conv", Conv3(base // 2, base // 2)),
        ("final.full2", FinalFull(base // 2, n_classes)),
    ]
    for _, mod in ops:
        init_cnn_weights(mod)
    cfg = dict(base_width=base, image_size=size, n_classes=n_classes, encoder="resnet18")
    return ZooModel(name=name, variant=variant, input_kind="image", ops=ops, config=cfg)
