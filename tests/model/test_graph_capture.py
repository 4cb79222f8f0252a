"""Capturing CUDA graphs (dvasim.model.stages.graphs.capture_stages), through a stand-in for the graph ops that
records every capture and whether one is open: per-lane batch sizes (a lane captures only the sizes its policy
forms there), the stop request asked between captures only, signals held back while a capture is open and
delivered right after it, and the error of a shape that was never captured."""

from __future__ import annotations

import os
import signal
import threading

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from dvasim.model.stages.graphs import (  # noqa: E402
    CpuGraphs,
    GraphStage,
    MissingGraph,
    Stopped,
    capture_stages,
    lane_sizes,
    signals_held,
)


class OpenCaptureOps(CpuGraphs):
    """CpuGraphs that logs each capture (its pool and input rows) and knows whether one is open right now;
    ``during(n)`` runs inside the ``n``-th capture (1-based), as a signal arriving then would."""

    def __init__(self, during=None):
        self.open = False
        self.log: list[tuple] = []
        self.during = during or {}

    def graph_pool(self, name=None):
        return ("pool", name)

    def capture_graph(self, fn, static_inputs, pool=None):
        self.open = True
        try:
            n = len(self.log) + 1
            if n in self.during:
                self.during[n]()
            graph = super().capture_graph(fn, static_inputs, pool)
            self.log.append((pool, static_inputs[0].shape[0]))
            return graph
        finally:
            self.open = False


class Buffers:
    """The one method capture_stages reads: ``read(lane, stage, pair, rows, length)``, rows of a 3-wide input."""

    def read(self, lane, stage, pair, rows, length):
        return torch.arange(len(rows) * 3, dtype=torch.float32).reshape(len(rows), 3)


STAGES = [lambda x: x * 2.0, lambda x: x + 1.0]


def test_each_lane_captures_only_its_own_batch_sizes_largest_first():
    ops = OpenCaptureOps()
    per_lane = {0: [8], 1: [4], 2: [1, 2], 3: [1]}
    graphs = capture_stages(STAGES, Buffers(), ops, lambda lane: per_lane[lane], [1], lanes=4, progress=False)
    assert len(ops.log) == len(STAGES) * sum(len(v) for v in per_lane.values()) == 10
    for lane, sizes in per_lane.items():
        for s in range(len(STAGES)):
            rows = [b for pool, b in ops.log if pool == ("pool", (lane, s))]
            assert rows == sorted(sizes, reverse=True)  # largest first: the smaller ones reuse its memory
            assert graphs[lane][s].batch_sizes() == sizes
    # the same sizes on every lane (every policy that does not say otherwise): lanes x stages x sizes, as before
    ops = OpenCaptureOps()
    capture_stages(STAGES, Buffers(), ops, range(1, 9), [1], lanes=2, progress=False)
    assert len(ops.log) == 2 * 2 * 8
    assert {(pool[1], b) for pool, b in ops.log} == {((lane, s), b) for lane in range(2) for s in range(2)
                                                      for b in range(1, 9)}


def test_lane_sizes_checks_its_input():
    assert lane_sizes(range(3, 0, -1), 2) == [[1, 2, 3], [1, 2, 3]]
    assert lane_sizes(lambda k: [4, 4, 2] if k else [1], 2) == [[1], [2, 4]]
    for bad in ([], [0, 1]):
        with pytest.raises(ValueError, match="lane 0"):
            lane_sizes(bad, 1)


class StopAt:
    """A stop request that answers from its ``k``-th look on and checks that no capture is open when asked."""

    def __init__(self, k, ops):
        self.k, self.ops, self.looks = k, ops, 0

    def __call__(self):
        assert not self.ops.open, "the stop request was asked inside a capture"
        self.looks += 1
        return "SIGTERM" if self.looks >= self.k else None


@pytest.mark.parametrize("k", [1, 2, 5])
def test_a_stop_request_ends_the_capture_between_two_graphs(k):
    ops = OpenCaptureOps()
    stop = StopAt(k, ops)
    with pytest.raises(Stopped) as e:
        capture_stages(STAGES, Buffers(), ops, range(1, 5), [1], lanes=2, progress=False, stop=stop)
    # asked before the first capture and after each one: the k-th look comes after k - 1 captures
    assert len(ops.log) == k - 1 and stop.looks == k and not ops.open
    assert e.value.reason == "SIGTERM"
    assert str(e.value) == f"stopped by SIGTERM while capturing CUDA graphs ({k - 1} of 16 captured)"


def test_a_stop_request_that_never_answers_changes_nothing():
    a, b = OpenCaptureOps(), OpenCaptureOps()
    capture_stages(STAGES, Buffers(), a, range(1, 5), [1], lanes=2, progress=False)
    stop = StopAt(10**9, b)
    capture_stages(STAGES, Buffers(), b, range(1, 5), [1], lanes=2, progress=False, stop=stop)
    assert a.log == b.log and stop.looks == 1 + 16


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread")
def test_a_signal_during_a_capture_is_delivered_once_the_capture_has_ended():
    seen: list[tuple[int, bool]] = []

    class Raised(Exception):
        pass

    def handler(signum, frame):  # a handler that raises, as the command line's SIGTERM handler does
        seen.append((signum, ops.open))
        raise Raised()

    ops = OpenCaptureOps(during={3: lambda: os.kill(os.getpid(), signal.SIGTERM)})
    previous = signal.signal(signal.SIGTERM, handler)
    sigint = signal.getsignal(signal.SIGINT)  # Python's default handler; SIG_IGN where the suite runs in the background
    try:
        with pytest.raises(Raised):
            capture_stages(STAGES, Buffers(), ops, range(1, 5), [1], lanes=1, progress=False)
        assert seen == [(signal.SIGTERM, False)]  # delivered after the capture, not inside it
        assert len(ops.log) == 3  # the capture the signal came in completed; no other began
        assert signal.getsignal(signal.SIGTERM) is handler  # the handler given back
        assert signal.getsignal(signal.SIGINT) is sigint
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread")
def test_signals_held_delivers_each_signal_once_in_arrival_order():
    got: list[int] = []
    before = {s: signal.signal(s, lambda signum, _f: got.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with signals_held():
            for s in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
                os.kill(os.getpid(), s)
            for _ in range(1000):  # bytecodes for the (held) handlers to run on
                pass
            assert got == []
        assert got == [signal.SIGTERM, signal.SIGINT]
    finally:
        for s, h in before.items():
            signal.signal(s, h)


def test_a_shape_never_captured_is_a_clear_error_not_an_eager_fallback():
    calls = []
    g = GraphStage(lambda x: calls.append(x.shape[0]) or x * 2.0, CpuGraphs(), 1, name=(3, 1))
    with torch.inference_mode():
        g.capture_rows(torch.zeros(4, 3), [4, 2])
        n = len(calls)
        with pytest.raises(MissingGraph) as e:
            g(torch.zeros(3, 3))
    assert len(calls) == n  # the stage did not run eagerly
    assert isinstance(e.value, KeyError)
    assert str(e.value).startswith("stage 1 (graphs (3, 1)): no CUDA graph captured for input shapes [(3, 3)]")
    assert "batch sizes [2, 4]" in str(e.value)
