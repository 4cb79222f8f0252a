"""perf_analyzer tables out (issue 24, item 5): dvasim writes the CSV that ``perf_analyzer -f`` writes.

The truth is perf_analyzer's own source and documentation, repository ``triton-inference-server/perf_analyzer`` at
commit ``263c5f6e0c7a6c15472a54409174981f67930cfe``:

* ``docs/measurements_metrics.md`` ("Visualizing Latency vs. Throughput"): the concurrency-mode header and an
  example file (``tests/data/perf_analyzer/docs_example_concurrency.csv``, copied by hand), "The rows in the CSV
  file are sorted in an increasing order of throughput (Inferences/Second)";
* ``src/report_writer.cc`` (``ReportWriter::GenerateReport``): ``Request Rate`` first in request-rate mode, the
  server columns only with server statistics, ``Avg latency,request/response,response wait`` with
  ``--verbose-csv``, every latency column ``ns / 1000`` (microseconds, truncated);
* ``src/inference_profiler.cc`` (``SummarizeLatency``): percentiles 50, 90, 95, 99, each the sorted latencies'
  element ``int(p / 100.0 * (n - 1) + 0.5)``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dvasim
from dvasim.errors import ConfigError
from dvasim.reporting.perf_analyzer import (
    header,
    overlay_figure,
    perf_analyzer_csv,
    perf_analyzer_table,
    point_columns,
    read_perf_analyzer_csv,
    run_columns,
    write_perf_analyzer_csv,
)
from dvasim.server.stacks import STACKS

ROOT = Path(__file__).resolve().parents[2]
DOC_EXAMPLE = ROOT / "tests/data/perf_analyzer/docs_example_concurrency.csv"
VGG16 = ROOT / "traces/default/vgg16_titanx_4stages.csv"

# docs/measurements_metrics.md @263c5f6e, the example's first line (concurrency mode, server statistics on)
DOCUMENTED_HEADER = ("Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,"
                     "Server Compute Input,Server Compute Infer,Server Compute Output,Client Recv,p50 latency,"
                     "p90 latency,p95 latency,p99 latency")
SERVER = ("Network+Server Send/Recv", "Server Queue", "Server Compute Input", "Server Compute Infer",
          "Server Compute Output")


def test_the_header_is_perf_analyzers_documented_one():
    assert ",".join(header("concurrency")) == DOCUMENTED_HEADER
    assert DOC_EXAMPLE.read_text().splitlines()[0] == DOCUMENTED_HEADER
    # report_writer.cc: "Request Rate," instead of "Concurrency," and nothing else changes
    assert header("request-rate") == ["Request Rate", *DOCUMENTED_HEADER.split(",")[1:]]
    # without server statistics: Client Send straight to Client Recv
    assert header("concurrency", server_stats=False) == ["Concurrency", "Inferences/Second", "Client Send",
                                                         "Client Recv", "p50 latency", "p90 latency",
                                                         "p95 latency", "p99 latency"]
    # --verbose-csv (no --percentile, no --collect-metrics): three more at the end
    assert header("concurrency", verbose=True)[-4:] == ["p99 latency", "Avg latency", "request/response",
                                                         "response wait"]
    with pytest.raises(ConfigError, match="perf_analyzer.mode"):
        header("qps")


def _doc_points():
    doc = pd.read_csv(DOC_EXAMPLE)
    return [(int(r["Concurrency"]), {c: r[c] for c in doc.columns[1:]}) for _, r in doc.iterrows()]


def test_rows_are_sorted_by_throughput_and_the_file_is_byte_for_byte_perf_analyzers():
    """The documented example's rows fed in load order come out in its order (1, 3, 4, 2: by Inferences/Second,
    the tie 84.2 by the load) and print exactly as perf_analyzer printed them."""
    points = sorted(_doc_points(), key=lambda p: p[0])
    for p in points:
        p[1]["Inferences/Second"] = float(p[1]["Inferences/Second"])
        for c in DOCUMENTED_HEADER.split(",")[2:]:
            p[1][c] = int(p[1][c])
    table = perf_analyzer_table(points, "concurrency")
    assert table["Concurrency"].tolist() == [1, 3, 4, 2]
    assert table["Inferences/Second"].is_monotonic_increasing
    assert perf_analyzer_csv(table) == DOC_EXAMPLE.read_text()


def test_the_reader_reads_the_documented_file_and_refuses_others(tmp_path):
    doc = read_perf_analyzer_csv(DOC_EXAMPLE)
    assert doc.attrs["mode"] == "concurrency" and len(doc) == 4
    assert doc["p99 latency"].tolist() == [21018, 51701, 64886, 34766]
    bad = tmp_path / "results.csv"
    bad.write_text("policy,rate\nzerobatch,10\n")
    with pytest.raises(ConfigError, match="first column must be 'Concurrency' or 'Request Rate', got 'policy'"):
        read_perf_analyzer_csv(bad)
    bad.write_text("Request Rate,Inferences/Second\n10,9.9\n")
    with pytest.raises(ConfigError, match="no 'p50 latency' column"):
        read_perf_analyzer_csv(bad)
    with pytest.raises(ConfigError, match="--overlay: cannot read"):
        read_perf_analyzer_csv(tmp_path / "absent.csv", field="--overlay")


def _batch1_total_us() -> int:
    """VGG16's batch-1 time through its four stages, from the table file itself, in whole microseconds."""
    t = pd.read_csv(VGG16, comment="#")
    return int(round(t.loc[t["batch_size"] == 1, "latency_ms"].sum() * 1e6)) // 1000


