"""Stage modules as TorchScript: traced, frozen graphs that run without Python's global interpreter lock.

The replay runs one executor thread per stage. An eager PyTorch stage returns to the interpreter between
operators, so executor threads running at once contend for the GIL as well as for the cores: measured on this
project's 2-core VM, an eager ResNet152 stage at batch 1-2 ran 1.8x its table time while another stage ran beside
it, where core sharing alone explains 1.2x. A TorchScript module runs its whole graph in C++ with the GIL
released, which is also how serving systems run PyTorch models (Triton's PyTorch backend executes TorchScript).
``torch.jit.freeze`` inlines the weights and folds BatchNorm into the convolutions, so a frozen stage is also a
little faster than the eager one (the latency tables must be profiled from the same modules; see
:func:`dvasim.fitting.validate.serving_stage_table`).

A zoo model's carry is a nested tuple of tensors and ``None`` (skip connections, BERT's attention mask);
TorchScript traces take and return tensors only, so :class:`TorchScriptStage` flattens the carry, runs the traced
graph on the tensor leaves and rebuilds the output structure recorded while tracing. The trace is taken at one
batch size and length; the zoo's operators use no shape-dependent Python control flow, which
``tests/model/test_replay_compiled.py`` checks by comparing traced and eager outputs at other batch sizes and lengths.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from dvasim.model.stages.buffers import flatten, unflatten

__all__ = ["MODULE_KINDS", "TorchScriptStage", "torchscript_stage", "stage_modules"]

MODULE_KINDS = ("torchscript", "eager", "cudagraph")  # cudagraph: dvasim.model.stages.graphs (built by prepare)


class _Flat(nn.Module):
    """``forward(*tensors)``: rebuild the carry, run the stage, return the output's tensor leaves."""

    def __init__(self, stage: nn.Module, in_structure: Any, in_none: list[bool]):
        super().__init__()
        self.stage = stage
        self.in_structure = in_structure
        self.in_none = in_none
        self.out_structure: Any = None
        self.out_none: list[bool] = []

    def forward(self, *tensors):
        it = iter(tensors)
        leaves = [None if none else next(it) for none in self.in_none]
        out = self.stage(unflatten(self.in_structure, leaves))
        out_leaves, self.out_structure = flatten(out)
        self.out_none = [x is None for x in out_leaves]
        return tuple(x for x in out_leaves if x is not None)


class TorchScriptStage:
    """A stage module traced and frozen; called like the eager one, ``stage(carry) -> carry``."""

    def __init__(self, stage: nn.Module, example_carry: Any):
        leaves, structure = flatten(example_carry)
        flat = _Flat(stage, structure, [x is None for x in leaves]).eval()
        args = tuple(x for x in leaves if x is not None)
        if not args:
            raise ValueError("a stage input with no tensor cannot be traced")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer's warnings about Python values are checked by tests
            with torch.inference_mode():
                traced = torch.jit.trace(flat, args, check_trace=False)
            self.module = torch.jit.freeze(traced.eval())
        self.in_structure, self.in_none = structure, flat.in_none
        self.out_structure, self.out_none = flat.out_structure, flat.out_none
        self.start, self.end = getattr(stage, "start", None), getattr(stage, "end", None)

    def __call__(self, carry: Any) -> Any:
        leaves, structure = flatten(carry)
        if structure != self.in_structure or [x is None for x in leaves] != self.in_none:
            raise ValueError("the carry's structure differs from the one the stage was traced with")
        out = self.module(*(x for x in leaves if x is not None))
        if isinstance(out, torch.Tensor):
            out = (out,)
        it = iter(out)
        return unflatten(self.out_structure, [None if none else next(it) for none in self.out_none])


def torchscript_stage(model, start: int, end: int, example_carry: Any) -> TorchScriptStage:
    """Stage ``ops[start:end]`` of zoo ``model`` as TorchScript, traced on ``example_carry`` (its input)."""
    return TorchScriptStage(model.stage_module(start, end), example_carry)


def stage_modules(model, bounds: list[int], kind: str = "torchscript", example_rows: int = 2,
                  example_len: int = 16) -> list:
    """The stage modules for cut points ``bounds`` (stage ``s`` runs ``ops[bounds[s]:bounds[s+1]]``).

    ``kind = "torchscript"`` traces each stage on the carry the preceding ops produce from an example input of
    ``example_rows`` rows (and ``example_len`` tokens for BERT); ``"eager"`` returns the plain modules."""
    if kind not in ("torchscript", "eager"):
        raise ValueError(f"stage modules here are torchscript or eager (cudagraph stages are captured from eager "
                         f"ones by dvasim.model.stages.graphs), got {kind!r}")
    ends = [*bounds[1:], model.n_ops()]
    eager = [model.stage_module(a, b) for a, b in zip(bounds, ends)]
    if kind == "eager":
        return eager
    dev = next((p.device for p in model.module().parameters()), torch.device("cpu"))
    g = torch.Generator().manual_seed(0)
    if model.input_kind == "tokens":
        carry = model.example_input(example_rows, min(example_len, int(model.max_seq_len)), generator=g)
    else:
        carry = model.example_input(example_rows, generator=g)
    carry = _to(carry, dev)
    out = []
    with torch.inference_mode():
        for st in eager:
            out.append(TorchScriptStage(st, carry))
            carry = st(carry)
    return out


def _to(carry: Any, dev) -> Any:
    leaves, structure = flatten(carry)
    return unflatten(structure, [None if x is None else x.to(dev) for x in leaves])
