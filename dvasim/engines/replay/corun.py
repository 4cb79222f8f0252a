"""E-Ebird's offline co-run profiler in the replay (:class:`dvasim.policies.e2bird.CoRunProfiler`): measured on the
real stage modules the replay runs, not on the simulator's model of them.

For a combination of worker batch sizes (E2bird §7.3.1), :class:`ReplayCoRun` starts one whole-model pass per
worker at the same time, each on a synthetic input of its batch size and the asked length (the zoo model's
``example_input``; for a replay of CUDA graphs, the smallest length bucket that holds it), runs that co-run
``warmup`` times untimed (default 2, as the replay's own warm-up: oneDNN builds its primitives per input shape,
TorchScript optimises a graph after its first runs) and then ``repeats`` times timed (default 3), and returns the
mean over the timed runs of the workers' mean latency (the paper's measure). Answers are cached per combination
(and length).

* Workers: one thread each, started together at a barrier, as the replay's executors are threads. A worker's
  latency runs from its start to the end of its pass on the host clock (``time.perf_counter``).
* CPU: the thread computes directly, with PyTorch's intra-op threads set to the replay's ``threads`` (process-wide,
  restored afterwards), as the replay's executors run.
* CUDA: every worker has its own stream and event, through the replay's :class:`dvasim.model.stages.cuda.CudaOps`
  object (or the stand-in a test gives): the thread launches its pass on its stream, records its event and waits
  for that event only; its pass ends when the event completes, as a replay executor's stage does. The device is
  synchronised once before the timed runs (the inputs and graphs are made on the default stream), never between.
* Stage modules: the very ones :func:`dvasim.engines.replay.engine.prepare` builds (TorchScript or eager, shared
  by the workers as the replay's lanes share them). Where the replay runs CUDA graphs (``[replay] modules =
  "cudagraph"``), the profile's workers replay graphs too, captured from the same eager modules through the same
  graph ops: one :class:`dvasim.model.stages.graphs.GraphStage` per worker slot and stage (two workers running at
  once never share a graph's buffers or memory pool), each shape captured when a combination first needs it.

Stop requests (``stop``: a callable returning why to stop, or None; ``dvasim replay`` passes its signal handlers'
answer): asked before each combination is measured, before each worker slot's graphs are captured and by every
worker before each round of a co-run (a worker that sees it lets the others go too); the profile then raises
:class:`dvasim.model.stages.graphs.Stopped` from :meth:`ReplayCoRun.average_ms`, with no graph capture open and
every worker thread ended.

Times are wall-clock measurements: they vary from run to run and with the machine's load, so an E-Ebird replay's
engine (its workers and configurations) may differ between runs where combinations are close.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from dvasim.model.stages.graphs import Stopped

__all__ = ["ReplayCoRun"]


class ReplayCoRun:
    """The replay's :class:`dvasim.policies.e2bird.CoRunProfiler` (see the module docstring).

    ``model``: the zoo model (on the replay's device); ``stages``: the stage callables the replay runs (for
    ``modules = "cudagraph"`` the eager modules its graphs are captured from); ``device``: ``"cpu"`` or
    ``"cuda"``; ``ops``: the CUDA calls (a :class:`CudaOps`; default the real one on CUDA) and, for graphs, the
    graph ops (default :func:`dvasim.model.stages.graphs.graph_ops` of the device); ``buckets``: the replay's
    length buckets (graphs of token models); ``stop``: the stop request (module docstring)."""

    def __init__(self, model, stages, *, device: str = "cpu", modules: str = "torchscript", ops=None,
                 threads: int = 1, warmup: int = 2, repeats: int = 3, buckets=None, seed: int = 0,
                 stop: Callable[[], str | None] | None = None):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
        if int(repeats) < 1 or int(warmup) < 0:
            raise ValueError(f"repeats must be >= 1 and warmup >= 0, got {repeats!r}, {warmup!r}")
        self.model = model
        self.stages = list(stages)
        self.device = device
        self.modules = modules
        self.threads = int(threads)
        self.warmup = int(warmup)
        self.repeats = int(repeats)
        self.buckets = sorted(int(b) for b in buckets or [])
        self.seed = int(seed)
        self._dev = next((p.device for p in model.module().parameters()), torch.device("cpu"))
        self._ops = ops
        self._graph_ops = ops
        self._streams: list = []  # per worker slot (CUDA)
        self._events: list = []
        self._graphs: list[list] = []  # per worker slot, per stage: GraphStage (cudagraph)
        self._captured: set[tuple] = set()  # (slot, batch size, length) captured
        self._inputs: dict[tuple, Any] = {}  # (batch size, length) -> synthetic input
        self._cache: dict[tuple, float] = {}
        self.measured = 0  # co-runs measured (cache misses)
        self.stop = stop

    # ------------------------------------------------------------------ the profiler protocol
    def average_ms(self, batch_sizes: tuple[int, ...], seq_len: int | None = None) -> float:
        """The mean of the workers' latencies (ms) of workers of ``batch_sizes`` co-running (cached)."""
        sizes = tuple(sorted((int(b) for b in batch_sizes), reverse=True))
        if not sizes or min(sizes) < 1:
            raise ValueError(f"batch sizes must be a non-empty list of integers >= 1, got {batch_sizes!r}")
        key = (sizes, self.length(seq_len))
        if key not in self._cache:
            self._check_stop()
            self._cache[key] = self._measure(*key)
            self.measured += 1
        return self._cache[key]

    def _check_stop(self, why: str | None = None) -> None:
        """Raise :class:`Stopped` if the stop request answers (or ``why`` is given: a worker saw it)."""
        if why is None and self.stop is not None:
            why = self.stop()
        if why is not None:
            raise Stopped(why, f"stopped by {why} during E-Ebird's co-run profile ({self.measured} combinations "
                               "measured)")

    def cache_key(self) -> None:
        """None: the answers are measurements, never reused across searches (this object caches its own)."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"corun_profile": {
            "source": "measured", "on": f"real {self.modules} stages on {self.device}", "threads": self.threads,
            "warmup": self.warmup, "repeats": self.repeats, "combinations": len(self._cache),
            "measure": "mean over the timed co-runs of the workers' mean latency, each from its start to the end "
                       "of its whole-model pass",
        }}

    # ------------------------------------------------------------------ inputs and stage callables
    def length(self, seq_len: int | None) -> int | None:
        """The length a pass runs at: None for images; for tokens the asked one (the model's default where None),
        or with length buckets (CUDA graphs) the smallest bucket that holds it."""
        if self.model.input_kind != "tokens":
            return None
        L = int(seq_len) if seq_len is not None else int(self.model.default_seq_len)
        return next((b for b in self.buckets if b >= L), L)

    def _input(self, b: int, L: int | None):
        key = (b, L)
        if key not in self._inputs:
            g = torch.Generator().manual_seed(self.seed + 7919 * b + (L or 0))
            x = (self.model.example_input(b, L, generator=g) if L is not None
                 else self.model.example_input(b, generator=g))
            self._inputs[key] = x.to(self._dev)
        return self._inputs[key]

    def _slot_stages(self, slot: int, b: int, L: int | None) -> list:
        """The stage callables worker ``slot`` runs at batch size ``b``: the shared modules, or its own graphs."""
        if self.modules != "cudagraph":
            return self.stages
        from dvasim.model.stages.graphs import GraphStage, graph_ops

        if self._graph_ops is None:
            self._graph_ops = graph_ops(self._dev if self.device == "cuda" else "cpu")
        while len(self._graphs) <= slot:
            k = len(self._graphs)
            self._graphs.append([GraphStage(st, self._graph_ops, s, name=("corun", k, s))
                                 for s, st in enumerate(self.stages)])
        if (slot, b, L) not in self._captured:
            self._check_stop()  # between two captures, never inside one
            carry = self._input(b, L)
            for s, st in enumerate(self.stages):  # each stage's input: the eager chain's carry at its boundary
                self._graphs[slot][s].capture(carry)
                carry = st(carry)
            self._captured.add((slot, b, L))
        return self._graphs[slot]

    def _stream(self, slot: int):
        if self._ops is None:
            from dvasim.model.stages.cuda import CudaOps

            self._ops = CudaOps(self._dev)
        while len(self._streams) <= slot:
            k = len(self._streams)
            self._streams.append(self._ops.new_stream(("corun", k)))
            self._events.append(self._ops.new_event(("corun", k)))
        return self._streams[slot], self._events[slot]

    def _passes(self, sizes: tuple[int, ...], L: int | None) -> list:
        """One callable per worker: its whole-model pass, on its own stream on CUDA (ending when its event has
        completed)."""
        out = []
        for slot, b in enumerate(sizes):
            x, stages = self._input(b, L), self._slot_stages(slot, b, L)

            def whole(x=x, stages=stages):
                carry = x
                for st in stages:
                    carry = st(carry)

            if self.device == "cuda":
                stream, event = self._stream(slot)

                def on_stream(fn=whole, stream=stream, event=event, ops=self._ops):
                    ops.launch(stream, fn)
                    ops.record_event(stream, event)
                    ops.synchronize_event(event)  # this worker's own work only

                out.append(on_stream)
            else:
                out.append(whole)
        return out

    # ------------------------------------------------------------------ measuring
    def _measure(self, sizes: tuple[int, ...], L: int | None) -> float:
        """Warm-up, then timed co-runs of workers of ``sizes``: the mean of their latencies (ms)."""
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)  # process-wide, as the replay sets it
        try:
            with torch.inference_mode():
                passes = self._passes(sizes, L)
                if self.device == "cuda":
                    self._ops.synchronize()  # inputs and graphs made on the default stream: ready before timing
            lat, why = _corun(passes, self.warmup + self.repeats, self.threads, self.stop)
        finally:
            torch.set_num_threads(before)
        self._check_stop(why)
        timed = lat[self.warmup:]
        return sum(sum(r) / len(r) for r in timed) / len(timed)


def _corun(passes: list, rounds: int, threads: int,
           stop: Callable[[], str | None] | None = None) -> tuple[list[list[float]], str | None]:
    """Run every callable of ``passes`` on a thread of its own, all started together at a barrier, ``rounds``
    times; returns ``(lat, why)``: ``lat[r][k]`` the ms worker ``k`` took in round ``r``, ``why`` what the stop
    request said if a worker saw it before a round (every worker then stops; else None). A worker that raises
    stops every round."""
    n = len(passes)
    lat = [[0.0] * n for _ in range(rounds)]
    gate = threading.Barrier(n)
    errors: list[BaseException] = []
    stopped: list[str] = []

    def worker(k: int) -> None:
        torch.set_num_threads(threads)
        with torch.inference_mode():
            try:
                for r in range(rounds):
                    why = stop() if stop is not None else None
                    if why is not None:
                        stopped.append(why)
                        gate.abort()  # the others, waiting or about to, stop too
                        return
                    gate.wait()
                    t0 = time.perf_counter()
                    passes[k]()
                    lat[r][k] = (time.perf_counter() - t0) * 1000.0
            except threading.BrokenBarrierError:
                return
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                errors.append(e)
                gate.abort()

    workers = [threading.Thread(target=worker, args=(k,), name=f"dvasim-corun-{k}", daemon=True) for k in range(n)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    if errors:
        raise errors[0]
    return lat, (stopped[0] if stopped else None)
