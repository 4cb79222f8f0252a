"""Each executor's CUDA graphs are captured on a stream of their own (dvasim.model.stages.cuda.CudaOps).

torch keys its cuBLAS / cuBLASLt workspaces by (handle, stream), and a graph replays the workspace address it was
captured with: graphs captured on one shared stream share one workspace, even in separate memory pools
(pytorch/pytorch#193402). On an H200 the four BERT-base stage executors, replaying such graphs at once, all
blocked in their warm-up (traces/gpu_matrix/h200_2026-11-28/device_call3_bert_hang.log). Here torch.cuda is
replaced by a recording stand-in (no GPU needed): every pool gets its own stream, its warm-up runs and its capture
both run on it, and two pools never share one."""

from __future__ import annotations

import contextlib
import itertools

import pytest

torch = pytest.importorskip("torch")

from dvasim.model.stages.cuda import CudaOps  # noqa: E402


class FakeStream:
    ids = itertools.count()

    def __init__(self, device=None):
        self.id = next(FakeStream.ids)

    def wait_stream(self, other):
        pass


@pytest.fixture
def fake_cuda(monkeypatch):
    log = {"current": [], "captured_on": []}
    pools = itertools.count()
    default = FakeStream()

    @contextlib.contextmanager
    def stream(s):
        log["current"].append(s)
        try:
            yield
        finally:
            log["current"].pop()

    @contextlib.contextmanager
    def graph(g, pool=None, stream=None, **kw):
        log["captured_on"].append((pool, stream))
        yield

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: (0, next(pools)))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: default)
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", graph)
    return log


def test_every_pool_captures_on_its_own_stream(fake_cuda):
    ops = CudaOps("cpu")
    warm_streams = []

    def fn(inputs):  # a stage: records the stream it runs on (warm-up runs; the capture's run is recorded too)
        warm_streams.append(fake_cuda["current"][-1] if fake_cuda["current"] else None)
        return torch.zeros(1)

    a, b = ops.graph_pool((0, 0)), ops.graph_pool((0, 1))
    for pool in (a, a, b):  # two graphs of executor (0, 0), one of executor (0, 1)
        ops.capture_graph(fn, [torch.zeros(1)], pool=pool)
    (pa, sa1), (pa2, sa2), (pb, sb) = fake_cuda["captured_on"]
    assert (pa, pa2, pb) == (a, a, b)
    assert sa1 is sa2 and sb is not sa1  # one stream per pool, kept for all of its graphs
    assert sa1 is ops._capture_streams[a] and sb is ops._capture_streams[b]
    # the two warm-up runs of each capture ran on the stream it is captured on (its workspace made before capture)
    warm = [s for i, s in enumerate(warm_streams) if i % 3 < 2]
    assert warm == [sa1, sa1, sa1, sa1, sb, sb]


def test_a_graph_without_a_pool_still_gets_a_fresh_stream(fake_cuda):
    ops = CudaOps("cpu")
    ops.capture_graph(lambda inputs: torch.zeros(1), [torch.zeros(1)])
    ops.capture_graph(lambda inputs: torch.zeros(1), [torch.zeros(1)])
    (_, s1), (_, s2) = fake_cuda["captured_on"]
    assert isinstance(s1, FakeStream) and s1 is not s2