def test_units_a_serial_run_at_a_low_rate_is_the_batch1_time_in_microseconds():
    """One query every 200 ms through VGG16's 6.28 ms: no query waits, so every latency percentile, the average
    and Server Compute Infer are the table's batch-1 time in us; queue and the stack's costs are 0 (the table's
    stack, as-profiled, adds none), and the throughput is the summary's."""
    cfg = {"model": {"table": str(VGG16)}, "policy": {"name": "serial"},
           "workload": {"kind": "uniform", "rate_qps": 5, "n_queries": 40}}
    res = dvasim.run(cfg)
    cols = run_columns(res, cfg)
    us = _batch1_total_us()
    assert us == 6277
    assert [cols[f"p{p} latency"] for p in (50, 90, 95, 99)] == [us] * 4
    assert cols["Avg latency"] == cols["response wait"] == cols["Server Compute Infer"] == us
    assert cols["Server Queue"] == cols["Server Compute Input"] == cols["Server Compute Output"] == 0
    assert cols["Client Send"] == cols["Client Recv"] == cols["request/response"] == 0
    assert cols["Inferences/Second"] == res.summary["throughput_qps"]


def _records(latency_ms) -> pd.DataFrame:
    n = len(latency_ms)
    arrival = np.arange(n) * 1000.0
    return pd.DataFrame({"query_id": np.arange(n), "arrival_ms": arrival, "seen_ms": arrival, "start_ms": arrival,
                         "finish_ms": arrival + np.asarray(latency_ms, float), "seq_len": 1,
                         "batch_id": np.arange(n), "exit_batch_size": 1})


def test_percentiles_follow_perf_analyzers_rounding_not_numpys_interpolation():
    """Latencies 1..100 ms: perf_analyzer's p50 is element int(0.5 * 99 + 0.5) = 50 of the sorted list, 51 ms
    (numpy's linear percentile would say 50.5 ms); p90 element 89 (90 ms), p95 element 94, p99 element 98."""
    lat = np.random.default_rng(0).permutation(np.arange(1, 101)).astype(float)
    cols = point_columns(_records(lat), {"throughput_qps": 1.0})
    assert [cols[f"p{p} latency"] for p in (50, 90, 95, 99)] == [51000, 90000, 95000, 99000]
    assert np.percentile(lat, 50) == 50.5
    assert cols["Avg latency"] == 50500  # the integer mean of 1..100 ms in ns, / 1000
    assert cols["Server Compute Infer"] == 50500 and cols["Network+Server Send/Recv"] == 0
    assert point_columns(_records([np.nan]), {"throughput_qps": 0.0}) is None  # no valid request: no row


