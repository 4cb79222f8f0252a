"""Stopping a run (issue 23): the engine asks its ``stop`` request every ``STOP_EVERY`` events, Ctrl-C in Python
stops it too, and either way the result keeps what was collected, leaves out the queries that had not arrived
(not recorded, not measured, not counted as QoS violations), and closes a streamed file readable. A request that
never fires changes nothing."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import dvasim
from dvasim.core.pipeline import Pipeline
from dvasim.engines.sim.engine import simulate
from dvasim.errors import IncompleteRunWarning
from dvasim.model.table import LatencyTable, default_table_path
from dvasim.policies import make_policy
from dvasim.reporting.records import RecordStore, read_records
from dvasim.workload import poisson_arrivals

N = 4000
CFG = {
    "model": {"table": "traces/default/vgg16_titanx_4stages.csv"},
    "policy": {"name": "delaybatch", "max_batch_size": 32, "max_queue_delay_ms": 10.0},
    "workload": {"kind": "poisson", "rate_qps": 150.0, "n_queries": N, "seed": 1},
    "qos": {"target_ms": 200.0},
    "engine": {"progress": False},
}


class StopAfter:
    """A stop request that fires (says ``reason``) from its ``k``-th look on; counts its looks."""

    def __init__(self, k: int, reason: str = "a test's request"):
        self.k, self.reason, self.looks = k, reason, 0

    def __call__(self):
        self.looks += 1
        return self.reason if self.looks >= self.k else None


def _pipeline(policy="delaybatch"):
    table = LatencyTable.load(default_table_path())
    return table, Pipeline(table, make_policy(policy, {"max_batch_size": 16}), 2)


def test_the_stop_request_is_asked_every_few_events_and_stops_the_run_where_it_is():
    table, pipe = _pipeline()
    arrivals = poisson_arrivals(200.0, N, seed=3)
    full = simulate(*_pipeline()[1:], arrivals, [1] * N, keep_queries=False)
    stop = StopAfter(4)
    res = simulate(pipe, arrivals, [1] * N, keep_queries=False, stop=stop)
    assert stop.looks == 4  # once before the first event, then every STOP_EVERY events until it fired
    assert res.interrupted == "a test's request"
    assert res.stuck.startswith(f"interrupted by a test's request at simulated time {res.sim_end_ms:.3f} ms")
    assert 0 < res.sim_end_ms < full.sim_end_ms
    # the queries that had not arrived by then are left out: not recorded, and said so
    arrived = int(np.searchsorted(arrivals, res.sim_end_ms, side="right"))
    assert res.n_not_arrived == N - arrived > 0
    df = res.records.frame()
    assert list(df["query_id"]) == list(range(arrived))
    assert res.records.n_rows == arrived and f"{N - arrived:,} of {N:,} queries had not arrived" in res.stuck
    # what finished before the stop finished exactly as in the full run
    done = df["finish_ms"].notna().to_numpy()
    np.testing.assert_array_equal(df["finish_ms"].to_numpy()[done],
                                  full.records.frame()["finish_ms"].to_numpy()[:arrived][done])


def test_a_stop_request_that_never_fires_changes_nothing():
    arrivals = poisson_arrivals(300.0, N, seed=5)
    plain = simulate(*_pipeline("dvabatch")[1:], arrivals, [1] * N, keep_queries=False)
    stop = StopAfter(math.inf)
    asked = simulate(*_pipeline("dvabatch")[1:], arrivals, [1] * N, keep_queries=False, stop=stop)
    assert asked.interrupted is None and asked.stuck is None and asked.n_not_arrived == 0
    assert stop.looks > 1
    pd.testing.assert_frame_equal(plain.records.frame(), asked.records.frame())


def test_ctrl_c_in_python_stops_the_run_and_keeps_what_was_collected():
    table, pipe = _pipeline()
    arrivals = poisson_arrivals(200.0, N, seed=3)
    begun = [0]

    def ctrl_c(_ex):
        begun[0] += 1
        if begun[0] == 300:
            raise KeyboardInterrupt

    pipe.on_begin.append(ctrl_c)
    res = simulate(pipe, arrivals, [1] * N, keep_queries=False)
    assert res.interrupted == "Ctrl-C" and res.stuck.startswith("interrupted by Ctrl-C at simulated time")
    assert 0 < res.records.n_rows < N and res.n_not_arrived == N - res.records.n_rows


def test_an_interrupted_api_run_measures_only_what_had_arrived(tmp_path):
    full = dvasim.run(CFG)
    path = tmp_path / "queries.parquet"
    with pytest.warns(IncompleteRunWarning, match="interrupted by SIGTERM"):
        r = dvasim.run(CFG, records=path, stop=StopAfter(3, "SIGTERM"))
    s = r.summary
    assert r.interrupted and s["interrupted"] is True and s["interrupted_reason"] == r.stuck
    assert r.stuck.startswith("interrupted by SIGTERM at simulated time")
    m = s["n_queries"]
    assert s["n_not_arrived"] == N - m > 0 and len(r.queries) == m
    # the queries that had not arrived are no QoS violations: the rate is that of the arrived ones alone
    unfinished = m - s["n_completed"]
    assert unfinished < 10 and s["qos_violation_rate"] <= unfinished / m
    assert full.summary["qos_violation_rate"] == 0.0
    # the file is closed (readable), under its final name only, and its footer says what was left out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["queries.parquet"]
    meta = pq.read_metadata(path).metadata
    assert meta[b"dvasim.n_not_arrived"] == str(N - m).encode() and b"SIGTERM" in meta[b"dvasim.interrupted"]
    assert "interrupted" not in full.summary and not full.interrupted


def test_a_run_stopped_before_its_first_event_writes_an_empty_readable_file(tmp_path):
    path = tmp_path / "queries.parquet"
    with pytest.warns(IncompleteRunWarning, match="interrupted by SIGINT"):
        r = dvasim.run(CFG, records=path, stop=lambda: "SIGINT")
    df = read_records(path)
    assert len(df) == 0 and list(df.columns) == list(dvasim.run(
        {**CFG, "workload": {**CFG["workload"], "n_queries": 5}}).queries.columns)
    assert r.summary["n_queries"] == 0 and r.summary["n_not_arrived"] == N


def test_a_failed_run_leaves_no_partial_file(tmp_path):
    """An error that is not soft (``fail_soft`` off) discards the streamed records: no file, no temporary one."""
    table, pipe = _pipeline()
    arrivals = poisson_arrivals(200.0, N, seed=3)
    store = RecordStore(N, table.n_stages, path=tmp_path / "q.parquet", chunk_rows=64, arrivals=arrivals)

    def boom(ex):
        if pipe.n_exited > 500:
            raise RuntimeError("policy bug")

    pipe.on_begin.append(boom)
    with pytest.raises(RuntimeError, match="policy bug"):
        simulate(pipe, arrivals, [1] * N, records=store, keep_queries=False)
    assert list(tmp_path.iterdir()) == []
