"""Replicas behind a router (dvasim.engines.sim.cluster, dvasim.server.router) against independent truth:
the single-GPU run, Lindley's recursion per replica, a second implementation of each router's choice, and the
queueing theory of splitting a Poisson stream (random: Poisson per replica, M/D/1; round robin: Erlang-N per
replica, E_N/D/1, whose waits are shorter -- Poisson splitting does not hold for round robin)."""

from __future__ import annotations

import numpy as np
import pytest

import dvasim
from dvasim.api import build
from dvasim.config import resolve
from dvasim.core.pipeline import Pipeline
from dvasim.engines.sim.cluster import simulate_cluster
from dvasim.engines.sim.engine import simulate
from dvasim.errors import ConfigError
from dvasim.policies import make_policy
from dvasim.server.router import ROUTERS, make_router
from dvasim.workload import poisson_arrivals
from tests.conftest import make_table
from tests.engines.test_sim_queueing_theory import lindley

T = 1.0  # ms: the deterministic single server's service time


def md1_pipelines(n: int) -> list[Pipeline]:
    table = make_table(1, lambda s, b: T, batch_sizes=[1])
    return [Pipeline(table, make_policy("zerobatch", {"max_batch_size": 1}), 1) for _ in range(n)]


def cluster_md1(n_rep: int, rho: float, n: int, router: str, seed: int):
    """``n_rep`` deterministic single servers at per-replica load ``rho`` behind ``router``."""
    arrivals = poisson_arrivals(n_rep * rho / T * 1000.0, n, seed)
    res = simulate_cluster(md1_pipelines(n_rep), arrivals, np.ones(n, dtype=int), make_router(router, n_rep, seed),
                           sharing="exclusive")
    assert res.stuck is None
    df = res.records.frame()
    return arrivals, df


# ------------------------------------------------------------------ the engine
@pytest.mark.parametrize("policy,stack", [("dvabatch", "gpu-only"), ("zerobatch", "triton-tensorrt"),
                                          ("delaybatch", "triton-tensorrt")])
def test_one_replica_is_the_single_gpu_run(policy, stack):
    cfg = resolve({"model": {"name": "resnet152", "device": "titanrtx", "stages": 4}, "policy": {"name": policy},
                   "workload": {"kind": "poisson", "rate_qps": 400, "n_queries": 3000, "seed": 5},
                   "engine": {"service_cv": 0.2}})
    runs = []
    for engine in ("single", "cluster"):
        parts = build(cfg, stack)
        w = parts.workload
        opts = dict(sharing="fluid", service_cv=0.2, seed=5, host=parts.served.host, batch_costs=parts.served.batch,
                    transfer=parts.transfer)
        if engine == "single":
            res = simulate(parts.pipeline, w.arrivals_ms, w.seq_lens, keep_queries=False, **opts)
        else:
            res = simulate_cluster([parts.pipeline], w.arrivals_ms, w.seq_lens, make_router("join_shortest_queue", 1),
                                   **opts)
        runs.append(res.records.frame())
    assert len(runs[0]) == 3000
    assert runs[0].equals(runs[1])


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_every_replica_is_a_fifo_server_lindley_exactly(router):
    """Whatever the router picked, each replica's queries (its records' ``replica``) went through a FIFO
    deterministic server: their latencies are Lindley's recursion over that replica's arrivals."""
    _, df = cluster_md1(3, 0.8, 6000, router, seed=4)
    assert sorted(df.replica.unique()) == [0, 1, 2]
    for _, part in df.groupby("replica"):
        part = part.sort_values("query_id")
        np.testing.assert_allclose(part.latency_ms.to_numpy(), lindley(part.arrival_ms.to_numpy(), T),
                                   rtol=0, atol=1e-9)


def jsq_reference(arrivals: np.ndarray, n_rep: int, service: float, work: bool = False) -> list[int]:
    """A second implementation of join-shortest-queue (and least-work, equal here: every query's work is the
    same) over deterministic FIFO servers: the fewest queries not yet answered, ties to the next replica after
    the last one picked."""
    free_at = [0.0] * n_rep  # when each server is done with what it holds
    departures: list[list[float]] = [[] for _ in range(n_rep)]
    last, out = n_rep - 1, []
    for a in arrivals.tolist():
        counts = [sum(1 for d in departures[r] if d > a) for r in range(n_rep)]
        order = [(last + 1 + i) % n_rep for i in range(n_rep)]
        r = min(order, key=lambda x: counts[x])  # min keeps the first of equal ones in scan order
        free_at[r] = max(free_at[r], a) + service
        departures[r] = [d for d in departures[r] if d > a] + [free_at[r]]
        out.append(r)
        last = r
    return out


