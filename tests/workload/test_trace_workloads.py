"""Tests of the gamma and trace workloads (dvasim.workload.arrivals.gamma_arrivals, dvasim.workload.traces)."""

from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import dvasim
from dvasim.errors import ConfigError, WorkloadError
from dvasim.model.table import traces_dir
from dvasim.workload import (
    gamma_arrivals,
    load_trace,
    poisson_arrivals,
    shipped_traces,
    trace_arrivals,
    workload_from_config,
)


# ---------------------------------------------------------------- gamma arrivals
@pytest.mark.parametrize("cv", [0.5, 1.0, 2.0, 3.0])
def test_gamma_mean_and_cv(cv):
    rate, n = 200.0, 40_000
    gaps = np.diff(np.r_[0.0, gamma_arrivals(rate, cv, n, seed=5)])
    mean = 1000.0 / rate
    # 4 standard errors: of the mean (sd = mean * cv / sqrt(n)) and of the sample CV (for Gamma, excess kurtosis
    # is 6 cv^2, so sd(s) / sigma ~ sqrt((2 + 6 cv^2) / n) / 2; plus the mean's share)
    assert abs(gaps.mean() - mean) < 4 * mean * cv / math.sqrt(n)
    cv_tol = 4 * (math.sqrt((2 + 6 * cv * cv) / n) / 2 + cv / math.sqrt(n))
    assert abs(gaps.std(ddof=1) / gaps.mean() - cv) < cv_tol * cv
    if cv <= 2.0:  # (at cv = 3, ~4% of the gaps are < 1 ulp of the arrival times and vanish in np.diff)
        shape = 1.0 / cv**2
        assert stats.kstest(gaps, "gamma", args=(shape, 0, mean / shape)).pvalue > 0.01


def test_gamma_cv1_is_exponential():
    rate, n = 150.0, 20_000
    arr = gamma_arrivals(rate, 1.0, n, seed=3)
    gaps = np.diff(np.r_[0.0, arr])
    mean = 1000.0 / rate
    assert stats.kstest(gaps, "expon", args=(0, mean)).pvalue > 0.01
    # numpy draws Gamma(1) as an exponential: the very same arrivals as the Poisson process
    np.testing.assert_array_equal(arr, poisson_arrivals(rate, n, seed=3))
    # and the test has power: a CV of 1.2 with the same mean is rejected as exponential
    bursty = np.diff(np.r_[0.0, gamma_arrivals(rate, 1.2, n, seed=3)])
    assert stats.kstest(bursty, "expon", args=(0, mean)).pvalue < 0.01


def test_gamma_determinism_and_config():
    a = gamma_arrivals(100, 2.0, 500, seed=7, start_ms=10.0)
    np.testing.assert_array_equal(a, gamma_arrivals(100, 2.0, 500, seed=7, start_ms=10.0))
    assert not np.array_equal(a, gamma_arrivals(100, 2.0, 500, seed=8, start_ms=10.0))
    assert a[0] > 10.0 and np.all(np.diff(a) >= 0)
    cfg = {"kind": "gamma", "rate_qps": 100, "cv": 2.0, "n_queries": 500, "seed": 7, "start_ms": 10.0,
           "seq_len_dist": "glue:RTE"}
    w = workload_from_config(cfg, needs_seq_len=True)
    np.testing.assert_array_equal(w.arrivals_ms, a)
    w2 = workload_from_config(dict(cfg), needs_seq_len=True)
    np.testing.assert_array_equal(w.seq_lens, w2.seq_lens)
    assert "gamma" in w.description and "cv 2" in w.description


G = {"kind": "gamma", "rate_qps": 100, "cv": 1.5, "n_queries": 10}