@pytest.mark.parametrize("admission_ms", [0.0, 1.0])
def test_server_columns_are_the_stacks_costs_and_add_up_to_the_latency(admission_ms):
    """ResNet152 on the Titan RTX tables (served by triton-tensorrt), three clients in a closed loop, ZeroBatch:
    every batch has the 3 queries. By the stack's published numbers (dvasim stacks triton-tensorrt) and the
    formulas of dvasim/server/costs.py's docstring: Compute Input = gathering + host-to-device copy of three
    224x224 float32 images, Compute Output = sync + three 1000-float outputs back; Network+Server Send/Recv =
    the admission delay + the per-batch request handling; the five server columns add up to the average latency
    (each truncated to whole us: within 5 us)."""
    cfg = {"model": {"name": "resnet152", "device": "titanrtx", "stages": 2},
           "policy": {"name": "zerobatch", "max_batch_size": 8},
           "workload": {"kind": "closed", "clients": 3, "n_queries": 60},
           "engine": {"admission_delay_ms": admission_ms}}
    res = dvasim.run(cfg)
    assert res.summary["stack"] == "triton-tensorrt-21.10" and set(res.queries["exit_batch_size"]) == {3}
    st, rows = STACKS["triton-tensorrt"], 3
    in_bytes = rows * 224 * 224 * 3 * 4  # three 224x224 RGB float32 images
    copy_in_ms = rows * st.gather_per_row_ms + in_bytes / (st.gather_gbps * 1e6) + in_bytes / (st.h2d_gbps * 1e6)
    out_ms = st.sync_ms + rows * 1000 * 4 / (st.d2h_gbps * 1e6)
    cols = run_columns(res, cfg)
    assert cols["Server Compute Input"] == int(round(copy_in_ms * 1e6)) // 1000 == 523
    assert cols["Server Compute Output"] == int(round(out_ms * 1e6)) // 1000 == 39
    assert cols["Network+Server Send/Recv"] == int(round((admission_ms + st.request_ms) * 1e6)) // 1000
    q = res.queries
    # Server Queue runs from the front door (seen_ms), so the admission delay is not in it (the records' queue_ms,
    # from the arrival, holds it)
    assert cols["Server Queue"] == int(round((q["start_ms"] - q["seen_ms"]).mean() * 1e6)) // 1000
    assert int(round(q["queue_ms"].mean() * 1e6)) // 1000 == cols["Server Queue"] + int(admission_ms * 1000)
    assert 0 <= cols["Avg latency"] - sum(cols[c] for c in SERVER) <= 5
    assert abs(cols["Avg latency"] - res.summary["mean_latency_ms"] * 1000) <= 1


def test_a_table_round_trips_through_the_file(tmp_path):
    points = [(r, {"Inferences/Second": r * 0.97 + 1 / 3, "Client Send": 0, **{c: int(r * 10 + i) for i, c in
                                                                             enumerate(SERVER)},
                   "Client Recv": 0, **{f"p{p} latency": int(r * 100 + p) for p in (50, 90, 95, 99)},
                   "Avg latency": int(r * 90), "request/response": 0, "response wait": int(r * 90)})
              for r in (12.5, 100.0, 50.0)]
    table = perf_analyzer_table(points, "request-rate", verbose=True)
    path = write_perf_analyzer_csv(table, tmp_path / "perf.csv")
    back = read_perf_analyzer_csv(path)
    assert back.attrs["mode"] == "request-rate" and list(back.columns) == list(table.columns)
    assert back["Request Rate"].tolist() == [12.5, 50.0, 100.0]
    pd.testing.assert_frame_equal(back.drop(columns="Inferences/Second"), table.drop(columns="Inferences/Second"),
                                  check_dtype=False)
    np.testing.assert_allclose(back["Inferences/Second"], table["Inferences/Second"], rtol=5e-6)  # 6 digits
    assert path.read_text().splitlines()[1].startswith("12.5,12.4583,")


