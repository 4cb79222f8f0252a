"""The replay's CUDA graphs per lane and its stoppable start-up, on the CPU through the recording CudaOps stand-in.

* E2bird's workers (one lane each) run batches of exactly their own size (Algorithm 1), so each lane's graphs are
  captured, and its executors warmed up, at that size alone (``Policy.lane_batch_sizes``); the other policies keep
  ``1..max_batch_size`` on every lane (the captures counted against lanes x stages x sizes).
* A batch size a policy did not announce is a clear error naming the stage and the shape, never an eager run.
* A stop request (``dvasim replay``'s SIGINT/SIGTERM handlers) ends the start-up between two captures or two
  co-run measurements, with no capture open, and the command with one line and 128 + the signal's number."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from dvasim.cli import main  # noqa: E402
from dvasim.engines.replay import ReplayStageError, make_engine, prepare, to_run_result  # noqa: E402
from dvasim.engines.replay.corun import ReplayCoRun  # noqa: E402
from dvasim.engines.replay.engine import ReplayEngine, Stopped, graph_batch_sizes  # noqa: E402
from dvasim.model.stages.graphs import CpuGraphs, MissingGraph  # noqa: E402
from dvasim.policies.base import _REGISTRY  # noqa: E402
from dvasim.policies.e2bird import combinations  # noqa: E402
from tests.engines.test_replay import assert_outputs_match, cfg  # noqa: E402
from tests.engines.test_replay_cuda_discipline import RecordingCudaOps, check_discipline  # noqa: E402

MAIN_THREAD = threading.current_thread() is threading.main_thread()


def ebird_cfg(name="e-ebird", n=40, stages=2, **params):
    params = params or ({"total_bs": [4]} if name == "e-ebird" else {"workers": [4, 2, 1]})
    return {"model": {"name": "vgg19", "device": "cpu", "stages": stages}, "policy": {"name": name, **params},
            "workload": {"kind": "poisson", "rate_qps": 600.0, "n_queries": n, "seed": 3},
            "replay": {"modules": "cudagraph"}}


def replay_captures(ops) -> dict:
    """(lane, stage) -> the batch sizes (rows) of the replay's own captures, in capture order (the co-run
    profile's captures, pools named ("corun", ...), left out)."""
    out: dict = {}
    for e in ops.log:
        if e[0] == "capture" and e[1][1][0] != "corun":
            out.setdefault(e[1][1], []).append(e[2][0][0])
    return out


@pytest.mark.parametrize("name", ["e-ebird", "n-ebird"])
def test_each_ebird_worker_is_captured_and_warmed_at_its_own_size_only(name):
    ops = RecordingCudaOps()
    setup = prepare(ebird_cfg(name), cuda_ops=ops)
    sizes = setup.policy.sizes
    n_lanes, n_stages = setup.pipeline.instances, setup.pipeline.n_stages
    assert n_lanes == len(sizes) >= 3 and len(set(sizes)) > 1
    caps = replay_captures(ops)
    assert caps == {(k, s): [sizes[k]] for k in range(n_lanes) for s in range(n_stages)}
    assert sum(map(len, caps.values())) == n_lanes * n_stages  # before: n_lanes * n_stages * table max (64)
    assert graph_batch_sizes(setup) == [[b] for b in sizes]
    eng = make_engine(setup, device="cuda", cuda_ops=ops, record_outputs=True, warmup=2)
    assert [eng.warm_sizes(k) for k in range(n_lanes)] == [[b] for b in sizes]
    res = eng.run(setup.workload.arrivals_ms, setup.workload.seq_lens)
    r = to_run_result(setup, res)
    assert r.summary["n_completed"] == 40 and r.summary["replay_modules"] == "cudagraph"
    assert_outputs_match(r)
    assert check_discipline(ops, n_stages) == len(res.executions)
    for e in res.executions:  # a worker ran batches of exactly its size, each through its one graph
        assert e["batch_size"] == e["rows_run"] == sizes[e["lane"]]
    assert sum(st.launches for lane in setup.lane_stages for st in lane) == len(res.executions) + 2 * n_lanes * n_stages


@pytest.mark.parametrize("policy, params", [("zerobatch", {}), ("dvabatch", {"t_comp_wait_ms": 20.0})])
def test_other_policies_still_capture_every_size_on_every_lane(policy, params):
    c = cfg("vgg19", policy, n=4, **params)  # max_batch_size 8
    c["engine"]["instances"] = 2
    c["replay"] = {"modules": "cudagraph"}
    ops = RecordingCudaOps()
    setup = prepare(c, cuda_ops=ops)
    assert all(setup.policy.lane_batch_sizes(k) is None for k in range(2))
    caps = replay_captures(ops)
    assert caps == {(k, s): list(range(8, 0, -1)) for k in range(2) for s in range(3)}  # 2 x 3 x 8, as before
    eng = make_engine(setup, device="cuda", cuda_ops=ops)
    assert eng.warm_sizes(0) == eng.warm_sizes(1) == list(range(1, 9))


