"""What a simulated query costs, as a ratio to the bare SimPy loop, in CPU time, interleaved in one process.

This machine is shared and noisy, so nothing is compared across runs: every repeat runs the bare SimPy loop
(:func:`bench_speed.bare_simpy_loop`: arrivals into a ``simpy.Store``, one server, an M/M/1 queue at 0.9 load)
and then each case on the same number of queries, and the ratio is taken within the repeat; the median ratio
over the repeats is printed. Times are CPU times (``time.process_time``) of ``dvasim.run(config)``: the whole
run a user pays for (config, tables, the engine, the records and the summary).

Cases (issue 25's targets in brackets):

* DVABatch at the benchmark load: BERT-base on the TITAN RTX, 4 stages, GLUE RTE lengths, Poisson arrivals at
  ``sat`` = 0.9 x ``64 / E[T(64)]`` (:func:`bench_speed.bert_config`) on the GPU alone (``gpu-only``) [6x];
* ZeroBatch and DelayBatch (10 ms window) at 0.9 of their peak, the same load: ``64 / E[T(64)]`` is their
  saturation throughput (full batches of 64 RTE inputs padded to the longest) [3x];
* with ``--stacks gpu-only,triton-tensorrt`` also each of them on the paper's serving stack (the host model's
  path: one process per executor), what ``make run`` runs.

``--profile`` then profiles one DVABatch run (cProfile) and prints the self time by module (the share of the
run's time spent in the code of each module), the profile the closing note of issue 25 asks for.

    python benchmarks/bench_ratio.py [--queries N] [--repeats R] [--policies dvabatch,zerobatch,delaybatch]
                                     [--stacks gpu-only] [--profile] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import simpy  # noqa: E402
from bench_speed import bare_simpy_loop, bert_config  # noqa: E402

TARGETS = {"dvabatch": 6.0, "zerobatch": 3.0, "delaybatch": 3.0}  # issue 25, on the GPU alone


def cpu(fn) -> tuple[float, object]:
    t0 = time.process_time()
    out = fn()
    return time.process_time() - t0, out


def by_module(stats: pstats.Stats, compiled: bool = False) -> list[tuple[str, float]]:
    """Self time per module (a file's path shortened to the package's module or the library's name). cProfile sees
    a compiled module's functions as built-ins: with the compiled core they are counted under that name."""
    share: dict[str, float] = defaultdict(float)
    for (path, _line, _fn), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():
        if "/dvasim/" in path:
            name = "dvasim." + path.rsplit("/dvasim/", 1)[1].removesuffix(".py").replace("/", ".")
        elif "/simpy/" in path:
            name = "simpy"
        elif path == "~":
            name = ("the compiled core (mypyc) and builtins" if compiled
                    else "builtins (len, max, list and dict methods, ...)")
        else:
            name = "other (numpy, pandas, the standard library)"
        share[name] += tt
    total = sum(share.values())
    return sorted(((k, v / total) for k, v in share.items()), key=lambda kv: -kv[1])


def main() -> None:
    import dvasim

    try:
        from dvasim.compiled import compiled_modules
    except ImportError:  # a tree from before the compiled core (PYTHONPATH=an older checkout, for a baseline)
        def compiled_modules() -> dict[str, bool]:
            return {}

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=50_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--policies", default="dvabatch,zerobatch,delaybatch")
    ap.add_argument("--stacks", default="gpu-only")
    ap.add_argument("--profile", action="store_true", help="profile one DVABatch run: self time by module")
    ap.add_argument("--json", help="also write the numbers to this JSON file")
    args = ap.parse_args()
    n = args.queries
    cases = [(p, st) for st in args.stacks.split(",") for p in args.policies.split(",")]
    compiled = compiled_modules()
    core = "compiled" if compiled and all(compiled.values()) else "pure" if not any(compiled.values()) else "mixed"
    where = Path(dvasim.__file__).parent.parent
    print(f"{n:,} queries a run, {args.repeats} interleaved repeats, CPU time; python "
          f"{platform.python_version()}, simpy {simpy.__version__}, core {core}, dvasim from {where}")
    for p, st in cases:  # warm: imports, tables, caches
        dvasim.run(bert_config(p, 2_000, "sat", st))
    ratios: dict[tuple[str, str], list[float]] = {c: [] for c in cases}
    bare_s: list[float] = []
    summaries = {}
    for _ in range(args.repeats):
        for c in cases:
            bare, _ = cpu(lambda: bare_simpy_loop(n))
            bare_s.append(bare)
            t, res = cpu(lambda c=c: dvasim.run(bert_config(c[0], n, "sat", c[1])))
            assert res.summary["n_completed"] == n, res.summary
            summaries[c] = res.summary
            ratios[c].append(t / bare)
    rows = []
    print(f"{'bare SimPy loop':>34}: {statistics.median(bare_s) / n * 1e6:6.2f} us a query (CPU)")
    for (p, st), rs in ratios.items():
        med = statistics.median(rs)
        target = TARGETS.get(p) if st == "gpu-only" else None
        verdict = "" if target is None else f"  target <= {target:g}x: {'met' if med <= target else 'NOT met'}"
        s = summaries[(p, st)]
        print(f"{p + ' on ' + st:>34}: {med:6.2f}x the bare loop (min {min(rs):.2f}, max {max(rs):.2f}; "
              f"exit batch {s['mean_exit_batch_size']:.2f}){verdict}")
        rows.append({"policy": p, "stack": st, "ratio_median": med, "ratios": rs, "target": target,
                     "offered_qps": s["offered_qps"] if "offered_qps" in s else None,
                     "mean_exit_batch_size": s["mean_exit_batch_size"]})
    prof_rows = []
    if args.profile:
        cfg = bert_config("dvabatch", n, "sat", "gpu-only")
        pr = cProfile.Profile()
        pr.runcall(dvasim.run, cfg)
        prof_rows = by_module(pstats.Stats(pr), core != "pure")
        print("DVABatch on gpu-only, self time by module (cProfile):")
        for name, share in prof_rows[:14]:
            print(f"  {100 * share:5.1f}%  {name}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "queries": n, "repeats": args.repeats, "core": core, "python": platform.python_version(),
            "simpy": simpy.__version__, "bare_us_per_query": statistics.median(bare_s) / n * 1e6, "rows": rows,
            "profile_by_module": prof_rows}, indent=2))


if __name__ == "__main__":
    main()
