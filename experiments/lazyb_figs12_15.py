"""LazyBatching (Choi et al., HPCA'21) Figures 12-15 on dvasim: Serial, GraphB(N), LazyB and Oracle.

**Figures.** 12: mean latency vs query-arrival rate; 13: throughput vs arrival rate; 14: CDF of latency at high
load (the paper's 1K req/s; Serial, the best GraphB, LazyB, Oracle); 15: SLA-violation rate vs SLA target at high
load. Policies: ``serial``, ``graphbatch`` (GraphB(N), the paper's windows N = 5, 25, 50, 95 ms), ``lazybatch``
(LazyB: the conservative slack predictor, Equation 2) and ``lazybatch`` with ``predictor = "oracle"`` (Oracle);
maximum batch size 64 for all batching policies (the paper's default).

**Models.** The paper's ResNet / GNMT / Transformer on an NPU simulator are not in dvasim. We use ``resnet152``
(for ResNet) and ``bert_base`` with GLUE RTE input lengths (an attention model with variable-length inputs, for
Transformer; its length is the dimension ``dec_timesteps`` stands for, see :mod:`dvasim.policies.lazybatch`) on
the ``h100`` tables (recalibrated against measured H100 GPU time), whose batching gain (64 x T(1) / T(64): 8.1
for ResNet152, about 10 for BERT-base) is closest to an NPU's among dvasim's devices. GNMT has no counterpart.
Granularity: LazyBatching is node-level; BERT-base runs at its operator granularity (62 stages, the finest its
table allows); ResNet152 at 32 stages cut time-evenly (its table has 157 operators; the finest slicing costs
5x the simulation time; our nodes take about 0.09 ms at batch 1 instead of 0.018 ms: ``--stages`` sets it).

**Time scale.** Our single-input latencies T1 differ from the paper's (ResNet 1.1 ms, Transformer 2.4 ms, Table
II), so every time of the setup is scaled by ``k = T1_ours / T1_paper`` (T1 of BERT-base: the mean over the RTE
length sample): arrival rates (the paper's 16 .. 1000 req/s divided by k), the GraphB windows and the SLA targets
(multiplied by k). The load relative to the model's speed is then the paper's; the CSVs carry both the paper's
value (``*_paper``) and ours.

**Serving stack** (``--stack``, default ``gpu-only``): the paper's results come from a cycle-level NPU simulator that
models no host cost (§V, §VI-D: scheduling "negligible", preemption overhead "negligible"), so its own stack is
the GPU alone. ``--stack triton-tensorrt`` runs the same setup on a GPU server (Triton with TensorRT: every batch's
inputs gathered and copied, every stage launch paying its host cost, see ``dvasim stacks triton-tensorrt``). A
node-level scheduler launches every node on its own, so LazyB and Oracle pay a launch per node (stage); the
policies that run a batch whole (Serial, GraphB) run the model as one stage (``--whole-stages``, default 1), one
launch per batch, as a server runs a TensorRT engine. Under ``gpu-only`` the stage count of a whole-batch policy
changes nothing (the stages' times add up to the model's). The time scale ``k`` is the GPU table's under every
stack, so the arrival rates and SLAs are the same and the stack's costs come on top.

Every point is averaged over ``--seeds`` Poisson runs (the paper: 20; we use 3) of ``--queries`` (400) queries (error
bars: the 25th and 75th percentiles over the seeds, as the paper's). Writes ``lazyb_runs.csv`` (one row per run),
``lazyb_fig12.csv`` / ``.png``, ``lazyb_fig13.csv`` / ``.png``, ``lazyb_fig14.csv`` / ``.png`` (latency quantiles,
all seeds' queries pooled), ``lazyb_fig15.csv`` / ``.png``, ``lazyb_headline.csv`` (the paper's headline comparisons,
also printed) and ``lazyb_capacity.csv``.

**Capacity** (``lazyb_capacity.csv``; ``--no-capacity`` skips it): the paper's throughput claim compares what each
batcher serves at its arrival rates, and at our scaled rates every batcher but Serial serves all it is offered (the
h100 tables batch far more cheaply than the rates the scale maps to), so the ratio is 1.00 by construction. What a
batcher can serve is its capacity: for Serial, every GraphB(N), LazyB and Oracle, the highest Poisson rate whose p99
latency stays within the Figures 12-14 SLA (100 x k ms), by :func:`dvasim.studies.capacity.capacity` (2% resolution, 95%
confidence per probe): ``capacity_qps``. That search assumes that a rate passes whenever a higher one does, which
fails for LazyB under a serving stack (its predictor knows the GPU's times only, and it pushes most at medium load,
so it can miss the SLA at medium rates and meet it at higher ones) and for GraphB windows close to the SLA (a lone
query waits out the window). So every policy is also run on a ladder of rates below its capacity (``0.8^j`` of
it, ``j`` = 12 .. 1; 2,000 queries each, pass = at most 1% of queries slower than the SLA); if a rung fails, the
capacity is searched again between the rung below and the failing one. ``sustained_qps`` is the highest rate up to
which every probed rate passes; ``first_fail_qps`` the lowest failing rung (NaN: none).

    .venv/bin/python experiments/lazyb_figs12_15.py [--quick] [--out DIR] [--seed S] [--seeds K] [--queries N]
        [--stack NAME] [--workers W] [--stages N] [--whole-stages N]
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import dvasim  # noqa: E402
from dvasim.model.catalog import resolve_model  # noqa: E402
from dvasim.reporting.plots import save_figure  # noqa: E402
from dvasim.workload import workload_from_config  # noqa: E402

DEVICE = "h100"
PAPER_STACK = "gpu-only"  # the paper's NPU simulator models no host cost
WHOLE = ("Serial", "GraphB")  # labels (prefixes) of the policies that run a batch whole
# dvasim model -> (the paper's model it stands for, the paper's T1 in ms (Table II), stages, workload extras)
MODELS = {
    "resnet152": ("ResNet", 1.1, 32, {}),
    "bert_base": ("Transformer", 2.4, 62, {"seq_len_dist": "glue:RTE"}),
}
RATES_PAPER = (16.0, 128.0, 256.0, 500.0, 750.0, 1000.0)  # req/s: low (0-256), medium (256-500), high (500+)
HIGH_PAPER = 1000.0
WINDOWS_PAPER = (5.0, 25.0, 50.0, 95.0)  # GraphB(N), ms
SLA_PAPER = 100.0  # the paper's SLA for Figures 12-14
SLAS_PAPER = (20.0, 40.0, 60.0, 80.0, 100.0)  # Figure 15's x-axis
MAX_BS = 64
# the paper's headline numbers (§VI-A/B), for the printed comparison
PAPER = {"ResNet": {"latency_x": 5.3, "throughput_x": 1.1, "zero_violation_above_ms": 20.0},
         "Transformer": {"latency_x": 2.5, "throughput_x": 1.2, "p99_lazyb_ms": 54.0, "p99_graphb_ms": 123.0,
                         "zero_violation_above_ms": 60.0}}


def scale(model: str, stages: int) -> dict:
    """T1 of the model and the time scale k = T1_ours / T1_paper."""
    _, t1_paper, _, extra = MODELS[model]
    table = resolve_model({"name": model, "device": DEVICE, "stages": stages}).table
    if table.seq_lens is not None:
        wl = workload_from_config({"kind": "poisson", "rate_qps": 1.0, "n_queries": 2000, "seed": 0, **extra},
                                  needs_seq_len=True, base_dir=".")
        t1 = float(np.mean([table.total(1, int(L)) for L in wl.seq_lens]))
    else:
        t1 = table.total(1)
    return {"t1_ms": t1, "k": t1 / t1_paper}


def policies(k: float, sla_paper: float = SLA_PAPER) -> list[tuple[str, dict, float]]:
    """(label, policy dict, window in the paper's ms or NaN)."""
    out = [("Serial", {"name": "serial"}, np.nan)]
    for w in WINDOWS_PAPER:
        out.append((f"GraphB({w:g})", {"name": "graphbatch", "window_ms": w * k, "max_batch_size": MAX_BS}, w))
    out.append(("LazyB", {"name": "lazybatch", "sla_ms": sla_paper * k, "max_batch_size": MAX_BS}, np.nan))
    out.append(("Oracle", {"name": "lazybatch", "sla_ms": sla_paper * k, "max_batch_size": MAX_BS,
                           "predictor": "oracle"}, np.nan))
    return out


def run_stages(job: dict) -> int:
    """The stages a job's policy runs the model in: node level for LazyB / Oracle, ``whole_stages`` for the
    policies that run a batch whole (0: the same as LazyB's)."""
    whole = job.get("whole_stages", 0)
    return whole if whole and job["label"].startswith(WHOLE) else job["stages"]


def one_run(job: dict) -> tuple[dict, np.ndarray]:
    model, extra = job["model"], MODELS[job["model"]][3]
    stages = run_stages(job)
    cfg = {"model": {"name": model, "device": DEVICE, "stages": stages},
           "policy": job["policy"],
           "workload": {"kind": "poisson", "rate_qps": job["rate_qps"], "n_queries": job["n_queries"],
                        "seed": job["seed"], **extra},
           "qos": {"target_ms": job["sla_ms"]},
           "server": {"stack": job.get("stack", PAPER_STACK)}}
    r = dvasim.run(cfg, progress=False)
    s = r.summary
    q = r.queries
    lat = (q["finish_ms"] - q["arrival_ms"]).to_numpy(dtype=float)
    row = {k: job[k] for k in ("model", "paper_model", "label", "window_ms_paper", "rate_paper_qps", "rate_qps",
                               "sla_ms_paper", "sla_ms", "seed", "fig")}
    row.update(stack=s["stack"], window_ms=job["policy"].get("window_ms", np.nan), stages=stages,
               mean_latency_ms=s["mean_latency_ms"], p99_latency_ms=s["p99_latency_ms"],
               throughput_qps=s["throughput_qps"], violation_rate=s["qos_violation_rate"],
               mean_exit_batch_size=s["mean_exit_batch_size"], n_stretch=s["n_stretch"],
               n_completed=s["n_completed"], n_queries=s["n_queries"], stable=s["steady_state"])
    return row, lat


def jobs_for(model: str, stages: int, k: float, seeds: list[int], n_queries: int, rates_paper, slas_paper,
             stack: str = PAPER_STACK, whole_stages: int = 1):
    paper_model = MODELS[model][0]
    base = {"model": model, "paper_model": paper_model, "stages": stages, "stack": stack,
            "whole_stages": whole_stages}
    jobs = []

    def add(label, pol, w, rp, sp, fig):
        for seed in seeds:
            jobs.append({**base, "label": label, "policy": pol, "window_ms_paper": w, "rate_paper_qps": rp,
                         "rate_qps": rp / k, "sla_ms_paper": sp, "sla_ms": sp * k, "seed": seed,
                         "n_queries": n_queries, "fig": fig})

    for rp in rates_paper:
        for label, pol, w in policies(k):
            add(label, pol, w, rp, SLA_PAPER, "12-14")
    for sp in slas_paper:  # Figure 15: LazyB / Oracle run with the SLA as their predictor's target
        if sp == SLA_PAPER:
            continue  # the Figure 12-14 run at high load
        for label, pol, w in policies(k, sp):
            if label in ("LazyB", "Oracle"):
                add(label, pol, w, HIGH_PAPER, sp, "15")
    return jobs


def q25(x):
    return float(np.quantile(x, 0.25))


def q75(x):
    return float(np.quantile(x, 0.75))


def main(argv=None) -> dict[str, pd.DataFrame]:
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=None, help="Poisson runs per point (default 3; quick 1)")
    p.add_argument("--queries", type=int, default=None, help="queries per run (default 400; quick 120)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--stages", type=int, default=None, help="ResNet152's stage count (default 32; quick 12)")
    p.add_argument("--no-capacity", action="store_true", help="skip the capacity search (lazyb_capacity.csv)")
    p.add_argument("--whole-stages", type=int, default=1,
                   help="stages of the policies that run a batch whole, Serial and GraphB (default 1: one launch "
                        "per batch; 0: LazyB's slicing)")
    p.set_defaults(stack=PAPER_STACK)
    args = common.parse(p, argv)
    stack = args.stack
    watch = common.Stopwatch()
    quick = args.quick
    n_seeds = args.seeds or (1 if quick else 3)
    n_queries = args.queries or (120 if quick else 400)
    seeds = [args.seed + i for i in range(n_seeds)]
    models = args.models or list(MODELS)
    rates_paper = (16.0, 1000.0) if quick else RATES_PAPER
    slas_paper = (40.0, 100.0) if quick else SLAS_PAPER
    jobs, scales = [], {}
    for model in models:
        stages = MODELS[model][2]
        if model == "resnet152":
            stages = args.stages or (12 if quick else stages)
        elif quick:
            stages = 16
        scales[model] = {"stages": stages, **scale(model, stages)}
        jobs += jobs_for(model, stages, scales[model]["k"], seeds, n_queries, rates_paper, slas_paper, stack,
                         args.whole_stages)
    print(f"stack: {stack}; Serial and GraphB at {args.whole_stages or 'the same'} stage(s)")
    print(f"{len(jobs)} runs; time scales: " + ", ".join(
        f"{m}: T1 {s['t1_ms']:.3f} ms, k {s['k']:.3f}, {s['stages']} stages" for m, s in scales.items()))
    if args.workers > 1 and len(jobs) > 1:
        with mp.get_context("spawn").Pool(args.workers) as pool:
            results = pool.map(one_run, jobs, chunksize=1)
    else:
        results = [one_run(j) for j in jobs]
    runs = pd.DataFrame([r for r, _ in results])
    lat = {i: lt for i, (_, lt) in enumerate(results)}
    runs["k"] = runs["model"].map({m: s["k"] for m, s in scales.items()})
    common.save(runs, args.out, "lazyb_runs.csv")

    main_runs = runs[runs["fig"] == "12-14"]
    keys = ["model", "paper_model", "stack", "label", "window_ms_paper", "rate_paper_qps", "rate_qps"]
    agg = (main_runs.groupby(keys, dropna=False)
           .agg(mean_latency_ms=("mean_latency_ms", "mean"), latency_p25=("mean_latency_ms", q25),
                latency_p75=("mean_latency_ms", q75), p99_latency_ms=("p99_latency_ms", "mean"),
                throughput_qps=("throughput_qps", "mean"), throughput_p25=("throughput_qps", q25),
                throughput_p75=("throughput_qps", q75), mean_exit_batch_size=("mean_exit_batch_size", "mean"),
                n_completed=("n_completed", "sum"), n_queries=("n_queries", "sum"),
                stable_runs=("stable", "sum"), runs=("seed", "count"))
           .reset_index().rename(columns={"label": "policy"}))
    fig12 = agg.drop(columns=["throughput_qps", "throughput_p25", "throughput_p75"])
    fig13 = agg.drop(columns=["mean_latency_ms", "latency_p25", "latency_p75", "p99_latency_ms"])
    common.save(fig12, args.out, "lazyb_fig12.csv")
    common.save(fig13, args.out, "lazyb_fig13.csv")

    # best GraphB per model: the lowest mean latency at high load (Figure 14 plots only that one)
    high = agg[agg["rate_paper_qps"] == HIGH_PAPER]
    best_g = {m: g[g["policy"].str.startswith("GraphB")].sort_values("mean_latency_ms")["policy"].iloc[0]
              for m, g in high.groupby("model")}

    # Figure 14: latency quantiles at high load, every seed's queries pooled
    qs = np.linspace(0, 1, 101)
    cdf_rows = []
    for model in models:
        for label in ("Serial", best_g[model], "LazyB", "Oracle"):
            idx = main_runs.index[(main_runs["model"] == model) & (main_runs["label"] == label)
                                  & (main_runs["rate_paper_qps"] == HIGH_PAPER)]
            pooled = np.concatenate([lat[i] for i in idx])
            pooled = pooled[np.isfinite(pooled)]
            for qv, v in zip(qs, np.quantile(pooled, qs)):
                cdf_rows.append({"model": model, "stack": stack, "policy": label, "quantile": qv,
                                 "latency_ms": v})
    fig14 = pd.DataFrame(cdf_rows)
    common.save(fig14, args.out, "lazyb_fig14.csv")

    # Figure 15: violation rate vs SLA at high load. Serial / GraphB: their high-load runs measured against each
    # SLA (the SLA does not change what they do); LazyB / Oracle: runs whose predictor targets that SLA
    v_rows = []
    for model in models:
        k = scales[model]["k"]
        for sp in slas_paper:
            for label, _, _ in policies(k):
                if label in ("LazyB", "Oracle"):
                    sel = runs[(runs["model"] == model) & (runs["label"] == label)
                               & (runs["rate_paper_qps"] == HIGH_PAPER) & (runs["sla_ms_paper"] == sp)]
                    rates = sel["violation_rate"].to_numpy()
                else:
                    sel = main_runs[(main_runs["model"] == model) & (main_runs["label"] == label)
                                    & (main_runs["rate_paper_qps"] == HIGH_PAPER)]
                    # unfinished queries count as violations, as in the runs' own summaries
                    rates = np.array([np.mean(~(lat[i] <= sp * k)) for i in sel.index])
                v_rows.append({"model": model, "paper_model": MODELS[model][0], "stack": stack, "policy": label,
                               "sla_ms_paper": sp, "sla_ms": sp * k, "violation_rate": float(np.mean(rates)),
                               "violation_p25": q25(rates), "violation_p75": q75(rates), "runs": len(rates)})
    fig15 = pd.DataFrame(v_rows)
    common.save(fig15, args.out, "lazyb_fig15.csv")

    _plots(args.out, models, fig12, fig13, fig14, fig15, stack)
    summary = _headline(models, agg, fig15, best_g)
    summary.insert(2, "stack", stack)
    common.save(summary, args.out, "lazyb_headline.csv")
    common.show(summary, f"LazyB against the best GraphB (ours) next to the paper's, stack {stack}")
    common.show(fig15.pivot_table(index=["model", "sla_ms_paper"], columns="policy", values="violation_rate")
                .reset_index(), "Figure 15: SLA-violation rate at high load")
    out = {"runs": runs, "fig12": fig12, "fig13": fig13, "fig14": fig14, "fig15": fig15, "headline": summary}
    if not args.no_capacity:
        caps = capacities(models, scales, stack, args.whole_stages, quick, args.seed, args.workers)
        common.save(caps, args.out, "lazyb_capacity.csv")
        common.show(caps, f"Capacity (p99 <= SLA {SLA_PAPER:g} x k ms), stack {stack}")
        out["capacity"] = caps
    print(f"\ndone in {watch}")
    return out