@pytest.mark.parametrize("router", ["join_shortest_queue", "least_work"])
def test_jsq_choices_match_a_second_implementation(router):
    arrivals, df = cluster_md1(3, 0.85, 3000, router, seed=9)
    assert df.replica.tolist() == jsq_reference(arrivals, 3, T)


def test_round_robin_sends_every_nth_query():
    _, df = cluster_md1(4, 0.5, 2000, "round_robin", seed=1)
    assert (df.replica.to_numpy() == np.arange(2000) % 4).all()


# ------------------------------------------------------------------ queueing theory
def test_random_router_replicas_are_md1_queues():
    """Random splitting of a Poisson stream gives each replica a Poisson stream: the mean latency is the M/D/1
    queue's (Pollaczek-Khinchine: T + rho T / (2 (1 - rho)))."""
    rho = 0.7
    _, df = cluster_md1(4, rho, 200_000, "random", seed=2022)
    expected = T + rho * T / (2 * (1 - rho))
    assert abs(df.latency_ms.mean() - expected) / expected < 0.03


def erlang_lindley_mean(n_rep: int, rho: float, n: int, seed: int) -> float:
    """E_N/D/1 by a second implementation: Lindley over Erlang-N inter-arrivals of rate rho / T."""
    rng = np.random.default_rng([seed, 77])
    gaps = rng.gamma(n_rep, T / rho / n_rep, size=n)
    return float(lindley(np.cumsum(gaps), T).mean())


def test_round_robin_replica_sees_erlang_arrivals_not_poisson():
    """Round robin over N replicas at N times the rate: each replica sees every N-th arrival of a Poisson stream,
    an Erlang-N renewal stream of the one-replica rate. Its latencies are then those of one replica fed Erlang-N
    arrivals (computed independently), clearly below the M/D/1 mean that Poisson splitting would predict."""
    rho, n_rep = 0.8, 4
    _, df = cluster_md1(n_rep, rho, 200_000, "round_robin", seed=31)
    got = df.latency_ms.mean()
    erlang = erlang_lindley_mean(n_rep, rho, 200_000, seed=32)
    md1 = T + rho * T / (2 * (1 - rho))
    assert abs(got - erlang) / erlang < 0.02
    assert got < 0.75 * md1  # 1.34 ms against 3.0 ms


def test_round_robin_cluster_equals_one_replica_fed_erlang_arrivals():
    """The same with DVABatch on ResNet152: a 3-replica round-robin cluster at 3x the rate, against one replica
    fed an Erlang-3 stream at the one-replica rate (independent seeds), and against one replica fed Poisson."""
    base = {"model": {"name": "resnet152", "device": "titanrtx", "stages": 4}, "policy": {"name": "dvabatch"},
            "qos": {"target_ms": 200.0}}
    rate, n = 330.0, 12_000  # about 80% of one replica's peak (411 qps, experiments/results/gpu-only)
    cl = dvasim.run({**base, "workload": {"kind": "poisson", "rate_qps": 3 * rate, "n_queries": 3 * n, "seed": 1},
                     "cluster": {"replicas": 3, "router": "round_robin"}}).queries
    cfg = resolve({**base, "workload": {"kind": "poisson", "rate_qps": rate, "n_queries": n, "seed": 2}})
    gaps = np.random.default_rng(8).gamma(3, 1000.0 / rate / 3, size=n)
    one = []
    for arrivals in (np.cumsum(gaps), poisson_arrivals(rate, n, 2)):
        parts = build(cfg, None)
        res = simulate(parts.pipeline, arrivals, np.ones(n, dtype=int), keep_queries=False)
        one.append(res.records.frame().latency_ms)
    erlang, poisson = one
    assert abs(cl.latency_ms.mean() - erlang.mean()) / erlang.mean() < 0.04
    assert abs(cl.latency_ms.quantile(0.99) - erlang.quantile(0.99)) / erlang.quantile(0.99) < 0.10
    assert poisson.mean() > 1.10 * cl.latency_ms.mean()


