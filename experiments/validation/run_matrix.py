"""The fidelity matrix: simulator vs real replay for the small BertBase, ResNet152 and UNet on this machine's CPU,
under ZeroBatch, DelayBatch and DVABatch at low, medium and high load.

    .venv/bin/python experiments/validation/run_matrix.py [--repeats 3] [--only resnet152] [--write-configs]

``--write-configs`` (re)writes ``configs/<model>_<policy>_<load>.toml`` from the constants below. Each case
runs ``dvasim.replay.validate`` (the simulator once, the replay ``--repeats`` times); the per-run files go to
``results/validation/<case>/`` (not committed), the summary to ``summary.csv`` and ``summary.json`` next to
this script. The timing is real: run it on a quiet machine (the load average is recorded per case).

Loads are fractions of ZeroBatch's saturation throughput in the simulator (``CAPACITY_QPS``: measured with
``--capacity``, which re-derives them), so each model is loaded alike.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

MODELS = ("bert_base", "resnet152", "unet")
POLICIES = ("zerobatch", "delaybatch", "dvabatch")
LOADS = {"low": 0.2, "medium": 0.5, "high": 0.8}
STAGES = 3
MAX_BATCH = 16
DELAY_MS = 4.0
BERT_LENGTHS = "glue:MRPC"
# The simulator's model of this CPU (see README.md): two single-threaded executions run on the two cores
# side by side ("parallel"), each slowed down by the co-run slowdown while they overlap; every stage launch
# costs the replay's measured scheduling overhead (benchmarks/bench_replay_overhead.py).
ENGINE = {"buffer_pairs": 2, "sharing": "parallel"}
# per-model cost of a stage launch beyond the stage's own time in the serving-context table (scheduling and
# buffer copies): open-loop "sched" + "copy" of benchmarks/bench_replay_overhead.py (benchmarks/results/)
LAUNCH_OVERHEAD_MS = {"bert_base": 0.24, "resnet152": 0.23, "unet": 0.28}
# per-model co-run slowdown (eager PyTorch: the executor threads also contend for the GIL between operators,
# so models with many small operators slow each other down more); fitted by --calibrate (see README.md)
CORUN_SLOWDOWN = {"bert_base": 1.3, "resnet152": 1.3, "unet": 1.1}
# ZeroBatch saturation throughput of the simulator with ENGINE (qps), from --capacity
CAPACITY_QPS = {"bert_base": 425.1, "resnet152": 390.0, "unet": 155.8}
SECONDS = 6.0  # target length of one run
MIN_QUERIES, MAX_QUERIES = 300, 1500


def case_config(model: str, policy: str, load: str) -> dict:
    rate = round(LOADS[load] * CAPACITY_QPS[model], 1)
    n = int(min(MAX_QUERIES, max(MIN_QUERIES, rate * SECONDS)))
    wl = {"kind": "poisson", "rate_qps": rate, "n_queries": n, "seed": 1}
    if model.startswith("bert"):
        wl["seq_len_dist"] = BERT_LENGTHS
    pol = {"name": policy, "max_batch_size": MAX_BATCH}
    if policy == "delaybatch":
        pol["max_queue_delay_ms"] = DELAY_MS
    return {"model": {"name": model, "device": "cpu", "stages": STAGES}, "policy": pol, "workload": wl,
            "qos": {"target_ms": 200.0},
            "engine": {**ENGINE, "corun_slowdown": CORUN_SLOWDOWN[model], "launch_overhead_ms": LAUNCH_OVERHEAD_MS[model]}}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)


def write_configs() -> list[Path]:
    out = []
    d = HERE / "configs"
    d.mkdir(exist_ok=True)
    for m in MODELS:
        for p in POLICIES:
            for ld in LOADS:
                c = case_config(m, p, ld)
                lines = [f"# fidelity matrix: {m} (small, CPU table) under {p} at {ld} load "
                         f"({LOADS[ld]:.0%} of ZeroBatch's simulated capacity); written by run_matrix.py"]
                for sec, vals in c.items():
                    lines.append(f"[{sec}]")
                    lines += [f"{k} = {_toml_value(v)}" for k, v in vals.items()]
                path = d / f"{m}_{p}_{ld}.toml"
                path.write_text("\n".join(lines) + "\n")
                out.append(path)
    return out


def capacity() -> dict:
    from dvasim.api import run

    caps = {}
    for m in MODELS:
        c = case_config(m, "zerobatch", "high")
        c["workload"].update(rate_qps=5000.0, n_queries=4000)
        caps[m] = round(run(c).summary["throughput_qps"], 1)
    return caps


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default=None, help="run only cases whose name contains this")
    ap.add_argument("--write-configs", action="store_true")
    ap.add_argument("--capacity", action="store_true", help="print ZeroBatch's simulated saturation throughput")
    ap.add_argument("--table", default="serving", choices=("serving", "fresh", "shipped"),
                    help="simulate with a per-stage table profiled just before each case as the replay runs the "
                         "stages (default), in a hot loop (fresh), or the shipped CPU table")
    ap.add_argument("--calibrate", action="store_true",
                    help="fit the co-run slowdowns: replay DVABatch and DelayBatch at high load with another seed "
                         "(into <runs-dir>_calibration) and print what analyze_sharing.py finds")
    ap.add_argument("--runs-dir", default=str(ROOT / "results" / "validation"))
    ap.add_argument("--max-foreign-load", type=float, default=0.25,
                    help="wait for / retry replays until other processes use at most this many cores (-1: never)")
    ap.add_argument("--summary", default=str(HERE / "summary"), help="summary path without extension")
    args = ap.parse_args()
    if args.capacity:
        print(json.dumps(capacity(), indent=2))
        return 0
    if args.write_configs:
        for p in write_configs():
            print(p.relative_to(ROOT))
        return 0
    import pandas as pd

    from dvasim.replay.validate import validate

    if args.calibrate:
        calib = Path(args.runs_dir + "_calibration")
        for m in MODELS:
            for p in ("dvabatch", "delaybatch"):
                validate(HERE / "configs" / f"{m}_{p}_high.toml", calib / f"{m}_{p}_high", repeats=1, figure=False,
                         overrides=["workload.seed=2"], table=args.table,
                         max_foreign=None if args.max_foreign_load < 0 else args.max_foreign_load)
        import subprocess

        return subprocess.call([sys.executable, str(HERE / "analyze_sharing.py"), "--runs-dir", str(calib)])
    rows = []
    summary_json = Path(args.summary + ".json")
    previous = json.loads(summary_json.read_text()) if args.only and summary_json.is_file() else {"cases": []}
    cases = sorted((HERE / "configs").glob("*.toml"))
    for path in cases:
        name = path.stem
        if args.only and args.only not in name:
            continue
        m, p, ld = name.rsplit("_", 2)[0], name.rsplit("_", 2)[1], name.rsplit("_", 2)[2]
        t0 = time.time()
        fid = validate(path, Path(args.runs_dir) / name, repeats=args.repeats, figure=True, table=args.table,
                       max_foreign=None if args.max_foreign_load < 0 else args.max_foreign_load)
        mt = fid["metrics"]
        row = {"case": name, "model": m, "policy": p, "load": ld, "rate_qps": fid["workload"].get("rate_qps"),
               "n_queries": fid["workload"].get("n_queries"), "repeats": args.repeats}
        for key, short in (("mean_latency_ms", "mean"), ("p50_latency_ms", "p50"), ("p99_latency_ms", "p99"),
                           ("throughput_qps", "thr")):
            r = mt[key]
            row.update({f"{short}_sim": r["sim"], f"{short}_real": r["real_mean"], f"{short}_err": r["rel_error"],
                        f"{short}_spread": r["real_spread"]})
            if "within" in r:
                row[f"{short}_ok"] = r["within"]
        row["exit_bs_sim"] = fid["mean_exit_batch_size"]["sim"]
        row["exit_bs_real"] = sum(fid["mean_exit_batch_size"]["real"]) / args.repeats
        row["overhead_ms_real"] = sum(fid["measured_launch_overhead_ms"]) / args.repeats
        row["loadavg_before"] = fid["loadavg_before"][0] if fid["loadavg_before"] else None
        row["loadavg_after"] = fid["loadavg_after"][0] if fid["loadavg_after"] else None
        fc = [f for f in fid["foreign_cores"] if f is not None]
        row["foreign_cores_max"] = max(fc) if fc else None
        rows.append(row)
        print(f"{name:<28} mean {row['mean_sim']:8.2f} vs {row['mean_real']:8.2f} ({row['mean_err']:+6.1%}, "
              f"spread {row['mean_spread']:5.1%}) p99 {row['p99_sim']:8.2f} vs {row['p99_real']:8.2f} "
              f"({row['p99_err']:+6.1%})  {'ok' if row['mean_ok'] and row['p99_ok'] else 'MISS'}  "
              f"others {row['foreign_cores_max']}  {time.time() - t0:.0f}s", flush=True)
    done = {r["case"] for r in rows}
    rows = [r for r in previous["cases"] if r["case"] not in done] + rows
    rows.sort(key=lambda r: (MODELS.index(r["model"]) if r["model"] in MODELS else 99,
                             POLICIES.index(r["policy"]) if r["policy"] in POLICIES else 99,
                             list(LOADS).index(r["load"]) if r["load"] in LOADS else 99))
    df = pd.DataFrame(rows)
    df.to_csv(args.summary + ".csv", index=False, float_format="%.4g")
    meta = {"engine": ENGINE, "corun_slowdown": CORUN_SLOWDOWN, "launch_overhead_ms": LAUNCH_OVERHEAD_MS,
            "table": args.table, "capacity_qps": CAPACITY_QPS, "loads": LOADS, "targets": {"mean": 0.10, "p99": 0.20},
            "cpu": os.cpu_count(), "python": sys.version.split()[0],
            "n_cases": len(rows), "n_within": int(sum(bool(r.get("mean_ok")) and bool(r.get("p99_ok")) for r in rows)),
            "cases": rows}
    summary_json.write_text(json.dumps(meta, indent=2, default=str) + "\n")
    print(f"{meta['n_within']} of {meta['n_cases']} cases within the targets; summary in {args.summary}.csv/.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
