"""The real-Triton check (issue 46): fit the simulator's stack to the real server's calibration runs, then predict
cases it never saw, each served twice on the real server, and score the predictions beside the real run-to-run
spread.

    python experiments/validation/triton/matrix.py --out experiments/validation/triton/results   # make triton-check
    python experiments/validation/triton/matrix.py --tiny --out results/triton_tiny               # CI: seconds
    python experiments/validation/triton/matrix.py --resimulate --out experiments/validation/triton/results

The server: tritonserver 2.51.0 (r24.10) from .venv/triton (make triton-env); the model: the one-stage table
T(b) = 3 + 0.6 b ms (linear_table.csv) on the triton engine's emulated device, max_batch_size 32, one instance
unless a case says. Calibration: ZeroBatch at 200, 500 and 800 QPS and a 20 QPS idle probe, fitted by
``dvasim fit`` into a stack file (``stack.toml``). Every case is then simulated with that stack (the same
workload, seed and config.pbtxt) and compared with its real runs: mean and p99 latency, throughput.

Writes, under ``--out``: ``real/<case>_r<k>/`` (each real run's compact records, ``queries.csv.gz``, its
``summary.json`` and ``executions.csv``: the server's own folder is not kept), ``stack.toml`` and ``fit.json``,
``cases.csv`` (one row per case: real runs, prediction, errors, spread, the machine's load) and ``summary.md``.
``--resimulate`` re-derives the fit and the predictions from the real runs already there.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
TABLE = HERE / "linear_table.csv"
KEEP = ["qid", "arrival_ms", "sent_ms", "seen_ms", "admitted_ms", "start_ms", "exec_start_ms", "device_start_ms",
        "device_end_ms", "exec_end_ms", "compute_end_ms", "finish_ms", "status", "batch_id", "exit_batch_size",
        "instance", "priority", "seq_len", "stage0_start_ms", "stage0_finish_ms", "exit_batch_id"]
TARGETS = {"mean": 0.05, "p99": 0.10, "throughput": 0.03}
N = 3000

ZB = {"name": "zerobatch", "max_batch_size": 32}


def poisson(rate, n=N, seed=1):
    return {"kind": "poisson", "rate_qps": float(rate), "n_queries": n, "seed": seed}


CALIBRATION = {
    "zb_200": (ZB, {}, poisson(200), None),
    "zb_500": (ZB, {}, poisson(500), None),
    "zb_800": (ZB, {}, poisson(800), None),
    "idle_20": (ZB, {}, poisson(20, 200), None),
}
CASES = {
    "delay_1ms_600": ({"name": "delaybatch", "max_batch_size": 32, "max_queue_delay_ms": 1.0}, {}, poisson(600), None),
    "delay_2ms_800": ({"name": "delaybatch", "max_batch_size": 32, "max_queue_delay_ms": 2.0}, {}, poisson(800), None),
    "delay_5ms_600": ({"name": "delaybatch", "max_batch_size": 32, "max_queue_delay_ms": 5.0}, {}, poisson(600), None),
    "preferred_4_8_600": ({"name": "delaybatch", "max_batch_size": 32, "max_queue_delay_ms": 2.0,
                           "preferred_batch_size": [4, 8]}, {}, poisson(600), None),
    "mbs8_700": ({"name": "zerobatch", "max_batch_size": 8}, {}, poisson(700), None),
    "instances2_800": (ZB, {"instances": 2}, poisson(800), None),
    "instances3_1000": (ZB, {"instances": 3}, poisson(1000), None),
    "queue_size_8_1000": (None, {}, poisson(1000),
                          "max_batch_size: 32\ndynamic_batching { default_queue_policy { max_queue_size: 8 } }\n"),
    "timeout_20ms_1000": (None, {}, poisson(1000),
                          "max_batch_size: 32\ndynamic_batching { default_queue_policy { timeout_action: REJECT "
                          "default_timeout_microseconds: 20000 } }\n"),
    "priority_2_700": (None, {}, {**poisson(700), "priority_mix": [0.3, 0.7]},
                       "max_batch_size: 32\ndynamic_batching { priority_levels: 2 default_priority_level: 2 }\n"),
    "stepping_200_1000": (ZB, {}, {"kind": "stepping", "start_qps": 200.0, "end_qps": 1000.0, "step_queries": 750,
                                   "n_queries": N, "seed": 1}, None),
    "closed_1": (ZB, {}, {"kind": "closed", "clients": 1, "think_ms": 0.0, "n_queries": 1000, "seed": 1}, None),
    "closed_4": (ZB, {}, {"kind": "closed", "clients": 4, "think_ms": 0.0, "n_queries": 2000, "seed": 1}, None),
    "closed_16": (ZB, {}, {"kind": "closed", "clients": 16, "think_ms": 0.0, "n_queries": N, "seed": 1}, None),
}
TINY_CALIBRATION = {"zb_200": (ZB, {}, poisson(200, 300), None)}
TINY_CASES = {"delay_2ms_400": ({"name": "delaybatch", "max_batch_size": 32, "max_queue_delay_ms": 2.0}, {},
                                poisson(400, 300), None)}


def config(spec, out: Path, name: str) -> dict:
    policy, engine, workload, pbtxt = spec
    if pbtxt is not None:
        p = out / "pbtxt" / f"{name}.pbtxt"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(pbtxt)
        policy = {"triton_config": str(p)}
    return {"model": {"table": str(TABLE)}, "policy": dict(policy), "engine": {**engine, "progress": False},
            "workload": dict(workload), "qos": {"target_ms": 200.0}}


def serve_once(spec, out: Path, name: str) -> Path:
    from dvasim.api import write_outputs
    from dvasim.engines.triton import serve, write_extras

    folder = out / "real" / name
    work = out / "work" / name
    r = serve(config(spec, out, name), work_dir=work)
    if folder.exists():
        shutil.rmtree(folder)
    write_outputs(r, folder, figure=False, csv=False)
    write_extras(r, folder)
    (folder / "queries.parquet").unlink()
    r.queries[[c for c in KEEP if c in r.queries]].to_csv(folder / "queries.csv.gz", index=False,
                                                          float_format="%.4f")
    shutil.rmtree(work, ignore_errors=True)
    s = r.summary
    print(f"  real {name}: mean {s.get('mean_latency_ms', float('nan')):.2f} ms, p99 "
          f"{s.get('p99_latency_ms', float('nan')):.2f} ms, {s['throughput_qps']:.1f} qps, batch "
          f"{s['mean_batch_size']:.2f}, lag p99 {s['client_lag_ms_p99']:.2f} ms, others "
          f"{s['machine']['others_cpu_s']:.2f} CPU s, load {s['machine']['load_before'].get('loadavg', ['?'])[0]}",
          flush=True)
    return folder


def metrics(summary: dict) -> dict:
    return {"mean": summary.get("mean_latency_ms", np.nan), "p99": summary.get("p99_latency_ms", np.nan),
            "throughput": summary.get("throughput_qps", np.nan)}


def simulate(spec, out: Path, name: str, stack: Path) -> dict:
    import dvasim

    r = dvasim.run(config(spec, out, name), stack=str(stack), progress=False)
    return {**metrics(r.summary), "batch": r.summary.get("mean_exit_batch_size", np.nan)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tiny", action="store_true", help="one calibration run and one case, 300 queries (CI)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--resimulate", action="store_true", help="reuse the real runs under --out")
    ap.add_argument("--only", default=None, help="comma-separated case names (calibration always runs)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    calib, cases = (TINY_CALIBRATION, TINY_CASES) if args.tiny else (CALIBRATION, CASES)
    if args.only:
        cases = {k: v for k, v in cases.items() if k in args.only.split(",")}
    t0 = time.monotonic()
    if not args.resimulate:
        print("calibration (real server):", flush=True)
        for name, spec in calib.items():
            serve_once(spec, out, name)
        print("cases (real server, each twice):", flush=True)
        for name, spec in cases.items():
            for k in range(1, args.repeats + 1):
                serve_once(spec, out, f"{name}_r{k}")
    from dvasim.fitting.triton_fit import fit_stack, write_stack

    stack, report = fit_stack([out / "real" / n for n in calib])
    stack_path = write_stack(stack, report, out / "stack.toml")
    (out / "fit.json").write_text(json.dumps(report, indent=1))
    print(f"fitted: entry {report['entry_ms'][0]:.3f} + {report['entry_ms'][1]:.4f} b ms, exit "
          f"{stack.sync_ms:.3f} ms, client path p50 {report['client_path_ms']['p50']:.3f} / p99 "
          f"{report['client_path_ms']['p99']:.3f} ms", flush=True)
    rows = []
    for name, spec in {**calib, **cases}.items():
        runs = [name] if name in calib else [f"{name}_r{k}" for k in range(1, args.repeats + 1)]
        real = []
        for run in runs:
            s = json.loads((out / "real" / run / "summary.json").read_text())
            real.append((metrics(s), s))
        sim = simulate(spec, out, name, stack_path)
        row = {"case": name, "calibration": name in calib}
        for m in TARGETS:
            vals = [r[0][m] for r in real]
            ref = float(np.mean(vals))
            row[f"real_{m}"] = " / ".join(f"{v:.4g}" for v in vals)
            row[f"sim_{m}"] = round(sim[m], 4)
            row[f"err_{m}"] = round((sim[m] - ref) / ref, 4) if ref else np.nan
            row[f"spread_{m}"] = round(abs(vals[0] - vals[1]) / ref, 4) if len(vals) > 1 and ref else np.nan
        row["real_batch"] = " / ".join(f"{r[1]['mean_exit_batch_size']:.3g}" for r in real)
        row["sim_batch"] = round(sim["batch"], 3)
        row["repeatable"] = bool(all(row[f"spread_{m}"] <= t for m, t in TARGETS.items())) if len(real) > 1 else None
        row["holds"] = bool(all(abs(row[f"err_{m}"]) <= t for m, t in TARGETS.items()))
        row["within_spread"] = bool(all(abs(row[f"err_{m}"]) <= max(t, row[f"spread_{m}"] or 0)
                                        for m, t in TARGETS.items()))
        row["client_behind"] = any(r[1].get("client_behind") for r in real)
        row["others_cpu_s"] = " / ".join(f"{r[1]['machine']['others_cpu_s']:.2f}" for r in real)
        row["loadavg"] = " / ".join(str(r[1]["machine"]["load_before"].get("loadavg", ["?"])[0]) for r in real)
        rows.append(row)
        print(f"  {name}: mean {row['err_mean']:+.1%} (spread {row['spread_mean']:.1%}), p99 {row['err_p99']:+.1%}, "
              f"throughput {row['err_throughput']:+.1%}{'  holds' if row['holds'] else ''}", flush=True)
    df = pd.DataFrame(rows)
    df.to_csv(out / "cases.csv", index=False)
    (out / "summary.md").write_text(summary_md(df, report))
    print(f"wrote {out}/cases.csv and summary.md ({time.monotonic() - t0:.0f} s)")
    return 0


def summary_md(df: pd.DataFrame, report: dict) -> str:
    pred = df[~df["calibration"]]
    rep = pred[pred["repeatable"] == True]  # noqa: E712
    lines = [f"Predicted cases: {len(pred)}; hold (mean 5%, p99 10%, throughput 3%): {int(pred['holds'].sum())}; "
             f"within the real spread where it is wider: {int(pred['within_spread'].sum())}; repeatable (both runs "
             f"within those targets of each other): {len(rep)}, of which hold: {int(rep['holds'].sum())}.", "",
             "| case | real mean ms | sim | err | spread | real p99 ms | sim | err | spread | thr err | holds |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in df.itertuples():
        lines.append(f"| {r.case}{' (calibration)' if r.calibration else ''} | {r.real_mean} | {r.sim_mean:.4g} | "
                     f"{r.err_mean:+.1%} | {r.spread_mean if r.spread_mean == r.spread_mean else '-'} | {r.real_p99} | "
                     f"{r.sim_p99:.4g} | {r.err_p99:+.1%} | {r.spread_p99 if r.spread_p99 == r.spread_p99 else '-'} | "
                     f"{r.err_throughput:+.1%} | {'yes' if r.holds else 'no'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
