"""The stability verdict (issue 13): stable and overloaded runs on real configs and against an independent M/D/1
queue, its independence of the run's length, the warm-up trim, stepping runs' per-level summaries and the
offered rate in the records."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dvasim
from dvasim.cli import main, print_summary
from dvasim.config import resolve
from dvasim.errors import ConfigError
from dvasim.reporting.stability import MIN_QUERIES, TREND_MAX, stability
from dvasim.studies import evaluation as study
from dvasim.workload import poisson_arrivals, stepping_rates

ROOT = Path(__file__).resolve().parents[2]
VERDICT = ("stable", "stability_reason", "throughput_ratio", "throughput_ratio_min", "latency_trend",
           "latency_trend_z", "warmup_queries")


def bert(rate: float, n: int, seed: int = 1, **qos) -> dict:
    """The issue's example: BERT-base in 2 stages on the Titan RTX, DelayBatch, GLUE RTE lengths, Poisson, on the
    Triton + TensorRT stack with the idealised batcher (no prefetch). Under Triton 21.10's rules (the Titan RTX
    default) 500 QPS is metastable: the first 1,500 queries are served in batches of about 4 (a stable verdict,
    rightly, for those queries) before merged payloads grow, their padding with them, and the run collapses."""
    return {"model": {"name": "bert_base", "device": "titanrtx", "stages": 2},
            "policy": {"name": "delaybatch", "max_batch_size": 64},
            "workload": {"kind": "poisson", "rate_qps": rate, "n_queries": n, "seed": seed,
                         "seq_len_dist": "glue:RTE"},
            "server": {"stack": "triton-tensorrt", "triton_release": "ideal"},
            "qos": {"target_ms": 200.0, **qos}, "engine": {"progress": False}}


def verdict(summary: dict) -> dict:
    return {k: summary[k] for k in VERDICT}


# ----------------------------------------------------------------------------- independent truth: M/D/1
def md1_finish(arrivals: np.ndarray, service: float) -> np.ndarray:
    """Finish times of a FIFO single server with a constant service time (Lindley's recursion)."""
    out = np.empty(len(arrivals))
    free = -math.inf
    for k, a in enumerate(arrivals):
        free = max(free, a) + service
        out[k] = free
    return out


@pytest.fixture
def md1_config(tmp_path):
    table = tmp_path / "md1.csv"
    table.write_text("stage,batch_size,latency_ms\n0,1,1.0\n")  # one stage, 1 ms, one query at a time

    def make(rho: float, n: int, seed: int) -> dict:
        return {"model": {"table": str(table)}, "policy": {"name": "zerobatch", "max_batch_size": 1},
                "workload": {"kind": "poisson", "rate_qps": rho * 1000.0, "n_queries": n, "seed": seed},
                "engine": {"progress": False, "buffer_pairs": 1, "sharing": "exclusive"}}

    return make


@pytest.mark.parametrize("rho,stable", [(0.5, True), (0.8, True), (1.2, False)])
def test_md1_run_gets_the_verdict_of_its_independent_queue(md1_config, rho, stable):
    n, seed = 3000, 7
    res = dvasim.run(md1_config(rho, n, seed))
    arrivals = poisson_arrivals(rho * 1000.0, n, seed)
    truth = md1_finish(arrivals, 1.0)
    np.testing.assert_allclose(res.queries["finish_ms"].to_numpy(), truth, rtol=0, atol=1e-9)
    s = res.summary
    assert s["stable"] is stable, s["stability_reason"]
    assert s["stability_reason"].startswith("stable" if stable else "unstable")
    want = stability(arrivals, truth)
    for k in ("stable", "throughput_ratio", "latency_trend", "latency_trend_z"):
        assert s[k] == pytest.approx(want[k], rel=1e-9), k
    if stable:
        assert s["throughput_ratio"] > 0.99 and s["latency_trend"] < TREND_MAX
    else:
        # a server at rate 1/ms offered 1.2/ms serves 1/1.2 of it, and the queue grows all the way
        assert s["throughput_ratio"] == pytest.approx(1 / 1.2, abs=0.03)
        assert s["latency_trend"] > 3 and s["latency_trend_z"] > 5


def test_md1_verdicts_over_many_seeds():
    # 40 independent M/D/1 runs of 3,000 queries at each load: every stable one stable, every overloaded one not
    def verdicts(rho):
        out = []
        for seed in range(40):
            a = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rho, 3000))
            out.append(stability(a, md1_finish(a, 1.0))["stable"])
        return out

    assert all(verdicts(0.5)) and all(verdicts(0.8))
    assert not any(verdicts(1.2))


