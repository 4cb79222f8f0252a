"""The replay's own cost per stage launch, fed to the simulator as ``[engine] launch_overhead_ms``
(the paper's §8.8 reports a scheduling overhead of 0.29 ms on its GPU).

Method
------
For each small model (3 stages) the script first profiles the replay's own stage modules *now*, as the replay
runs them (``dvasim.fitting.validate.serving_stage_table``: TorchScript by default, one thread per stage, stages in
pipeline order with a pause between rounds), because this shared virtual machine's speed drifts over hours; then
it replays
ZeroBatch, where no two stage executions ever overlap, in two settings:

* **closed loop** (one client, no think time; the paper's setting): the executors never idle long;
* **open loop** (Poisson arrivals at ``--load`` of ZeroBatch's capacity, as in the fidelity matrix's low load):
  the executors sleep between queries, as in serving.

For every stage launch the engine records (``time.perf_counter``; see ``dvasim.engines.replay.engine``) when the control
plane started it, when its thread began, when the computation ended and when the control plane learnt it. Per
launch the script reports

* ``handoff``: control plane -> executor thread running (the ``Pipeline.step`` that started it, a
  ``queue.SimpleQueue`` hand-off, a thread wake-up and the GIL);
* ``bookkeeping``: end of computation -> ``Pipeline.finish`` (the control-plane lock);
* ``sched = handoff + bookkeeping``: the **scheduling cost**, comparable to the paper's 0.29 ms;
* ``copy``: the buffer copies inside the executor (inputs into the first buffer, output rows into the next);
* ``excess = (finish - start) - table``: everything a launch takes beyond the freshly profiled stage time
  (scheduling, copies, and what the table misses);
* ``admit``: how late the front door saw a query after its arrival (a timed wait on this VM wakes late), the
  simulator's ``[engine] admission_delay_ms``.

``sched + copy`` of the open-loop run is the simulator's ``launch_overhead_ms`` (what
``dvasim.fitting.validate.fit_engine`` fits, and what ``experiments/validation/run_matrix.py --calibrate`` puts
into the fidelity matrix's configs). The script also prints a bare thread hand-off microbenchmark for reference.

Usage::

    .venv/bin/python benchmarks/bench_replay_overhead.py [--models vgg19,resnet152,bert_base,unet] [--queries 200]
        [--out benchmarks/results/replay_overhead.json]

Timing is real: run it on a quiet machine (the script prints the load average before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import threading
import time
from pathlib import Path

import numpy as np


def handoff_microbench(n: int = 2000) -> dict:
    """Round trips between two threads through SimpleQueue (the executor mailbox), one-way time in ms."""
    a, b = queue.SimpleQueue(), queue.SimpleQueue()

    def echo():
        while True:
            x = a.get()
            if x is None:
                return
            b.put(time.perf_counter())

    t = threading.Thread(target=echo)
    t.start()
    one_way = []
    for _ in range(n):
        t0 = time.perf_counter()
        a.put(t0)
        t1 = b.get()
        one_way.append((t1 - t0) * 1000.0)
        time.sleep(0.0005)  # let the echo thread go back to sleep, as an idle executor does
    a.put(None)
    t.join()
    return {"handoff_ms_mean": statistics.fmean(one_way), "handoff_ms_p50": statistics.median(one_way),
            "handoff_ms_p90": float(np.percentile(one_way, 90))}


def _launch_stats(r) -> dict:
    """Per-launch costs of replay ``r``; each execution carries its table time (the replay decided with it)."""
    ex = r.extra["replay"].executions
    h = np.array([e["handoff_ms"] for e in ex])
    k = np.array([e["bookkeeping_ms"] for e in ex])
    c = np.array([e["copy_ms"] for e in ex])
    t = np.array([e["table_ms"] for e in ex])
    span = np.array([e["finish_ms"] - e["start_ms"] for e in ex])
    comp = np.array([e["compute_ms"] for e in ex])
    excess = span - t
    return {
        "launches": len(ex), "sched_ms": float((h + k).mean()), "sched_ms_p50": float(np.median(h + k)),
        "handoff_ms": float(h.mean()), "bookkeeping_ms": float(k.mean()), "copy_ms": float(c.mean()),
        "exec_excess_ms": float((comp - c - t).mean()), "excess_ms": float(excess.mean()),
        "excess_ms_p50": float(np.median(excess)), "table_ms": float(t.mean()),
        "mean_latency_ms": float(r.queries["latency_ms"].mean()),
        "admission_delay_ms": float(r.summary.get("admission_delay_ms_mean", float("nan"))),
    }


def measure(model: str, stages: int, queries: int, load: float, tmp: Path) -> dict:
    from dvasim.api import run
    from dvasim.engines.replay import replay
    from dvasim.fitting.validate import serving_stage_table

    base = {
        "model": {"name": model, "device": "cpu", "stages": stages},
        "policy": {"name": "zerobatch", "max_batch_size": 8},
        "engine": {"buffer_pairs": 2},
    }
    lens = {"seq_len_dist": "glue:MRPC"} if model.startswith("bert") else {}
    path = serving_stage_table({**base, "workload": {"kind": "closed", "n_queries": 1, **lens}},
                               tmp / f"{model}_stages.csv")
    closed = {**base, "workload": {"kind": "closed", "clients": 1, "n_queries": queries, "think_ms": 0.0,
                                   "seed": 0, **lens}}
    r_closed = replay(closed, warmup=2, table=path)
    cap = {**base, "model": {"table": str(path)},
           "workload": {"kind": "poisson", "rate_qps": 10000.0, "n_queries": 2000, "seed": 0, **lens}}
    capacity = run(cap).summary["throughput_qps"]
    rate = round(load * capacity, 1)
    opened = {**base, "workload": {"kind": "poisson", "rate_qps": rate, "n_queries": queries, "seed": 1, **lens}}
    r_open = replay(opened, warmup=2, table=path)
    return {"model": model, "stages": stages, "open_rate_qps": rate,
            "closed": _launch_stats(r_closed), "open": _launch_stats(r_open)}


def main() -> None:
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="vgg19,resnet152,bert_base,unet")
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--load", type=float, default=0.2, help="open-loop load, fraction of ZeroBatch's capacity")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    load0 = os.getloadavg()
    micro = handoff_microbench()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(m, args.stages, args.queries, args.load, Path(tmp)) for m in args.models.split(",")]
    load1 = os.getloadavg()
    print(f"load average before {load0[0]:.2f}, after {load1[0]:.2f} (timings are real: quiet machine wanted)")
    print(f"bare thread hand-off (SimpleQueue, idle receiver): mean {micro['handoff_ms_mean']:.3f} ms, "
          f"p50 {micro['handoff_ms_p50']:.3f} ms")
    overall = {}
    for mode in ("closed", "open"):
        print(f"\n{mode} loop{'' if mode == 'closed' else f' ({args.load:.0%} of capacity)'}: ms per stage launch, means")
        print(f"{'model':<11} {'launches':>8} {'table':>7} {'handoff':>8} {'bookkeep':>8} {'sched':>7} {'copy':>7} "
              f"{'exec+':>7} {'excess':>7} {'admit':>7}")
        for r in rows:
            x = r[mode]
            print(f"{r['model']:<11} {x['launches']:>8} {x['table_ms']:>7.3f} {x['handoff_ms']:>8.3f} "
                  f"{x['bookkeeping_ms']:>8.3f} {x['sched_ms']:>7.3f} {x['copy_ms']:>7.3f} {x['exec_excess_ms']:>7.3f} "
                  f"{x['excess_ms']:>7.3f} {x['admission_delay_ms']:>7.3f}")
        w = [r[mode]["launches"] for r in rows]
        overall[mode] = {k: float(np.average([r[mode][k] for r in rows], weights=w))
                         for k in ("sched_ms", "handoff_ms", "bookkeeping_ms", "copy_ms", "exec_excess_ms", "excess_ms",
                                   "admission_delay_ms")}
        o = overall[mode]
        print(f"{'all':<11} {sum(w):>8} {'':>7} {o['handoff_ms']:>8.3f} {o['bookkeeping_ms']:>8.3f} {o['sched_ms']:>7.3f} "
              f"{o['copy_ms']:>7.3f} {o['exec_excess_ms']:>7.3f} {o['excess_ms']:>7.3f} {o['admission_delay_ms']:>7.3f}")
    print(f"\nscheduling cost per stage launch: {overall['closed']['sched_ms']:.3f} ms closed loop, "
          f"{overall['open']['sched_ms']:.3f} ms open loop (paper, GPU: 0.29 ms)")
    o = overall["open"]
    print(f"-> [engine] launch_overhead_ms = {o['sched_ms'] + o['copy_ms']:.2f} (open loop: scheduling + copies), "
          f"admission_delay_ms = {o['admission_delay_ms']:.2f}")
    if args.out:
        p = Path(args.out)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"loadavg_before": load0, "loadavg_after": load1, "microbench": micro,
                                 "models": rows, "overall": overall,
                                 "launch_overhead_ms": o["sched_ms"] + o["copy_ms"],
                                 "admission_delay_ms": o["admission_delay_ms"]}, indent=2) + "\n")
        print(f"written {p}")


if __name__ == "__main__":
    main()
