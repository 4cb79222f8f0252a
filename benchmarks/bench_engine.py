"""CPU time of the SimPy engine (``dvasim/engines/sim/engine.py``) against a baseline version of the same file.

Issue 22 turned ``simulate`` from one 423-line function with closures into the class
:class:`dvasim.engines.sim.engine.Simulation`. This runs the same workloads on the baseline engine and on the
working tree's, interleaved (baseline, new, baseline, new, ...), in CPU time (``time.process_time``, the engine's
call alone), asserts that both give identical records (and end time, device busy time and ``stuck``), and prints
for each workload the median over the repeats of the ratio new / baseline (each repeat's pair):

* ZeroBatch, DelayBatch (10 ms window) and DVABatch on the shipped default table (four-stage VGG16 on a TITAN X)
  at 0.9 of its capacity at batch size 32, Poisson arrivals (as ``benchmarks/bench_sim.py``);
* DVABatch on BERT-base (TITAN RTX, 4 stages) with GLUE RTE input lengths at 0.9 of ``64 / E[T(64)]`` (the
  ``sat`` load of ``benchmarks/bench_speed.py``);
* with ``--host``, also that BERT run under the ``triton-tensorrt`` stack: the host model's path (one process
  per executor) instead of the callbacks' path.

The baseline is by default the file as committed at ``--rev`` (``HEAD``), read with ``git show`` at run time;
once HEAD has the class, give ``--rev 478c6fd`` (the last commit with the one-function engine) or
``--baseline PATH`` (a copy of that file). Not a test: the ratios are what to compare (on a loaded machine, run
more repeats).

    .venv/bin/python benchmarks/bench_engine.py [--queries N] [--repeats R] [--host] [--only NAMES]
                                          [--rev REV | --baseline PATH] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
ENGINE = "dvasim/engines/sim/engine.py"


def load_baseline(rev: str, path: str | None):
    """The baseline engine as a module of its own (``_engine_baseline``), from ``path`` or from git."""
    if path is not None:
        text, origin = Path(path).read_text(encoding="utf-8"), path
    else:
        got = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{ENGINE}"], capture_output=True, text=True)
        if got.returncode != 0:
            sys.exit(f"cannot read {ENGINE} at {rev} ({got.stderr.strip()}); give --baseline PATH")
        text, origin = got.stdout, f"{rev}:{ENGINE}"
    if text == (REPO / ENGINE).read_text(encoding="utf-8"):
        print(f"warning: the baseline ({origin}) is the working tree's engine itself; the ratios measure noise. "
              "Give --rev 478c6fd or --baseline PATH for the one-function engine.", file=sys.stderr)
    name = "_engine_baseline"
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__file__ = origin
    sys.modules[name] = mod  # dataclasses look their module up
    exec(compile(text, origin, "exec"), mod.__dict__)
    return mod, origin


def default_table_workloads(n: int) -> list[tuple[str, object]]:
    """ZeroBatch, DelayBatch and DVABatch on the shipped default table at 0.9 of its capacity at batch size 32."""
    from dvasim.core.pipeline import Pipeline
    from dvasim.model.table import LatencyTable, default_table_path
    from dvasim.policies import make_policy
    from dvasim.workload import poisson_arrivals

    table = LatencyTable.load(default_table_path())
    B = 32
    rate = 0.9 * B / table.total(B) * 1000.0
    arrivals = poisson_arrivals(rate, n, seed=7)
    lens = [1] * n
    out = []
    for policy, params in [("zerobatch", {}), ("delaybatch", {"max_queue_delay_ms": 10.0}), ("dvabatch", {})]:
        def make(policy=policy, params=params):
            pipe = Pipeline(table, make_policy(policy, {"max_batch_size": B, **params}), 2)
            return pipe, arrivals, lens, {}

        out.append((f"{policy} {table.name} {rate:.0f} qps", make))
    return out


def bert_workloads(n: int, host: bool) -> list[tuple[str, object]]:
    """DVABatch on BERT-base (4 stages, RTE lengths) at 0.9 of its padded capacity; with ``host`` also under the
    triton-tensorrt stack (its host model and per-batch costs)."""
    from dvasim import config as cfgmod
    from dvasim.core.pipeline import Pipeline
    from dvasim.model.catalog import resolve_model
    from dvasim.policies import make_policy
    from dvasim.policies.dvabatch import padded_batch_ms
    from dvasim.server.resolve import resolve_stack
    from dvasim.workload import load_lengths, poisson_arrivals
    from dvasim.workload.config import length_rng

    model_cfg = {"name": "bert_base", "device": "titanrtx", "stages": 4}
    model = resolve_model(model_cfg)
    table = model.table
    B = 64
    pool = load_lengths("glue:RTE")
    rate = 0.9 * B / padded_batch_ms(table, pool, B) * 1000.0
    arrivals = poisson_arrivals(rate, n, seed=7)
    lens = length_rng(7).choice(pool, size=n, replace=True)
    out = []
    for stack in ["gpu-only"] + (["triton-tensorrt"] if host else []):
        cfg = cfgmod.resolve({"model": model_cfg, "policy": {"name": "dvabatch", "max_batch_size": B},
                              "workload": {"kind": "poisson", "rate_qps": rate, "n_queries": n, "seed": 7,
                                           "seq_len_dist": "glue:RTE"},
                              "server": {"stack": stack}})
        served = resolve_stack(cfg, model, None)

        def make(served=served):
            pipe = Pipeline(table, make_policy("dvabatch", {"max_batch_size": B}), 2, input_lengths=lens,
                            served=served)
            kw = {} if served.host is None else {"host": served.host, "batch_costs": served.batch,
                                                 "corun_per_worker": served.corun_per_worker}
            return pipe, arrivals, lens, kw

        out.append((f"dvabatch {table.name} {stack} {rate:.0f} qps", make))
    return out


def timed(simulate, make):
    pipe, arrivals, lens, kw = make()
    gc.collect()
    t0 = time.process_time()
    res = simulate(pipe, arrivals, lens, **kw)
    return time.process_time() - t0, res


def same_result(a, b, what: str) -> None:
    assert (a.sim_end_ms, a.device_busy_ms, a.stuck) == (b.sim_end_ms, b.device_busy_ms, b.stuck), what
    pd.testing.assert_frame_equal(a.records.frame(), b.records.frame(), check_exact=True, obj=what)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--host", action="store_true", help="also the BERT run under triton-tensorrt (host model path)")
    ap.add_argument("--rev", default="HEAD", help="git revision of the baseline engine (default HEAD)")
    ap.add_argument("--baseline", help="path of the baseline engine.py (instead of --rev)")
    ap.add_argument("--only", help="run only the workloads whose names contain one of these (comma-separated)")
    ap.add_argument("--json", help="also write the numbers to this JSON file")
    args = ap.parse_args()
    from dvasim.engines.sim import engine as new

    old, origin = load_baseline(args.rev, args.baseline)
    workloads = default_table_workloads(args.queries) + bert_workloads(args.queries, args.host)
    if args.only:
        workloads = [w for w in workloads if any(o in w[0] for o in args.only.split(","))]
    print(f"baseline {origin}; {args.queries:,} queries a run, {args.repeats} repeats interleaved, CPU seconds")
    rows = []
    for what, make in workloads:
        t_old, t_new = [], []
        for _ in range(args.repeats):
            a, res_old = timed(old.simulate, make)
            b, res_new = timed(new.simulate, make)
            assert res_old.stuck is None, res_old.stuck
            same_result(res_old, res_new, what)
            t_old.append(a)
            t_new.append(b)
        ratios = [b / a for a, b in zip(t_old, t_new)]
        row = {"workload": what, "baseline_s": statistics.median(t_old), "new_s": statistics.median(t_new),
               "ratio_median": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios)}
        rows.append(row)
        print(f"{what:>52}: baseline {row['baseline_s']:6.3f} s, new {row['new_s']:6.3f} s; new/baseline "
              f"{row['ratio_median']:.3f} (median; min {row['ratio_min']:.3f}, max {row['ratio_max']:.3f})",
              flush=True)
    print("records identical in every run")
    if args.json:
        Path(args.json).write_text(json.dumps({"baseline": origin, "queries": args.queries,
                                               "repeats": args.repeats, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