# ----------------------------------------------------------------------------- the example
def test_overloaded_bert_is_unstable_at_every_length_and_a_stable_load_is_stable_at_every_length():
    means, ratios = [], []
    for n in (1500, 3000, 6000):
        over = dvasim.run(bert(500.0, n)).summary
        assert over["stable"] is False, (n, over["stability_reason"])
        assert "served" in over["stability_reason"] and "grew" in over["stability_reason"]
        means.append(over["mean_latency_ms"])
        ratios.append(over["throughput_ratio"])
        for rate in (100.0, 300.0):  # about 1/4 and 3/4 of the peak (about 400 QPS: p99 within 200 ms)
            ok = dvasim.run(bert(rate, n)).summary
            assert ok["stable"] is True, (rate, n, ok["stability_reason"])
            assert ok["throughput_ratio"] > 0.99 and ok["latency_trend"] < 1.3
    # the mean depends on the run's length (it more than doubles with it), the verdict and its measure do not
    assert means[1] > 2 * means[0] and means[2] > 2 * means[1]
    assert max(ratios) < 0.85 and max(ratios) - min(ratios) < 0.1


def test_the_verdict_is_in_summary_json_and_printed(tmp_path):
    out = tmp_path / "run"
    code = main(["run", str(ROOT / "configs/default.toml"), "--set", "workload.n_queries=600", "--set",
                 "engine.progress=false", "--no-figure", "--out", str(out)])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stable"] is True and summary["stability_reason"].startswith("stable")
    assert summary["warmup_queries"] == 0 and summary["throughput_ratio"] > 0.97
    buf = io.StringIO()
    print_summary(summary, file=buf)  # what dvasim run prints
    printed = buf.getvalue()
    assert any(line.split()[:2] == ["stable", "True"] for line in printed.splitlines())
    # and the records carry the offered rate, in both files
    for df in (pd.read_parquet(out / "queries.parquet"), pd.read_csv(out / "queries.csv")):
        assert (df["offered_qps"] == 150.0).all() and len(df) == 600


# ----------------------------------------------------------------------------- the rule's edges
def test_unfinished_queries_make_a_run_unstable():
    a = np.arange(300, dtype=float)
    f = a + 0.5
    f[[10, 200]] = np.nan
    v = stability(a, f)
    assert v["stable"] is False and "2 of 300 queries never finished" in v["stability_reason"]
    assert v["throughput_ratio"] == pytest.approx(1.0, abs=1e-3)  # measured over the finished ones


def test_too_few_queries_are_judged_on_completion_only():
    a = np.arange(MIN_QUERIES - 1, dtype=float)
    v = stability(a, a + np.linspace(1.0, 50.0, len(a)))  # a steep growth, but too few queries to tell
    assert v["stable"] is True and "too few" in v["stability_reason"] and math.isnan(v["latency_trend"])
    f = a + 1.0
    f[3] = np.nan
    assert stability(a, f)["stable"] is False


def test_order_of_the_arrays_does_not_matter():
    rng = np.random.default_rng(3)
    a = np.cumsum(rng.exponential(1.25, 2000))
    f = md1_finish(a, 1.0)
    perm = rng.permutation(len(a))
    assert stability(a[perm], f[perm], 0.1) == stability(a, f, 0.1)


def test_closed_loop_is_stable():
    cfg = {**bert(100.0, 1500), "workload": {"kind": "closed", "clients": 8, "n_queries": 1500,
                                             "seq_len_dist": "glue:RTE"}}
    res = dvasim.run(cfg)
    assert res.summary["stable"] is True, res.summary["stability_reason"]
    assert res.queries["offered_qps"].isna().all()  # a closed loop's rate is not a setting


# ----------------------------------------------------------------------------- warm-up trim
def test_warmup_trim_leaves_out_the_start():
    # 3,000 queries 1 ms apart: the first 900 see an empty system (2 ms), the rest a steady 5 ms plus noise
    n = 3000
    a = np.arange(n, dtype=float)
    lat = np.where(np.arange(n) < 900, 2.0, 5.0 + np.random.default_rng(0).uniform(-1.0, 1.0, n))
    untrimmed = stability(a, a + lat)
    assert untrimmed["stable"] is False and untrimmed["latency_trend"] > TREND_MAX
    trimmed = stability(a, a + lat, warmup_fraction=0.3)
    assert trimmed["stable"] is True and trimmed["warmup_queries"] == 900
    assert abs(trimmed["latency_trend"] - 1.0) < 0.05


def test_warmup_fraction_from_the_config_changes_only_the_verdict():
    base = dvasim.run(bert(300.0, 3000))
    res = dvasim.run(bert(300.0, 3000, warmup_fraction=0.25))
    s = res.summary
    assert s["warmup_queries"] == 750
    df = res.queries
    want = stability(df["arrival_ms"].to_numpy()[750:], df["finish_ms"].to_numpy()[750:])
    assert {k: s[k] for k in ("stable", "throughput_ratio", "latency_trend", "latency_trend_z")} == {
        k: want[k] for k in ("stable", "throughput_ratio", "latency_trend", "latency_trend_z")}
    # the latency statistics are the whole run's either way
    assert s["mean_latency_ms"] == base.summary["mean_latency_ms"]
    assert s["p99_latency_ms"] == base.summary["p99_latency_ms"]
    # an overload stays unstable after the trim
    assert dvasim.run(bert(500.0, 3000, warmup_fraction=0.25)).summary["stable"] is False


