"""Simulated queries per wall-clock second for a four-stage model at high load.

Runs the shipped four-stage VGG16 (TITAN X) table at about 90% of its capacity under each policy and each
device-sharing mode, and prints one line per run. Not a test: numbers depend on the machine.

    python benchmarks/bench_sim.py [--queries N] [--repeats R]
"""

from __future__ import annotations

import argparse
import statistics
import time

from dvasim.core.pipeline import Pipeline
from dvasim.engines.sim.engine import simulate
from dvasim.model.table import LatencyTable, default_table_path
from dvasim.policies import make_policy
from dvasim.workload import poisson_arrivals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    table = LatencyTable.load(default_table_path())
    B = 32
    capacity_qps = B / table.total(B) * 1000.0
    rate = 0.9 * capacity_qps
    arrivals = poisson_arrivals(rate, args.queries, seed=7)
    lens = [1] * args.queries
    print(f"table {table.name}: {table.n_stages} stages, capacity at bs={B}: {capacity_qps:.0f} qps; load {rate:.0f} qps")
    for policy, params in [("zerobatch", {}), ("delaybatch", {"max_queue_delay_ms": 10.0}), ("dvabatch", {})]:
        for sharing in ("fluid", "exclusive"):
            speeds = []
            for _ in range(args.repeats):
                pipe = Pipeline(table, make_policy(policy, {"max_batch_size": B, **params}), 2)
                t0 = time.perf_counter()
                res = simulate(pipe, arrivals, lens, sharing=sharing)
                speeds.append(args.queries / (time.perf_counter() - t0))
                assert res.stuck is None
            print(f"{policy:>10} {sharing:>9}: {statistics.median(speeds):8.0f} simulated queries / wall s "
                  f"(median of {args.repeats}; min {min(speeds):.0f}, max {max(speeds):.0f})")


if __name__ == "__main__":
    main()
