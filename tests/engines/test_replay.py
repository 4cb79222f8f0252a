"""The replay backend on the CPU: real stage modules driven by the simulator's own control plane.

Every test runs the real small zoo models on real buffers, so a mechanism bug (two batches in one buffer pair
at once, a pair handed back too early, a wrong row) would show as a wrong output for some query.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections import Counter

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from dvasim.cli import main  # noqa: E402
from dvasim.core.executor import ExecutorState  # noqa: E402
from dvasim.engines.replay import ReplayStageError, make_engine, prepare, replay, to_run_result  # noqa: E402
from tests.conftest import vgg19_config_file  # noqa: E402

A, C, W, INA = ExecutorState.ACTIVE, ExecutorState.CHECKING, ExecutorState.WORKING, ExecutorState.INACTIVE
# the transitions of the paper's Figure 11 (and nothing else)
ALLOWED = {(A, W), (A, C), (C, W), (W, A), (W, INA), (INA, A)}


def cfg(model="vgg19", policy="zerobatch", rate=200.0, n=80, pairs=2, stages=3, seed=1, **policy_params):
    c = {
        "model": {"name": model, "device": "cpu", "stages": stages},
        "policy": {"name": policy, "max_batch_size": 8, **policy_params},
        "workload": {"kind": "poisson", "rate_qps": rate, "n_queries": n, "seed": seed},
        "engine": {"buffer_pairs": pairs},
    }
    if model.startswith("bert"):
        c["workload"]["seq_len_dist"] = "glue:MRPC"
    return c


def assert_outputs_match(result):
    """Every query's output equals the unbatched, unpadded model's output for the same input."""
    setup = result.extra["setup"]
    outs = result.extra["replay"].outputs
    assert set(outs) == {q for q in result.queries["query_id"]}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small models: much faster than contended intra-op threads on a busy machine
    try:
        with torch.inference_mode():
            for qid, got in outs.items():
                want = setup.model.forward(setup.inputs.sample(qid))[0]
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda m, q=qid: f"query {q}: {m}")
    finally:
        torch.set_num_threads(threads)


def test_replay_completes_every_query_with_correct_outputs():
    r = replay(cfg("vgg19", "delaybatch", rate=400.0, n=100, max_queue_delay_ms=4.0), record_outputs=True,
               warmup=0)
    s = r.summary
    assert s["n_completed"] == s["n_queries"] == 100
    assert r.stuck is None
    assert s["mean_exit_batch_size"] > 1.0  # batches were really formed (the check below covers batching)
    assert_outputs_match(r)
    rep = r.extra["replay"]
    # every query went through every stage exactly once, in order
    per_query = Counter(q for e in rep.executions for q in e["query_ids"])
    assert set(per_query.values()) == {3}
    df = r.queries
    for st in range(3):
        assert (df[f"s{st}_finish_ms"] >= df[f"s{st}_start_ms"]).all()
        if st:
            assert (df[f"s{st}_start_ms"] >= df[f"s{st - 1}_finish_ms"]).all()
    assert (df["latency_ms"] > 0).all()


def test_stretch_with_longer_newcomers_pads_correctly():
    """BERT under Policy III: stretched batches merge rows written at different lengths (padding path)."""
    r = replay(cfg("bert_base", "dvabatch", rate=800.0, n=60, policies=["load"], t_comp_wait_ms=50.0),
               record_outputs=True, warmup=0)
    s = r.summary
    assert s["n_completed"] == 60
    assert s["n_stretch"] > 0
    ex = r.extra["replay"].executions
    assert any(e["row_start"] > 0 for e in ex)  # catch-up executions of stretched rows
    # some merged execution read rows that an earlier execution had written at a shorter length
    assert r.extra["setup"].buffers.padded_rows > 0
    assert_outputs_match(r)


@pytest.mark.parametrize("manner", ["serial", "pipelined"])
def test_split_sub_batches_share_the_parent_pair_correctly(manner):
    r = replay(cfg("bert_base", "dvabatch-split", rate=600.0, n=60, split_factor=1.0, max_queue_delay_ms=3.0,
                   split_manner=manner), record_outputs=True, warmup=0)
    assert r.summary["n_split"] > 0
    assert r.summary["n_completed"] == 60
    assert_outputs_match(r)
    if manner == "serial":  # a sub-batch runs the stage after the split only once its elder sibling has exited
        df = r.queries
        checked = 0
        for _, batch in df.groupby("batch_id"):
            subs = sorted(batch.groupby("exit_batch_id"), key=lambda kv: kv[1]["finish_ms"].max())
            for (_, first), (_, later) in zip(subs, subs[1:]):
                assert later["s2_start_ms"].min() >= first["finish_ms"].max() - 1e-6
                checked += 1
        assert checked > 0


def test_executor_states_follow_the_transition_diagram():
    r = replay(cfg("vgg19", "dvabatch", rate=500.0, n=80, pairs=2), record_states=True, warmup=0)
    setup = r.extra["setup"]
    seen = set()
    for ex in setup.pipeline.executors:
        h = ex.history
        assert h[0] is A
        steps = set(zip(h, h[1:]))
        assert steps <= ALLOWED, (ex.stage, steps - ALLOWED)
        assert (A, W) in steps or (C, W) in steps
        seen |= steps
        assert h[-1] in (A, INA)  # nothing left running or waiting
    assert (W, A) in seen


def _overlaps(executions, key_begin, key_end):
    iv = sorted((e[key_begin], e[key_end], e["stage"]) for e in executions)
    n = 0
    for k, (_b, e, s) in enumerate(iv):
        for b2, _e2, s2 in iv[k + 1:]:
            if b2 >= e:
                break
            if s2 != s:
                n += 1
    return n


class Rendezvous:
    """Stage 1's first call and stage 0's second call wait for each other (``hang_s`` only guards against a hang:
    the mechanism refusing the overlap), so both are running at once by construction, whatever the machine's
    speed: stage 1's first call waits until stage 0's second has begun, and that one until stage 1's has begun."""

    def __init__(self, hang_s: float = 120.0):
        self.entered, self.opened, self.hang_s = threading.Event(), threading.Event(), hang_s

    def wrap(self, inner, stage: int):
        calls = [0]

        def forward(x):
            calls[0] += 1
            if stage == 1 and calls[0] == 1:
                self.entered.set()
                self.opened.wait(self.hang_s)
            elif stage == 0 and calls[0] == 2:
                self.entered.wait(self.hang_s)
                self.opened.set()
            return inner(x)

        return forward


