"""ResNet-50/101/152 (He et al., 2016; torchvision v1.5 layout: stride on the 3x3 conv) as per-conv operators.

Operators, in order: ``stem.conv`` (7x7/2 conv + BN + ReLU), ``stem.pool`` (3x3/2 max-pool); for every
bottleneck block ``s{stage}.b{block}``: ``.down`` (1x1 projection + BN, first block of a stage only),
``.conv1`` (1x1 + BN + ReLU), ``.conv2`` (3x3 + BN + ReLU), ``.conv3`` (1x1 + BN, residual add, ReLU);
finally ``head`` (global average pool + fully connected 2048 -> 1000).

Each op is one fused kernel the way TensorRT runs it (BN folded into the conv, ReLU/add in its epilogue).
Inside a block the carry is ``(h, identity)`` so the block can be cut between its convolutions.
Full: 224x224 input, widths 64..512 (x4 expansion). Small: same layout with widths 16..128, fewer blocks and
64x64 input.
"""

from __future__ import annotations

import torch
from torch import nn

from dvasim.model.zoo.base import ZooModel, init_cnn_weights

LAYERS = {
    "resnet50": (3, 4, 6, 3),
    "resnet101": (3, 4, 23, 3),
    "resnet152": (3, 8, 36, 3),
}
SMALL_LAYERS = {
    "resnet50": (1, 1, 2, 1),
    "resnet101": (1, 1, 3, 1),
    "resnet152": (1, 2, 4, 1),
}


def conv_bn(cin: int, cout: int, k: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, padding=k // 2, bias=False), nn.BatchNorm2d(cout))


class Stem(nn.Module):
    def __init__(self, cout: int):
        super().__init__()
        self.conv = conv_bn(3, cout, 7, 2)

    def forward(self, x):
        return torch.relu(self.conv(x))


class Down(nn.Module):
    """Projection shortcut: ``x -> (x, proj(x))``."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.proj = conv_bn(cin, cout, 1, stride)

    def forward(self, x):
        return x, self.proj(x)


class Conv1(nn.Module):
    def __init__(self, cin: int, cmid: int):
        super().__init__()
        self.conv = conv_bn(cin, cmid, 1)

    def forward(self, carry):
        x, idn = carry if isinstance(carry, tuple) else (carry, carry)
        return torch.relu(self.conv(x)), idn


class Conv2(nn.Module):
    def __init__(self, cmid: int, stride: int):
        super().__init__()
        self.conv = conv_bn(cmid, cmid, 3, stride)

    def forward(self, carry):
        h, idn = carry
        return torch.relu(self.conv(h)), idn


class Conv3(nn.Module):
    def __init__(self, cmid: int, cout: int):
        super().__init__()
        self.conv = conv_bn(cmid, cout, 1)

    def forward(self, carry):
        h, idn = carry
        return torch.relu(self.conv(h) + idn)


class Head(nn.Module):
    def __init__(self, cin: int, n_classes: int):
        super().__init__()
        self.fc = nn.Linear(cin, n_classes)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def build_resnet(name: str, variant: str) -> ZooModel:
    if variant == "full":
        layers, base, image_size, n_classes = LAYERS[name], 64, 224, 1000
    else:
        layers, base, image_size, n_classes = SMALL_LAYERS[name], 16, 64, 100
    ops: list[tuple[str, nn.Module]] = [
        ("stem.conv", Stem(base)),
        ("stem.pool", nn.MaxPool2d(3, 2, padding=1)),
    ]
    cin = base
    for s, n_blocks in enumerate(layers):
        cmid = base * 2**s
        cout = cmid * 4
        for b in range(n_blocks):
            stride = 2 if (b == 0 and s > 0) else 1
            p = f"s{s + 1}.b{b}"
            if b == 0:
                ops.append((f"{p}.down", Down(cin, cout, stride)))
            ops += [
                (f"{p}.conv1", Conv1(cin, cmid)),
                (f"{p}.conv2", Conv2(cmid, stride)),
                (f"{p}.conv3", Conv3(cmid, cout)),
            ]
            cin = cout
    ops.append(("head", Head(cin, n_classes)))
    for _, m in ops:
        init_cnn_weights(m)
    cfg = dict(layers=layers, base_width=base, image_size=image_size, n_classes=n_classes)
    return ZooModel(name=name, variant=variant, input_kind="image", ops=ops, config=cfg)
