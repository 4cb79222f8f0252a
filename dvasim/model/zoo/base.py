"""The common container of the model zoo: an ordered list of operators that can be cut between any two.

A :class:`ZooModel` holds ``ops``, a list of ``(name, module)`` pairs. Op ``k`` consumes the output of op
``k-1`` (the *carry*). The carry is a tensor, or a tuple of tensors when something must travel past the cut
(a residual/skip tensor, UNet's encoder features, BERT's attention mask). Because everything the later ops
need is inside the carry, the model can be cut anywhere: ``run_ops(run_ops(x, 0, k), k, n) == run_ops(x, 0, n)``.

Every op module acts on the batch dimension independently (eval mode; no batch statistics), so row ``i`` of a
batched output equals the output of query ``i`` run alone (up to floating-point reassociation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["ZooModel", "Stage", "carry_to", "carry_rows"]


class Stage(nn.Module):
    """``forward(carry)`` runs a contiguous slice of a zoo model's operators."""

    def __init__(self, ops: Sequence[tuple[str, nn.Module]], start: int, end: int):
        super().__init__()
        self.start, self.end = start, end
        self.op_names = [name for name, _ in ops]
        self.ops = nn.ModuleList([m for _, m in ops])

    def forward(self, carry: Any) -> Any:
        for m in self.ops:
            carry = m(carry)
        return carry


@dataclass
class ZooModel:
    """An operator-sliceable DNN with deterministic random weights (see module docstring).

    ``input_kind`` is ``"tokens"`` (int64 ids ``[bs, seq_len]``) or ``"image"`` (float ``[bs, 3, H, W]``).
    ``config`` records the architecture hyper-parameters (widths, depths, resolution, ...).
    """

    name: str
    variant: str
    input_kind: str
    ops: list[tuple[str, nn.Module]]
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.input_kind not in ("tokens", "image"):
            raise ValueError(f"input_kind must be 'tokens' or 'image', got {self.input_kind!r}")
        names = [n for n, _ in self.ops]
        if len(set(names)) != len(names):
            raise ValueError(f"{self.name}: duplicate op names")
        self._all = Stage(self.ops, 0, len(self.ops))
        self._all.eval()

    # ------------------------------------------------------------------ structure
    def n_ops(self) -> int:
        return len(self.ops)

    @property
    def op_names(self) -> list[str]:
        return [n for n, _ in self.ops]

    def module(self) -> nn.Module:
        """The whole model as one module (``forward(input) -> output``); shares the op modules."""
        return self._all

    def parameters_count(self) -> int:
        """Number of parameters (weights shared between ops are counted once)."""
        return sum(p.numel() for p in self._all.parameters())

    def _check_range(self, start: int, end: int) -> None:
        n = len(self.ops)
        if not (isinstance(start, int) and isinstance(end, int)) or not (0 <= start <= end <= n):
            raise ValueError(f"{self.name}: need 0 <= start <= end <= {n}, got start={start}, end={end}")

    def stage_module(self, start: int, end: int) -> nn.Module:
        """A module whose ``forward(carry)`` runs ``ops[start:end]`` (shares the weights, eval mode)."""
        self._check_range(start, end)
        st = Stage(self.ops[start:end], start, end)
        st.eval()
        return st

    def run_ops(self, carry: Any, start: int, end: int) -> Any:
        """Run ``ops[start:end]`` on ``carry`` (no autograd) and return the new carry."""
        self._check_range(start, end)
        with torch.no_grad():
            for _, m in self.ops[start:end]:
                carry = m(carry)
        return carry

    def forward(self, x: Any) -> Any:
        return self.run_ops(x, 0, len(self.ops))

    # ------------------------------------------------------------------ inputs
    @property
    def image_size(self) -> int | None:
        return self.config.get("image_size")

    @property
    def default_seq_len(self) -> int | None:
        return self.config.get("default_seq_len")

    @property
    def max_seq_len(self) -> int | None:
        return self.config.get("max_position")

    def example_input(
        self,
        batch_size: int,
        seq_len: int | None = None,
        generator: torch.Generator | None = None,
        device: str | torch.device = "cpu",
    ) -> torch.Tensor:
        """A real input batch: token ids ``int64 [bs, seq_len]`` in ``[1, vocab)`` (no padding) for BERT,
        images ``float32 [bs, 3, H, W]`` (standard normal) for CNNs. Deterministic given ``generator``.

        On the ``meta`` device (for shape/FLOP propagation of the full models) the tensor has no data.
        """
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        dev = torch.device(device)
        if self.input_kind == "tokens":
            L = self.default_seq_len if seq_len is None else seq_len
            if not isinstance(L, int) or L < 1 or L > self.max_seq_len:
                raise ValueError(f"seq_len must be an integer in 1..{self.max_seq_len}, got {seq_len!r}")
            if dev.type == "meta":
                return torch.empty(batch_size, L, dtype=torch.int64, device=dev)
            return torch.randint(1, self.config["vocab_size"], (batch_size, L), generator=generator)
        H = self.image_size
        if dev.type == "meta":
            return torch.empty(batch_size, 3, H, H, device=dev)
        return torch.randn(batch_size, 3, H, H, generator=generator)

    def __repr__(self) -> str:
        return (
            f"ZooModel({self.name!r}, variant={self.variant!r}, n_ops={len(self.ops)}, config={self.config})"
        )


def carry_to(carry: Any, fn) -> Any:
    """Apply ``fn`` to every tensor inside a carry (tensor or nested tuple/list); keep ``None``."""
    if carry is None:
        return None
    if isinstance(carry, torch.Tensor):
        return fn(carry)
    if isinstance(carry, (tuple, list)):
        return type(carry)(carry_to(c, fn) for c in carry)
    raise TypeError(f"unsupported carry element {type(carry).__name__}")


def carry_rows(carry: Any, rows) -> Any:
    """Select batch rows ``rows`` (an index or slice along dim 0) of every tensor in a carry."""
    return carry_to(carry, lambda t: t[rows])


def init_cnn_weights(module: nn.Module) -> None:
    """torchvision-style initialisation: He-normal (fan_out) convolutions, unit BatchNorm, N(0, 0.01) linear.

    Keeps activations well scaled through deep random networks (so numerical comparisons stay meaningful).
    """
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)
