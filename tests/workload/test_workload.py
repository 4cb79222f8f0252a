"""Tests of dvasim.workload: arrival processes, length distributions, and [workload] config parsing."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dvasim.errors import ConfigError, WorkloadError
from dvasim.workload import (
    Workload,
    glue_tasks,
    load_lengths,
    poisson_arrivals,
    stepping_arrivals,
    uniform_arrivals,
    workload_from_config,
)

# Mean whitespace-word counts of the GLUE dev sets, from the source data's summary glue_lengths.csv
# (shared/data/glue/glue_lengths.csv, computed independently of traces/derive/derive_glue_lengths.py).
GLUE_MEAN_WORDS = {"RTE": 50.78, "SST-2": 19.55, "CoLA": 7.92, "QNLI": 37.63}
SPECIAL_TOKENS = {"RTE": 3, "SST-2": 2, "CoLA": 2, "QNLI": 3}


# ---------------------------------------------------------------- arrival processes
def test_poisson_mean_and_ks():
    rate, n = 200.0, 20000
    arr = poisson_arrivals(rate, n, seed=7)
    gaps = np.diff(np.r_[0.0, arr])
    mean_gap = 1000.0 / rate
    assert abs(gaps.mean() - mean_gap) < 3 * mean_gap / math.sqrt(n)
    assert stats.kstest(gaps, "expon", args=(0, mean_gap)).pvalue > 0.01
    # and the test has power: the same gaps are rejected against a 10% wrong rate
    assert stats.kstest(gaps, "expon", args=(0, 1.1 * mean_gap)).pvalue < 0.01


def test_poisson_start_and_order():
    arr = poisson_arrivals(50.0, 1000, seed=1, start_ms=500.0)
    assert arr.dtype == np.float64 and len(arr) == 1000
    assert arr[0] > 500.0 and np.all(np.diff(arr) >= 0)


def test_uniform_spacing_exact():
    arr = uniform_arrivals(400.0, 1000, start_ms=10.0)
    assert arr[0] == 10.0
    np.testing.assert_allclose(arr, [10.0 + i * 2.5 for i in range(1000)], rtol=0, atol=1e-9)


def test_stepping_rates_and_levels():
    arr, rates = stepping_arrivals(seed=3)
    assert len(arr) == len(rates) == 32000
    assert rates[0] == 66.0 and rates[1999] == 66.0 and rates[2000] > 66.0
    assert rates[29999] < 4000.0 and rates[30000] == 4000.0 and rates[-1] == 4000.0
    levels = rates[::2000]
    assert len(np.unique(rates)) == 16 and np.all(np.diff(levels) > 0)
    np.testing.assert_allclose(levels[1:] / levels[:-1], (4000 / 66) ** (1 / 15), rtol=1e-12)  # geometric
    # the offered rate shows in the gaps: mean gap of the first level ~ 1000/66 ms (4 sigma, 2000 samples)
    gaps = np.diff(np.r_[0.0, arr])
    assert abs(gaps[:2000].mean() - 1000 / 66) < 4 * (1000 / 66) / math.sqrt(2000)
    assert abs(gaps[30000:].mean() - 0.25) < 4 * 0.25 / math.sqrt(2000)


def test_stepping_constant_gaps():
    arr, rates = stepping_arrivals(start_qps=10, end_qps=1000, step_queries=5, n_queries=15, poisson=False)
    assert rates.tolist() == [10.0] * 5 + [pytest.approx(100.0)] * 5 + [1000.0] * 5
    np.testing.assert_allclose(np.diff(np.r_[0.0, arr]), 1000.0 / rates, rtol=1e-12)


# ---------------------------------------------------------------- lengths
def test_glue_tasks_shipped():
    assert {"CoLA", "SST-2", "MRPC", "STS-B", "QNLI", "RTE", "WNLI", "QQP"} <= set(glue_tasks())


@pytest.mark.parametrize("task", sorted(GLUE_MEAN_WORDS))
def test_glue_file_means_match_source_summary(task):
    lens = load_lengths(f"glue:{task}")
    assert lens.dtype == np.int64 and lens.min() >= 1
    assert round(float(lens.mean()) - SPECIAL_TOKENS[task], 2) == GLUE_MEAN_WORDS[task]


def test_glue_sampler_reproduces_mean():
    w = workload_from_config(
        {"kind": "poisson", "rate_qps": 100, "n_queries": 20000, "seq_len_dist": "glue:RTE"}, needs_seq_len=True
    )
    truth = GLUE_MEAN_WORDS["RTE"] + 3
    assert abs(w.seq_lens.mean() - truth) < 0.05 * truth
    assert set(np.unique(w.seq_lens)) <= set(load_lengths("glue:RTE").tolist())


def test_task_name_case_insensitive():
    np.testing.assert_array_equal(load_lengths("glue:rte"), load_lengths("glue:RTE"))


def test_custom_length_file_relative_to_base_dir(tmp_path):
    (tmp_path / "lens.csv").write_text("# source: test\nseq_len\n7\n9\n")
    w = workload_from_config(
        {"kind": "uniform", "rate_qps": 10, "n_queries": 500, "seq_len_dist": "lens.csv", "seed": 4},
        needs_seq_len=True,
        base_dir=tmp_path,
    )
    assert set(w.seq_lens.tolist()) == {7, 9}


# ---------------------------------------------------------------- config -> Workload
def test_explicit_sorting_keeps_lengths_aligned():
    w = workload_from_config(
        {"kind": "explicit", "arrivals_ms": [5.0, 1, 3.0, 1], "seq_lens": [50, 10, 30, 11]}, needs_seq_len=True
    )
    assert w.arrivals_ms.tolist() == [1.0, 1.0, 3.0, 5.0]
    assert w.seq_lens.tolist() == [10, 11, 30, 50]  # stable: the first '1' keeps its length 10


def test_explicit_with_constant_seq_len():
    w = workload_from_config({"kind": "explicit", "arrivals_ms": [2, 0], "seq_len": 128}, needs_seq_len=True)
    assert w.arrivals_ms.tolist() == [0.0, 2.0] and w.seq_lens.tolist() == [128, 128]


def test_no_seq_dimension_gives_ones():
    w = workload_from_config(
        {"kind": "poisson", "rate_qps": 100, "n_queries": 50, "seq_len": 64}, needs_seq_len=False
    )
    assert w.seq_lens.dtype == np.int64 and w.seq_lens.tolist() == [1] * 50


def test_poisson_config_matches_function():
    w = workload_from_config(
        {"kind": "poisson", "rate_qps": 100, "n_queries": 50, "seed": 9, "start_ms": 3.0}, needs_seq_len=False
    )
    np.testing.assert_array_equal(w.arrivals_ms, poisson_arrivals(100, 50, 9, 3.0))


def test_stepping_config():
    w = workload_from_config(
        {"kind": "stepping", "n_queries": 3000, "step_queries": 1000, "seed": 2, "seq_len": 32}, needs_seq_len=True
    )
    np.testing.assert_array_equal(w.arrivals_ms, stepping_arrivals(66.0, 4000.0, 1000, 3000, 2)[0])
    assert len(w) == 3000


def test_determinism_and_stream_independence():
    cfg = {"kind": "poisson", "rate_qps": 300, "n_queries": 2000, "seed": 11, "seq_len_dist": "glue:SST-2"}
    a = workload_from_config(cfg, needs_seq_len=True)
    b = workload_from_config(dict(cfg), needs_seq_len=True)
    np.testing.assert_array_equal(a.arrivals_ms, b.arrivals_ms)
    np.testing.assert_array_equal(a.seq_lens, b.seq_lens)
    c = workload_from_config({**cfg, "seed": 12}, needs_seq_len=True)
    assert not np.array_equal(a.arrivals_ms, c.arrivals_ms) and not np.array_equal(a.seq_lens, c.seq_lens)
    # lengths come from a separate stream: changing the length spec leaves arrivals unchanged
    d = workload_from_config({**cfg, "seq_len_dist": "glue:RTE"}, needs_seq_len=True)
    np.testing.assert_array_equal(a.arrivals_ms, d.arrivals_ms)


def test_workload_arrays_read_only_and_validated():
    w = Workload(np.array([0.0, 1.0]), np.array([3, 4]), "x")
    with pytest.raises(ValueError):
        w.arrivals_ms[0] = 5.0
    with pytest.raises(WorkloadError) as e:
        Workload(np.array([1.0, 0.0]), np.array([1, 1]))
    assert e.value.field == "workload.arrivals_ms" and "non-decreasing" in e.value.message
    with pytest.raises(WorkloadError) as e:
        Workload(np.array([0.0, 1.0]), np.array([1]))
    assert e.value.field == "workload.seq_lens"
    with pytest.raises(WorkloadError):
        Workload(np.array([0.0]), np.array([0]))


P = {"kind": "poisson", "rate_qps": 100, "n_queries": 10}


@pytest.mark.parametrize(
    "section, needs, field, needle",
    [
        ({"rate_qps": 1, "n_queries": 1}, False, "workload.kind", "missing"),
        ({"kind": "weibull"}, False, "workload.kind", "'poisson'"),
        ({**P, "rate": 5}, False, "workload.rate", "allowed: backlog, kind, n_queries, priority_mix, rate_qps"),
        ({**P, "arrivals_ms": [1]}, False, "workload.arrivals_ms", "unknown key"),
        ({**P, "rate_qps": -5}, False, "workload.rate_qps", "must be a number in [1e-06, 1e+09], got -5"),
        ({**P, "rate_qps": 0}, False, "workload.rate_qps", "number in [1e-06, 1e+09]"),
        ({**P, "rate_qps": "fast"}, False, "workload.rate_qps", "must be a number"),
        ({**P, "rate_qps": True}, False, "workload.rate_qps", "must be a number"),
        ({**P, "rate_qps": float("inf")}, False, "workload.rate_qps", "number in [1e-06, 1e+09]"),
        ({"kind": "poisson", "n_queries": 10}, False, "workload.rate_qps", "missing"),
        ({**P, "n_queries": 0}, False, "workload.n_queries", "integer >= 1"),
        ({**P, "n_queries": 1.5}, False, "workload.n_queries", "integer >= 1"),
        ({**P, "seed": -1}, False, "workload.seed", "integer in 0.."),
        ({**P, "seed": "abc"}, False, "workload.seed", "integer in 0.."),
        ({**P, "start_ms": -1}, False, "workload.start_ms", "in [0, 1e+12]"),
        ({"kind": "uniform", "rate_qps": -1, "n_queries": 3}, False, "workload.rate_qps", "[1e-06, 1e+09]"),
        ({"kind": "explicit"}, False, "workload.arrivals_ms", "missing"),
        ({"kind": "explicit", "arrivals_ms": []}, False, "workload.arrivals_ms", "at least one"),
        ({"kind": "explicit", "arrivals_ms": [1, -2]}, False, "workload.arrivals_ms", "entry 1"),
        ({"kind": "explicit", "arrivals_ms": "1,2"}, False, "workload.arrivals_ms", "list of numbers"),
        ({"kind": "explicit", "arrivals_ms": [1, "x"]}, False, "workload.arrivals_ms", "entry 1"),
        ({"kind": "explicit", "arrivals_ms": [1, 2], "seq_lens": [3]}, True, "workload.seq_lens", "one entry per arrival"),
        ({"kind": "explicit", "arrivals_ms": [1], "seq_lens": [0]}, True, "workload.seq_lens", "integers >= 1"),
        ({"kind": "explicit", "arrivals_ms": [1], "seq_lens": [3], "seq_len": 4}, True, "workload.seq_lens", "not both"),
        ({"kind": "stepping", "poisson": "yes"}, False, "workload.poisson", "true or false"),
        ({"kind": "stepping", "end_qps": -1}, False, "workload.end_qps", "[1e-06, 1e+09]"),
        ({"kind": "stepping", "step_queries": 0}, False, "workload.step_queries", ">= 1"),
        (P, True, "workload.seq_len", 'seq_len = N or seq_len_dist = "glue:RTE"'),
        ({**P, "seq_len": 0}, True, "workload.seq_len", "integer >= 1"),
        ({**P, "seq_len": 12.5}, True, "workload.seq_len", "integer >= 1"),
        ({**P, "seq_len": 8, "seq_len_dist": "glue:RTE"}, True, "workload.seq_len_dist", "only one"),
        ({**P, "seq_len_dist": "glue:MNLI"}, True, "workload.seq_len_dist", "shipped tasks are CoLA"),
        ({**P, "seq_len_dist": "no/such/file.csv"}, True, "workload.seq_len_dist", "not found"),
        ({**P, "seq_len_dist": 5}, True, "workload.seq_len_dist", "must be a string"),
    ],
)
def test_config_errors(section, needs, field, needle):
    with pytest.raises(ConfigError) as e:
        workload_from_config(section, needs_seq_len=needs)
    assert e.value.field == field
    assert needle in e.value.message
    assert "\n" not in str(e.value)


def test_section_must_be_mapping():
    with pytest.raises(ConfigError) as e:
        workload_from_config([1, 2], needs_seq_len=False)
    assert e.value.field == "workload"


def test_bad_length_file_contents(tmp_path):
    (tmp_path / "a.csv").write_text("length\n3\n")
    (tmp_path / "b.csv").write_text("seq_len\n3\n-1\n")
    for name, needle in (("a.csv", "no seq_len column"), ("b.csv", "integers >= 1")):
        with pytest.raises(WorkloadError) as e:
            load_lengths(str(tmp_path / name))
        assert e.value.field == "workload.seq_len_dist" and needle in e.value.message


def test_a_start_beyond_the_clocks_resolution_is_refused_in_one_line():
    """Issue 34: ``start_ms = 1e308`` rounded every latency to 0 and the run was judged stable. The first arrival
    may be at most 1e12 ms (about 31.7 years; the float64 clock still resolves 0.12 us there), and a start there
    still gives the latencies of a start at 0."""
    import pytest

    import dvasim
    from dvasim.errors import ConfigError
    from dvasim.workload.arrivals import poisson_arrivals

    with pytest.raises(ConfigError, match=r"workload\.start_ms"):
        poisson_arrivals(100.0, 10, 1, start_ms=1e308)
    cfg = {"model": {"name": "vgg19", "device": "titanrtx", "stages": 2}, "policy": {"name": "zerobatch"},
           "workload": {"kind": "poisson", "rate_qps": 100.0, "n_queries": 200, "seed": 1}}
    with pytest.raises(ConfigError, match=r"workload\.start_ms"):
        dvasim.run({**cfg, "workload": {**cfg["workload"], "start_ms": 1e13}})
    late = dvasim.run({**cfg, "workload": {**cfg["workload"], "start_ms": 1e12}}).summary
    early = dvasim.run(cfg).summary
    assert late["mean_latency_ms"] > 0
    assert abs(late["mean_latency_ms"] - early["mean_latency_ms"]) < 1e-3