@pytest.mark.parametrize("value", [-0.1, 1.0, 1.5, "half", True, float("nan"), float("inf")])
def test_bad_warmup_values_name_the_field(value):
    with pytest.raises(ConfigError) as e:
        resolve(bert(100.0, 100, warmup_fraction=value))
    assert e.value.field == "qos.warmup_fraction" and "\n" not in str(e.value)
    assert "[0, 1)" in str(e.value)


def test_bad_warmup_value_on_the_command_line_is_one_line(tmp_path, capsys):
    code = main(["run", str(ROOT / "configs/default.toml"), "--set", "qos.warmup_fraction=2", "--no-figure",
                 "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "qos.warmup_fraction" in err


# ----------------------------------------------------------------------------- stepping levels, offered rate
def test_stepping_summary_has_each_level_as_study_computes_it():
    spec = {"start_qps": 66.0, "end_qps": 1000.0, "step_queries": 1000, "n_queries": 8000}
    cfg = study.make_config("bert_base", {"name": "delaybatch"}, {"kind": "stepping", "seed": 0, **spec})
    res = dvasim.run(cfg)
    rates = stepping_rates(**spec)
    df = res.queries
    np.testing.assert_array_equal(df["offered_qps"].to_numpy(), rates)
    levels = res.summary["levels"]
    want = study.level_stats(df, rates, qos_ms=cfg["qos"]["target_ms"])
    pd.testing.assert_frame_equal(pd.DataFrame(levels), want)
    assert [lv["offered_qps"] for lv in levels] == sorted(set(rates.tolist()))
    assert set(levels[0]) >= {"offered_qps", "n", "mean_latency_ms", "p99_latency_ms", "throughput_qps",
                              "within_qos", "stable"}
    # the low levels are served at their rate and stable; the top ones (above the peak: ~400 QPS, ~460 QPS under
    # Triton 21.10's merge at dequeue, the Titan RTX default) are not
    by_rate = {lv["offered_qps"]: lv for lv in levels}
    for r, lv in by_rate.items():
        assert lv["n"] == 1000
        if r < 350:
            assert lv["stable"] and lv["within_qos"] and lv["throughput_qps"] == pytest.approx(r, rel=0.1)
        elif r > 500:
            assert not lv["stable"] and not lv["within_qos"] and lv["throughput_qps"] < 0.9 * r
    # the whole run ends in overload: not stable
    assert res.summary["stable"] is False
    # json-able as written to summary.json
    json.dumps(res.summary, default=str)


def test_study_level_stats_keeps_working_on_latencies_alone():
    rates = np.repeat([100.0, 200.0], 100)
    lv = study.level_stats(pd.DataFrame({"latency_ms": np.r_[np.full(100, 10.0), np.full(100, 300.0)]}), rates)
    assert lv["within_qos"].tolist() == [True, False] and "stable" not in lv


@pytest.mark.parametrize("kind", ["poisson", "uniform"])
def test_offered_rate_column_of_constant_rate_loads(kind, tmp_path):
    cfg = bert(120.0, 400)
    cfg["workload"]["kind"] = kind
    mem = dvasim.run(cfg)
    streamed = dvasim.run(cfg, records=tmp_path / "q.parquet")
    for df in (mem.queries, streamed.queries):
        assert df.columns[-1] == "offered_qps" and (df["offered_qps"] == 120.0).all()
    pd.testing.assert_frame_equal(mem.queries, streamed.queries)


def test_offered_rate_of_explicit_arrivals_is_nan():
    cfg = {**bert(1.0, 1), "workload": {"kind": "explicit", "arrivals_ms": [0.0, 3.0, 9.0], "seq_len": 64}}
    res = dvasim.run(cfg)
    assert res.queries["offered_qps"].isna().all() and len(res.queries) == 3
    assert res.summary["stable"] is True  # three queries: too few to judge anything but completion


def test_the_verdict_of_an_interrupted_run_is_that_of_the_queries_that_had_arrived():
    """Queries that had not arrived when a run was stopped are not 'never finished' (issue 23)."""
    from dvasim.reporting.records import RecordStore
    from dvasim.reporting.verdict import run_verdict

    n, m = 1000, 700
    arrival = np.arange(n, dtype=float) * 10.0
    store = RecordStore(n, 1, arrivals=arrival)
    store.finish[:m] = arrival[:m] + 5.0  # the arrived ones finished; the rest never came
    cfg = {"qos": {"target_ms": 50.0}, "workload": {"kind": "poisson"}}
    assert run_verdict(store, cfg, np.full(n, 100.0))["stable"] is False
    store.leave_out(m, "interrupted by a test")
    got = run_verdict(store, cfg, np.full(n, 100.0))
    assert {k: v for k, v in got.items() if k not in ("verdict", "verdict_reason", "steady_state")} == \
        stability(arrival[:m], arrival[:m] + 5.0) and got["stable"] is True and got["verdict"] == "stable"