def test_one_buffer_pair_runs_stages_serially_two_pairs_overlap():
    """Order and overlap from the recorded execution intervals, not durations: with one pair no two executions
    of different stages intersect; with two, stage 0 runs the next batch on the second pair while stage 1 still
    runs the first batch (the two calls wait for each other), so their intervals intersect."""
    # zerobatch never overlaps batches (one batch per instance); dvabatch does when the buffers allow it
    one = replay(cfg("vgg19", "dvabatch", rate=800.0, n=80, pairs=1), warmup=0).extra["replay"].executions
    assert _overlaps(one, "begin_ms", "end_ms") == 0
    assert _overlaps(one, "start_ms", "finish_ms") == 0
    # policies = []: plain multi-entry pipelining, every batch enters as soon as the first stage takes it
    setup = prepare(cfg("vgg19", "dvabatch", rate=800.0, n=80, pairs=2, policies=[]))
    meet = Rendezvous()
    setup.stages[0], setup.stages[1] = meet.wrap(setup.stages[0], 0), meet.wrap(setup.stages[1], 1)
    res = make_engine(setup, warmup=0).run(setup.workload.arrivals_ms, setup.workload.seq_lens)
    assert meet.entered.is_set() and meet.opened.is_set(), "stage 0 never ran again while stage 1 ran the first batch"
    assert sum(q.done for q in res.queries) == 80
    two = res.executions
    first1 = min((e for e in two if e["stage"] == 1), key=lambda e: e["begin_ms"])
    second0 = sorted((e for e in two if e["stage"] == 0), key=lambda e: e["begin_ms"])[1]
    assert second0["slot"] != first1["slot"] and second0["batch_id"] != first1["batch_id"]  # the other pair
    assert second0["begin_ms"] < first1["end_ms"] and first1["begin_ms"] < second0["end_ms"]  # they intersect
    assert _overlaps(two, "begin_ms", "end_ms") > 0