def test_jsq_beats_random_at_high_load():
    _, jsq = cluster_md1(4, 0.9, 40_000, "join_shortest_queue", seed=6)
    _, rnd = cluster_md1(4, 0.9, 40_000, "random", seed=6)
    _, p2c = cluster_md1(4, 0.9, 40_000, "power_of_two", seed=6)
    assert jsq.latency_ms.mean() < 0.5 * rnd.latency_ms.mean()
    assert jsq.latency_ms.quantile(0.99) < 0.5 * rnd.latency_ms.quantile(0.99)
    assert jsq.latency_ms.mean() <= p2c.latency_ms.mean() < rnd.latency_ms.mean()


def test_least_work_beats_jsq_on_diverse_lengths():
    """With input lengths whose work differs 8-fold, counting queries misjudges a replica's backlog; the
    least-work router weighs each query by its batch-1 time and waits less."""
    table = make_table(1, lambda s, b, L: L / 64.0, batch_sizes=[1], seq_lens=[16, 128])
    n, n_rep = 30_000, 3
    rng = np.random.default_rng(3)
    lens = np.where(rng.random(n) < 0.8, 16, 128)
    mean_work = (0.8 * 16 + 0.2 * 128) / 64.0
    arrivals = poisson_arrivals(0.9 * n_rep / mean_work * 1000.0, n, 4)
    means = {}
    for router in ("join_shortest_queue", "least_work"):
        pipes = [Pipeline(table, make_policy("zerobatch", {"max_batch_size": 1}), 1) for _ in range(n_rep)]
        res = simulate_cluster(pipes, arrivals, lens, make_router(router, n_rep, 0), sharing="exclusive")
        means[router] = res.records.frame().latency_ms.mean()
    assert means["least_work"] < 0.97 * means["join_shortest_queue"]  # measured: 2.70 against 2.87 ms


# ------------------------------------------------------------------ runs, records and summaries
def test_network_delay_adds_to_latency_and_is_recorded():
    base = {"model": {"name": "resnet152", "device": "titanrtx", "stages": 4}, "policy": {"name": "serial"},
            "workload": {"kind": "uniform", "rate_qps": 10, "n_queries": 40, "seed": 1}}
    alone = dvasim.run({**base, "cluster": {"replicas": 2}}).queries
    late = dvasim.run({**base, "cluster": {"replicas": 2, "network_delay_ms": 3.0}}).queries
    np.testing.assert_allclose(late.latency_ms, alone.latency_ms + 3.0, atol=1e-9)
    np.testing.assert_allclose(late.seen_ms - late.arrival_ms, 3.0, atol=1e-9)


def test_network_delay_acts_at_one_replica_too():
    """Issue 34: every [cluster] key acts at every replica count. Before, one replica dropped the delay (a 100 ms
    delay gave the latency of none). Now each query reaches the replica's front door the delay after it arrived,
    and a run without a delay is the plain single-GPU run, unchanged."""
    base = {"model": {"name": "resnet152", "device": "titanrtx", "stages": 4}, "policy": {"name": "serial"},
            "workload": {"kind": "uniform", "rate_qps": 10, "n_queries": 40, "seed": 1}}
    alone = dvasim.run(base).queries
    for cluster in ({"network_delay_ms": 100.0}, {"replicas": 1, "network_delay_ms": 100.0}):
        late = dvasim.run({**base, "cluster": cluster}).queries
        np.testing.assert_allclose(late.latency_ms, alone.latency_ms + 100.0, atol=1e-9)
        np.testing.assert_allclose(late.seen_ms - late.arrival_ms, 100.0, atol=1e-9)
    same = dvasim.run({**base, "cluster": {"network_delay_ms": 0.0}}).queries
    assert same.equals(alone)


