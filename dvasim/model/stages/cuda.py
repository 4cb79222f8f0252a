"""Every ``torch.cuda`` call the replay and the profiler make, behind one object (:class:`CudaOps`) so tests can
substitute a recording stand-in. May import torch and :mod:`dvasim.model.stages.buffers`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class CudaOps:
    """Every ``torch.cuda`` call the replay makes. Tests replace this object by a recording stand-in."""

    def __init__(self, device: str | torch.device = "cuda"):
        self.device = torch.device(device)
        self._capture_streams: dict = {}  # memory pool -> the stream its graphs are captured on (capture_graph)

    def new_stream(self, name):
        return torch.cuda.Stream(device=self.device)

    def new_event(self, name):
        return torch.cuda.Event()

    def wait_event(self, stream, event) -> None:
        stream.wait_event(event)  # device-side: the stream waits, the host does not

    def launch(self, stream, fn: Callable[[], Any]) -> Any:
        with torch.cuda.stream(stream):
            return fn()

    def record_event(self, stream, event) -> None:
        stream.record_event(event)

    def synchronize_event(self, event) -> None:
        event.synchronize()  # the host waits for this event only

    # CUDA graphs (dvasim.model.stages.graphs): capture at start-up, replay inside a launch (on the executor's stream)
    timer = "CUDA graph replays between CUDA events (GPU time, no host launch cost)"

    def graph_pool(self, name=None):
        """A private memory pool for the graphs of one executor (graphs sharing it must never run at once), with
        a capture stream of its own (:meth:`capture_graph`)."""
        pool = torch.cuda.graph_pool_handle()
        self._capture_streams[pool] = torch.cuda.Stream(device=self.device)
        return pool

    def capture_graph(self, fn: Callable[[list], Any], static_inputs: list, pool=None) -> dict:
        """Capture ``fn(static_inputs)`` as a CUDA graph (after two warm-up runs on a side stream, as CUDA graph
        capture requires) into memory pool ``pool`` (``None``: a pool of its own); returns ``{"graph", "inputs",
        "out", "structure"}`` (see dvasim.model.stages.graphs)."""
        from dvasim.model.stages.buffers import flatten

        # The pool's own stream, for the warm-up and the capture alike: torch keys cuBLAS / cuBLASLt workspaces by
        # (handle, stream), and a graph replays the workspace address it was captured with, so graphs captured on
        # one shared stream (torch.cuda.graph's default) share one workspace even in separate pools
        # (pytorch/pytorch#193402). Replayed at once by the executors' threads, they race on it: on an H200 every
        # BERT-base stage executor blocked for good in its warm-up (traces/gpu_matrix/h200_2026-11-28), where
        # ResNet152 and VGG19, whose GEMMs sit in one stage, ran. One stream per executor's pool, one workspace each;
        # the warm-up on it allocates that workspace before the capture, outside the graph's pool.
        side = self._capture_streams.get(pool) if pool is not None else None
        side = side if side is not None else torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side), torch.inference_mode():
            for _ in range(2):
                fn(static_inputs)
        torch.cuda.current_stream(self.device).wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(g, pool=pool, stream=side):
            out = fn(static_inputs)
        leaves, structure = flatten(out)
        return {"graph": g, "inputs": static_inputs, "out": leaves, "structure": structure}

    def replay_graph(self, graph: dict) -> None:
        graph["graph"].replay()  # on the current (the executor's) stream

    def time_replays(self, graph: dict, n: int) -> float:
        """GPU ms per replay: ``n`` back-to-back replays on the current stream between two CUDA events. A spin
        kernel (``torch.cuda._sleep``, ~2 ms) holds the stream first while the host enqueues the events and the
        replays, so they run without gaps even where a replay is shorter than the host's launch of it: no launch
        gap is in the figure."""
        stream = torch.cuda.current_stream(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        spin = getattr(torch.cuda, "_sleep", None)
        if spin is not None:
            spin(4_000_000)  # clock cycles: ~2 ms at 2 GHz
        start.record(stream)
        for _ in range(n):
            graph["graph"].replay()
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) / n

    def synchronize(self) -> None:
        """The whole device (the profiler between timed calls; the replay never calls it)."""
        torch.cuda.synchronize(self.device)