@pytest.mark.parametrize(
    "section, field, needle",
    [
        ({k: v for k, v in G.items() if k != "cv"}, "workload.cv", "missing"),
        ({**G, "cv": 0}, "workload.cv", "in [1e-06, 1000]"),
        ({**G, "cv": -1.0}, "workload.cv", "in [1e-06, 1000]"),
        ({**G, "cv": "high"}, "workload.cv", "must be a number"),
        ({**G, "cv": True}, "workload.cv", "must be a number"),
        ({**G, "cv": float("inf")}, "workload.cv", "in [1e-06, 1000], got inf"),
        ({**G, "rate_qps": 0}, "workload.rate_qps", "[1e-06, 1e+09]"),
        ({**G, "n_queries": 0}, "workload.n_queries", ">= 1"),
        ({**G, "path": "x.csv"}, "workload.path", "unknown key"),
    ],
)
def test_gamma_config_errors(section, field, needle):
    with pytest.raises(ConfigError) as e:
        workload_from_config(section, needs_seq_len=False)
    assert e.value.field == field and needle in e.value.message
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- trace files
# unsorted, with a tie (rows 1 and 3 at 10 ms: the stable sort keeps their order and their lengths)
TIMES = [10.0, 0.0, 10.0, 4.5, 30.25]
LENS = [11, 22, 33, 44, 55]
WANT_T = [0.0, 4.5, 10.0, 10.0, 30.25]
WANT_L = [22, 44, 11, 33, 55]


