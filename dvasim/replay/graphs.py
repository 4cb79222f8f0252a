"""Stages as CUDA graphs: ``[replay] modules = "cudagraph"`` (the default on CUDA).

Measured on an H100 (``traces/h100_replays/README.md``), a BERT-base stage at batch 1 takes 1.1-2.6 ms to launch
as TorchScript and 0.25-0.3 ms as a replayed CUDA graph; ResNet152's launch costs 14.5 ms per forward for 2.6 ms of
GPU work. Serving stacks run small batches as graphs for that reason: TensorRT and Triton's TensorRT backend keep
one per batch size, vLLM and SGLang one per batch-size bucket. Here every stage is captured once per batch size
the policy can form (``1..max_batch_size``) and, for token models, per length bucket (the table's profiled lengths;
an execution's input is padded up to its bucket with padding tokens, which BERT's mask ignores), per model
instance (two executors never share a graph's buffers), at start-up, with a progress bar.

Static buffers and the buffer pairs: a captured graph reads and writes fixed tensors. The mechanism hands an
execution any rows of its pair's buffers (a stretched batch's newcomers start at a row offset, split sub-batches
at theirs), so the pairs' rows cannot be the graph's static inputs without a graph per (pair, row offset). Each
launch therefore makes **one device copy** of its input rows into the graph's static input, replays the graph on
the executor's stream, and the output is copied into the next buffer's rows exactly as for the other module kinds
(that copy exists for every kind). The extra copy is the carry at the stage's input boundary, at batch 16: BERT-base
(length 128, the H100 cuts) 0.02 / 31.5 / 6.3 / 25.2 MB for stages 0-3, ResNet152 9.6 / 25.7 / 16.1 / 16.1 MB:
at most ~10 us at an H100's 3.35 TB/s against stage GPU times of 0.4-2.5 ms. ``GraphStage.copy_ms`` accumulates
the host time of these copies (on the CPU stand-in the copy itself; on a GPU the time to enqueue it), and the
replay reports its mean per launch as ``graph_copy_ms_mean``.

All CUDA calls go through :class:`dvasim.replay.engine.CudaOps` (``capture_graph`` / ``replay_graph``). On a machine
without CUDA, :class:`CpuGraphs` stands in with the same static-buffer semantics (copy in, replay writes the static
outputs in place, the next replay overwrites them), so the whole path runs and is tested on the CPU.
"""

from __future__ import annotations

import time

import torch

from dvasim.replay.buffers import flatten, unflatten

__all__ = ["CpuGraphs", "GraphStage", "capture_stages"]


class CpuGraphs:
    """CPU stand-in for CUDA graph capture and replay (same static-buffer semantics, no CUDA)."""

    name = "cpu-standin"

    def capture_graph(self, fn, static_inputs: list[torch.Tensor]):
        with torch.inference_mode():
            out = fn(static_inputs)
        leaves, structure = flatten(out)
        static_out = [None if t is None else t.clone() for t in leaves]
        return {"fn": fn, "inputs": static_inputs, "out": static_out, "structure": structure}

    def replay_graph(self, graph) -> None:
        leaves, _ = flatten(graph["fn"](graph["inputs"]))
        for dst, src in zip(graph["out"], leaves):
            if dst is not None:
                dst.copy_(src)


class GraphStage:
    """One stage of one model instance as graphs, one per input shape (rows, length); called like a module.

    A graph is a dict ``{"inputs": static input tensors, "out": static output leaves, "structure": the output's
    structure, ...}`` made by ``ops.capture_graph`` and run by ``ops.replay_graph``."""

    def __init__(self, eager, ops, stage: int):
        self.eager = eager
        self.ops = ops
        self.stage = stage
        self.graphs: dict[tuple, dict] = {}
        self.in_structure = None
        self.in_none: list[bool] = []
        self.launches = 0
        self.copy_ms = 0.0  # host time of the input copies into the static buffers, summed over launches

    def _fn(self, static_inputs):
        it = iter(static_inputs)
        leaves = [None if none else next(it) for none in self.in_none]
        return self.eager(unflatten(self.in_structure, leaves))

    @staticmethod
    def _key(tensors) -> tuple:
        return tuple(tuple(t.shape) for t in tensors)

    def capture(self, carry) -> None:
        leaves, structure = flatten(carry)
        self.in_structure, self.in_none = structure, [x is None for x in leaves]
        static = [x.clone() for x in leaves if x is not None]
        self.graphs[self._key(static)] = self.ops.capture_graph(self._fn, static)

    def __call__(self, carry):
        leaves, structure = flatten(carry)
        if structure != self.in_structure or [x is None for x in leaves] != self.in_none:
            raise ValueError("the carry's structure differs from the captured one")
        tensors = [x for x in leaves if x is not None]
        graph = self.graphs.get(self._key(tensors))
        if graph is None:
            raise KeyError(f"stage {self.stage}: no CUDA graph captured for input shapes "
                           f"{[tuple(t.shape) for t in tensors]} (captured: {len(self.graphs)} shapes)")
        t0 = time.perf_counter()
        for dst, src in zip(graph["inputs"], tensors):
            dst.copy_(src, non_blocking=True)  # the one device copy per launch
        self.copy_ms += (time.perf_counter() - t0) * 1000.0
        self.ops.replay_graph(graph)
        self.launches += 1
        return unflatten(graph["structure"], list(graph["out"]))


def capture_stages(eager_stages, buffers, ops, batch_sizes, lengths, lanes: int = 1, progress: bool = True):
    """Capture every stage of every lane at every (batch size, length): ``result[lane][stage]`` is a
    :class:`GraphStage`. The example inputs are the buffers' own rows (whatever they hold), so the shapes and
    dtypes are exactly those the executions will pass."""
    lengths = list(lengths) or [1]
    total = lanes * len(eager_stages) * len(batch_sizes) * len(lengths)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, desc="capturing CUDA graphs", unit="graph", leave=False)
    out = []
    try:
        for lane in range(lanes):
            row = []
            for s, st in enumerate(eager_stages):
                g = GraphStage(st, ops, s)
                for b in batch_sizes:
                    for L in lengths:
                        g.capture(buffers.read(lane, s, 0, range(b), L))
                        if bar is not None:
                            bar.update(1)
                row.append(g)
            out.append(row)
    finally:
        if bar is not None:
            bar.close()
    return out
