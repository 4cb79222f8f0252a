"""Model zoo: the paper's six DNN services as operator lists that can be cut anywhere (random weights).

>>> from dvasim.model import zoo
>>> m = zoo.build("resnet152", variant="small")
>>> x = m.example_input(4)
>>> y = m.run_ops(m.run_ops(x, 0, 10), 10, m.n_ops())     # == m.run_ops(x, 0, m.n_ops())

``MODEL_NAMES`` are the paper's benchmarks (Sec. 8.1); ``EXTRA_MODEL_NAMES`` are used only to validate the
analytic GPU model against published measurements (ResNet-50/101: E2bird Table 1; VGG-16: Nexus profiles).
Nothing is downloaded: weights are drawn from ``torch.manual_seed(seed)`` (the global RNG state is restored).
Every model is returned in eval mode.

Small variants (same operator structure, reduced width/depth/resolution), forward time on this project's
2-core CPU (torch 2.13 CPU, 1 thread, best of 15, other jobs running), batch 1 / batch 8:
bert_base (2 layers, hidden 128, seq 128) 5.2 / 34 ms; bert_large (3 layers, hidden 192, seq 128) 15 / 89 ms;
resnet152 (blocks 1-2-4-1, widths 16..128, 64x64) 7.1 / 19 ms; vgg19 (widths /8, 32x32) 2.9 / 10 ms;
unet (8..128 channels, 64x64) 8.4 / 41 ms; linknet (widths /4, 64x64) 8.3 / 24 ms;
resnet50 5.7 / 17 ms; resnet101 6.6 / 19 ms; vgg16 2.8 / 10 ms.
Full variants follow the published architectures (parameter counts: BERT-base 109.5 M, BERT-large 335.1 M,
ResNet-152 60.19 M, VGG-19 143.67 M, UNet 31.0 M, LinkNet 11.5 M); build them with ``device="meta"`` for
shape and FLOP propagation without allocating weights.

May import: torch, the foundation and the standard library.
"""

from __future__ import annotations

import torch

from dvasim.errors import ConfigError
from dvasim.model.zoo.base import ZooModel, carry_rows, carry_to

MODEL_NAMES = ("bert_base", "bert_large", "resnet152", "vgg19", "unet", "linknet")
EXTRA_MODEL_NAMES = ("resnet50", "resnet101", "vgg16")
VARIANTS = ("full", "small")

__all__ = [
    "MODEL_NAMES",
    "EXTRA_MODEL_NAMES",
    "VARIANTS",
    "ZooModel",
    "UnknownModelError",
    "build",
    "carry_rows",
    "carry_to",
]


class UnknownModelError(ConfigError, ValueError):
    """An unknown model name or variant (a :class:`ConfigError` that is also a ``ValueError``)."""


def _builder(name: str):
    if name in ("bert_base", "bert_large"):
        from dvasim.model.zoo.bert import build_bert

        return build_bert
    if name in ("resnet50", "resnet101", "resnet152"):
        from dvasim.model.zoo.resnet import build_resnet

        return build_resnet
    if name in ("vgg16", "vgg19"):
        from dvasim.model.zoo.vgg import build_vgg

        return build_vgg
    if name == "unet":
        from dvasim.model.zoo.unet import build_unet

        return build_unet
    if name == "linknet":
        from dvasim.model.zoo.linknet import build_linknet

        return build_linknet
    raise AssertionError(name)


def build(
    name: str, variant: str = "small", seed: int = 0, device: str | torch.device = "cpu", **kwargs
) -> ZooModel:
    """Build zoo model ``name`` (``variant`` "full" or "small") with deterministic random weights, in eval mode.

    ``device="meta"`` builds the full-size structure without allocating weights (for shape and FLOP
    propagation). ``kwargs`` go to the family builder (``image_size=`` for ``unet`` and ``linknet``).
    """
    allowed = MODEL_NAMES + EXTRA_MODEL_NAMES
    if name not in allowed:
        raise UnknownModelError("model.name", f"unknown model {name!r}; allowed: {', '.join(allowed)}")
    if variant not in VARIANTS:
        raise UnknownModelError(
            "model.variant", f"unknown variant {variant!r}; allowed: {', '.join(VARIANTS)}"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device):
            model = _builder(name)(name, variant, **kwargs)
    model.config["seed"] = seed
    for _, m in model.ops:
        m.eval()
    model.module().eval()
    return model
