"""One set of verdicts (issue 34): a run is never "stable" while it misses its SLO or refuses more queries than the
SLO allows to be late; the trigger's recovery test; every ranking against the best, ties shown."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dvasim
from dvasim.reporting.intervals import Interval, against_best, single
from dvasim.reporting.verdict import VERDICTS, default_backlog, judge, recovery, worst

STEADY = {"stable": True, "stability_reason": "stable: served 100.0% of the offered rate"}
GROWING = {"stable": False, "stability_reason": "unstable: mean latency grew 9.00x"}


def test_the_verdicts_and_their_order():
    assert VERDICTS == ("stable", "over-SLO", "rejecting", "metastable", "unstable")
    assert worst(["over-SLO", "unstable", "rejecting"]) == "unstable" and worst([]) == "stable"


def test_a_run_over_its_slo_is_never_stable():
    lat = np.r_[np.full(980, 5.0), np.full(20, 80.0)]  # 2% late: the p99 is 80 ms
    v = judge(STEADY, latency=lat, slo_ms=50.0, percentile=99.0)
    assert v["verdict"] == "over-SLO" and not v["stable"] and v["steady_state"]
    assert "p99 80 ms > 50 ms" in v["verdict_reason"]
    ok = judge(STEADY, latency=lat, slo_ms=50.0, percentile=95.0)  # 2% late is within a p95 SLO
    assert ok["verdict"] == "stable" and ok["stable"]


def test_refusals_beyond_the_allowed_share_are_rejecting_and_each_failing_rule_is_named():
    lat = np.full(1000, 5.0)
    v = judge(STEADY, latency=lat, slo_ms=50.0, percentile=99.0, refused_fraction=0.23)
    assert v["verdict"] == "rejecting" and not v["stable"]
    assert judge(STEADY, latency=lat, slo_ms=50.0, percentile=99.0, refused_fraction=0.005)["stable"]
    both = judge(GROWING, latency=np.full(1000, 90.0), slo_ms=50.0, percentile=99.0, refused_fraction=0.5)
    assert both["verdict"] == "unstable"
    assert all(w in both["verdict_reason"] for w in ("unstable:", "rejecting:", "over-SLO:"))


def test_an_unfinished_query_is_infinitely_late():
    lat = np.r_[np.full(90, 1.0), np.full(10, np.nan)]
    assert judge(STEADY, latency=lat, slo_ms=50.0, percentile=99.0)["verdict"] == "over-SLO"


def test_recovery_from_a_backlog_and_a_collapse():
    rng = np.random.default_rng(1)
    n, backlog = 4000, 50
    arr = np.r_[np.zeros(backlog), np.cumsum(rng.exponential(1.0, n))]
    drained = arr + np.r_[np.linspace(60, 40, backlog), 40 * np.exp(-np.arange(n) / 100) + 2]
    ok = recovery(arr, drained, backlog, 10.0, 99.0)
    assert ok["recovered"] and ok["n_judged"] == n // 2 and ok["slow_fraction"] == 0.0
    collapsed = arr + np.r_[np.full(backlog, 60.0), 60 + 0.5 * np.arange(n)]  # the queue never shrinks again
    bad = recovery(arr, collapsed, backlog, 10.0, 99.0)
    assert not bad["recovered"] and "did not recover" in bad["reason"]
    assert default_backlog(4500, 50) == 225 and default_backlog(1, 1) == 1 and default_backlog(1500, 50, 2) == 150


def test_a_summary_says_over_slo_where_stable_was_printed(tmp_path):
    """M/D/1 at 80% load, with a target its p99 misses: the steady-state rule holds, the verdict does not."""
    table = tmp_path / "t.csv"
    table.write_text("stage,batch_size,latency_ms\n0,1,1.0\n0,2,1.5\n")
    cfg = {"model": {"table": str(table)}, "policy": {"name": "zerobatch", "max_batch_size": 1},
           "workload": {"kind": "poisson", "rate_qps": 800.0, "n_queries": 20_000, "seed": 1},
           "qos": {"target_ms": 3.0}}
    s = dvasim.run(cfg).summary
    assert s["steady_state"] and s["verdict"] == "over-SLO" and not s["stable"]
    assert s["p99_latency_ms"] > 3.0
    cfg["qos"]["target_ms"] = 100.0
    s = dvasim.run(cfg).summary
    assert s["verdict"] == "stable" and s["stable"]


def _iv(point: float, hw: float) -> Interval:
    return Interval(point, point - hw, point + hw, 5, 0.95, "t over seeds")


def test_comparisons_are_against_the_best_never_a_percentage_of_zero():
    # the first listed has capacity 0: the old rule printed 'ahead by 100.0% [92.9, 107.1]' against it
    cmp = against_best({"e2bird": single(0.0), "dvabatch": single(412.0), "delaybatch": single(350.0)},
                       resolution=0.02)
    assert cmp["best"] == "dvabatch"
    rows = {r["name"]: r for r in cmp["rows"]}
    assert rows["delaybatch"]["difference_%"] == pytest.approx(-15.05, abs=0.01)
    assert rows["e2bird"]["difference_%"] == -100.0 and not rows["e2bird"]["tie"]
    assert cmp["ranking"] == "dvabatch > delaybatch > e2bird"
    zeros = against_best({"a": single(0.0), "b": single(0.0)})
    assert math.isnan(zeros["rows"][0]["difference_%"]) and zeros["ranking"] == "a = b"


def test_ties_are_shown_in_the_ranking_and_the_labels():
    cmp = against_best({"zerobatch": _iv(100.0, 4.0), "dvabatch": _iv(102.0, 4.0), "delaybatch": _iv(60.0, 4.0)})
    assert cmp["ranking"] == "dvabatch = zerobatch > delaybatch"
    assert cmp["rows"][0]["label"].startswith("zerobatch: tie with dvabatch (difference 2.0% within the interval)")
    assert cmp["rows"][1]["label"].startswith("delaybatch: 41.2% below dvabatch [")
    # equal values below the best tie with each other too (which_batching_system: delaybatch, graphbatch and
    # tfserving-optwait all at 382 qps were printed 'delaybatch > tfserving-optwait > graphbatch')
    cmp = against_best({"dvabatch": single(413.0), "delaybatch": single(382.0), "tfserving": single(382.0),
                        "graphbatch": single(382.0), "zerobatch": single(370.0), "serial": single(211.0)},
                       resolution=0.03)
    assert cmp["ranking"] == "dvabatch > delaybatch = tfserving = graphbatch > zerobatch > serial"  # 3.2% apart
    assert not any(r["tie"] for r in cmp["rows"])  # each row is still against the best
    # fewer is better for replica counts
    gpus = against_best({"zerobatch": single(2.0), "dvabatch": single(1.0)}, higher_is_better=False)
    assert gpus["best"] == "dvabatch" and gpus["rows"][0]["label"].startswith("zerobatch: 100.0% above dvabatch")
