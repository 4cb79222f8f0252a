"""The simulator against independent truth: the M/D/1 queue (Pollaczek-Khinchine), Lindley's recursion, and the
throughput of a saturated batcher."""

import numpy as np
import pytest

from dvasim.core.pipeline import Pipeline
from dvasim.engines.sim.engine import simulate
from dvasim.policies import make_policy
from dvasim.reporting.metrics import records_frame, summarize
from dvasim.workload import poisson_arrivals
from tests.conftest import make_table

T = 1.0  # ms, constant service time


def md1_run(rho: float, n: int, seed: int):
    table = make_table(1, lambda s, b: T, batch_sizes=[1])
    pipe = Pipeline(table, make_policy("zerobatch", {"max_batch_size": 1}), 1)
    arrivals = poisson_arrivals(rho / T * 1000.0, n, seed)
    res = simulate(pipe, arrivals, np.ones(n, dtype=int), sharing="exclusive")
    assert res.stuck is None
    return arrivals, np.array([q.latency for q in res.queries])


def lindley(arrivals: np.ndarray, service: float) -> np.ndarray:
    """Sojourn times of a FIFO single server: W_n = max(0, W_{n-1} + S - A_n) + S (a second implementation)."""
    out = np.empty(len(arrivals))
    wait = 0.0
    prev = arrivals[0]
    for k, a in enumerate(arrivals):
        if k:
            wait = max(0.0, wait + service - (a - prev))
        prev = a
        out[k] = wait + service
    return out


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_single_server_matches_lindley_exactly(rho):
    arrivals, lat = md1_run(rho, 20_000, seed=11)
    np.testing.assert_allclose(lat, lindley(arrivals, T), rtol=0, atol=1e-9)


@pytest.mark.parametrize("rho,n", [(0.5, 100_000),
                                   pytest.param(0.8, 600_000, marks=pytest.mark.slow)])  # (17 s: make test-slow)
def test_md1_mean_latency_matches_pollaczek_khinchine(rho, n):
    # M/D/1 mean sojourn: T + rho*T / (2(1-rho)).  n is chosen so that the run-to-run spread of the sample mean
    # (standard deviation over 12 seeds: 0.4% at rho=0.5 with 100k queries; 1.7% at rho=0.8 with 100k, so about
    # 0.7% with 600k) leaves the 2% tolerance at 3 to 5 standard deviations.
    _, lat = md1_run(rho, n, seed=2022)
    expected = T + rho * T / (2 * (1 - rho))
    assert abs(lat.mean() - expected) / expected < 0.02


@pytest.mark.parametrize("n_stages,sharing", [(1, "exclusive"), (1, "fluid"), (4, "exclusive")])
def test_saturated_batcher_reaches_B_over_T_of_B(n_stages, sharing):
    B = 8
    table = make_table(n_stages, lambda s, b: (2.0 + 0.5 * b) / n_stages, batch_sizes=range(1, 17))
    pipe = Pipeline(table, make_policy("zerobatch", {"max_batch_size": B}), 2)
    n = 8_000
    arrivals = np.sort(np.random.default_rng(3).uniform(0, 100.0, n))  # 80 queries per ms: far beyond capacity
    res = simulate(pipe, arrivals, np.ones(n, dtype=int), sharing=sharing)
    df = records_frame(res.queries, n_stages)
    s = summarize(df, 1e9)
    capacity_qps = B / table.total(B) * 1000.0
    assert s["n_completed"] == n
    assert (df["exit_batch_size"] == B).mean() > 0.99
    assert s["throughput_qps"] == pytest.approx(capacity_qps, rel=0.01)


def test_delaybatch_saturated_also_reaches_capacity():
    B = 16
    table = make_table(1, lambda s, b: 1.0 + 0.25 * b, batch_sizes=range(1, 17))
    pipe = Pipeline(table, make_policy("delaybatch", {"max_batch_size": B, "max_queue_delay_ms": 3.0}), 1)
    n = 6_000
    arrivals = np.sort(np.random.default_rng(4).uniform(0, 50.0, n))
    res = simulate(pipe, arrivals, np.ones(n, dtype=int))
    s = summarize(records_frame(res.queries, 1), 1e9)
    assert s["throughput_qps"] == pytest.approx(B / table.total(B) * 1000.0, rel=0.01)


def test_closed_loop_single_client_latency_is_service_time():
    """One client, no think time: each query finds the pipeline empty, so its latency is the model's
    standalone latency, and queries follow each other back to back."""
    table = make_table(3, lambda s, b: 1.0 + s, batch_sizes=range(1, 5))
    pipe = Pipeline(table, make_policy("zerobatch", {"max_batch_size": 4}), 2)
    res = simulate(pipe, np.zeros(50), np.ones(50, dtype=int), closed_clients=1)
    lat = np.array([q.latency for q in res.queries])
    arrivals = np.array([q.arrival for q in res.queries])
    np.testing.assert_allclose(lat, 6.0)
    np.testing.assert_allclose(np.diff(arrivals), 6.0)


