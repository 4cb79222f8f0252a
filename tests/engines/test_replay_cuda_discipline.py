"""The CUDA path's stream/event discipline (paper §6.3), checked against a recording stand-in for torch.cuda.

No GPU here: :class:`RecordingCudaOps` replaces the few ``torch.cuda`` calls the engine makes (through
``dvasim.engines.replay.engine.CudaOps``). It behaves like real streams: work launched on a stream is *deferred* until
someone synchronises an event recorded after it, and a ``wait_event`` makes the stream run the awaited work
first. So an engine that forgot a synchronisation would read buffers that were never written, and the outputs
check below would fail. The log of calls is then checked for the discipline itself: which stream records which
event, who waits on what, in which order, and that the host never synchronises the whole device.
"""

from __future__ import annotations

import functools
import threading

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from dvasim.engines.replay import make_engine, prepare, replay, to_run_result  # noqa: E402
from dvasim.engines.replay.engine import _CudaBackend  # noqa: E402
from tests.engines.test_replay import assert_outputs_match, cfg  # noqa: E402


class FakeStream:
    def __init__(self, name):
        self.name = name
        self.ops: list = []  # ("wait", (stream, pos) | None) or ("run", fn)
        self.done = 0


class FakeEvent:
    def __init__(self, name):
        self.name = name
        self.rec: tuple[FakeStream, int] | None = None


class RecordingCudaOps:
    """A stand-in for :class:`dvasim.engines.replay.engine.CudaOps` that defers work like a stream and logs every call."""

    device = torch.device("cpu")

    def __init__(self):
        self.lock = threading.RLock()
        self.log: list[tuple] = []

    def _log(self, *entry):
        self.log.append((*entry, threading.current_thread().name))

    def new_stream(self, name):
        with self.lock:
            self._log("new_stream", name)
            return FakeStream(name)

    def new_event(self, name):
        with self.lock:
            self._log("new_event", name)
            return FakeEvent(name)

    def wait_event(self, stream, event):
        with self.lock:
            stream.ops.append(("wait", event.rec))
            self._log("wait", stream.name, event.name, None if event.rec is None else event.rec[1])

    def launch(self, stream, fn):
        with self.lock:
            ex = fn.args[0] if isinstance(fn, functools.partial) else None
            stream.ops.append(("run", fn))
            self._log("launch", stream.name, ex)

    def record_event(self, stream, event):
        with self.lock:
            event.rec = (stream, len(stream.ops))
            self._log("record", stream.name, event.name, len(stream.ops))

    def synchronize_event(self, event):
        with self.lock:
            self._log("sync", event.name)
            if event.rec is not None:
                self._drain(*event.rec)

    def synchronize(self):  # device-wide: the engine must never call it
        with self.lock:
            self._log("device_sync")

    def _drain(self, stream, upto):
        while stream.done < upto:
            kind, arg = stream.ops[stream.done]
            stream.done += 1
            if kind == "wait":
                if arg is not None:
                    self._drain(*arg)
            else:
                outer, self.draining = getattr(self, "draining", None), stream.name
                try:
                    arg()
                finally:
                    self.draining = outer

    # CUDA graphs: captured through the same object (prepare(..., cuda_ops=)), replayed inside launches
    def graph_pool(self, name):
        with self.lock:
            self._log("pool", name)
            return ("pool", name)

    def capture_graph(self, fn, static_inputs, pool=None):
        from dvasim.model.stages.graphs import CpuGraphs

        with self.lock:
            self._log("capture", pool, tuple(tuple(t.shape) for t in static_inputs))
        return {**CpuGraphs().capture_graph(fn, static_inputs), "pool": pool}

    def replay_graph(self, graph):
        from dvasim.model.stages.graphs import CpuGraphs

        self._log("replay", getattr(self, "draining", None), graph["pool"])
        CpuGraphs().replay_graph(graph)


def run_fake(config, backend_cls=None, **kw):
    ops = RecordingCudaOps()
    setup = prepare(config, cuda_ops=ops)
    eng = make_engine(setup, device="cuda", cuda_ops=ops, record_outputs=True, warmup=1, **kw)
    if backend_cls is not None:
        eng.backend = backend_cls(ops, setup.pipeline.instances, setup.pipeline.n_stages,
                                  setup.pipeline.n_buffer_pairs)
    res = eng.run(setup.workload.arrivals_ms, setup.workload.seq_lens)
    return to_run_result(setup, res), ops