def test_overlay_figure_draws_both_tables(tmp_path, drawn):
    measured = read_perf_analyzer_csv(DOC_EXAMPLE)
    sim = measured.copy()
    sim["p50 latency"] = sim["p50 latency"] * 0.9
    out = overlay_figure({"simulated": sim, "measured": measured}, tmp_path / "overlay.png")
    assert out.stat().st_size > 10_000
    # one panel per latency, each table a line through its four points in load order (1, 2, 3, 4), in ms
    (fig,) = drawn
    by_load = measured.sort_values("Concurrency")
    for ax, col in zip(fig.axes, ("p50 latency", "p99 latency")):
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["simulated", "measured"]
        lines = dict(zip(("simulated", "measured"), [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 4]))
        assert len(lines) == 2
        np.testing.assert_allclose(lines["measured"].get_xdata(), by_load["Inferences/Second"])
        np.testing.assert_allclose(lines["measured"].get_ydata(), by_load[col] / 1000.0)
        factor = 0.9 if col == "p50 latency" else 1.0
        np.testing.assert_allclose(lines["simulated"].get_ydata(), by_load[col] * factor / 1000.0)


def test_queries_that_wait_are_in_server_queue_and_batches_of_any_size_pay_their_own_costs():
    """DelayBatch under Poisson load on triton-tensorrt: batches of many sizes, queries that wait for the window.
    Server Queue is the mean front door -> first launch; Compute Input the mean, over queries, of their launch's
    gathering and copy (its rows counted here from batch_id and start_ms); the server columns add up."""
    cfg = {"model": {"name": "resnet152", "device": "titanrtx", "stages": 2},
           "policy": {"name": "delaybatch", "max_batch_size": 8, "max_queue_delay_ms": 4.0},
           "workload": {"kind": "poisson", "rate_qps": 250, "n_queries": 400, "seed": 3}}
    res = dvasim.run(cfg)
    q = res.queries
    assert q["exit_batch_size"].nunique() >= 3
    cols = run_columns(res, cfg)
    queue_us = (q["start_ms"] - q["seen_ms"]).mean() * 1000
    assert cols["Server Queue"] > 500 and abs(cols["Server Queue"] - queue_us) <= 1
    st = STACKS["triton-tensorrt"]
    rows = q.groupby(["batch_id", "start_ms"])["query_id"].transform("count")
    image = 224 * 224 * 3 * 4
    per_query = rows * (st.gather_per_row_ms + image / (st.gather_gbps * 1e6) + image / (st.h2d_gbps * 1e6))
    assert abs(cols["Server Compute Input"] - per_query.mean() * 1000) <= 1
    assert 0 <= cols["Avg latency"] - sum(cols[c] for c in SERVER) <= 5


@pytest.mark.parametrize("end", ["", ","])
def test_the_reader_takes_verbose_and_gpu_metric_columns(tmp_path, end):
    """--verbose-csv with --collect-metrics: four more columns of 'uuid:value;' pairs (report_writer.cc's
    WriteGpuMetrics); the documentation's example ends its lines with a comma too."""
    cols = [*header("concurrency", verbose=True), "Avg GPU Utilization", "Avg GPU Power Usage",
            "Max GPU Memory Usage", "Total GPU Memory"]
    line = "1,46.8,2,187,18,34,65,16,1,4600,4700,4800,4900,4500,3,4400," + ",".join(
        f"gpu_uuid_0:{v};gpu_uuid_1:{v};" for v in (0.5, 55.3, 10000, 50000)) + end
    path = tmp_path / "pa.csv"
    path.write_text(",".join(cols) + "\n" + line + "\n")
    df = read_perf_analyzer_csv(path)
    assert list(df.columns) == cols
    assert df.loc[0, "Concurrency"] == 1 and df.loc[0, "p99 latency"] == 4900
    assert df.loc[0, "Total GPU Memory"] == "gpu_uuid_0:50000;gpu_uuid_1:50000;"


def test_only_served_requests_count():
    """perf_analyzer's latencies are over valid requests: a record whose status is not "ok" is left out."""
    rec = _records([10.0, 20.0, 30.0, 1000.0])
    rec["status"] = ["ok", "ok", "ok", "timed_out"]
    cols = point_columns(rec, {"throughput_qps": 3.0})
    assert cols["p99 latency"] == 30000 and cols["Avg latency"] == 20000