def test_network_delay_distribution_reorders_but_loses_nothing():
    cfg = {"model": {"name": "resnet152", "device": "titanrtx", "stages": 4}, "policy": {"name": "dvabatch"},
           "workload": {"kind": "poisson", "rate_qps": 1500, "n_queries": 4000, "seed": 2},
           "cluster": {"replicas": 3, "router": "jsq", "network_delay_ms": [0.0, 0.5, 2.0, 10.0]}}
    a, b = dvasim.run(cfg), dvasim.run(cfg)
    q = a.queries
    assert len(q) == 4000 and q.query_id.tolist() == list(range(4000)) and q.finish_ms.notna().all()
    delay = q.seen_ms - q.arrival_ms
    assert delay.min() >= 0 and delay.max() <= 10.0 and delay.std() > 0.5
    assert (np.diff(q.sort_values("seen_ms").query_id.to_numpy()) < 0).any()  # some overtook others
    assert a.queries.equals(b.queries)  # deterministic
    wall = ("sim_wall_s", "sim_queries_per_wall_s")
    assert {k: v for k, v in a.summary.items() if k not in wall} == {k: v for k, v in b.summary.items()
                                                                     if k not in wall}


def test_summary_gives_per_replica_utilisation():
    res = dvasim.run({"model": {"name": "resnet152", "device": "titanrtx", "stages": 4},
                      "policy": {"name": "zerobatch"},
                      "workload": {"kind": "poisson", "rate_qps": 900, "n_queries": 6000, "seed": 3},
                      "cluster": {"replicas": 3, "router": "random"}})
    s, q = res.summary, res.queries
    assert s["replicas"] == 3 and s["router"] == "random" and len(s["per_replica"]) == 3
    for row in s["per_replica"]:
        mine = q[q.replica == row["replica"]]
        assert row["n_queries"] == len(mine)
        assert row["mean_latency_ms"] == pytest.approx(mine.latency_ms.mean(), rel=1e-12)
        assert 0 < row["device_busy_fraction"] < 1
    assert s["device_busy_fraction"] == pytest.approx(np.mean([r["device_busy_fraction"] for r in s["per_replica"]]))
    assert sum(r["n_queries"] for r in s["per_replica"]) == 6000


def test_a_cluster_serves_more_than_instances_on_one_gpu():
    """The issue's case: instances share one device, replicas do not. At a rate three GPUs hold, three
    replicas keep up; three instances on one GPU do not."""
    base = {"model": {"name": "bert_base", "device": "titanrtx", "stages": 2}, "policy": {"name": "zerobatch"},
            "workload": {"kind": "poisson", "rate_qps": 1000, "n_queries": 6000, "seed": 1, "seq_len": 64}}
    replicas = dvasim.run({**base, "cluster": {"replicas": 3, "router": "jsq"}}).summary
    instances = dvasim.run({**base, "engine": {"instances": 3}}).summary
    assert replicas["stable"] and replicas["throughput_qps"] > 0.97 * 1000
    assert not instances["stable"]


def test_cluster_config_errors_are_one_line():
    base = {"model": {"name": "resnet152", "device": "titanrtx", "stages": 4},
            "workload": {"kind": "poisson", "rate_qps": 100, "n_queries": 100}}
    for cluster, needle in [({"replicas": 0}, "cluster.replicas"), ({"router": "best"}, "cluster.router"),
                            ({"network_delay_ms": [3, 1]}, "cluster.network_delay_ms"),
                            ({"replicas": 100_000}, "cluster.replicas")]:
        with pytest.raises(ConfigError, match=needle):
            dvasim.run({**base, "cluster": cluster})
    closed = {**base, "workload": {"kind": "closed", "clients": 4, "n_queries": 100}, "cluster": {"replicas": 2}}
    with pytest.raises(ConfigError, match="cluster.replicas"):
        dvasim.run(closed)


def test_dvasim_run_prints_and_writes_each_replica(tmp_path, capfd):
    import json

    from dvasim.cli import main

    rc = main(["run", "configs/default.toml", "--out", str(tmp_path), "--no-figure", "--set", "cluster.replicas=2",
               "--set", "cluster.router=rr", "--set", "workload.n_queries=400"])
    out = capfd.readouterr().out
    s = json.loads((tmp_path / "summary.json").read_text())
    assert rc == 0 and s["replicas"] == 2 and s["router"] == "round_robin"
    assert [r["n_queries"] for r in s["per_replica"]] == [200, 200]
    assert "replica 0" in out and "replica 1" in out and "round_robin" in out
