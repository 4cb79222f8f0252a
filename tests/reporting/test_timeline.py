"""Executor timelines (issue 13): every stage execution recorded, agreeing with the query records, exported as a
valid Chrome/Perfetto trace (written whole, issue 23) and drawn as a Gantt chart titled with the run; bounded."""

from __future__ import annotations

import json

import numpy as np

from dvasim.core.pipeline import Pipeline
from dvasim.engines.sim.engine import simulate
from dvasim.model.table import LatencyTable, default_table_path
from dvasim.policies import make_policy
from dvasim.reporting.records import records_frame
from dvasim.reporting.timeline import TimelineRecorder, chrome_trace, gantt_figure
from dvasim.workload import poisson_arrivals


def _run(n=600, instances=2, max_rows=200_000):
    table = LatencyTable.load(default_table_path())
    pipe = Pipeline(table, make_policy("dvabatch", {"max_batch_size": 16}), 2, instances=instances)
    rec = TimelineRecorder(pipe, max_rows=max_rows)
    res = simulate(pipe, poisson_arrivals(320.0, n, seed=3), [1] * n)
    return table, rec, records_frame(res.queries, table.n_stages)


def test_the_timeline_holds_every_execution_and_agrees_with_the_query_records():
    table, rec, q = _run()
    tl = rec.frame()
    assert len(tl) > 0 and rec.dropped == 0
    assert (tl["end_ms"] > tl["start_ms"]).all() and set(tl["lane"]) == {0, 1}
    # the queries carried through each stage: the executions' sizes add up to every query once per stage
    for s in range(table.n_stages):
        assert tl.loc[tl["stage"] == s, "batch_size"].sum() == len(q)
        # every query's stage start is the start of an execution of that stage
        starts = set(tl.loc[tl["stage"] == s, "start_ms"])
        assert set(q[f"s{s}_start_ms"]) <= starts
    # one executor runs one execution at a time
    for (_lane, _stage), g in tl.groupby(["lane", "stage"]):
        g = g.sort_values("start_ms")
        assert (g["start_ms"].to_numpy()[1:] >= g["end_ms"].to_numpy()[:-1] - 1e-9).all()


def test_chrome_trace_is_valid_trace_event_json(tmp_path):
    _, rec, _ = _run(n=200)
    tl = rec.frame()
    path = chrome_trace(tl, tmp_path / "t.json")
    data = json.loads(path.read_text())
    xs = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == len(tl)
    assert {(e["pid"], e["tid"]) for e in xs} == set(zip(tl["lane"], tl["stage"]))
    np.testing.assert_allclose(sorted(e["ts"] for e in xs), sorted(tl["start_ms"] * 1000.0))
    np.testing.assert_allclose(sum(e["dur"] for e in xs), ((tl["end_ms"] - tl["start_ms"]) * 1000.0).sum())
    names = [e for e in data["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"]
    assert len(names) == 2 * 4
    assert gantt_figure(tl, tmp_path / "g.png").stat().st_size > 5_000


def test_a_trace_that_cannot_be_written_leaves_nothing_and_says_so(tmp_path, monkeypatch):
    import errno
    from pathlib import Path

    import pytest

    from dvasim.errors import OutputError

    _, rec, _ = _run(n=50)
    real = Path.write_text

    def full(self, *a, **k):
        real(self, "{half", encoding="utf-8")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OutputError, match="t.json: cannot write: no space left"):
        chrome_trace(rec.frame(), tmp_path / "t.json")
    assert list(tmp_path.iterdir()) == []


def test_the_recorder_keeps_at_most_max_rows():
    _, rec, _ = _run(n=400, max_rows=50)
    assert len(rec.frame()) == 50 and rec.dropped > 0


def test_dvasim_run_timeline_writes_the_trace_and_the_gantt(tmp_path):
    from pathlib import Path

    from dvasim.cli import main

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "o"
    assert main(["run", str(root / "configs/default.toml"), "--out", str(out), "--timeline", "100",
                 "--set", "workload.n_queries=300", "--set", "engine.progress=false"]) == 0
    data = json.loads((out / "timeline.json").read_text())
    assert sum(e["ph"] == "X" for e in data["traceEvents"]) == 100
    assert (out / "timeline.png").stat().st_size > 5_000
    assert not list(out.glob(".*partial*"))
