"""Stages as CUDA graphs: ``[replay] modules = "cudagraph"`` (the default on CUDA).

Measured on an H100 (``traces/h100_replays/README.md``), a BERT-base stage at batch 1 takes 1.1-2.6 ms to launch
as TorchScript and 0.25-0.3 ms as a replayed CUDA graph; ResNet152's launch costs 14.5 ms per forward for 2.6 ms of
GPU work. Serving stacks run small batches as graphs for that reason: TensorRT and Triton's TensorRT backend keep
one per batch size, vLLM and SGLang one per batch-size bucket. Here every stage is captured once per batch size
the policy can form on that model instance (``1..max_batch_size``, or only the sizes the policy says the instance
runs: :meth:`dvasim.policies.base.Policy.lane_batch_sizes`, e.g. an E-Ebird worker's own size) and, for token
models, per length bucket (the table's profiled lengths; an execution's input is padded up to its bucket with
padding tokens, which BERT's mask ignores), per model instance (two executors never share a graph's buffers), at
start-up, with a progress bar. An execution of a shape that was not captured stops the replay with an error
naming the stage, the shape and the batch sizes captured (:class:`MissingGraph`): there is no eager fallback.

Stopping the capture
--------------------
A capture runs eager warm-up passes and then records every kernel of the stage into the graph; an exception
raised between ``capture_begin`` and ``capture_end`` (a signal's handler raising in the middle of a forward) can
leave the CUDA context unusable. So: :func:`capture_stages` takes a ``stop`` request (a callable returning why to
stop, or None) and asks it between two captures only, raising :class:`Stopped` there, with no capture open; and
while one graph is captured on the main thread, SIGINT and SIGTERM are held back (:func:`signals_held`) and
delivered, to whatever handler was installed, as soon as that capture has ended (one capture: well under a
second for the H100 models).

Static buffers and the buffer pairs
-----------------------------------
A captured graph reads and writes fixed tensors. The mechanism hands an execution any rows of its pair's buffers
(a stretched batch's newcomers start at a row offset, split sub-batches at theirs), and a pair's rows cut to a
length below the buffer's longest are not contiguous, so the pairs' rows cannot be the graph's static inputs
without a graph per (pair, row offset). Each launch therefore makes **one device copy** (one ``copy_`` per tensor
of the carry) of its input rows into the graph's static input, replays the graph on the executor's stream, and
the static output is copied into the next buffer's rows exactly as for the other module kinds (that copy exists
for every kind).

* Static inputs: per executor and length bucket one tensor set of ``max_batch_size`` rows; the graph of batch
  size ``b`` reads its first ``b`` rows (a contiguous view), so the inputs take ``max_batch_size`` rows per bucket,
  not ``1 + 2 + ... + max_batch_size``.
* Memory pool: the graphs of one executor share one private pool (:meth:`CudaOps.graph_pool`), captured from the
  largest shape down, so a smaller graph's intermediates and outputs reuse the larger ones' memory. Graphs that
  share a pool may overwrite each other's intermediates and outputs, which is safe because one executor replays
  its graphs one at a time and its output is copied out on the same stream before its next replay; two
  executors (which do replay concurrently) never share a pool.

The extra copy is the carry at the stage's input boundary. Bytes per copy at batch 16 for the H100 models (the
four-stage cuts of the H100 measurements, ``traces/gpu/h100/measured/stage_bounds.csv``: BERT-base length 128
ops 0/15/31/47, ResNet152 0/39/78/118,
VGG19 0/12/21/22, UNet 0/10/16/21), stages 0-3: BERT-base 0.016 / 31.5 / 6.3 / 25.2 MB (per row 1,024 /
1,966,592 / 393,728 / 1,573,376 B), ResNet152 9.6 / 25.7 / 16.1 / 16.1 MB, VGG19 9.6 / 25.7 / 1.6 / 0.26 MB,
UNet 12.6 / 503 / 503 / 537 MB (its encoder features travel in the carry: 31.5 MB a row). At an H100's
3.35 TB/s that is at most ~20 us (BERT, ResNet, VGG) against stage GPU times of 0.2-3 ms, but ~0.3 ms for a
UNet stage at batch 16 (a few percent of its GPU time). Measured on this project's 2-core CPU (AMD EPYC, one
intra-op thread; the copy-in of :meth:`GraphStage.__call__` around an identity graph, median of 50-300 launches):
the small variants the CPU replay runs 0.001-0.004 ms per launch at batch 1 and 0.01-0.034 ms at batch 16; the
full models (CPU memory, ~35 GB/s up to 2 MB and ~11 GB/s beyond) BERT-base 0.002 / 0.058 / 0.014 / 0.045 ms at
batch 1 and 0.003 / 2.7 / 0.49 / 2.8 ms at batch 16 (stages 0-3), ResNet152 0.02-0.05 ms at batch 1 and
0.5-2.1 ms at batch 16. ``GraphStage.copy_ms`` accumulates the host time
of these copies (on the CPU stand-in the copy itself; on a GPU the time to enqueue it), and the replay reports its
mean per launch as ``graph_copy_ms_mean``.

All CUDA calls go through :class:`dvasim.model.stages.cuda.CudaOps` (``graph_pool`` / ``capture_graph`` /
``replay_graph`` / ``time_replays``). On a machine without CUDA, :class:`CpuGraphs` stands in with the same
static-buffer semantics (copy in, replay writes the static outputs in place, the next replay overwrites them) and
a wall clock, so the whole path, the GPU profiler's included, runs and is tested on the CPU.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from dvasim.model.stages.buffers import flatten, unflatten

__all__ = ["CpuGraphs", "GraphStage", "MissingGraph", "Stopped", "capture_stages", "graph_ops", "lane_sizes",
           "signals_held"]

HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # held back while a graph is captured (see the module docstring)


class Stopped(Exception):
    """A stop request ended a start-up phase (the graphs' capture, E-Ebird's co-run profile) between two of its
    steps, with no capture open. ``reason``: what the stop request said (e.g. ``"SIGTERM"``)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class MissingGraph(KeyError):
    """An execution's input shape has no captured graph (the policy formed a batch size it said the lane would
    never run, or a length outside the buckets): the replay stops with this, never falls back to eager."""

    def __str__(self) -> str:  # KeyError's own would quote the message
        return str(self.args[0]) if self.args else ""


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM held back for the block and then delivered (``signal.raise_signal``) to the handlers
    that were installed before it, in the order they came; a no-op off the main thread (where Python runs no
    handler anyway). Around one graph capture: no handler can raise inside it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[int] = []
    previous = {}
    try:
        for s in HELD_SIGNALS:
            previous[s] = signal.signal(s, lambda signum, _frame: came.append(signum))
    except ValueError:  # pragma: no cover - not the main interpreter
        pass
    try:
        yield
    finally:
        for s, handler in previous.items():
            if handler is None:  # installed outside Python: give back Python's default
                handler = signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL
            signal.signal(s, handler)
        for s in dict.fromkeys(came):  # each signal once, as the kernel would have merged them
            signal.raise_signal(s)


