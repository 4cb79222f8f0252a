"""The fidelity matrix: simulator vs real replay for the small BertBase, ResNet152 and UNet on this machine's CPU,
under ZeroBatch, DelayBatch and DVABatch at low, medium and high load.

    .venv/bin/python experiments/validation/run_matrix.py --calibrate     # calibration.json, then configs/
    .venv/bin/python experiments/validation/run_matrix.py [--repeats 3] [--only resnet152]

``--calibrate`` measures, per model and on a workload seed the matrix does not use (seed 2), what the simulator
needs to know about this CPU and the replay (``dvasim.fitting.validate.fit_engine``): the ZeroBatch capacity
(simulated with a serving-context table profiled now), the launch overhead per stage launch and the front door's
admission delay (from ZeroBatch replays at the three loads, pooled: ZeroBatch never runs two stages at once, and
the cores model adds that contention, since the host's launch work runs on the same cores) and the co-run slowdown of the ``cores``
sharing model (from a DVABatch replay at high load, where the stages overlap most); it writes ``calibration.json`` and the configs ``configs/<model>_<policy>_<load>
.toml`` from it (``--write-configs`` rewrites only the configs). Each case then runs
``dvasim.fitting.validate`` (a serving-context table profiled right before, the simulator once, the replay
``--repeats`` times, both deciding with that table); per-run files go to ``results/validation/<case>/`` (not
committed), the summary to ``summary.csv`` and ``summary.json`` next to this script. The timing is real: run it
on a quiet machine (the load average and the CPU other processes used are recorded per case).
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
LOADS = {"low": 0.2, "medium": 0.5, "high": 0.8}  # fractions of ZeroBatch's simulated capacity
STAGES = 3
MAX_BATCH = 16
DELAY_MS = 4.0
BERT_LENGTHS = "glue:MRPC"
# The simulator's model of this CPU (see README.md): every execution is single-threaded and takes a core; with n
# executions on the 2 cores each progresses at min(1, 2 / n) / corun_slowdown (sharing = "cores").
ENGINE = {"buffer_pairs": 2, "sharing": "cores", "cores": 2}
CALIBRATION = HERE / "calibration.json"
SECONDS = 6.0  # target length of one run
MIN_QUERIES, MAX_QUERIES = 300, 1500


def calibration() -> dict:
    if not CALIBRATION.is_file():
        raise SystemExit(f"{CALIBRATION.relative_to(ROOT)} is missing: run run_matrix.py --calibrate first")
    return json.loads(CALIBRATION.read_text())["models"]


def case_config(model: str, policy: str, load: str, cal: dict | None = None) -> dict:
    cal = (cal or calibration())[model]
    rate = round(LOADS[load] * cal["capacity_qps"], 1)
    n = int(min(MAX_QUERIES, max(MIN_QUERIES, rate * SECONDS)))
    wl = {"kind": "poisson", "rate_qps": rate, "n_queries": n, "seed": 1}
    if model.startswith("bert"):
        wl["seq_len_dist"] = BERT_LENGTHS
    pol = {"name": policy, "max_batch_size": MAX_BATCH}
    if policy == "delaybatch":
        pol["max_queue_delay_ms"] = DELAY_MS
    eng = {**ENGINE, **{k: round(cal[k], 3) for k in ("corun_slowdown", "launch_overhead_ms", "admission_delay_ms", "service_cv")}}
    if cal.get("admission_delay_quantiles_ms"):  # the measured distribution, not only its mean
        eng["admission_delay_ms"] = [round(x, 3) for x in cal["admission_delay_quantiles_ms"]]
    return {"model": {"name": model, "device": "cpu", "stages": STAGES}, "policy": pol, "workload": wl,
            "qos": {"target_ms": 200.0}, "engine": eng, "replay": {"modules": "torchscript"}}


def calibrate(runs_dir: Path, max_foreign: float | None) -> dict:
    """Per model: serving table now, ZeroBatch capacity with it, replays on seed 2, fit_engine."""
    from dvasim.api import run
    from dvasim.engines.replay.engine import replay
    from dvasim.fitting.validate import fit_engine, serving_stage_table
    from dvasim.model.profiling.profiler import wait_quiet

    base = {m: {"capacity_qps": 100.0, "corun_slowdown": 1.0, "launch_overhead_ms": 0.0,
                "admission_delay_ms": 0.0, "service_cv": 0.0} for m in MODELS}
    out = {}
    for m in MODELS:
        d = runs_dir / m
        d.mkdir(parents=True, exist_ok=True)
        if max_foreign is not None:
            wait_quiet(max_foreign, max_wait=120.0, probe=1.0)
        cfg = case_config(m, "zerobatch", "high", base)
        table = serving_stage_table(cfg, d / "stage_table.csv")
        cap_cfg = {**cfg, "model": {"table": str(table)}}
        cap_cfg["workload"] = {**cfg["workload"], "rate_qps": 5000.0, "n_queries": 3000}
        cap = run(cap_cfg).summary["throughput_qps"]
        cal = {m: {**base[m], "capacity_qps": cap}}
        runs = {}
        for pol, ld in (("zerobatch", "low"), ("zerobatch", "medium"), ("zerobatch", "high"), ("dvabatch", "high")):
            c = case_config(m, pol, ld, cal)
            c["workload"]["seed"] = 2
            runs[pol, ld] = replay(c, table=table)
        # the host's own costs where no two stages compete for the cores (ZeroBatch runs one stage at a time;
        # the cores model adds the contention), pooled over three loads: one replay's overheads are noisy ...
        base_fit = fit_engine([runs["zerobatch", ld] for ld in LOADS], cores=ENGINE["cores"])
        # ... and the co-run slowdown where the stages overlap most
        corun_fit = fit_engine([runs["dvabatch", "high"]], cores=ENGINE["cores"])
        # the loads are fractions of ZeroBatch's capacity *with* the fitted host costs (they take cores too)
        fitted = {"corun_slowdown": corun_fit["corun_slowdown"], "launch_overhead_ms": base_fit["launch_overhead_ms"],
                  "admission_delay_ms": base_fit["admission_delay_quantiles_ms"] or base_fit["admission_delay_ms"],
                  "service_cv": base_fit["service_cv"]}
        cap_cfg["engine"] = {**cap_cfg["engine"], **fitted}
        cap_fitted = run(cap_cfg).summary["throughput_qps"]
        out[m] = {"capacity_qps": round(cap_fitted, 1), "capacity_qps_without_host_costs": round(cap, 1),
                  "launch_overhead_ms": base_fit["launch_overhead_ms"], "service_cv": base_fit["service_cv"],
                  "admission_delay_ms": base_fit["admission_delay_ms"],
                  "admission_delay_quantiles_ms": base_fit["admission_delay_quantiles_ms"],
                  "corun_slowdown": corun_fit["corun_slowdown"],
                  "fit_zerobatch_3_loads": base_fit, "fit_high_load_dvabatch": corun_fit,
                  "table": str(table.relative_to(ROOT)) if table.is_relative_to(ROOT) else str(table)}
        print(m, json.dumps(out[m]), flush=True)
    CALIBRATION.write_text(json.dumps({
        "method": "run_matrix.py --calibrate: serving-context table, ZeroBatch capacity simulated with it, "
                  "launch overhead and admission delay from fit_engine on ZeroBatch replays at 20, 50 and 80% of that capacity pooled (the host's costs without two stages competing for the cores: the cores model adds that), co-run slowdown from one on a DVABatch replay at 80% (seed 2)",
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "loadavg": list(os.getloadavg()),
        "models": out}, indent=2) + "\n")
    return out


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)


def write_configs() -> list[Path]:
    out = []
    cal = calibration()
    d = HERE / "configs"
    d.mkdir(exist_ok=True)
    for m in MODELS:
        for p in POLICIES:
            for ld in LOADS:
                c = case_config(m, p, ld, cal)
                lines = [f"# fidelity matrix: {m} (small, CPU) under {p} at {ld} load ({LOADS[ld]:.0%} of ZeroBatch's "
                         f"simulated capacity); [engine] from calibration.json; written by run_matrix.py"]
                for sec, vals in c.items():
                    lines.append(f"[{sec}]")
                    lines += [f"{k} = {_toml_value(v)}" for k, v in vals.items()]
                path = d / f"{m}_{p}_{ld}.toml"
                path.write_text("\n".join(lines) + "\n")
                out.append(path)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default=None, help="run only cases whose name contains this")
    ap.add_argument("--write-configs", action="store_true")
    ap.add_argument("--table", default="serving", choices=("serving", "fresh", "shipped"),
                    help="simulate with a per-stage table profiled just before each case as the replay runs the "
                         "stages (default), in a hot loop (fresh), or the shipped CPU table")
    ap.add_argument("--calibrate", action="store_true",
                    help="measure capacity, launch overhead, admission delay and co-run slowdown per model (seed 2) "
                         "into calibration.json, then write the configs")
    ap.add_argument("--runs-dir", default=str(ROOT / "results" / "validation"))
    ap.add_argument("--max-foreign-load", type=float, default=0.25,
                    help="wait for / retry replays until other processes use at most this many cores (-1: never)")
    ap.add_argument("--summary", default=str(HERE / "summary"), help="summary path without extension")
    args = ap.parse_args()
    if args.write_configs:
        for p in write_configs():
            print(p.relative_to(ROOT))
        return 0
    import pandas as pd

    from dvasim.fitting.validate import validate

    mf = None if args.max_foreign_load < 0 else args.max_foreign_load
    if args.calibrate:
        calibrate(Path(args.runs_dir + "_calibration"), mf)
        for p in write_configs():
            print(p.relative_to(ROOT))
        return 0
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
                       max_foreign=mf)
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
        ar = [x for x in fid.get("alone_ratio_per_repeat") or [] if x is not None]
        row["alone_ratio"] = sum(ar) / len(ar) if ar else None  # real / table speed of lone executions (drift)
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
    meta = {"engine": ENGINE, "calibration": calibration(), "table": args.table, "loads": LOADS, "targets": {"mean": 0.10, "p99": 0.20},
            "cpu": os.cpu_count(), "python": sys.version.split()[0],
            "n_cases": len(rows), "n_within": int(sum(bool(r.get("mean_ok")) and bool(r.get("p99_ok")) for r in rows)),
            "cases": rows}
    summary_json.write_text(json.dumps(meta, indent=2, default=str) + "\n")
    print(f"{meta['n_within']} of {meta['n_cases']} cases within the targets; summary in {args.summary}.csv/.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
