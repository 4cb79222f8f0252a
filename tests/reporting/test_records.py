"""Columnar records (issue 12): streamed and in-memory records agree exactly, memory holds only what is in flight,
the batch table's running count is the sum it stands for, and the progress bar is for terminals only."""

from __future__ import annotations

import fcntl
import gc
import json
import math
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dvasim
from dvasim.cli import main
from dvasim.core.pipeline import Pipeline
from dvasim.core.query import Query
from dvasim.engines.sim.engine import simulate
from dvasim.model.table import LatencyTable, default_table_path
from dvasim.policies import make_policy
from dvasim.reporting.records import RecordStore, read_records, records_frame, summarize_arrays
from dvasim.workload import poisson_arrivals

ROOT = Path(__file__).resolve().parents[2]
CFG = {  # (BERT's length clusters: short queries leave before long ones that came earlier)
    "model": {"name": "bert_base", "device": "titanrtx", "stages": 2},
    "policy": {"name": "dvabatch", "max_batch_size": 32},
    "workload": {"kind": "poisson", "rate_qps": 300.0, "n_queries": 3000, "seed": 4, "seq_len_dist": "glue:RTE"},
    "engine": {"progress": False},
}


def test_streamed_records_equal_the_in_memory_ones_and_give_the_same_summary(tmp_path, monkeypatch):
    mem = dvasim.run(CFG)
    path = tmp_path / "q.parquet"
    monkeypatch.setattr(RecordStore, "CHUNK_ROWS", 256)  # the file is written in many pieces, in exit order
    streamed = dvasim.run(CFG, records=path)
    assert streamed.frame is None  # nothing held in memory until asked
    raw = pd.read_parquet(path)
    assert not raw["query_id"].is_monotonic_increasing  # exit order, not id order: really streamed
    pd.testing.assert_frame_equal(streamed.queries, mem.queries)
    assert streamed.summary == {**mem.summary, "sim_wall_s": streamed.summary["sim_wall_s"],
                                "sim_queries_per_wall_s": streamed.summary["sim_queries_per_wall_s"]}


def test_summary_statistics_are_numpy_exact_over_finished_queries():
    df = dvasim.run(CFG).queries
    done = df[df["finish_ms"].notna()]
    lat = (done["finish_ms"] - done["arrival_ms"]).to_numpy()
    s = summarize_arrays(df["arrival_ms"].to_numpy(), df["start_ms"].to_numpy(), df["finish_ms"].to_numpy(),
                         df["exit_batch_size"].to_numpy(), 50.0)
    assert s["mean_latency_ms"] == float(lat.mean())
    assert s["p99_latency_ms"] == float(np.percentile(lat, 99))
    assert s["qos_violation_rate"] == pytest.approx((lat > 50.0).mean())


def test_unfinished_queries_keep_their_records_in_both_stores(tmp_path):
    # a run cut short: queries inside the pipeline and queries that never arrived are all in the records
    table = LatencyTable.load(default_table_path())
    arrivals = poisson_arrivals(300.0, 500, seed=2)
    lens = [1] * 500
    frames = []
    for path in (None, tmp_path / "cut.parquet"):
        pipe = Pipeline(table, make_policy("delaybatch", {"max_batch_size": 16}), 2)
        store = RecordStore(500, table.n_stages, path=path, chunk_rows=64, arrivals=arrivals)
        res = simulate(pipe, arrivals, lens, until_ms=float(arrivals[250]), records=store, keep_queries=False)
        assert res.queries is None
        frames.append(store.frame())
    a, b = frames
    pd.testing.assert_frame_equal(a, b)
    assert list(a["query_id"]) == list(range(500))
    assert a["finish_ms"].notna().sum() < 250 < a["seen_ms"].notna().sum() + 1
    assert a["seen_ms"].iloc[300:].isna().all() and (a["arrival_ms"] == arrivals).all()


def test_records_frame_of_query_objects_equals_the_store():
    table = LatencyTable.load(default_table_path())
    arrivals = poisson_arrivals(200.0, 400, seed=5)
    pipe = Pipeline(table, make_policy("dvabatch", {"max_batch_size": 16}), 2)
    res = simulate(pipe, arrivals, [1] * 400, keep_queries=True)
    pd.testing.assert_frame_equal(records_frame(res.queries, table.n_stages), res.records.frame())


def test_no_query_object_outlives_its_exit():
    """Memory is bounded by what is in flight: after a run, no Query object is left (none kept)."""
    table = LatencyTable.load(default_table_path())
    arrivals = poisson_arrivals(250.0, 5000, seed=1)
    pipe = Pipeline(table, make_policy("dvabatch", {"max_batch_size": 16}), 2)
    peak = [0]
    bt = pipe.table
    pipe.on_begin.append(lambda ex: peak.__setitem__(0, max(peak[0], bt.n_queries())))
    res = simulate(pipe, arrivals, [1] * 5000, keep_queries=False)
    assert res.records.n_rows == 5000 and res.stuck is None
    del res, pipe
    gc.collect()
    assert sum(type(o) is Query for o in gc.get_objects()) == 0
    assert peak[0] > 1  # several queries were in flight at once