def capacity_row(job: tuple, progress=None) -> dict:
    """One policy's capacity and sustained capacity (a job of :func:`capacities`)."""
    from dvasim.studies.capacity import capacity, sustained_capacity

    model, k, stages, label, pol, w, stack, whole_stages, quick, seed = job
    st = run_stages({"label": label, "stages": stages, "whole_stages": whole_stages})
    cfg = {"model": {"name": model, "device": DEVICE, "stages": st}, "policy": pol,
           "workload": {"kind": "poisson", "rate_qps": 1.0, "n_queries": 1000, "seed": seed, **MODELS[model][3]},
           "qos": {"target_ms": SLA_PAPER * k}, "server": {"stack": stack}}
    kw = dict(resolution=0.1, min_queries=300, max_queries=1200, min_duration_s=0.5) if quick else {}
    t0 = time.perf_counter()
    res = capacity(cfg, SLA_PAPER * k, percentile=99.0, workers=1, **kw)
    top = res["capacity_qps"]
    sustained, first_fail = sustained_capacity(cfg, SLA_PAPER * k, top, steps=4 if quick else 12,
                                               n_queries=500 if quick else 2000, workers=1, **kw)
    return {"model": model, "paper_model": MODELS[model][0], "stack": res.get("stack", stack), "policy": label,
            "window_ms_paper": w, "stages": st, "slo_ms": SLA_PAPER * k, "capacity_qps": top,
            "capacity_searched_qps": res["capacity_searched_qps"], "sustained_qps": sustained,
            "first_fail_qps": first_fail, "sustained_paper_qps": sustained * k,
            "top_exceeded": res.get("top_exceeded"), "probes": len(res.get("probes", [])),
            "wall_s": time.perf_counter() - t0}