def test_overload_finishes_without_losing_a_query():
    r = replay(cfg("vgg19", "zerobatch", rate=20000.0, n=150, pairs=2), warmup=0)
    s = r.summary
    assert r.stuck is None
    assert s["n_completed"] == 150
    ex = r.extra["replay"].executions
    last = [q for e in ex if e["stage"] == 2 for q in e["query_ids"]]
    assert sorted(last) == list(range(150))  # every query left exactly once
    # it did queue: the last query started only after the first one's batch had left stage 0 (order, not time)
    df = r.queries.set_index("query_id")
    first_batch_ids = set(next(e["query_ids"] for e in ex if e["stage"] == 0 and 0 in e["query_ids"]))
    assert 149 not in first_batch_ids
    assert df.loc[149, "s0_start_ms"] >= df.loc[0, "s0_finish_ms"]


class Exploding(torch.nn.Module):
    def __init__(self, inner, fail_on_call):
        super().__init__()
        self.inner, self.fail_on_call, self.calls = inner, fail_on_call, 0

    def forward(self, x):
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise RuntimeError("injected failure")
        return self.inner(x)


def test_exception_in_a_stage_names_the_stage_and_queries():
    setup = prepare(cfg("vgg19", "zerobatch", rate=300.0, n=60))
    setup.stages[1] = Exploding(setup.stages[1], fail_on_call=3)
    begun = []
    setup.pipeline.on_begin.append(lambda ex: begun.append((ex.stage, [q.qid for q in ex.queries])))
    eng = make_engine(setup, warmup=0)
    with pytest.raises(ReplayStageError) as info:
        eng.run(setup.workload.arrivals_ms, setup.workload.seq_lens)
    err = info.value
    failed = [qids for st, qids in begun if st == 1][2]
    assert err.stage == 1 and err.query_ids == failed
    msg = str(err)
    assert msg.startswith("stage 1 (") and str(failed) in msg and "injected failure" in msg
    assert err.result is not None and len(err.result.queries) == 60
    assert not [t for t in threading.enumerate() if t.name.startswith("dvasim-executor")]


