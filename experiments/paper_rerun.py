"""The DVABatch paper's claims rerun three ways (issue 33): DVABatch as its authors built it on the paper's Triton
release, DVABatch as the paper describes it on today's Triton, and both on the GPU's time alone.

Configurations (every one the whole study of ``dvasim compare``: six models, DelayBatch's window tuned for peak
throughput, the stepping load's peaks, low / medium / high = 1/4, 3/5, 9/10 of DelayBatch's peak):

* ``as-built-21.10`` -- the Titan RTX default stack ``triton-tensorrt-21.10`` (Triton 21.10's instance pipeline:
  payloads formed ahead and frozen, merged at dequeue, TensorRT freeing the instance at inputs-consumed); the
  DVABatch system is ``dvabatch-built`` (the authors' backend: hand-chosen schedulers, fixed thresholds);
* ``described-current`` -- ``triton-tensorrt`` (today's Triton: payloads grow until an instance takes them); the
  DVABatch system is ``dvabatch`` (§7's policies, Policy III with the derived fixed thresholds);
* ``gpu-only`` -- the GPU's time alone, Triton's batchers idealised (no prefetch); both DVABatch systems.

Every configuration runs all four systems (zerobatch, delaybatch, dvabatch, dvabatch-built); the claims table names
which DVABatch each configuration stands for. Writes, under ``--out`` (default ``results/experiments``;
``--out experiments/results`` regenerates the committed ones): ``paper_rerun/<configuration>/compare.csv`` and
``calibration.csv``, and ``paper_rerun/claims.csv``: one row per claim with the paper's number, each
configuration's and the DVABatch system it used. Figures 17-21 have scripts of their own (``fig*.py``, ``--stack``).

    python experiments/paper_rerun.py [--quick] [--queries N] [--out DIR]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from dvasim.studies import evaluation as study  # noqa: E402

SYSTEMS = ("zerobatch", "delaybatch", "dvabatch", "dvabatch-built")
CONFIGS = {  # name -> (stack, the DVABatch system it stands for)
    "as-built-21.10": (None, "dvabatch-built"),
    "described-current": ("triton-tensorrt", "dvabatch"),
    "gpu-only": ("gpu-only", "dvabatch"),
}
PAPER = {  # §8.2 (Figures 14 and 16) and §8.3 (Figure 15)
    ("mean", "zerobatch"): (16.1, 39.0, 57.7), ("mean", "delaybatch"): (35.4, 47.3, 48.5),
    ("p99", "zerobatch"): (16.9, 27.4, 53.7), ("p99", "delaybatch"): (45.2, 45.1, 29.2),
}
PAPER_PEAK_GAIN = {"bert_base": 46.81, "bert_large": 137.0, "resnet152": 0.0, "vgg19": 0.0, "linknet": 0.0,
                   "unet": 0.0}


def claims(results: pd.DataFrame, calib: pd.DataFrame, system: str) -> list[dict]:
    """The paper's claims measured on one configuration's runs, with ``system`` as DVABatch."""
    rows = []
    n_models = results["model"].nunique()
    for label, metric in (("mean", "mean_latency_ms"), ("p99", "p99_latency_ms")):
        red = study.reductions(results, metric, system)
        for base in ("zerobatch", "delaybatch"):
            avg = red.groupby("load")[f"vs_{base}_%"].mean()
            for i, load in enumerate(study.LOADS):
                rows.append({"claim": f"{label} latency reduction vs {base}, {load} load (%, average of {n_models} models)",
                             "paper": PAPER[(label, base)][i], "value": round(float(avg[load]), 1)})
    piv = results.pivot_table(index=["model", "load"], columns="policy", values="mean_latency_ms")
    tol = 1.0 + study.MATCH_TOLERANCE  # a system is below another only by more than 2% (else a tie)
    wins = int(((piv[system] * tol < piv["zerobatch"]) & (piv[system] * tol < piv["delaybatch"])).sum())
    rows.append({"claim": f"DVABatch more than 2% below both baselines' mean latency (cases of {len(piv)})",
                 "paper": len(piv), "value": wins})
    high = piv.xs("high", level="load")
    low = piv.xs("low", level="load")
    rows.append({"claim": f"DelayBatch more than 2% below ZeroBatch at high load (models of {n_models})",
                 "paper": n_models, "value": int((high["delaybatch"] * tol < high["zerobatch"]).sum())})
    rows.append({"claim": f"ZeroBatch more than 2% below DelayBatch at low load (models of {n_models})",
                 "paper": n_models, "value": int((low["zerobatch"] * tol < low["delaybatch"]).sum())})
    col = "peak_qps_dvabatch" if system == "dvabatch" else f"peak_qps_{system}"
    for r in calib.to_dict("records"):
        gain = 100.0 * (r[col] / r["peak_qps_delaybatch"] - 1.0)
        rows.append({"claim": f"peak throughput gain over DelayBatch, {r['model']} (%, Figure 15)",
                     "paper": PAPER_PEAK_GAIN[r["model"]], "value": round(gain, 1)})
    return rows


def main(argv=None) -> dict[str, pd.DataFrame]:
    p = common.parser(__doc__.split("\n")[0])
    p.add_argument("--queries", type=int, default=5000, help="queries per (model, load, system) run")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--claims-only", action="store_true",
                   help="instead: the claims table again from the configurations' compare.csv and calibration.csv "
                        "already under --out")
    p.add_argument("--figures", action="store_true",
                   help="instead: run Figures 15 and 17-21's scripts under each configuration "
                        "(paper_rerun/<configuration>/figures/)")
    args = common.parse(p, argv)
    if args.stack is not None:
        raise SystemExit("paper_rerun: --stack: the script runs its three configurations' own stacks")
    if args.figures:
        return figures(args)
    models = args.models or list(common.ALL_MODELS)
    n = 1500 if args.quick else args.queries
    out = Path(args.out) / "paper_rerun"
    table: dict[str, list] = {}
    frames: dict[str, pd.DataFrame] = {}
    for name, (stack, system) in CONFIGS.items():
        t0 = time.perf_counter()
        (out / name).mkdir(parents=True, exist_ok=True)
        if args.claims_only:
            results, calib = pd.read_csv(out / name / "compare.csv"), pd.read_csv(out / name / "calibration.csv")
        else:
            results, calib = study.compare(models, n_queries=n, workers=args.workers, progress=False,
                                           policies=SYSTEMS, stack=stack, refine=2 if args.quick else 4)
            common.save(results, out / name, "compare.csv")
            common.save(calib, out / name, "calibration.csv")
            stacks = sorted(set(results["stack"])) if "stack" in results else []
            print(f"{name}: {len(results)} runs in {time.perf_counter() - t0:.0f} s (stack {', '.join(stacks)})",
                  flush=True)
        for r in claims(results, calib, system):
            table.setdefault(r["claim"], [r["claim"], r["paper"]]).append(r["value"])
        frames[name] = results
    df = pd.DataFrame([row for row in table.values()], columns=["claim", "paper", *CONFIGS])
    df.attrs["systems"] = {k: v[1] for k, v in CONFIGS.items()}
    common.save(df, out, "claims.csv")
    print("\nclaims (DVABatch: " + "; ".join(f"{k}: {v[1]}" for k, v in CONFIGS.items()) + ")")
    print(df.to_markdown(index=False) if _has_tabulate() else df.to_string(index=False))
    return {"claims": df, **frames}


FIGURES = ("fig15_stepping", "fig17_glue", "fig18_split", "fig19_buffer_pairs", "fig20_stages", "fig21_closed_loop")


def figures(args) -> dict[str, pd.DataFrame]:
    """Figures 15 and 17-21's scripts under each configuration: ``--dva`` the configuration's DVABatch, ``--stack``
    its stack, Figure 15's peaks (run first) the others' calibration; each into ``<configuration>/figures``."""
    import importlib

    out: dict[str, pd.DataFrame] = {}
    for name, (stack, system) in CONFIGS.items():
        where = Path(args.out) / "paper_rerun" / name / "figures"
        common_args = ["--out", str(where), "--dva", system, *(["--stack", stack] if stack else []),
                       *(["--quick"] if args.quick else []), *(["--models", *args.models] if args.models else [])]
        for fig in FIGURES:
            t0 = time.perf_counter()
            extra = [] if fig in ("fig15_stepping", "fig21_closed_loop") else [
                "--calib-from", str(where / "fig15_peaks.csv")]
            res = importlib.import_module(fig).main(common_args + extra)
            print(f"{name}: {fig} in {time.perf_counter() - t0:.0f} s", flush=True)
            for k, v in (res or {}).items():
                if isinstance(v, pd.DataFrame):
                    out[f"{name}/{fig}/{k}"] = v
    return out


def _has_tabulate() -> bool:
    try:
        import tabulate  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