@pytest.mark.parametrize("policy", ["zerobatch", "dvabatch", "dvabatch-split"])
def test_the_tables_running_count_of_active_queries_is_the_sum_it_stands_for(policy):
    table = LatencyTable.load(default_table_path())
    arrivals = poisson_arrivals(300.0, 1500, seed=8)
    pipe = Pipeline(table, make_policy(policy, {"max_batch_size": 16}), 2)
    seen = []

    def check(_ex):
        t = pipe.table
        seen.append(t.n_queries())
        assert t.n_queries() == sum(b.bs - b.status_map[-1] for b in t.rows.values())

    pipe.on_begin.append(check)
    pipe.on_finish.append(check)
    simulate(pipe, arrivals, [1] * 1500)
    assert max(seen) > 1 and pipe.table.n_queries() == 0


def test_cli_writes_parquet_always_and_csv_for_small_runs_unless_told(tmp_path):
    base = ["run", str(ROOT / "configs/default.toml"), "--set", "workload.n_queries=300", "--set",
            "engine.progress=false", "--no-figure"]
    assert main([*base, "--out", str(tmp_path / "a")]) == 0
    a = tmp_path / "a"
    pq, csv = read_records(a / "queries.parquet"), pd.read_csv(a / "queries.csv")
    assert len(pq) == 300 and list(pq["query_id"]) == list(csv["query_id"])
    np.testing.assert_array_equal(pq["finish_ms"].to_numpy(), csv["finish_ms"].to_numpy())
    assert json.loads((a / "summary.json").read_text())["n_completed"] == 300
    assert main([*base, "--out", str(tmp_path / "b"), "--no-csv"]) == 0
    assert (tmp_path / "b" / "queries.parquet").exists() and not (tmp_path / "b" / "queries.csv").exists()


def _run_dvasim(args, tty: bool) -> str:
    cmd = [sys.executable, "-m", "dvasim", *args]
    env = {**os.environ, "COLUMNS": "120"}
    if not tty:
        return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120).stderr
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # a 120-column terminal
    p = subprocess.Popen(cmd, stdout=slave, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    p.wait(timeout=120)
    os.close(master)
    return out.decode(errors="replace")


def test_progress_bar_shows_rate_and_eta_on_a_terminal_and_stays_quiet_otherwise(tmp_path):
    args = ["run", "configs/default.toml", "--no-figure", "--progress", "--set", "workload.n_queries=20000"]
    quiet = _run_dvasim([*args, "--out", str(tmp_path / "a")], tty=False)
    assert "simulating" not in quiet and "q/s" not in quiet
    shown = _run_dvasim([*args, "--out", str(tmp_path / "b")], tty=True)
    assert "simulating" in shown and "q/s" in shown and "<" in shown  # rate, and the time left (elapsed<left)


def test_nan_free_arrivals_of_closed_loops_are_recorded():
    cfg = {**CFG, "workload": {"kind": "closed", "clients": 4, "n_queries": 200, "seq_len_dist": "glue:RTE"}}
    df = dvasim.run(cfg).queries
    assert df["arrival_ms"].notna().all() and not math.isnan(df["finish_ms"].max())


def test_meta_operation_counts_equal_the_log_and_the_log_is_bounded(monkeypatch):
    from dvasim.core.batch_table import BatchTable, meta_op_counts

    table = LatencyTable.load(default_table_path())
    arrivals = poisson_arrivals(420.0, 3000, seed=3)
    pipe = Pipeline(table, make_policy("dvabatch", {"max_batch_size": 16}), 2)
    simulate(pipe, arrivals, [1] * 3000)
    log = pipe.table.log
    c = meta_op_counts(pipe.table)
    assert c["n_batches"] == sum(op[0] == "new" for op in log) > 0
    assert c["n_stretch"] == sum(op[0] == "stretch" for op in log) > 0
    assert c["n_stretch_started"] == sum(op[0] == "stretch" and op[3][1] for op in log)
    assert c["n_split"] == sum(op[0] == "split" for op in log)
    monkeypatch.setattr(BatchTable, "LOG_LIMIT", 50)
    pipe2 = Pipeline(table, make_policy("dvabatch", {"max_batch_size": 16}), 2)
    simulate(pipe2, arrivals, [1] * 3000)
    assert len(pipe2.table.log) == 50 and meta_op_counts(pipe2.table) == c


# ---- issue 23: a streamed file is readable under its final name only once complete; an interrupted run's records


def _filled_store(path, n=500, chunk_rows=64):
    table = LatencyTable.load(default_table_path())
    arrivals = poisson_arrivals(300.0, n, seed=2)
    pipe = Pipeline(table, make_policy("delaybatch", {"max_batch_size": 16}), 2)
    store = RecordStore(n, table.n_stages, path=path, chunk_rows=chunk_rows, arrivals=arrivals)
    return table, pipe, arrivals, store


def test_a_streamed_file_has_a_temporary_name_until_closed(tmp_path):
    path = tmp_path / "queries.parquet"
    table, pipe, arrivals, store = _filled_store(path)
    seen = []
    pipe.on_finish.append(lambda ex: seen.append(sorted(p.name for p in tmp_path.iterdir())))
    simulate(pipe, arrivals, [1] * 500, records=store, keep_queries=False)
    assert [".queries.parquet.partial"] in seen and ["queries.parquet"] not in seen  # written as the run went
    assert sorted(p.name for p in tmp_path.iterdir()) == ["queries.parquet"]
    assert len(read_records(path)) == 500
    store.close()  # closing again changes nothing
    assert len(read_records(path)) == 500


def test_a_full_disk_while_streaming_is_one_output_error_and_leaves_no_file(tmp_path, monkeypatch):
    import errno

    import pyarrow.parquet as pq

    from dvasim.errors import OutputError

    real = pq.ParquetWriter.write_table
    calls = [0]

    def write_table(self, table, *a, **k):  # the first chunks go to disk, then the disk is full
        calls[0] += 1
        if calls[0] > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, table, *a, **k)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    path = tmp_path / "queries.parquet"
    table, pipe, arrivals, store = _filled_store(path)
    with pytest.raises(OutputError) as e:
        simulate(pipe, arrivals, [1] * 500, records=store, keep_queries=False, fail_soft=True)
    assert str(e.value).startswith(f"{path}: cannot write: no space left on the device")
    assert list(tmp_path.iterdir()) == []  # neither the final name nor the temporary one