def check_discipline(ops, n_stages):
    """Assert the §6.3 discipline on the call log (one pass, in call order); returns the executions checked."""
    log = [e for e in ops.log if e[0] in ("wait", "launch", "record", "sync", "device_sync")]
    assert not [e for e in log if e[0] == "device_sync"], "the host synchronised the whole device"
    since_record: dict = {}  # stream -> its waits since its last record
    captured: dict = {}  # (stream, event) -> log index of the record the wait captured
    latest: dict = {}  # event -> log index of its latest record
    producer: dict = {}  # (lane, boundary, slot, row) -> log index of the record after its last write
    running: dict = {}  # stream -> execution launched and not yet recorded
    checked = 0
    for i, e in enumerate(log):
        kind = e[0]
        if kind == "wait":
            since_record.setdefault(e[1], []).append(e[:3])
            captured[(e[1], e[2])] = latest.get(e[2], -1)
        elif kind == "launch" and e[2] is not None:
            ex, stream = e[2], e[1]
            lane, s = stream
            j = ex.slot
            assert (ex.lane, ex.stage) == stream, f"execution of stage {ex.stage} launched on stream {stream}"
            want = []
            if s > 0:
                want.append(("wait", stream, (lane, s - 1, j)))
            if s + 1 < n_stages:
                want.append(("wait", stream, (lane, s + 1, j)))
            got = since_record.pop(stream, [])
            assert got == want, f"execution of stage {s} on pair {j}: waits {got}, expected {want}"
            for nb in (s - 1, s + 1):  # neither neighbour is using pair j right now
                other = running.get((lane, nb))
                assert other is None or other.slot != j, f"stage {s} launched on pair {j} while stage {nb} uses it"
            if s > 0:  # read-after-write: the awaited record covers the last write of every row we read
                rec = captured[(stream, (lane, s - 1, j))]
                assert rec >= 0, "waited on an event nobody recorded"
                for r in ex.rows:
                    assert producer.get((lane, s, j, r), -1) <= rec, f"row {r} written after the awaited record"
            running[stream] = ex
        elif kind == "record" and e[2][0] != "warmup":
            stream, ev = e[1], e[2]
            assert ev[:2] == stream, f"stream {stream} recorded event {ev}"
            ex = running.pop(stream)
            assert (ex.lane, ex.stage, ex.slot) == ev, "recorded a pair the execution did not use"
            latest[ev] = i
            for r in ex.rows:
                producer[(ex.lane, ex.stage + 1, ex.slot, r)] = i
            # the host then waits for this very event (its own work) from the executor's thread
            nxt = next((x for x in log[i + 1:] if x[-1] == e[-1]), None)
            assert nxt is not None and nxt[:2] == ("sync", ev), f"after recording {ev}: {nxt}"
            checked += 1
    return checked


def test_cuda_path_discipline_and_outputs():
    c = cfg("vgg19", "dvabatch", rate=600.0, n=60, pairs=2, t_comp_wait_ms=20.0)
    r, ops = run_fake(c)
    assert r.summary["n_completed"] == 60
    assert_outputs_match(r)  # deferred execution: only correct if every needed sync/wait happened
    n_exec = len(r.extra["replay"].executions)
    assert check_discipline(ops, 3) == n_exec >= 20
    # one stream per executor, one event per buffer pair of each executor (+ one per executor's warm-up)
    streams = [e[1] for e in ops.log if e[0] == "new_stream"]
    events = [e[1] for e in ops.log if e[0] == "new_event" and e[1][0] != "warmup"]
    assert sorted(streams) == [(0, s) for s in range(3)]
    assert sorted(events) == [(0, s, j) for s in range(3) for j in range(2)]
    # the threads: every launch on stream (0, s) came from executor thread s
    for e in ops.log:
        if e[0] == "launch":
            assert e[-1] == f"dvasim-executor-{e[1][1]}"


def test_cuda_path_with_split_and_stretch_and_two_instances():
    c = cfg("bert_base", "dvabatch", rate=800.0, n=60, pairs=2, policies=["load", "operator"],
            split_factor=1.0, t_comp_wait_ms=20.0)
    c["engine"]["instances"] = 2
    r, ops = run_fake(c)
    assert r.summary["n_completed"] == 60
    assert_outputs_match(r)
    assert check_discipline(ops, 3) == len(r.extra["replay"].executions)
    lanes = {e[1][0] for e in ops.log if e[0] == "launch"}
    assert lanes == {0, 1}