def graph_ops(device) -> Any:
    """Graph capture, replay and timing for ``device``: the replay's :class:`~dvasim.model.stages.cuda.CudaOps` on a
    GPU (replays between CUDA events), :class:`CpuGraphs` (same static-buffer semantics, wall clock) on the CPU.
    The replay and the profiler both take their graphs from here."""
    if str(device) == "cpu":
        return CpuGraphs()
    from dvasim.model.stages.cuda import CudaOps

    return CudaOps(device)


class CpuGraphs:
    """CPU stand-in for CUDA graph capture, replay and timing (same static-buffer semantics, no CUDA).

    ``capture_graph`` runs the function once and keeps copies of its outputs as the static outputs;
    ``replay_graph`` runs it again on the static inputs and writes the result into those same tensors."""

    name = "cpu-standin"
    timer = "CPU stand-in graph replays timed with time.perf_counter_ns (wall clock; no GPU)"

    def graph_pool(self, name=None):
        return None

    def capture_graph(self, fn, static_inputs: list[torch.Tensor], pool=None):
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

    def time_replays(self, graph, n: int) -> float:
        """ms per replay of ``n`` back-to-back replays."""
        t0 = time.perf_counter_ns()
        for _ in range(n):
            self.replay_graph(graph)
        return (time.perf_counter_ns() - t0) / 1e6 / n

    def synchronize(self) -> None:
        pass


