"""Simulated queries per wall second of ``dvasim.run``, against a bare SimPy loop in the same process run.

The case of issue 12: BERT-base on the TITAN RTX, sliced into 4 stages, GLUE RTE input lengths, Poisson arrivals
at 0.9 of its "capacity", under ZeroBatch, DelayBatch (10 ms window) and DVABatch, at two loads:

* ``issue``: 0.9 x ``64 / T(64, median RTE length)`` = 1,136 qps, the load that reproduces issue 12's table. It
  overloads ZeroBatch and DelayBatch (padded batches of 64 serve only 370 qps), which then run full batches
  of 64, and is 1.1x DVABatch's saturation throughput (1,016 qps, batches of about one query);
* ``sat``: 0.9 x ``64 / E[T(64)]`` = 333 qps, ``E[T(64)]`` the expected time of a batch of 64 RTE inputs padded to
  the longest (:func:`dvasim.policies.dvabatch.padded_batch_ms`): 0.9 of ZeroBatch's measured saturation
  throughput, a stable load where batches are small (1-6 queries) and so per-query work is largest.

Under
ZeroBatch, DelayBatch (10 ms window) and DVABatch. The reference is the bare SimPy loop a simulator cannot beat by
much: an arrivals process putting each query into a ``simpy.Store``, one server process getting it and holding it
for an exponential service time (an M/M/1 queue at 0.9 load). Both see the same number of queries.

Prints one line per run (median of ``--repeats``), its ratio to the bare loop, and the peak memory of the whole
process (``ru_maxrss``). Not a test: the numbers depend on the machine; the ratios are what to compare.

    python benchmarks/bench_speed.py [--queries N] [--repeats R] [--policies zerobatch,delaybatch,dvabatch]
                                     [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import sys
import time

import numpy as np
import simpy


def _draws(n: int, stages: int, seed: int) -> tuple[list[float], list[list[float]]]:
    """Exponential gaps (mean 1) and per-stage service times (mean 0.9: a 0.9 load) of ``n`` queries."""
    rng = np.random.default_rng(seed)
    return rng.exponential(1.0, n).tolist(), rng.exponential(0.9, (stages, n)).tolist()


def _timed(env: simpy.Environment, done: list[int], n: int) -> float:
    """Wall seconds of ``env.run()``, checking that all ``n`` queries were served."""
    t0 = time.perf_counter()
    env.run()
    wall = time.perf_counter() - t0
    assert done[0] == n
    return wall


def bare_simpy_loop(n: int, seed: int = 7) -> float:
    """Wall seconds of an M/M/1 queue at 0.9 load with ``n`` customers: arrivals -> Store -> one server."""
    gaps, (service,) = _draws(n, 1, seed)
    env = simpy.Environment()
    store = simpy.Store(env)
    done = [0]

    def arrivals():
        for k in range(n):
            yield env.timeout(gaps[k])
            yield store.put(k)

    def server():
        while True:
            k = yield store.get()
            yield env.timeout(service[k])
            done[0] += 1

    env.process(arrivals())
    env.process(server())
    return _timed(env, done, n)


def pipeline_floor_loop(n: int, stages: int = 4, seed: int = 7) -> float:
    """Wall seconds of a ``stages``-stage pipeline written the usual SimPy way, serving batches of one: the
    arrivals process and one server process per stage, each getting a query from its ``Store``, holding it for
    an exponential time (0.9 load per stage) and putting it into the next stage's store. No batching, no policy,
    no device model."""
    gaps, service = _draws(n, stages, seed)
    env = simpy.Environment()
    stores = [simpy.Store(env) for _ in range(stages + 1)]
    done = [0]

    def arrivals():
        for k in range(n):
            yield env.timeout(gaps[k])
            yield stores[0].put(k)

    def server(s: int):
        src, dst, times = stores[s], stores[s + 1], service[s]
        while True:
            k = yield src.get()
            yield env.timeout(times[k])
            if s == stages - 1:
                done[0] += 1
            else:
                yield dst.put(k)

    env.process(arrivals())
    for s in range(stages):
        env.process(server(s))
    return _timed(env, done, n)


def timeout_chain_floor(n: int, stages: int = 4, seed: int = 7) -> float:
    """Wall seconds of the absolute least: per query an arrival timeout and then one timeout per stage, chained
    by callbacks (no queue, no server, no batching, no records): 5 SimPy events a query for 4 stages."""
    gaps, service = _draws(n, stages, seed)
    env = simpy.Environment()
    done = [0]

    def chain(k: int, s: int) -> None:
        def next_stage(_event) -> None:
            if s == stages - 1:
                done[0] += 1
            else:
                chain(k, s + 1)

        env.timeout(service[s][k]).callbacks.append(next_stage)

    def arrivals():
        for k in range(n):
            yield env.timeout(gaps[k])
            chain(k, 0)

    env.process(arrivals())
    return _timed(env, done, n)


LOADS = ("issue", "sat")


def bert_config(policy: str, n: int, load: str = "sat", stack: str = "gpu-only") -> dict:
    from dvasim.model.catalog import resolve_model
    from dvasim.workload import load_lengths

    model = {"name": "bert_base", "device": "titanrtx", "stages": 4}
    table = resolve_model(model).table
    from dvasim.policies.dvabatch import padded_batch_ms

    lengths = load_lengths("glue:RTE")
    if load == "issue":
        capacity = 64 / table.total(64, int(np.median(lengths))) * 1000.0
    else:
        capacity = 64 / padded_batch_ms(table, lengths, 64) * 1000.0
    params = {"max_batch_size": 64}
    if policy == "delaybatch":
        params["max_queue_delay_ms"] = 10.0
    return {
        "model": model,
        "policy": {"name": policy, **params},
        "workload": {"kind": "poisson", "rate_qps": 0.9 * capacity, "n_queries": n, "seed": 7,
                     "seq_len_dist": "glue:RTE"},
        "qos": {"target_ms": 200.0},
        "engine": {"progress": False},
        "server": {"stack": stack},  # the load is the GPU's capacity: a stack with host costs runs it overloaded
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--policies", default="zerobatch,delaybatch,dvabatch")
    ap.add_argument("--loads", default="issue,sat", help="which loads (issue, sat)")
    ap.add_argument("--stacks", default="gpu-only,triton-tensorrt",
                    help="serving stacks (gpu-only: the GPU alone, the engine's callback path; a stack with host "
                         "costs runs the host model's processes)")
    ap.add_argument("--json", help="also write the numbers to this JSON file")
    args = ap.parse_args()
    import dvasim

    n = args.queries
    bare = statistics.median(bare_simpy_loop(n) for _ in range(args.repeats))
    rows = [{"what": "bare SimPy loop (arrivals, Store, one server)", "queries_per_s": n / bare, "ratio": 1.0}]
    print(f"{n:,} queries, median of {args.repeats}; python {platform.python_version()}, simpy {simpy.__version__}")
    print(f"{'bare SimPy loop':>28}: {n / bare:9,.0f} q/s   1.00x")
    floor = statistics.median(pipeline_floor_loop(n) for _ in range(args.repeats))
    rows.append({"what": "SimPy 4-stage pipeline floor (a process per stage, batches of one, no logic)",
                 "queries_per_s": n / floor, "ratio": floor / bare})
    print(f"{'SimPy 4-stage floor':>28}: {n / floor:9,.0f} q/s  {floor / bare:5.2f}x slower   "
          "(a process and a Store per stage, batches of one, no policy)")
    chain = statistics.median(timeout_chain_floor(n) for _ in range(args.repeats))
    rows.append({"what": "SimPy timeout chain (an arrival and 4 stage timeouts a query, callbacks, nothing else)",
                 "queries_per_s": n / chain, "ratio": chain / bare})
    print(f"{'SimPy 4-timeout chain':>28}: {n / chain:9,.0f} q/s  {chain / bare:5.2f}x the bare loop's time   "
          "(5 events a query, no queue, no logic: the least any per-stage SimPy model does)")
    for stack, load, policy in [(st, ld, p) for st in args.stacks.split(",") for ld in args.loads.split(",")
                                for p in args.policies.split(",")]:
        cfg = bert_config(policy, n, load, stack)
        walls, summary = [], None
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            res = dvasim.run(cfg)
            walls.append(time.perf_counter() - t0)
            summary = res.summary
            assert summary["n_completed"] == n, summary
        wall = statistics.median(walls)
        rows.append({"what": f"dvasim.run {policy} at {load} on {stack}", "stack": stack, "load": load, "queries_per_s": n / wall, "ratio": wall / bare,
                     "sim_only_queries_per_s": summary["sim_queries_per_wall_s"],
                     "mean_latency_ms": summary["mean_latency_ms"], "offered_qps": cfg["workload"]["rate_qps"],
                     "mean_exit_batch_size": summary["mean_exit_batch_size"]})
        print(f"{policy + ' @' + load + ' ' + stack:>36}: {n / wall:9,.0f} q/s  {wall / bare:5.2f}x slower   "
              f"(engine alone {summary['sim_queries_per_wall_s']:,.0f} q/s; {cfg['workload']['rate_qps']:.0f} qps, "
              f"mean {summary['mean_latency_ms']:.2f} ms, "
              f"exit batch {summary['mean_exit_batch_size']:.1f})")
        sys.stdout.flush()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak memory of this process: {peak:,.0f} MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"queries": n, "repeats": args.repeats, "rows": rows, "peak_rss_mib": peak,
                       "python": platform.python_version(), "simpy": simpy.__version__}, f, indent=2)


if __name__ == "__main__":
    main()