def capacities(models, scales, stack: str, whole_stages: int, quick: bool, seed: int,
               workers: int = 1) -> pd.DataFrame:
    """Every policy's capacity under the Figures 12-14 SLA (p99 <= SLA_PAPER x k): see the module docstring. The
    searches are independent: they run on ``workers`` processes (:func:`dvasim.studies.parallel.map_jobs`; the
    result does not depend on them)."""
    from dvasim.studies.parallel import map_jobs

    jobs = []
    for model in models:
        k, stages = scales[model]["k"], scales[model]["stages"]
        for label, pol, w in policies(k):
            if quick and label not in ("GraphB(5)", "LazyB"):
                continue  # a smoke test: the best GraphB's usual window and LazyB
            jobs.append((model, k, stages, label, pol, w, stack, whole_stages, quick, seed))
    rows = map_jobs(capacity_row, jobs, workers=workers)
    df = pd.DataFrame(rows)
    for col in ("capacity_qps", "sustained_qps"):
        best = {m: g[g.policy.str.startswith("GraphB")][col].max() for m, g in df.groupby("model")}
        df[col.replace("_qps", "") + "_vs_best_graphb"] = [c / best[m] for m, c in zip(df.model, df[col])]
    return df


def _headline(models, agg, fig15, best_g) -> pd.DataFrame:
    rows = []
    for model in models:
        pm = MODELS[model][0]
        g = agg[agg["model"] == model]
        graph = g[g["policy"].str.startswith("GraphB")]
        lazy = g[g["policy"] == "LazyB"].set_index("rate_paper_qps")
        # the paper: LazyB's latency against the best GraphB, averaged over the arrival rates; here the best
        # GraphB per rate (lowest mean latency / highest throughput)
        best_lat = graph.groupby("rate_paper_qps")["mean_latency_ms"].min()
        best_thr = graph.groupby("rate_paper_qps")["throughput_qps"].max()
        lat_x = float(np.mean(best_lat / lazy["mean_latency_ms"]))
        thr_x = float(np.mean(lazy["throughput_qps"] / best_thr))
        hi = g[g["rate_paper_qps"] == HIGH_PAPER].set_index("policy")
        f = fig15[(fig15["model"] == model) & (fig15["policy"] == "LazyB")]
        nonzero = f[f["violation_rate"] > 0]["sla_ms_paper"]
        rows.append({"model": model, "paper_model": pm, "latency_x_vs_best_graphb": lat_x,
                     "paper_latency_x": PAPER[pm]["latency_x"], "throughput_x_vs_best_graphb": thr_x,
                     "paper_throughput_x": PAPER[pm]["throughput_x"], "best_graphb_high": best_g[model],
                     "p99_lazyb_high_ms": hi.loc["LazyB", "p99_latency_ms"],
                     "p99_best_graphb_high_ms": hi.loc[best_g[model], "p99_latency_ms"],
                     "lazyb_largest_sla_with_violations_paper_ms": float(nonzero.max()) if len(nonzero) else 0.0,
                     "paper_zero_above_ms": PAPER[pm]["zero_violation_above_ms"]})
    return pd.DataFrame(rows)