def test_closed_loop_clients_bound_concurrency():
    table = make_table(1, lambda s, b: 2.0, batch_sizes=range(1, 9))
    pipe = Pipeline(table, make_policy("zerobatch", {"max_batch_size": 8}), 1)
    res = simulate(pipe, np.zeros(400), np.ones(400, dtype=int), closed_clients=4, think_ms=1.0)
    assert res.stuck is None
    # 4 clients, each cycle = 2 ms service + 1 ms think (they stay in lockstep): throughput 4 / 3 per ms
    span = max(q.finish for q in res.queries) - min(q.arrival for q in res.queries)
    assert 400 / span == pytest.approx(4 / 3, rel=0.02)
    assert max(q.exit_batch_size for q in res.queries) <= 4


@pytest.mark.parametrize("policy,params", [("zerobatch", {}), ("delaybatch", {"max_queue_delay_ms": 2.0}),
                                           ("dvabatch", {"max_queue_delay_ms": 2.0})])
def test_admission_delay_shifts_every_query_by_exactly_the_delay(policy, params):
    """The front door seeing every query ``d`` late is a time shift of the whole open-loop run (batch windows
    count from when the server saw a query): each latency grows by exactly ``d``, nothing else changes."""
    table = make_table(3, lambda s, b: 0.8 + 0.3 * b, batch_sizes=[1, 2, 4, 8])
    arrivals = poisson_arrivals(900.0, 3000, 4)
    runs = {}
    for d in (0.0, 0.37):
        pipe = Pipeline(table, make_policy(policy, {"max_batch_size": 8, **params}), 2)
        res = simulate(pipe, arrivals, np.ones(len(arrivals), dtype=int), sharing="cores", cores=2,
                       corun_slowdown=1.2, launch_overhead_ms=0.1, admission_delay_ms=d)
        assert res.stuck is None
        df = records_frame(res.queries, 3)
        assert np.allclose(df["seen_ms"] - df["arrival_ms"], d)
        runs[d] = df
    assert np.allclose(runs[0.37]["latency_ms"] - runs[0.0]["latency_ms"], 0.37, atol=1e-6)
    assert (runs[0.37]["exit_batch_size"] == runs[0.0]["exit_batch_size"]).all()


def test_service_jitter_keeps_the_mean_has_the_cv_and_is_seeded():
    """Log-normal execution-time jitter: mean 1, the configured CV, the same run for the same seed."""
    table = make_table(1, lambda s, b: T, batch_sizes=[1])
    arrivals = poisson_arrivals(100.0, 20000, 5)  # rho 0.1: mostly no queueing

    def run(cv, seed):
        pipe = Pipeline(table, make_policy("zerobatch", {"max_batch_size": 1}), 1)
        res = simulate(pipe, arrivals, np.ones(len(arrivals), dtype=int), sharing="exclusive", service_cv=cv,
                       seed=seed)
        df = records_frame(res.queries, 1)
        return (df["s0_finish_ms"] - df["s0_start_ms"]).to_numpy(), df["latency_ms"].to_numpy()

    service, lat = run(0.3, 1)
    assert service.mean() == pytest.approx(T, rel=0.01)
    assert service.std() / service.mean() == pytest.approx(0.3, rel=0.05)
    assert np.array_equal(run(0.3, 1)[1], lat)
    assert not np.array_equal(run(0.3, 2)[1], lat)
    flat, _ = run(0.0, 1)
    assert np.allclose(flat, T)


def test_admission_delay_drawn_from_measured_quantiles():
    """A quantile list: each query draws its delay (inverse CDF), the front door keeps arrival order, and the
    draws follow the distribution (sparse arrivals, so the FIFO rule never binds)."""
    q = [0.0, 0.02, 0.05, 0.1, 2.0]  # levels 0, .25, .5, .75, 1
    table = make_table(1, lambda s, b: 0.1, batch_sizes=[1])
    arrivals = np.arange(20000) * 10.0
    pipe = Pipeline(table, make_policy("zerobatch", {"max_batch_size": 1}), 1)
    res = simulate(pipe, arrivals, np.ones(len(arrivals), dtype=int), sharing="exclusive", admission_delay_ms=q,
                   seed=3)
    d = np.array([x.seen - x.arrival for x in res.queries])
    want_mean = np.trapezoid(q, np.linspace(0, 1, len(q)))
    assert d.mean() == pytest.approx(want_mean, rel=0.03)
    assert np.median(d) == pytest.approx(0.05, abs=0.005)
    assert (d >= 0).all() and d.max() <= 2.0
    # dense arrivals: the front door sees queries in arrival order
    dense = poisson_arrivals(5000.0, 5000, 2)
    pipe = Pipeline(table, make_policy("zerobatch", {"max_batch_size": 1}), 1)
    res = simulate(pipe, dense, np.ones(len(dense), dtype=int), sharing="exclusive", admission_delay_ms=q, seed=3)
    seen = np.array([x.seen for x in res.queries])
    assert (np.diff(seen) >= 0).all() and (seen >= dense).all()


def test_admission_delay_quantiles_are_checked():
    from dvasim import config
    from dvasim.errors import ConfigError

    base = {"model": {"table": "traces/default/vgg16_titanx_4stages.csv"},
            "workload": {"kind": "poisson", "rate_qps": 10, "n_queries": 5}}
    assert config.resolve({**base, "engine": {"admission_delay_ms": [0.0, 0.5]}})["engine"]["admission_delay_ms"]
    for bad in ([0.5, 0.1], [1.0], [-0.1, 0.2], "fast"):
        with pytest.raises(ConfigError, match="engine.admission_delay_ms"):
            config.resolve({**base, "engine": {"admission_delay_ms": bad}})