class NoWarWait(_CudaBackend):
    """A broken discipline: forgets the write-after-read wait."""

    def execute(self, k, ex, compute):
        ops, stream = self.ops, self.streams[k]
        s, j = ex.stage, ex.slot
        if s > 0:
            ops.wait_event(stream, self.events[ex.lane][s - 1][j])
        ops.launch(stream, functools.partial(compute, ex))
        ops.record_event(stream, self.events[ex.lane][s][j])
        ops.synchronize_event(self.events[ex.lane][s][j])


class NoSync(_CudaBackend):
    """A broken discipline: reports the stage finished without waiting for its work."""

    def execute(self, k, ex, compute):
        ops, stream = self.ops, self.streams[k]
        s, j = ex.stage, ex.slot
        if s > 0:
            ops.wait_event(stream, self.events[ex.lane][s - 1][j])
        if s + 1 < self.n_stages:
            ops.wait_event(stream, self.events[ex.lane][s + 1][j])
        ops.launch(stream, functools.partial(compute, ex))
        ops.record_event(stream, self.events[ex.lane][s][j])


def test_the_checks_catch_a_broken_discipline():
    c = cfg("vgg19", "zerobatch", rate=300.0, n=20, pairs=1)
    _, ops = run_fake(c, backend_cls=NoWarWait)
    with pytest.raises(AssertionError, match="waits"):
        check_discipline(ops, 3)
    r, ops = run_fake(c, backend_cls=NoSync)
    with pytest.raises(AssertionError, match="after recording"):
        check_discipline(ops, 3)
    with pytest.raises(AssertionError, match="not close"):
        assert_outputs_match(r)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_cuda_path_runs_unchanged():  # pragma: no cover - no GPU on the CI machine
    r = replay(cfg("vgg19", "dvabatch", rate=300.0, n=40), device="cuda", record_outputs=True)
    assert r.summary["n_completed"] == 40
    setup = r.extra["setup"]
    outs = r.extra["replay"].outputs
    with torch.inference_mode():
        for qid, got in outs.items():
            want = setup.model.forward(setup.inputs.sample(qid).to("cuda"))[0].cpu()
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


def test_cuda_graph_stages_replay_inside_their_executors_stream():
    """modules = "cudagraph": every stage of every lane captured at start-up for every batch size and length
    bucket; every execution replays exactly one graph, on its own executor's stream (between the stream's waits
    and its event record: the deferred run the executor's sync drains), never outside a launch."""
    c = cfg("bert_base", "dvabatch", rate=800.0, n=50, pairs=2, policies=["load"], t_comp_wait_ms=20.0)
    c["replay"] = {"modules": "cudagraph"}
    c["engine"]["instances"] = 2
    r, ops = run_fake(c)
    assert r.summary["n_completed"] == 50 and r.summary["replay_modules"] == "cudagraph"
    assert_outputs_match(r)
    assert check_discipline(ops, 3) == len(r.extra["replay"].executions)
    setup = r.extra["setup"]
    captures = [e for e in ops.log if e[0] == "capture"]
    assert len(captures) == 2 * 3 * 8 * len(setup.buckets)  # lanes x stages x batch sizes x buckets
    # one memory pool per executor (executors replay at the same time; one executor's graphs never do), and
    # each executor's graphs captured longest bucket first, largest batch first (smaller ones reuse the memory)
    assert [e[1] for e in ops.log if e[0] == "pool"] == [(lane, s) for lane in range(2) for s in range(3)]
    for lane in range(2):
        for s in range(3):
            shapes = [e[2] for e in captures if e[1] == ("pool", (lane, s))]
            order = [(sh[0][1], sh[0][0]) for sh in shapes]  # stage inputs: (rows, length, ...) first leaf
            assert len(shapes) == 8 * len(setup.buckets) and order == sorted(order, reverse=True)
            assert {(b, L) for L, b in order} == {(b, L) for b in range(1, 9) for L in setup.buckets}
    first_launch = next(i for i, e in enumerate(ops.log) if e[0] == "launch")
    assert max(i for i, e in enumerate(ops.log) if e[0] == "capture") < first_launch  # all at start-up
    replays = [e for e in ops.log if e[0] == "replay"]
    launches = [e for e in ops.log if e[0] == "launch"]  # the executions and the executors' warm-up passes
    assert len(replays) == len(launches) > len(r.extra["replay"].executions)  # one graph replay per launch
    assert not [e for e in replays if e[1] is None], "a graph replayed outside any stream"
    for e in replays:  # ... while its own executor's stream ran (lane, stage) -> executor thread lane*3+stage
        assert e[-1] == f"dvasim-executor-{e[1][0] * 3 + e[1][1]}"
        assert e[2] == ("pool", e[1]), f"stream {e[1]} replayed a graph of executor {e[2][1]}"