def test_a_batch_size_the_policy_did_not_announce_stops_the_replay_with_the_stage_and_shape(monkeypatch):
    """A policy that says its lanes run batches of 1 and then forms larger ones: no graph for them, and the replay
    stops with a ReplayStageError naming the stage and the shape (its cause a MissingGraph), instead of running
    the stage eagerly."""
    monkeypatch.setattr(_REGISTRY["zerobatch"], "lane_batch_sizes", lambda self, lane: [1], raising=False)
    c = cfg("vgg19", "zerobatch", stages=2)
    c["workload"] = {"kind": "explicit", "arrivals_ms": [0.0] * 6}  # six at once: one batch of 6
    c["replay"] = {"modules": "cudagraph"}
    setup = prepare(c)
    assert [st.batch_sizes() for st in setup.lane_stages[0]] == [[1], [1]]
    with pytest.raises(ReplayStageError) as e:
        make_engine(setup, warmup=1).run(setup.workload.arrivals_ms, setup.workload.seq_lens)
    assert isinstance(e.value.cause, MissingGraph) and e.value.stage == 0
    msg = str(e.value)
    assert msg.startswith("stage 0 (") and "no CUDA graph captured for input shapes [(6, " in msg
    assert "batch sizes [1]" in msg and e.value.query_ids == list(range(6))


class StopAfter:
    """A stop request answering ``reason`` from its ``k``-th look on, from any thread; counts its looks."""

    def __init__(self, k: int, reason: str = "SIGTERM"):
        self.k, self.reason, self.looks = k, reason, 0
        self.lock = threading.Lock()

    def __call__(self):
        with self.lock:
            self.looks += 1
            return self.reason if self.looks >= self.k else None


def test_a_stop_request_during_the_capture_stops_between_two_captures():
    c = cfg("vgg19", "zerobatch", n=4)
    c["replay"] = {"modules": "cudagraph"}
    ops = RecordingCudaOps()
    stop = StopAfter(6)
    with pytest.raises(Stopped) as e:
        prepare(c, cuda_ops=ops, stop=stop)
    assert str(e.value) == "stopped by SIGTERM while capturing CUDA graphs (5 of 24 captured)"
    assert len([x for x in ops.log if x[0] == "capture"]) == 5 and stop.looks == 6


def test_a_stop_request_during_the_corun_profile_stops_it_and_its_workers():
    stop = StopAfter(9)
    with pytest.raises(Stopped) as e:
        prepare(ebird_cfg(total_bs=[4, 8]) | {"replay": {"modules": "torchscript"}}, stop=stop)
    msg = str(e.value)
    assert msg.startswith("stopped by SIGTERM during E-Ebird's co-run profile (")
    measured = int(msg.split("(")[1].split()[0])
    assert measured < len(combinations(4)) + len(combinations(8))  # the search did not go on
    # after the answer, only the co-run's other workers (at most 7: TotalBS 8) may each have asked once more
    assert 9 <= stop.looks < 9 + 8
    assert not [t for t in threading.enumerate() if t.name.startswith("dvasim-corun") and t.is_alive()]


def test_corun_workers_that_see_the_stop_request_release_each_other():
    setup = prepare(ebird_cfg("n-ebird") | {"replay": {"modules": "torchscript"}})
    # looks: 1 before the combination, then one per worker before each of its rounds (3 workers x 3 rounds):
    # the 3rd look comes from a worker before the first round while the others may be waiting at the barrier
    stop = StopAfter(3)
    prof = ReplayCoRun(setup.model, setup.stages, warmup=1, repeats=2, stop=stop)
    with pytest.raises(Stopped, match=r"co-run profile \(0 combinations measured\)"):
        prof.average_ms((1, 1, 2), None)
    assert prof.measured == 0 and not [t for t in threading.enumerate() if t.name.startswith("dvasim-corun")]


def test_the_engine_asks_the_stop_request_and_stops_as_for_sigint():
    c = cfg("vgg19", "zerobatch", stages=2)
    c["workload"] = {"kind": "explicit", "arrivals_ms": [float(i) for i in range(10)] + [120_000.0]}
    setup = prepare(c)
    gone = threading.Event()
    eng = make_engine(setup, warmup=0, on_exit=lambda qs: gone.set(), stop=lambda: "SIGTERM" if gone.is_set() else None)
    res = eng.run(setup.workload.arrivals_ms, setup.workload.seq_lens)  # hang guard: the last arrival at 120 s
    assert res.interrupted and 0 < sum(q.done for q in res.queries) <= 10 and not res.queries[-1].done
    assert to_run_result(setup, res).summary["interrupted"]