def test_left_out_queries_are_neither_recorded_nor_measured(tmp_path):
    for path in (None, tmp_path / "q.parquet"):
        arrival = np.arange(10, dtype=float)
        store = RecordStore(10, 1, path=path, arrivals=arrival)
        for k in range(6):
            q = Query(k, float(k), 1)
            q.stage_start, q.stage_finish = [k + 0.5], [k + (300.0 if k == 5 else 1.0)]
            q.seen = q.admitted = k + 0.5
            q.finish, q.batch_id, q.exit_batch_id, q.exit_batch_size = q.stage_finish[0], k, k, 1
            store.add(q)
        store.leave_out(6, "interrupted by a test")
        s = store.summary(100.0)
        assert s["n_queries"] == 6 and s["n_completed"] == 6 and s["n_not_arrived"] == 4 == store.n_left_out
        assert s["qos_violation_rate"] == pytest.approx(1 / 6)  # query 5 only; 6..9 are no violations
        assert list(store.frame()["query_id"]) == list(range(6))
        assert len(store.latency_sample(100)) == 6


def test_packed_rows_give_back_every_field_exactly():
    """A record packed into a row (dvasim.reporting.rows) reads back field by field: extreme and special values of
    every type (NaN, -0.0, the largest int64 and int16, -1 ids), a query that never reached the front door, and a
    value its column cannot hold refused rather than wrapped."""
    from dvasim.reporting.records import _columns
    from dvasim.reporting.rows import UNFINISHED, Rows, row_format

    n_stages = 3
    assert struct.calcsize(row_format(n_stages)) % 8 == 0  # whole 8-byte slots: every 8-byte field aligned
    q = Query(2**63 - 1, -0.0, 7)
    q.seen, q.admitted, q.finish = 1e-300, math.inf, 5.5
    q.stage_start, q.stage_finish = [0.5, math.nan, 2.5], [1.5, 2.0, 5.5]
    q.batch_id, q.exit_batch_id, q.exit_batch_size, q.priority, q.replica = -1, 2**40, 64, 32767, -32768
    rows = Rows(n_stages)
    rows.add([q])
    rows.add_blank(9, 3.25, 128)
    cols = _columns(rows)
    assert len(rows) == 2 and {len(v) for v in cols.values()} == {2}
    assert cols["query_id"].tolist() == [2**63 - 1, 9] and cols["seq_len"].tolist() == [7, 128]
    assert math.copysign(1.0, cols["arrival_ms"][0]) == -1.0 and cols["arrival_ms"][1] == 3.25
    assert cols["seen_ms"][0] == 1e-300 and cols["admitted_ms"][0] == math.inf and cols["start_ms"][0] == 0.5
    assert [cols[f"s{s}_start_ms"][0] for s in (0, 2)] == [0.5, 2.5] and math.isnan(cols["s1_start_ms"][0])
    assert [cols[f"s{s}_finish_ms"][0] for s in range(3)] == [1.5, 2.0, 5.5]
    assert cols["batch_id"].tolist() == [-1, -1] and cols["exit_batch_id"].tolist() == [2**40, -1]
    assert cols["exit_batch_size"].tolist() == [64, 0]
    assert cols["priority"].tolist() == [32767, 0] and cols["replica"].tolist() == [-32768, 0]
    assert cols["status"].tolist() == [0, UNFINISHED] and all(math.isnan(cols[c][1]) for c in ("seen_ms", "finish_ms"))
    assert (cols["priority"].dtype, cols["status"].dtype, cols["query_id"].dtype) == (np.int16, np.int8, np.int64)
    q.priority = 32768
    with pytest.raises(struct.error):
        rows.add([q])
    assert len(rows) == 2  # nothing half-written
