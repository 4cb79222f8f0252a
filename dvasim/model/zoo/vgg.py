"""VGG-16 / VGG-19 (Simonyan & Zisserman, 2015; configurations D and E, no BatchNorm) as per-layer operators.

Operators, in order: ``conv{i}`` (3x3 conv + ReLU) and ``pool{j}`` (2x2/2 max-pool) following the
configuration, then ``fc6`` (flatten + Linear + ReLU), ``fc7`` (Linear + ReLU), ``fc8`` (Linear, logits).
Dropout is omitted (inference). Full: 224x224 input, widths 64..512, 4096-wide FC layers, 1000 classes
(VGG-19: 143.7 M parameters). Small: widths / 8, 32x32 input, 256-wide FC layers, 100 classes.
"""

from __future__ import annotations

import torch
from torch import nn

from dvasim.model.zoo.base import ZooModel, init_cnn_weights

CFG = {
    "vgg16": (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"),
    "vgg19": (
        64,
        64,
        "M",
        128,
        128,
        "M",
        256,
        256,
        256,
        256,
        "M",
        512,
        512,
        512,
        512,
        "M",
        512,
        512,
        512,
        512,
        "M",
    ),
}


class ConvReLU(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x))


class FC(nn.Module):
    def __init__(self, cin: int, cout: int, relu: bool, flatten: bool = False):
        super().__init__()
        self.fc = nn.Linear(cin, cout)
        self.relu, self.flatten = relu, flatten

    def forward(self, x):
        if self.flatten:
            x = torch.flatten(x, 1)
        y = self.fc(x)
        return torch.relu(y) if self.relu else y


def build_vgg(name: str, variant: str) -> ZooModel:
    full = variant == "full"
    div, image_size, fc, n_classes = (1, 224, 4096, 1000) if full else (8, 32, 256, 100)
    ops: list[tuple[str, nn.Module]] = []
    cin, size, i, j = 3, image_size, 0, 0
    for v in CFG[name]:
        if v == "M":
            j += 1
            ops.append((f"pool{j}", nn.MaxPool2d(2, 2)))
            size //= 2
        else:
            i += 1
            cout = v // div
            ops.append((f"conv{i}", ConvReLU(cin, cout)))
            cin = cout
    ops += [
        ("fc6", FC(cin * size * size, fc, relu=True, flatten=True)),
        ("fc7", FC(fc, fc, relu=True)),
        ("fc8", FC(fc, n_classes, relu=False)),
    ]
    for _, m in ops:
        init_cnn_weights(m)
    cfg = dict(config=name, width_divisor=div, image_size=image_size, fc_width=fc, n_classes=n_classes)
    return ZooModel(name=name, variant=variant, input_kind="image", ops=ops, config=cfg)