# ---- the command line: one line, 128 + the signal's number, nothing written during the start-up


def _cfg_file(tmp_path, c) -> str:
    lines = []
    for sec, body in c.items():
        lines.append(f"[{sec}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in body.items()]
    p = tmp_path / "c.toml"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


@pytest.mark.skipif(not MAIN_THREAD, reason="signals are delivered to the main thread")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_capture_ends_dvasim_replay_with_one_line(tmp_path, capsys, monkeypatch, sig):
    real, n = CpuGraphs.capture_graph, [0]

    def capture_graph(self, fn, static_inputs, pool=None):  # the signal comes inside the third capture
        n[0] += 1
        if n[0] == 3:
            os.kill(os.getpid(), sig)
        return real(self, fn, static_inputs, pool)

    monkeypatch.setattr(CpuGraphs, "capture_graph", capture_graph)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    out = tmp_path / "out"
    c = cfg("vgg19", "zerobatch", n=10)
    rc = main(["replay", _cfg_file(tmp_path, c), "--out", str(out), "--modules", "cudagraph", "--no-figure"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 128 + sig
    assert err == [f"dvasim replay: stopped by {sig.name} while capturing CUDA graphs (3 of 24 captured); nothing "
                   "was written"]
    assert n[0] == 3  # no capture began after the one the signal came in
    assert not out.exists() or not list(out.iterdir())
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.skipif(not MAIN_THREAD, reason="signals are delivered to the main thread")
def test_sigterm_during_the_corun_profile_ends_dvasim_replay_with_one_line(tmp_path, capsys, monkeypatch):
    real, n = ReplayCoRun._measure, [0]

    def measure(self, sizes, L):  # the signal comes while the second combination is measured
        n[0] += 1
        if n[0] == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, sizes, L)

    monkeypatch.setattr(ReplayCoRun, "_measure", measure)
    out = tmp_path / "out"
    c = ebird_cfg(n=10) | {"replay": {"modules": "torchscript"}}
    rc = main(["replay", _cfg_file(tmp_path, c), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 143 and n[0] == 2
    assert err == ["dvasim replay: stopped by SIGTERM during E-Ebird's co-run profile (1 combinations measured); "
                   "nothing was written"]
    assert not out.exists() or not list(out.iterdir())


@pytest.mark.skipif(not MAIN_THREAD, reason="signals are delivered to the main thread")
def test_sigterm_during_the_run_writes_the_records_and_exits_143(tmp_path, capsys, monkeypatch):
    real, sent = ReplayEngine._record, threading.Event()

    def record(self, *a, **k):  # the signal comes when the first execution has finished
        if not sent.is_set():
            sent.set()
            os.kill(os.getpid(), signal.SIGTERM)
        return real(self, *a, **k)

    monkeypatch.setattr(ReplayEngine, "_record", record)
    c = cfg("vgg19", "zerobatch", stages=2)
    c["workload"] = {"kind": "explicit", "arrivals_ms": [float(i) for i in range(10)] + [120_000.0]}
    out = tmp_path / "out"
    rc = main(["replay", _cfg_file(tmp_path, c), "--out", str(out), "--no-figure", "--warmup", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 143 and err == ["dvasim replay: interrupted by SIGTERM; the records collected so far are written"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["n_completed"] < 11


def test_a_warm_up_blocked_inside_a_stage_call_is_abandoned_after_the_stop_request(monkeypatch):
    """The H200 hang (traces/gpu_matrix/h200_2026-11-28/device_call3_bert_hang.log): every executor blocked in a
    synchronisation of its warm-up, which asks the stop request only between passes, so the replay's time limit
    never fired. start() now asks it itself and gives up ``warm_grace_s`` after it, naming the blocked executor."""
    import time

    setup = prepare(cfg("vgg19", "zerobatch", stages=2))
    release, real = threading.Event(), ReplayEngine._warm

    def warm(self, lane, stage, rows, L=None):
        if stage == 1:
            release.wait(60)  # a call that does not return (released when the test ends)
        return real(self, lane, stage, rows, L)

    monkeypatch.setattr(ReplayEngine, "_warm", warm)
    t0 = time.monotonic()
    eng = make_engine(setup, warmup=1, warm_grace_s=0.5,
                      stop=lambda: "the time limit" if time.monotonic() - t0 > 1.0 else None)
    try:
        with pytest.raises(Stopped, match=r"during the warm-up: dvasim-executor-1 still inside a stage call 0.5 s"):
            eng.run(setup.workload.arrivals_ms, setup.workload.seq_lens)
        assert 1.4 < time.monotonic() - t0 < 30  # the limit, then the grace (not the 60 s of the blocked call)
        assert eng._abandoned and eng._warmed == [True, False]
    finally:
        release.set()
    eng._threads[1].join(10)
    assert not eng._threads[1].is_alive()  # released, it sees the stop and ends
