"""The cost of one run of a study, and how a 10,000-run study divides across workers.

Runs the runs a study is made of -- every model of the paper's zoo under ZeroBatch, DelayBatch and DVABatch at
medium load (0.6 of DelayBatch's peak, from the committed ``experiments/results/compare/calibration.csv``), 5,000
Poisson queries each, as ``dvasim compare`` runs them -- one after another in this process, and reports the wall
time and peak memory of one run. A study's runs are independent, so W workers (local processes, or a Dask cluster
with ``dvasim sweep --dask``) take about ``runs x per-run cost / W``; the table printed at the end says so for a
10,000-run study.

    python benchmarks/bench_study.py [--queries N] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=5000)
    ap.add_argument("--json", help="also write the numbers to this JSON file")
    args = ap.parse_args()
    import dvasim
    from dvasim.studies import evaluation as study

    calib = pd.read_csv(ROOT / "experiments/results/compare/calibration.csv").set_index("model")
    rows = []
    for model in study.MODELS:
        rate = float(calib.loc[model, "peak_qps_delaybatch"]) * study.LOADS["medium"]
        window = float(calib.loc[model, "delaybatch_window_ms"])
        for label in ("zerobatch", "delaybatch", "dvabatch"):
            wl = {"kind": "poisson", "rate_qps": rate, "n_queries": args.queries, "seed": 1}
            cfg = study.variant_config(label, model, window, wl)
            t0 = time.perf_counter()
            r = dvasim.run(cfg)
            wall = time.perf_counter() - t0
            rows.append({"model": model, "policy": label, "wall_s": wall, "queries": args.queries,
                         "engine_q_per_s": r.summary["sim_queries_per_wall_s"]})
            print(f"{model:>10} {label:>10}: {wall:6.3f} s  ({r.summary['sim_queries_per_wall_s']:,.0f} q/s in the "
                  f"engine)")
    walls = [r["wall_s"] for r in rows]
    per_run = statistics.mean(walls)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"per run: mean {per_run:.3f} s, median {statistics.median(walls):.3f} s, max {max(walls):.3f} s; "
          f"peak memory of this process {peak:,.0f} MiB")
    print("a 10,000-run study of such runs:")
    for w in (1, 2, 16, 64, 256):
        print(f"  {w:>4} workers: {10_000 * per_run / w / 60:8.1f} min")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "per_run_s": per_run, "peak_rss_mib": peak}, indent=1))


if __name__ == "__main__":
    main()