def test_interrupt_stops_cleanly_and_keeps_records():
    """SIGINT sent when the first query has left (not after a delay): ten queries arrive in the first 10 ms, the last
    one two minutes later, so the run stops on the interrupt or, if that failed, after the last arrival (a hang
    guard): the run stopped and returned every query's record, with interrupted set."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("SIGINT is delivered to the main thread")
    c = cfg("vgg19", "zerobatch")
    c["workload"] = {"kind": "explicit", "arrivals_ms": [float(i) for i in range(10)] + [120_000.0]}
    setup = prepare(c)
    sent = threading.Event()

    def interrupt_once(queries):
        if not sent.is_set():
            sent.set()
            os.kill(os.getpid(), signal.SIGINT)

    before = signal.getsignal(signal.SIGINT)  # Python's default handler; SIG_IGN where the suite runs in the background
    eng = make_engine(setup, warmup=0, on_exit=interrupt_once)
    res = eng.run(setup.workload.arrivals_ms, setup.workload.seq_lens)
    assert sent.is_set() and res.interrupted
    assert len(res.queries) == 11  # the records of every query, done or not
    done = [q for q in res.queries if q.done]
    assert 0 < len(done) <= 10 and not res.queries[-1].done  # stopped before the last arrival
    assert all(q.finish >= q.arrival for q in done)
    assert not setup.pipeline.running  # the running executions were let finish
    assert signal.getsignal(signal.SIGINT) is before  # the handler given back
    r = to_run_result(setup, res)
    assert r.summary["interrupted"] and r.summary["n_completed"] == len(done)


def test_same_config_same_schedule_and_inputs():
    a, b = prepare(cfg("bert_base", n=40)), prepare(cfg("bert_base", n=40))
    assert (a.workload.arrivals_ms == b.workload.arrivals_ms).all()
    assert (a.workload.seq_lens == b.workload.seq_lens).all()
    assert torch.equal(a.inputs.data, b.inputs.data)
    assert [a.inputs.sample(k).shape[1] for k in range(40)] == list(a.workload.seq_lens)
    from dvasim.api import run

    sim = run(cfg("bert_base", n=40))
    assert list(sim.queries["arrival_ms"]) == list(a.workload.arrivals_ms)
    assert list(sim.queries["seq_len"]) == list(a.workload.seq_lens)


def test_cli_replay_writes_the_run_files(tmp_path):
    conf = vgg19_config_file(tmp_path / "c.toml", 200, 40, 4)
    out = tmp_path / "out"
    assert main(["replay", str(conf), "--out", str(out)]) == 0
    for f in ("queries.csv", "summary.json", "config.json", "latency.png"):
        assert (out / f).is_file(), f
    s = json.loads((out / "summary.json").read_text())
    assert s["n_completed"] == 40 and s["engine"] == "replay"


def test_cli_replay_errors_are_one_line(tmp_path, capsys):
    conf = tmp_path / "c.toml"
    conf.write_text('[model]\ntable = "traces/default/vgg16_titanx_4stages.csv"\n[workload]\nkind = "poisson"\n'
                    'rate_qps = 10\nn_queries = 5\n')
    assert main(["replay", str(conf), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dvasim: error: model.table:")
    assert main(["replay", str(conf), "--out", str(tmp_path / "o"), "--threads", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dvasim replay: error: --threads:")


def test_closed_loop_like_the_simulator():
    c = cfg("vgg19", "zerobatch", n=40)
    c["workload"] = {"kind": "closed", "clients": 2, "n_queries": 40, "think_ms": 0.5}
    r = replay(c, warmup=0)
    df = r.queries
    assert r.summary["n_completed"] == 40 and r.stuck is None
    # never more than two queries in the system: each client waits for its answer (plus think time)
    events = sorted([(a, 1) for a in df["arrival_ms"]] + [(f, -1) for f in df["finish_ms"]])
    inside = peak = 0
    for _, d in events:
        inside += d
        peak = max(peak, inside)
    assert peak == 2
    assert (df["arrival_ms"].iloc[2:].to_numpy() > df["finish_ms"].min()).all()


def test_cli_validate_writes_fidelity(tmp_path):
    conf = vgg19_config_file(tmp_path / "c.toml", 150, 40, 5,
                             engine='[engine]\nsharing = "parallel"\nlaunch_overhead_ms = 0.3\n')
    out = tmp_path / "val"
    assert main(["validate", str(conf), "--out", str(out), "--repeats", "2", "--set", "workload.seed=6"]) == 0
    fid = json.loads((out / "fidelity.json").read_text())
    assert (out / "fidelity.png").is_file() and (out / "sim" / "queries.csv").is_file()
    assert (out / "replay_1" / "executions.csv").is_file()
    assert fid["repeats"] == 2 and fid["workload"]["seed"] == 6 and fid["engine"]["launch_overhead_ms"] == 0.3
    for key in ("mean_latency_ms", "p50_latency_ms", "p99_latency_ms", "throughput_qps"):
        row = fid["metrics"][key]
        assert len(row["real"]) == 2
        mean = sum(row["real"]) / 2
        assert row["real_mean"] == pytest.approx(mean)
        assert row["rel_error"] == pytest.approx((row["sim"] - mean) / mean)
        assert row["real_spread"] == pytest.approx(abs(row["real"][0] - row["real"][1]) / mean)
    sim = json.loads((out / "sim" / "summary.json").read_text())
    assert fid["metrics"]["mean_latency_ms"]["sim"] == pytest.approx(sim["mean_latency_ms"])
    assert fid["metrics"]["p99_latency_ms"]["tolerance"] == 0.2
    assert fid["metrics"]["mean_latency_ms"]["tolerance"] >= 0.1
    assert main(["validate", str(conf), "--out", str(out), "--repeats", "0"]) == 2


def test_validate_stopped_by_ctrl_c_keeps_the_replays_records_and_runs_no_other(tmp_path, capsys, monkeypatch):
    """Ctrl-C during validate's replay: the replay stops (interrupted) and keeps its records; validate writes them,
    runs no further repeat and exits 130 with one line (it used to start the next repeat, so a long validate
    never stopped)."""
    import dvasim.engines.replay.engine as engine

    conf = vgg19_config_file(tmp_path / "c.toml", 60, 40, 5)
    calls = []
    real = engine.replay

    def interrupted_replay(*args, **kwargs):
        r = real(*args, **kwargs)
        calls.append(1)
        r.summary["interrupted"] = True  # as a SIGINT during the run leaves it
        return r

    monkeypatch.setattr(engine, "replay", interrupted_replay)
    out = tmp_path / "val"
    assert main(["validate", str(conf), "--out", str(out), "--repeats", "3", "--no-figure"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"dvasim validate: interrupted by SIGINT; the records of replay 0 so far are in {out}/replay_0/"]
    assert calls == [1] and (out / "replay_0" / "executions.csv").is_file() and not (out / "replay_1").exists()
    assert not (out / "fidelity.json").exists()


def test_serving_stage_table_profiles_the_replays_stages(tmp_path):
    from dvasim.fitting.validate import serving_stage_table
    from dvasim.model.table import LatencyTable

    c = cfg("vgg19", stages=2)
    path = serving_stage_table(c, tmp_path / "t.csv", repeats=3, gap_ms=0.2, warmup=1)
    t = LatencyTable.load(path)
    assert t.n_stages == 2 and list(t.batch_sizes) == list(range(1, 9))  # every size the policy forms (max 8)
    for s in range(2):  # measured: positive and finite (no order between batch sizes is asserted of a clock)
        assert all(0 < t.latency(s, b) < float("inf") for b in range(1, 9))
    assert "serving" in t.provenance.get("source", "") and t.provenance["modules"] == "torchscript"


def test_validate_with_a_table_per_repeat(tmp_path):
    """--table serving: a table profiled before each replay, a simulation with each, their mean compared."""
    from dvasim.fitting.validate import validate

    c = cfg("vgg19", stages=2, n=40, rate=150.0)
    c["policy"]["max_batch_size"] = 4
    fid = validate(c, tmp_path, repeats=2, table="serving", figure=False)
    for k in range(2):
        assert (tmp_path / f"stage_table_{k}.csv").is_file() and (tmp_path / f"sim_{k}" / "summary.json").is_file()
        # the replay decided with the table its simulation used
        rcfg = json.loads((tmp_path / f"replay_{k}" / "config.json").read_text())
        assert rcfg["config"]["model"]["provenance"]["source"].startswith("dvasim.fitting.validate.serving_stage_table")
    per = fid["sim_per_repeat"]["mean_latency_ms"]
    assert fid["metrics"]["mean_latency_ms"]["sim"] == pytest.approx(sum(per) / 2)
    assert len(fid["alone_ratio_per_repeat"]) == 2 and all(0 < x < float("inf") for x in fid["alone_ratio_per_repeat"])