class GraphStage:
    """One stage of one model instance as graphs, one per input shape (rows, length); called like a module.

    A graph is a dict ``{"inputs": static input tensors, "out": static output leaves, "structure": the output's
    structure, ...}`` made by ``ops.capture_graph`` and run by ``ops.replay_graph``. All graphs of one
    ``GraphStage`` share one memory pool (``ops.graph_pool(name)``): never replay two of them at once."""

    def __init__(self, eager, ops, stage: int, name=None):
        self.eager = eager
        self.ops = ops
        self.stage = stage
        self.name = stage if name is None else name
        self.graphs: dict[tuple, dict] = {}
        self.in_structure = None
        self.in_none: list[bool] = []
        self.launches = 0
        self.copy_ms = 0.0  # host time of the input copies into the static buffers, summed over launches
        self.pool = None
        self._pool_made = False

    def _fn(self, static_inputs):
        it = iter(static_inputs)
        leaves = [None if none else next(it) for none in self.in_none]
        return self.eager(unflatten(self.in_structure, leaves))

    @staticmethod
    def _key(tensors) -> tuple:
        return tuple(tuple(t.shape) for t in tensors)

    def _structure(self, carry) -> list:
        leaves, structure = flatten(carry)
        none = [x is None for x in leaves]
        if self.in_structure is None:
            self.in_structure, self.in_none = structure, none
        elif structure != self.in_structure or none != self.in_none:
            raise ValueError("the carry's structure differs from the captured one")
        if not self._pool_made:
            make = getattr(self.ops, "graph_pool", None)
            self.pool = make(self.name) if make is not None else None
            self._pool_made = True
        return [x for x in leaves if x is not None]

    def _capture(self, static: list) -> None:
        with signals_held():  # no signal handler may raise inside an open capture (module docstring)
            self.graphs[self._key(static)] = self.ops.capture_graph(self._fn, static, pool=self.pool)

    def batch_sizes(self) -> list[int]:
        """The batch sizes (rows) captured, ascending."""
        return sorted({key[0][0] for key in self.graphs if key and key[0]})

    def capture(self, carry) -> None:
        """Capture the graph for ``carry``'s shapes, on a private copy of ``carry`` as its static input."""
        self._capture([x.clone() for x in self._structure(carry)])

    def capture_rows(self, carry, batch_sizes, on_each=None) -> None:
        """Capture one graph per batch size ``b`` in ``batch_sizes`` (largest first), all reading the first ``b``
        rows of one static copy of ``carry`` (whose rows must cover the largest ``b``); ``on_each()`` after each."""
        base = [x.contiguous().clone() for x in self._structure(carry)]
        for b in sorted(set(int(b) for b in batch_sizes), reverse=True):
            if b > min(t.shape[0] for t in base):
                raise ValueError(f"batch size {b} above the {base[0].shape[0]} rows of the example carry")
            self._capture([t[:b] for t in base])
            if on_each is not None:
                on_each()

    def __call__(self, carry):
        leaves, structure = flatten(carry)
        if structure != self.in_structure or [x is None for x in leaves] != self.in_none:
            raise ValueError("the carry's structure differs from the captured one")
        tensors = [x for x in leaves if x is not None]
        graph = self.graphs.get(self._key(tensors))
        if graph is None:
            raise MissingGraph(f"stage {self.stage} (graphs {self.name}): no CUDA graph captured for input shapes "
                               f"{[tuple(t.shape) for t in tensors]} (captured: {len(self.graphs)} shapes, batch "
                               f"sizes {self.batch_sizes()}); the policy formed a batch its lane_batch_sizes did "
                               "not announce, or an input length is outside the length buckets")
        t0 = time.perf_counter()
        for dst, src in zip(graph["inputs"], tensors):
            dst.copy_(src, non_blocking=True)  # the one device copy per launch
        self.copy_ms += (time.perf_counter() - t0) * 1000.0
        self.ops.replay_graph(graph)
        self.launches += 1
        return unflatten(graph["structure"], list(graph["out"]))


def lane_sizes(batch_sizes, lanes: int) -> list[list[int]]:
    """``batch_sizes`` (the sizes of every lane, or a callable ``lane -> sizes``) as one ascending list of
    distinct sizes per lane."""
    out = []
    for lane in range(lanes):
        sizes = batch_sizes(lane) if callable(batch_sizes) else batch_sizes
        sizes = sorted({int(b) for b in sizes})
        if not sizes or sizes[0] < 1:
            raise ValueError(f"lane {lane}: batch sizes must be a non-empty list of integers >= 1, got {sizes}")
        out.append(sizes)
    return out


def capture_stages(eager_stages, buffers, ops, batch_sizes: Iterable[int] | Callable[[int], Iterable[int]],
                   lengths, lanes: int = 1, progress: bool = True, stop: Callable[[], str | None] | None = None):
    """Capture every stage of every lane at each of its batch sizes and every length: ``result[lane][stage]`` is a
    :class:`GraphStage` (one memory pool each). ``batch_sizes``: the sizes of every lane, or a callable giving
    lane ``k``'s (a policy's :meth:`~dvasim.policies.base.Policy.lane_batch_sizes`: an E-Ebird worker captures its
    own size only). The example inputs are the buffers' own rows (whatever they hold), so the shapes and dtypes
    are exactly those the executions will pass. Longest length first, then largest batch first (see the module
    docstring: the smaller graphs reuse the larger ones' memory).

    ``stop()`` (why to stop, or None) is asked before the first capture and after each one, never during one:
    once it answers, :class:`Stopped` is raised with no capture open (the graphs captured so far are dropped)."""
    lengths = sorted(set(lengths or [1]), reverse=True)
    per_lane = lane_sizes(batch_sizes, lanes)
    total = len(eager_stages) * len(lengths) * sum(len(sizes) for sizes in per_lane)
    from dvasim.progress import progress_bar

    bar = progress_bar(total, enabled=progress, desc="capturing CUDA graphs", unit="graph", leave=False)
    done = [0]

    def between() -> None:  # after each capture (and before the first): the stop request
        why = stop() if stop is not None else None
        if why is not None:
            raise Stopped(why, f"stopped by {why} while capturing CUDA graphs ({done[0]} of {total} captured)")

    def captured() -> None:
        done[0] += 1
        bar.update(1)
        between()

    out = []
    try:
        between()
        for lane, sizes in enumerate(per_lane):
            row = []
            for s, st in enumerate(eager_stages):
                g = GraphStage(st, ops, s, name=(lane, s))
                for L in lengths:
                    g.capture_rows(buffers.read(lane, s, 0, range(sizes[-1]), L), sizes, on_each=captured)
                row.append(g)
            out.append(row)
    finally:
        bar.close()
    return out