def _write_all(d) -> dict[str, str]:
    """The same trace in every supported format; name -> file name."""
    recs = [{"timestamp_ms": t, "seq": n, "other": "x"} for t, n in zip(TIMES, LENS)]
    df = pd.DataFrame(recs)
    (d / "t.csv").write_text("# source: a test\n# licence: none\n" + df.to_csv(index=False))
    (d / "t.csv.gz").write_bytes(gzip.compress(df.to_csv(index=False).encode()))
    (d / "t.json").write_text(json.dumps(recs))
    (d / "cols.json").write_text(json.dumps({"timestamp_ms": TIMES, "seq": LENS}))
    (d / "t.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    df.to_parquet(d / "t.parquet")
    return {k: k for k in ("t.csv", "t.csv.gz", "t.json", "cols.json", "t.jsonl", "t.parquet")}


def test_csv_json_parquet_identical(tmp_path):
    files = _write_all(tmp_path)
    got = {}
    for name in files:
        w = workload_from_config({"kind": "trace", "path": name, "length_column": "seq"}, needs_seq_len=True,
                                 base_dir=tmp_path)
        got[name] = w
        assert w.arrivals_ms.tolist() == WANT_T, name
        assert w.seq_lens.tolist() == WANT_L, name
    assert len({tuple(w.arrivals_ms) for w in got.values()}) == 1
    assert load_trace(tmp_path / "t.csv").provenance == {"source": "a test", "licence": "none"}
    # a bare JSON list of numbers (no lengths): the same arrivals
    (tmp_path / "bare.json").write_text(json.dumps(TIMES))
    w = workload_from_config({"kind": "trace", "path": "bare.json", "seq_len": 7}, needs_seq_len=True,
                             base_dir=tmp_path)
    assert w.arrivals_ms.tolist() == WANT_T and w.seq_lens.tolist() == [7] * 5


def test_units_and_datetimes(tmp_path):
    pd.DataFrame({"t": [x / 1000 for x in TIMES]}).to_csv(tmp_path / "s.csv", index=False)
    pd.DataFrame({"t": [x * 1000 for x in TIMES]}).to_csv(tmp_path / "us.csv", index=False)
    stamps = pd.Timestamp("2023-11-16 18:17:03.979960") + pd.to_timedelta(TIMES, unit="ms")
    pd.DataFrame({"TIMESTAMP": [str(s) for s in stamps]}).to_csv(tmp_path / "dt.csv", index=False)
    pd.DataFrame({"when": stamps}).to_parquet(tmp_path / "dt.parquet")
    for name, extra in (("s.csv", {"column": "t", "unit": "s"}), ("us.csv", {"column": "t", "unit": "us"}),
                        ("dt.csv", {}), ("dt.parquet", {"column": "when"})):
        w = workload_from_config({"kind": "trace", "path": str(tmp_path / name), **extra}, needs_seq_len=False)
        np.testing.assert_allclose(w.arrivals_ms, WANT_T, rtol=0, atol=1e-9, err_msg=name)


def test_start_time_scale_and_rate(tmp_path):
    _write_all(tmp_path)
    base = {"kind": "trace", "path": str(tmp_path / "t.csv")}
    w = workload_from_config({**base, "start_ms": 100.0, "time_scale": 2.0}, needs_seq_len=False)
    np.testing.assert_allclose(w.arrivals_ms, [100.0 + 2 * t for t in WANT_T], rtol=1e-15)
    for n in (3, 5, 12):  # fewer, exactly, more (looped) than the trace's 5 requests
        w = workload_from_config({**base, "rate_qps": 40.0, "n_queries": n, "start_ms": 7.0}, needs_seq_len=False)
        a = w.arrivals_ms
        assert a[0] == 7.0 and len(a) == n
        assert (n - 1) * 1000.0 / (a[-1] - a[0]) == pytest.approx(40.0, rel=1e-12)
        # scaling keeps the shape: the gaps are proportional to the unscaled ones
        raw = workload_from_config({**base, "n_queries": n}, needs_seq_len=False).arrivals_ms
        np.testing.assert_allclose(np.diff(a), np.diff(raw) * (a[-1] - a[0]) / raw[-1], rtol=1e-12, atol=1e-12)


def test_n_queries_loops_the_trace(tmp_path):
    _write_all(tmp_path)
    m, n = 5, 13
    w = workload_from_config({"kind": "trace", "path": "t.json", "length_column": "seq", "n_queries": n},
                             needs_seq_len=True, base_dir=tmp_path)
    a = w.arrivals_ms
    period = WANT_T[-1] * m / (m - 1)  # the span plus one mean gap: the trace's mean rate is kept
    want = [WANT_T[i % m] + (i // m) * period for i in range(n)]
    np.testing.assert_allclose(a, want, rtol=1e-15)
    assert w.seq_lens.tolist() == [WANT_L[i % m] for i in range(n)]
    assert np.all(np.diff(a) >= 0)
    # two whole passes: 2 m queries in 2 periods, the trace's mean rate (m - 1) / span
    assert 2 * m * 1000 / (a[2 * m] - a[0]) == pytest.approx((m - 1) * 1000 / WANT_T[-1])
    short = workload_from_config({"kind": "trace", "path": "t.json", "n_queries": 2}, needs_seq_len=False,
                                 base_dir=tmp_path)
    assert short.arrivals_ms.tolist() == WANT_T[:2]


def test_lengths_from_file_or_sampled(tmp_path):
    _write_all(tmp_path)
    base = {"kind": "trace", "path": str(tmp_path / "t.parquet")}
    assert workload_from_config({**base, "length_column": "seq"}, needs_seq_len=False).seq_lens.tolist() == [1] * 5
    w = workload_from_config({**base, "seq_len_dist": "glue:RTE", "seed": 3}, needs_seq_len=True)
    w2 = workload_from_config({**base, "seq_len_dist": "glue:RTE", "seed": 3}, needs_seq_len=True)
    assert w.seq_lens.tolist() == w2.seq_lens.tolist() and w.arrivals_ms.tolist() == WANT_T
    with pytest.raises(ConfigError) as e:
        workload_from_config(base, needs_seq_len=True)
    assert e.value.field == "workload.seq_len" and "length_column" in e.value.message


def test_relative_path_falls_back_to_project_root(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    w = workload_from_config({"kind": "trace", "path": "traces/arrivals/azure_code.csv.gz", "n_queries": 10},
                             needs_seq_len=False, base_dir=tmp_path)
    w2 = workload_from_config({"kind": "trace", "path": "trace:azure_code", "n_queries": 10}, needs_seq_len=False)
    np.testing.assert_array_equal(w.arrivals_ms, w2.arrivals_ms)


def _bad_files(d):
    (d / "ok.csv").write_text("time,len\n0,3\n5,4\n")
    (d / "one.csv").write_text("time\n3\n")
    (d / "same.csv").write_text("time\n3\n3\n3\n")
    (d / "nonnum.csv").write_text("time\n0\nabc\n")
    (d / "hole.csv").write_text("time,len\n0,1\n,2\n")
    (d / "neg.csv").write_text("time\n0\n-5\n")
    (d / "header.csv").write_text("# source: x\ntime\n")
    (d / "empty.csv").write_text("")
    (d / "nodefault.csv").write_text("a,b\n1,2\n")
    (d / "badlen.csv").write_text("time,len\n0,3\n1,2.5\n")
    (d / "zerolen.csv").write_text("time,len\n0,0\n")
    (d / "bad.json").write_text("{not json")
    (d / "nested.json").write_text("[[1, 2], [3]]")
    (d / "bare.json").write_text("[1, 2, 3]")
    (d / "bad.parquet").write_bytes(b"not a parquet file")
    (d / "notgz.csv.gz").write_text("time\n1\n")
    (d / "t.txt").write_text("time\n1\n")
    (d / "dates.csv").write_text("timestamp\n2023-11-16 18:17:03.9799600\nyesterday\n")


T = {"kind": "trace", "path": "ok.csv"}


@pytest.mark.parametrize(
    "section, err, field, needle",
    [
        ({"kind": "trace"}, ConfigError, "workload.path", "missing"),
        ({"kind": "trace", "path": 5}, ConfigError, "workload.path", "must be a file path"),
        ({**T, "path": "nope.csv"}, ConfigError, "workload.path", "not found"),
        ({**T, "path": "trace:nope"}, ConfigError, "workload.path", "azure_code"),
        ({**T, "path": "t.txt"}, ConfigError, "workload.path", "unknown format"),
        ({**T, "column": "when"}, ConfigError, "workload.column", "columns: time, len"),
        ({**T, "column": 3}, ConfigError, "workload.column", "must be a string"),
        ({**T, "length_column": "size"}, ConfigError, "workload.length_column", "columns: time, len"),
        ({**T, "path": "nodefault.csv"}, ConfigError, "workload.column", "columns: a, b"),
        ({**T, "path": "nonnum.csv"}, WorkloadError, "workload.column", "non-numeric value 'abc' in data row 2"),
        ({**T, "path": "hole.csv"}, WorkloadError, "workload.column", "missing value (empty cell) in data row 2"),
        ({**T, "path": "dates.csv"}, WorkloadError, "workload.column", "'yesterday' in data row 2 is not a date-time"),
        ({**T, "path": "neg.csv"}, WorkloadError, "workload.column", "negative time -5 in data row 2"),
        ({**T, "path": "header.csv"}, WorkloadError, "workload.path", "no rows"),
        ({**T, "path": "empty.csv"}, WorkloadError, "workload.path", "no rows"),
        ({**T, "path": "badlen.csv", "length_column": "len"}, WorkloadError, "workload.length_column", "got 2.5 in"),
        ({**T, "path": "zerolen.csv", "length_column": "len"}, WorkloadError, "workload.length_column", ">= 1"),
        ({**T, "path": "bad.json"}, WorkloadError, "workload.path", "neither JSON nor JSON lines"),
        ({**T, "path": "nested.json"}, WorkloadError, "workload.path", "list of numbers or a list of objects"),
        ({**T, "path": "bare.json", "column": "t"}, ConfigError, "workload.column", "no columns"),
        ({**T, "path": "bad.parquet"}, WorkloadError, "workload.path", "Parquet"),
        ({**T, "path": "notgz.csv.gz"}, WorkloadError, "workload.path", "gzip"),
        ({**T, "unit": "min"}, ConfigError, "workload.unit", "'ms', 's', 'us'"),
        ({**T, "rate_qps": 10, "time_scale": 2}, ConfigError, "workload.time_scale", "only one"),
        ({**T, "time_scale": 0}, ConfigError, "workload.time_scale", "in [0.001, 1000]"),
        ({**T, "rate_qps": -1}, ConfigError, "workload.rate_qps", "[1e-06, 1e+09]"),
        ({**T, "n_queries": 0}, ConfigError, "workload.n_queries", ">= 1"),
        ({**T, "start_ms": -1}, ConfigError, "workload.start_ms", "in [0, 1e+12]"),
        ({**T, "cv": 2}, ConfigError, "workload.cv", "unknown key"),
        ({**T, "path": "one.csv", "n_queries": 3}, WorkloadError, "workload.n_queries", "cannot be looped"),
        ({**T, "path": "same.csv", "n_queries": 9}, WorkloadError, "workload.n_queries", "same time"),
        ({**T, "path": "same.csv", "rate_qps": 10}, WorkloadError, "workload.rate_qps", "same time"),
        ({**T, "length_column": "len", "seq_len": 4}, ConfigError, "workload.length_column", "not both"),
    ],
)
def test_trace_bad_input(tmp_path, section, err, field, needle):
    _bad_files(tmp_path)
    with pytest.raises(err) as e:
        workload_from_config(section, needs_seq_len=True, base_dir=tmp_path)
    assert e.value.field == field, str(e.value)
    assert needle in e.value.message, str(e.value)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- shipped traces
SHIPPED = {"azure_code": "CC-BY-4.0", "azure_conv": "CC-BY-4.0", "mooncake_conversation": "Apache-2.0"}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_trace(name):
    assert name in shipped_traces()
    path = traces_dir() / "arrivals" / f"{name}.csv.gz"
    assert path.stat().st_size < 300_000
    t = load_trace(f"trace:{name}", length_column="prompt_tokens")
    b = load_trace(f"trace:{name}", length_column="bert_seq_len")
    assert t.path == path.resolve() and len(t) > 5000
    assert t.times_ms[0] == 0 and np.all(np.diff(t.times_ms) >= 0) and np.all(t.times_ms >= 0)
    assert t.lengths.min() >= 1 and np.array_equal(b.lengths, np.minimum(t.lengths, 512))
    p = t.provenance
    assert SHIPPED[name] in p["licence"] and p["derived_by"] == "traces/derive/derive_arrival_traces.py"
    assert "commit" in p["source"] and int(p["rows"]) == len(t)
    if name.startswith("azure"):
        assert "Azure Public Dataset" in p["licence"]
    assert float(p["span_ms"]) == pytest.approx(t.span_ms, abs=1e-6)
    assert float(p["mean_rate_qps"]) == pytest.approx(t.mean_rate_qps, abs=1e-4)
    arr, lens = trace_arrivals(t)
    np.testing.assert_array_equal(arr, t.times_ms) and np.testing.assert_array_equal(lens, t.lengths)


def test_run_shipped_trace_completes():
    cfg = {
        "model": {"name": "bert_base", "device": "titanrtx", "stages": 2},
        "policy": {"name": "delaybatch", "max_batch_size": 8, "max_queue_delay_ms": 5.0},
        "workload": {"kind": "trace", "path": "trace:azure_conv", "length_column": "bert_seq_len",
                     "n_queries": 300, "rate_qps": 50.0, "start_ms": 2.0},
        "qos": {"target_ms": 200.0},
    }
    r = dvasim.run(cfg)
    assert r.stuck is None and r.summary["n_queries"] == r.summary["n_completed"] == 300
    q = r.queries
    want = load_trace("trace:azure_conv", length_column="bert_seq_len")
    assert q["arrival_ms"].iloc[0] == 2.0
    assert q["seq_len"].tolist() == want.lengths[:300].tolist()


def test_run_trace_config_file_relative_path(tmp_path):
    pd.DataFrame({"time": [0.0, 0.5, 0.7, 2.0] * 1}).to_csv(tmp_path / "arr.csv", index=False)
    (tmp_path / "run.toml").write_text(
        '[model]\nname = "resnet152"\ndevice = "titanrtx"\nstages = 2\n'
        '[policy]\nname = "zerobatch"\n'
        '[workload]\nkind = "trace"\npath = "arr.csv"\nunit = "s"\nn_queries = 10\n'
    )
    r = dvasim.run(tmp_path / "run.toml")
    assert r.summary["n_completed"] == 10
    assert r.queries["arrival_ms"].tolist()[:5] == [0.0, 500.0, 700.0, 2000.0, 2000.0 + 2000.0 / 3]
