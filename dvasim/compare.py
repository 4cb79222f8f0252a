"""``dvasim compare``: the paper's Figures 14 and 16 in simulation (six models x three loads x ZeroBatch /
DelayBatch / DVABatch on the Titan RTX tables), with DVABatch's latency reduction against each baseline."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd

from dvasim import study

PAPER = {  # the paper's average reductions (§8.2), for the printout
    "mean_latency_ms": {"zerobatch": (16.1, 39.0, 57.7), "delaybatch": (35.4, 47.3, 48.5)},
    "p99_latency_ms": {"zerobatch": (16.9, 27.4, 53.7), "delaybatch": (45.2, 45.1, 29.2)},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dvasim compare", description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(study.MODELS), help="comma-separated model names")
    ap.add_argument("--device", default="titanrtx", help="titanrtx | a100 | h100 | cpu")
    ap.add_argument("--queries", type=int, default=5000, help="queries per (model, load, policy) run")
    ap.add_argument("--workers", type=int, default=2, help="processes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="fewer queries and bisection steps (a smoke run)")
    ap.add_argument("--out", default="results/compare", help="output directory")
    args = ap.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in study.MODELS]
    if unknown:
        print(f"dvasim compare: error: --models: unknown {unknown[0]!r}; allowed: {', '.join(study.MODELS)}",
              file=sys.stderr)
        return 2
    if args.queries < 100 or args.workers < 1:
        print("dvasim compare: error: --queries must be >= 100 and --workers >= 1", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results, calib = study.compare(models, n_queries=1000 if args.quick else args.queries, seed=args.seed,
                                   workers=args.workers, device=args.device, refine=2 if args.quick else 4)
    red_mean = study.reductions(results, "mean_latency_ms")
    red_p99 = study.reductions(results, "p99_latency_ms")
    results.to_csv(out / "compare.csv", index=False)
    calib.to_csv(out / "calibration.csv", index=False)
    red = red_mean.merge(red_p99, on=["model", "load"], suffixes=("_mean", "_p99"))
    red.to_csv(out / "reductions.csv", index=False)
    from dvasim.plots import policy_bars

    policy_bars(results, "mean_latency_ms", out / "fig14_mean_latency.png", "mean latency (paper Figure 14)")
    policy_bars(results, "p99_latency_ms", out / "fig16_p99_latency.png", "p99 latency (paper Figure 16)")
    print_report(results, calib, red, sys.stdout)
    print(f"\n{len(results)} runs in {time.perf_counter() - t0:.0f} s; results in {out}/")
    return 0


def print_report(results: pd.DataFrame, calib: pd.DataFrame, red: pd.DataFrame, file) -> None:
    pd.set_option("display.width", 160)
    print("\nDelayBatch window (tuned for peak throughput) and peak throughput (p99 <= 200 ms):", file=file)
    print(calib.round(1).to_string(index=False), file=file)
    for metric, label in (("mean_latency_ms", "mean"), ("p99_latency_ms", "p99")):
        piv = results.pivot_table(index=["model", "load"], columns="policy", values=metric)
        piv = piv[[p for p in study.POLICIES if p in piv.columns]]
        r = red.set_index(["model", "load"])[[f"vs_zerobatch_%_{label}", f"vs_delaybatch_%_{label}"]]
        table = piv.join(r).reindex(sorted(piv.index, key=lambda k: (k[0], list(study.LOADS).index(k[1]))))
        print(f"\n{label} latency (ms) and DVABatch's reduction (%):", file=file)
        print(table.round(2).to_string(), file=file)
        avg = red.groupby("load")[[f"vs_zerobatch_%_{label}", f"vs_delaybatch_%_{label}"]].mean()
        avg = avg.reindex([x for x in study.LOADS if x in avg.index])
        print(f"\naverage {label} reduction over models (ours | paper):", file=file)
        for i, (load, row) in enumerate(avg.iterrows()):
            pz, pdl = PAPER[metric]["zerobatch"][i], PAPER[metric]["delaybatch"][i]
            print(f"  {load:>6}: vs ZeroBatch {row.iloc[0]:6.1f}% | {pz:4.1f}%   "
                  f"vs DelayBatch {row.iloc[1]:6.1f}% | {pdl:4.1f}%", file=file)
