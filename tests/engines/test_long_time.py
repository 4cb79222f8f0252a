"""Simulated time that scales: runs far from time 0 (up to 1e12 ms, 31 years) and over a month of sparse traffic
finish, return every query, and give the same latencies as the same arrivals near time 0 (to what the clock can
resolve there). Before, completion and batch-window tolerances were absolute (1e-9 ms) while the clock's float
spacing beyond ~1.7e7 ms is coarser, and timers re-armed at the same instant forever."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dvasim

TABLE = "traces/default/vgg16_titanx_4stages.csv"
POLICIES = [
    {"name": "zerobatch", "max_batch_size": 8},
    {"name": "delaybatch", "max_batch_size": 8, "max_queue_delay_ms": 0.41},
    {"name": "dvabatch", "max_batch_size": 8},
    {"name": "dvabatch", "max_batch_size": 8, "policies": ["load", "operator"], "split_factor": 1.0},
]
# a few bursts and lone queries, 0-60 ms apart
BASE = np.cumsum(np.random.default_rng(4).choice([0.0, 0.0, 0.3, 2.5, 17.0, 60.0], size=40)).tolist()


def run(policy, sharing, offset):
    cfg = {"model": {"table": TABLE}, "policy": dict(policy),
           "workload": {"kind": "explicit", "arrivals_ms": [offset + t for t in BASE]},
           "engine": {"sharing": sharing, "buffer_pairs": 2}}
    return dvasim.run(cfg, progress=False)


@pytest.mark.parametrize("offset", [2.7e7, 1e9, 1e12])
@pytest.mark.parametrize("sharing", ["fluid", "exclusive", "parallel", "cores"])
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: "-".join(map(str, p.values())))
def test_far_from_time_zero_every_query_comes_back_unchanged(policy, sharing, offset):
    near = run(policy, sharing, 0.0)
    far = run(policy, sharing, offset)
    assert far.stuck is None and far.summary["n_completed"] == len(BASE)
    # the clock resolves ulp(offset): latencies may differ by a few units of it
    tol = 1e-6 + 32 * math.ulp(offset)  # measured: at most 7 ulp
    assert far.queries["latency_ms"].to_numpy() == pytest.approx(near.queries["latency_ms"].to_numpy(), abs=tol)


@pytest.mark.parametrize("policy", POLICIES, ids=["zerobatch", "delaybatch", "dvabatch", "dvabatch-split"])
def test_a_month_of_sparse_poisson_traffic(policy):
    days = 30
    n = 600
    rate = n / (days * 86400.0)  # queries per second
    cfg = {"model": {"table": TABLE}, "policy": dict(policy),
           "workload": {"kind": "poisson", "rate_qps": rate, "n_queries": n, "seed": 3}}
    r = dvasim.run(cfg, progress=False)
    assert r.stuck is None and r.summary["n_completed"] == n
    assert r.queries["arrival_ms"].max() > 20 * 86400e3  # it did span weeks
    # lone queries: each waits its window (DelayBatch) and runs the model alone
    lat = r.queries["latency_ms"].to_numpy()
    assert np.median(lat) == pytest.approx(np.median(lat[:20]), rel=1e-3)


def test_single_arrivals_at_random_times_all_finish():
    """The fuzzing run's failing family: one query at a random time between 1e6 and 1e8 ms, DelayBatch with a
    random window (293 of 400 such trials hung or lost the query before)."""
    from dvasim.model.table import LatencyTable

    model_ms = LatencyTable.load(TABLE).total(1)
    rng = np.random.default_rng(11)
    for t, w in zip(10 ** rng.uniform(6, 8, 60), rng.uniform(0.01, 5.0, 60)):
        cfg = {"model": {"table": TABLE},
               "policy": {"name": "delaybatch", "max_batch_size": 8, "max_queue_delay_ms": float(w)},
               "workload": {"kind": "explicit", "arrivals_ms": [float(t)]}}
        r = dvasim.run(cfg, progress=False)
        assert r.stuck is None, (t, w)
        # a lone query waits the window, then runs the model at batch size 1
        tol = 32 * math.ulp(t) + 1e-9
        assert r.queries["s0_start_ms"].iloc[0] - t == pytest.approx(w, abs=tol)
        assert r.queries["latency_ms"].iloc[0] == pytest.approx(w + model_ms, abs=tol)


def test_watchdog_stops_a_livelock():
    """A process that re-arms itself at the same instant (what the old absolute tolerances did far from time 0)
    never lets the clock advance: the watchdog stops it with the pipeline's description."""
    import simpy

    from dvasim.engines.sim.engine import SimulationStuck, _run_watched

    env = simpy.Environment()

    def ticker():
        yield env.timeout(5.0)
        while True:
            yield env.timeout(1e-12)  # below the clock's resolution at 2.7e7 ms: no progress
            if env.now > 1.0:
                yield env.timeout(0.0)

    def far():
        yield env.timeout(27_366_700.0)
        env.process(ticker())

    class Stub:
        def stuck_report(self):
            return "executors=['working'] buffers=[['inreading']]"

    env.process(far())
    with pytest.raises(SimulationStuck, match=r"no progress in simulated time for 10,000 events at 27366705\.0+ ms"):
        _run_watched(env, Stub(), 10_000)


def test_watchdog_leaves_normal_runs_alone():
    """Many events at one instant are fine below the limit (a burst of 2,000 queries at time 0)."""
    cfg = {"model": {"table": TABLE}, "policy": {"name": "zerobatch", "max_batch_size": 1},
           "workload": {"kind": "explicit", "arrivals_ms": [0.0] * 2000}}
    r = dvasim.run(cfg, progress=False)
    assert r.stuck is None and r.summary["n_completed"] == 2000