# GraphB's windows as shades of its colour: > 0 toward white, < 0 toward black (a longer window, a darker line)
GRAPHB_SHADES = {"GraphB(5)": 0.55, "GraphB(25)": 0.3, "GraphB(50)": 0.0, "GraphB(95)": -0.4}


def _style(label: str) -> dict:
    """A line's style; its colour is its policy's in every figure (``common.PALETTE``)."""
    if label == "Serial":
        return {"color": common.PALETTE["serial"], "marker": "s"}
    if label == "LazyB":
        return {"color": common.PALETTE["lazybatch"], "marker": "o", "linewidth": 2.2}
    if label == "Oracle":
        return {"color": common.PALETTE["oracle"], "marker": "^", "linestyle": "--"}
    from matplotlib.colors import to_hex, to_rgb

    base = np.array(to_rgb(common.PALETTE["graphbatch"]))
    k = GRAPHB_SHADES.get(label, 0.0)
    return {"color": to_hex(base + k * (1 - base) if k >= 0 else base * (1 + k)), "marker": "x"}


def _plots(out: Path, models, fig12, fig13, fig14, fig15, stack: str = PAPER_STACK) -> None:
    for name, df, y, lo, hi, ylabel, logy in (
            ("fig12", fig12, "mean_latency_ms", "latency_p25", "latency_p75", "mean latency (ms)", True),
            ("fig13", fig13, "throughput_qps", "throughput_p25", "throughput_p75", "throughput (req/s)", False)):
        plt, sns, fig, axes = common.model_panels(models, 5.0, 3.8)
        for ax, model in zip(axes.flat, models):
            d = df[df["model"] == model]
            for label, g in d.groupby("policy", sort=False):
                g = g.sort_values("rate_qps")
                ax.errorbar(g["rate_qps"], g[y], yerr=[g[y] - g[lo], g[hi] - g[y]], label=label, capsize=2,
                            **_style(label))
            # a point some of whose runs were not stable (stable_runs < runs) carries the unstable marker
            common.mark_verdicts(ax, d["rate_qps"], d[y], [common.row_verdict(r) for r in d.to_dict("records")])
            ax.set_xlabel("arrival rate (req/s)")
            ax.set_ylabel(ylabel)
            if logy:
                ax.set_yscale("log")
            ax.set_title(f"{model} ({MODELS[model][0]})")
        _legend(fig, axes, models)
        save_figure(fig, out / f"lazyb_{name}.png",
                    {"fig12": "Figure 12: mean latency vs arrival rate",
                     "fig13": "Figure 13: throughput vs arrival rate"}[name]
                    + f"\n{common.context(df, DEVICE, stack=stack, load='Poisson arrivals')}")
    plt, sns, fig, axes = common.model_panels(models, 5.0, 3.8)
    for ax, model in zip(axes.flat, models):
        for label, g in fig14[fig14["model"] == model].groupby("policy", sort=False):
            ax.plot(g["latency_ms"], g["quantile"], label=label, **{**_style(label), "marker": None})
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("CDF")
        ax.set_title(f"{model} ({MODELS[model][0]}), high load")
    _legend(fig, axes, models)
    save_figure(fig, out / "lazyb_fig14.png", "Figure 14: latency CDF at high load (paper's 1K req/s, scaled)\n"
                f"{common.context(fig14, DEVICE, stack=stack)}")
    plt, sns, fig, axes = common.model_panels(models, 5.0, 3.8)
    for ax, model in zip(axes.flat, models):
        d = fig15[fig15["model"] == model]
        for label, g in d.groupby("policy", sort=False):
            ax.plot(g["sla_ms_paper"], 100 * g["violation_rate"], label=label, **_style(label))
        ax.set_xlabel("SLA target (paper's ms; ours x k)")
        ax.set_ylabel("SLA violations (%)")
        ax.set_title(f"{model} ({MODELS[model][0]}), high load")
    _legend(fig, axes, models)
    save_figure(fig, out / "lazyb_fig15.png", "Figure 15: SLA-violation rate vs SLA target\n"
                f"{common.context(fig15, DEVICE, stack=stack)}")


def _legend(fig, axes, models) -> None:
    """One legend for every panel, right of the last panel of the first row: off the data."""
    handles, labels = {}, {}
    for ax in list(axes.flat)[:len(models)]:
        for h, lb in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lb, h)
    labels = list(handles)
    right = list(axes.flat)[min(len(models), axes.shape[1]) - 1]
    right.legend([handles[lb] for lb in labels], labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                 borderaxespad=0.0)


if __name__ == "__main__":
    main()
