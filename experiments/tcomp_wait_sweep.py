"""Policy III's threshold T_comp_wait (paper §7.2): newly arrived queries stretch the latest batch unless it has
been processed too long. dvasim's default derives it from the QoS target, per batch (a stretch is made only if the
stretched batch still finishes within the target of its oldest query's arrival, from the latency table; see
``dvasim/policies/dvabatch.py``); ``t_comp_wait_frac`` (opt-in) sets a fixed T_comp_wait as a fraction of the model's
batch-1 latency instead (0.25 was the former default). This sweep measures what each fixed fraction costs or saves,
and the QoS rule against them.

For each model of ``dvasim.studies.evaluation.MODELS`` (Titan RTX tables) at the low / medium / high loads (``study.LOADS``
fractions of DelayBatch's peak throughput, read from ``--calib-from``, default the committed
``experiments/results/compare/calibration.csv``) it runs Poisson workloads (5,000 queries, seed 1) with
``{"name": "dvabatch", "t_comp_wait_frac": f}`` for every f of :data:`FRACS`, plus one no-stretch reference:
``{"name": "dvabatch", "policies": <the auto-selected list minus "load">}`` (with ``"pipeline": false`` where
DVABatch runs one batch at a time, as on UNet's table). Models whose auto-selected policies
do not include "load" (stretch is off, so T_comp_wait has no effect) get one run per load, recorded as the
reference, and no frac sweep. For the swept models it also runs DVABatch's default (the QoS rule, under the
study's 200 ms target) and ZeroBatch.

``--behind-window`` puts DVABatch behind DelayBatch's tuned window (the calibration's ``delaybatch_window_ms``;
the paper's Figure 3 Case III has such a window) and adds the suffix ``_window`` to the file names. ``--stack``
runs everything on one serving stack (default: the one each table implies, ``triton-tensorrt-21.10`` for the Titan RTX
tables); the CSVs name it in a ``stack`` column.

Writes ``tcomp_wait_sweep.csv`` (one row per model, load and frac; the reference rows have ``run =
"no-stretch"`` and an empty ``frac``), ``tcomp_wait_qos.csv`` (per swept model and load: the QoS rule, ZeroBatch,
and the no-stretch reference and fracs 0 and 0.25 again for comparison) and ``tcomp_wait_sweep.png`` (mean latency
relative to the no-stretch reference vs frac, one panel per model, hue = load; the QoS rule as a marker on the
right). Prints, per frac, the mean over models and loads of the mean and p99 latency relative to the reference,
the best frac per model and load, the QoS rule against them, and a per-query account of what stretching a
*started* batch costs its original queries and saves its newcomers (run at frac f against the same arrivals at
frac 0, where only batches not yet started are stretched).

    .venv/bin/python experiments/tcomp_wait_sweep.py [--quick] [--out DIR] [--models ...] [--workers 2]
                                                     [--seed 1] [--calib-from CSV] [--behind-window]
                                                     [--stack NAME]
"""

from __future__ import annotations

import math
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from dvasim.studies import evaluation as study  # noqa: E402

FRACS = (0.0, 0.125, 0.25, 0.5, 1.0, 2.0, 8.0)
CALIB = common.RESULTS / "compare" / "calibration.csv"
ANALYSE_FRACS = (0.25, 1.0)  # fracs whose started stretches the per-query account looks at (against frac 0)
NOTE_OFF = "'load' not auto-selected: stretch off, T_comp_wait has no effect; frac sweep skipped"
STACK: dict = {}  # the serving stack of every run (--stack; default: the one each table implies)
COUNTERS = ("n_stretch", "n_stretch_started", "n_split", "mean_batches_in_flight", "mean_exit_batch_size")


def _run(job):
    """One Poisson run: its summary row, and its per-query records when ``keep``."""
    model, load, rate, n, seed, policy, run, frac, keep, stack = job
    wl = {"kind": "poisson", "rate_qps": float(rate), "n_queries": int(n), "seed": int(seed)}
    r = study.run_config(study.make_config(model, policy, wl, **stack))
    s, pol = r.summary, r.config["policy"]
    pols = list(pol.get("policies", []))
    on = "load" in pols or pol.get("stretch") is True
    tcw = pol.get("t_comp_wait_ms") if on else None  # None: no QoS target (the rule "none")
    row = {"model": model, "stack": s.get("stack", ""), "load": load, "load_frac": study.LOADS[load],
           "offered_qps": float(rate),
           "window_ms": float(policy.get("max_queue_delay_ms", 0.0)), "run": run,
           "frac": frac, "t_comp_wait_ms": math.nan if tcw is None else tcw,
           "policies": "+".join(pols) if pols else "-", "stretch_on": "load" in pols,
           "pipeline": pol.get("pipeline", True) is not False,
           "mean_latency_ms": s["mean_latency_ms"], "p99_latency_ms": s["p99_latency_ms"],
           "throughput_qps": s["throughput_qps"], **{k: s[k] for k in COUNTERS},
           "n_completed": s["n_completed"], "n_queries": s["n_queries"],
           "complete": s["n_completed"] == s["n_queries"]}
    cols = ["query_id", "arrival_ms", "admitted_ms", "finish_ms", "latency_ms", "batch_id"]
    cols += [c for c in r.queries.columns if c.startswith("s") and c[1:2].isdigit()]
    return row, (r.queries[cols].copy() if keep else None)


def _map(jobs, workers: int):
    jobs = [(*j, dict(STACK)) for j in jobs]  # the stack travels with each job (worker processes)
    if workers <= 1 or len(jobs) <= 1:
        return [_run(j) for j in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_run, jobs))  # job order: results do not depend on the worker count


def main(argv=None) -> dict[str, pd.DataFrame]:
    p = common.parser(__doc__.split("\n\n")[0])
    p.set_defaults(seed=1, calib_from=CALIB)
    p.add_argument("--queries", type=int, default=None, help="queries per run (default 5000; quick 800)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    p.add_argument("--behind-window", action="store_true",
                   help="DVABatch behind DelayBatch's tuned window (the calibration's delaybatch_window_ms, as the "
                        "dvabatch-window variant of dvasim compare); files get the suffix _window")
    args = common.parse(p, argv)  # --stack: common.parser's
    STACK.clear()
    if args.stack is not None:
        STACK["stack"] = args.stack
    models = args.models or (["bert_base", "linknet"] if args.quick else list(study.MODELS))
    loads = ["low", "high"] if args.quick else list(study.LOADS)
    n = args.queries or (800 if args.quick else 5000)
    calib = common.read_calib(args.calib_from)
    clock = common.Stopwatch()
    print(f"T_comp_wait sweep: models {', '.join(models)}; loads {', '.join(loads)}; {n} queries, seed {args.seed}; "
          f"fracs {', '.join(f'{f:g}' for f in FRACS)}; calibration {args.calib_from}; stack "
          f"{args.stack or 'implied by each table'}", flush=True)
    rates, windows = {}, {}
    for model in models:
        c = common.calib_for(model, calib, quick=args.quick, seed=args.seed)
        windows[model] = {"max_queue_delay_ms": c["window"]} if args.behind_window else {}
        for load in loads:
            rates[(model, load)] = study.LOADS[load] * c["peak_delaybatch"]
    suffix = "_window" if args.behind_window else ""
    keep_fracs = {0.0, *ANALYSE_FRACS}

    # phase 1: frac 0 everywhere, which also tells which policies the model's diversities select
    first = _map([(m, ld, rates[(m, ld)], n, args.seed, {"name": "dvabatch", "t_comp_wait_frac": 0.0, **windows[m]},
                    "sweep", 0.0, True) for (m, ld) in rates], args.workers)
    print(f"phase 1 (frac 0) done [{clock}]", flush=True)
    rows, queries, jobs = {}, {}, []
    for (key, (row, q)) in zip(rates, first):
        model, load = key
        if row["stretch_on"]:
            rows[(model, load, 0.0)] = row
            queries[(model, load, 0.0)] = q
            ref = [x for x in row["policies"].split("+") if x not in ("load", "-")]
            for f in FRACS[1:]:
                pol = {"name": "dvabatch", "t_comp_wait_frac": f, **windows[model]}
                jobs.append((model, load, rates[key], n, args.seed, pol, "sweep", f, f in keep_fracs))
            # the same pipelining as the swept runs (one batch at a time where DVABatch identifies that)
            serial = {} if row["pipeline"] else {"pipeline": False}
            pol = {"name": "dvabatch", "policies": ref, **windows[model], **serial}
            jobs.append((model, load, rates[key], n, args.seed, pol, "no-stretch", math.nan, False))
        else:  # stretch off: this run is the no-stretch reference, and T_comp_wait changes nothing
            rows[(model, load, "ref")] = {**row, "run": "no-stretch", "frac": math.nan}
    for (model, load) in {k[:2] for k in rows if k[2] == 0.0}:
        # DVABatch's default (T_comp_wait from the QoS target) and ZeroBatch, for the QoS-rule comparison
        jobs.append((model, load, rates[(model, load)], n, args.seed, {"name": "dvabatch", **windows[model]}, "qos",
                     math.nan, False))
        jobs.append((model, load, rates[(model, load)], n, args.seed, {"name": "zerobatch"}, "zerobatch", math.nan,
                     False))
    extra = {}
    for job, (row, q) in zip(jobs, _map(jobs, args.workers)):
        model, load, *_, run, f, _keep = job
        if run in ("qos", "zerobatch"):
            extra[(model, load, run)] = row
            continue
        rows[(model, load, f if run == "sweep" else "ref")] = row
        if q is not None:
            queries[(model, load, f)] = q
    print(f"phase 2 (other fracs, no-stretch references, QoS rule, ZeroBatch) done [{clock}]", flush=True)

    df = _assemble(rows, models, loads)
    swept = set(df.loc[df["run"] == "sweep", "model"])
    df["note"] = np.where(df["model"].isin(swept), "", NOTE_OFF)
    common.save(df, args.out, f"tcomp_wait_sweep{suffix}.csv")
    qos = qos_table(df, extra)
    if len(qos):
        common.save(qos, args.out, f"tcomp_wait_qos{suffix}.csv")
    plot(df, args.out / f"tcomp_wait_sweep{suffix}.png", qos)
    out = {"runs": df, **report(df)}
    if len(qos):
        common.show(qos[["model", "load", "offered_qps", "run", "t_comp_wait_rule", "mean_latency_ms",
                         "p99_latency_ms", "mean_rel", "p99_rel", "n_stretch_started", "mean_exit_batch_size"]],
                    "The QoS rule (default) against no stretch, fixed fractions 0 and 0.25, and ZeroBatch "
                    "(mean_rel / p99_rel: relative to no stretch)")
        out["qos"] = qos
    acc = catch_up_account(queries, df)
    if len(acc):
        common.show(acc, "Started stretches, per query: run at frac f vs the same arrivals at frac 0 "
                         "(ms; 'orig' = queries in the batch before the stretch, 'new' = the queries that stretched "
                         "it, 'rest' = every other query)", digits=2)
        out["catch_up"] = acc
    print(f"\ntotal {clock}")
    return out


def qos_table(df: pd.DataFrame, extra: dict) -> pd.DataFrame:
    """Per swept model and load: the QoS rule's run and ZeroBatch's, beside the no-stretch reference and the fixed
    fractions 0 and 0.25 (from ``df``), with mean / p99 relative to no stretch."""
    out = []
    for (model, load), g in df.groupby(["model", "load"], sort=False):
        if (model, load, "qos") not in extra:
            continue
        ref = g[g["run"] == "no-stretch"].iloc[0]
        picks = [("no-stretch", ref), ("frac 0", g[g["frac"] == 0.0].iloc[0]),
                 ("frac 0.25", g[g["frac"] == 0.25].iloc[0]), ("qos", extra[(model, load, "qos")]),
                 ("zerobatch", extra[(model, load, "zerobatch")])]
        for run, r in picks:
            r = dict(r)
            rule = {"no-stretch": "-", "qos": "qos", "zerobatch": "-"}.get(run, "frac")
            out.append({**r, "run": run, "t_comp_wait_rule": rule,
                        "mean_rel": r["mean_latency_ms"] / ref["mean_latency_ms"],
                        "p99_rel": r["p99_latency_ms"] / ref["p99_latency_ms"]})
    cols = [c for c in df.columns if c != "note"] + ["t_comp_wait_rule"]
    return pd.DataFrame(out, columns=cols) if out else pd.DataFrame(columns=cols)


def _assemble(rows: dict, models, loads) -> pd.DataFrame:
    order = []
    for model in models:
        for load in loads:
            ref = rows[(model, load, "ref")]
            sweep = sorted(((k[2], r) for k, r in rows.items() if k[:2] == (model, load) and k[2] != "ref"),
                           key=lambda x: x[0])
            for _, r in sweep:
                order.append({**r, "mean_rel": r["mean_latency_ms"] / ref["mean_latency_ms"],
                              "p99_rel": r["p99_latency_ms"] / ref["p99_latency_ms"]})
            order.append({**ref, "mean_rel": 1.0, "p99_rel": 1.0})
    return pd.DataFrame(order)


def report(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    off = sorted(set(df["model"]) - set(df.loc[df["run"] == "sweep", "model"]))
    if off:
        print(f"\nstretch off in {', '.join(off)} ({NOTE_OFF}): one no-stretch run per load, not in the tables below")
    bad = df[~df["complete"]]
    if len(bad):
        # a run whose queries did not all finish (the pipeline stalled): its latencies cover the finished ones only
        print(f"\nWARNING: {len(bad)} runs left queries unfinished; they (and their model/load's reference, if it is "
              "one of them) are left out of the tables below:")
        common.show(bad[["model", "load", "run", "frac", "n_completed", "n_queries", "n_stretch_started"]])
    bad_ref = set(map(tuple, bad.loc[bad["run"] == "no-stretch", ["model", "load"]].to_numpy()))
    sw = df[(df["run"] == "sweep") & df["complete"]]
    sw = sw[[(m, ld) not in bad_ref for m, ld in zip(sw["model"], sw["load"])]]
    if sw.empty:
        return {}
    summ = (sw.groupby("frac")
            .agg(mean_rel=("mean_rel", "mean"), mean_rel_worst=("mean_rel", "max"), p99_rel=("p99_rel", "mean"),
                 p99_rel_worst=("p99_rel", "max"), n_stretch_started=("n_stretch_started", "mean"),
                 n_cases=("mean_rel", "size"))
            .reset_index())
    common.show(summ, "Per frac: mean over models and loads of mean / p99 latency relative to no stretch "
                      "(worst: the largest ratio)")
    per_load = sw.pivot_table(index="frac", columns="load", values="mean_rel", aggfunc="mean")
    per_load = per_load[[ld for ld in study.LOADS if ld in per_load.columns]].reset_index()
    common.show(per_load, "Per frac and load: mean over models of mean latency relative to no stretch")
    per_model = sw.pivot_table(index="frac", columns="model", values="mean_rel", aggfunc="mean").reset_index()
    common.show(per_model, "Per frac and model: mean over loads of mean latency relative to no stretch")
    best = []
    for (model, load), g in sw.groupby(["model", "load"], sort=False):
        g = g.set_index("frac").reindex(FRACS)
        b = g["mean_latency_ms"].idxmin()
        b25 = g.loc[[f for f in FRACS if f >= 0.25], "mean_latency_ms"].idxmin()
        best.append({"model": model, "load": load, "offered_qps": g["offered_qps"].dropna().iloc[0],
                     "policies": g["policies"].dropna().iloc[0], "best_frac": b, "best_mean_rel": g.loc[b, "mean_rel"],
                     "best_p99_rel": g.loc[b, "p99_rel"], "best_frac_ge_0.25": b25,
                     "mean_rel_at_0": g.loc[0.0, "mean_rel"], "mean_rel_at_0.25": g.loc[0.25, "mean_rel"],
                     "mean_rel_at_1": g.loc[1.0, "mean_rel"], "no_stretch_mean_ms":
                         (g["mean_latency_ms"] / g["mean_rel"]).dropna().iloc[0]})
    best = pd.DataFrame(best)
    common.show(best, "Best frac (lowest mean latency) per model and load")
    return {"summary": summ, "per_load": per_load, "per_model": per_model, "best": best}


def catch_up_account(queries: dict, df: pd.DataFrame) -> pd.DataFrame:
    """For each model / load and each f of ANALYSE_FRACS: the batches stretched after their first stage started
    (newcomers admitted after the batch's first ``s0_start``), how long their original queries waited at the
    boundary where the newcomers caught up, how long the newcomers took to catch up, and each group's latency
    against the same query ids at frac 0."""
    rows = []
    for (model, load, f), q in queries.items():
        if f == 0.0 or (model, load, 0.0) not in queries:
            continue
        ok = df[(df["model"] == model) & (df["load"] == load) & df["frac"].isin([0.0, f])]["complete"]
        if not ok.all():
            continue  # a run with unfinished queries has no latency to compare
        base = queries[(model, load, 0.0)].set_index("query_id")["latency_ms"]
        q = q.set_index("query_id")
        n_st = sum(c.endswith("_start_ms") and c.startswith("s") for c in q.columns)
        first0 = q.groupby("batch_id")["s0_start_ms"].transform("min")
        new = q["admitted_ms"] > first0 + 1e-9  # joined after the batch's first stage had started
        hit = q.loc[new, "batch_id"].unique()
        orig = q["batch_id"].isin(hit) & ~new
        # the originals' wait at the merge: for each stretched batch, the boundary after the last stage the
        # originals finished before the first newcomer joined; wait = next start - that finish
        waits, catch = [], []
        for _, g in q[q["batch_id"].isin(hit)].groupby("batch_id"):
            gn, go = g[new.loc[g.index]], g[~new.loc[g.index]]
            t_join = gn["admitted_ms"].min()
            for k in range(n_st - 1):
                fin = go[f"s{k}_finish_ms"]
                if (fin >= t_join - 1e-9).any():  # this stage was still running when they joined: merge after it
                    waits.extend((go[f"s{k + 1}_start_ms"] - fin).tolist())
                    catch.extend((gn[f"s{k}_finish_ms"] - gn["admitted_ms"]).tolist())
                    break
        d = q["latency_ms"] - base.reindex(q.index)
        rest = ~(new | orig)
        r = df[(df["model"] == model) & (df["load"] == load) & (df["frac"] == f)]
        rows.append({"model": model, "load": load, "frac": f, "mean_rel": float(r["mean_rel"].iloc[0]),
                     "stretched_batches": len(hit), "n_orig": int(orig.sum()), "n_new": int(new.sum()),
                     "orig_merge_wait_ms": float(np.mean(waits)) if waits else math.nan,
                     "new_catch_up_ms": float(np.mean(catch)) if catch else math.nan,
                     "orig_delta_ms": float(d[orig].mean()) if orig.any() else math.nan,
                     "new_delta_ms": float(d[new].mean()) if new.any() else math.nan,
                     "rest_delta_ms": float(d[rest].mean()) if rest.any() else math.nan,
                     "orig_sum_s": float(d[orig].sum()) / 1e3, "new_sum_s": float(d[new].sum()) / 1e3,
                     "rest_sum_s": float(d[rest].sum()) / 1e3, "all_delta_ms": float(d.mean())})
    acc = pd.DataFrame(rows)
    if len(acc):
        order = {k: i for i, k in enumerate(study.LOADS)}
        acc = acc.sort_values(["model", "load", "frac"], key=lambda c: c.map(order) if c.name == "load" else c)
    return acc.reset_index(drop=True)


QOS_MS = 200.0  # the study's p99 target (the QoS rule's)


def plot(df: pd.DataFrame, path: Path, qos: pd.DataFrame | None = None, device: str = common.DEVICE) -> None:
    """Mean latency relative to the no-stretch reference over the fixed fraction, one line per load, one panel per
    model; the QoS rule as a star right of the largest fraction. A run with queries unfinished or a p99 over 200 ms
    carries its verdict's marker. The title names the models, the ``device``, the stack, the policy and the load."""
    models = list(dict.fromkeys(df["model"]))
    plt, sns, fig, axes = common.model_panels(models, 5.0, 3.8)
    pos = sorted(f for f in FRACS if f > 0)
    x0 = pos[0] / 4  # where frac 0 is drawn on the log axis
    xq = pos[-1] * 4  # the QoS rule (default), drawn right of the largest frac
    sw = common.with_verdicts(df[df["run"] == "sweep"], QOS_MS).assign(
        x=lambda d: d["frac"].where(d["frac"] > 0, x0))
    hue_order = [ld for ld in study.LOADS if ld in set(df["load"])]
    colors = dict(zip(hue_order, sns.color_palette(n_colors=len(hue_order))))
    for ax, model in zip(axes.flat, models):
        d = sw[sw["model"] == model]
        ax.set_xscale("log")
        ax.axhline(1.0, color="grey", ls="--", lw=1, label="no stretch")
        ax.axvline(0.25, color="grey", ls=":", lw=1)
        if d.empty:
            ref = df[df["model"] == model]
            ax.text(0.5, 0.5, f"stretch off\n(policies: {ref['policies'].iloc[0]})\nT_comp_wait has no effect",
                    transform=ax.transAxes, ha="center", va="center")
            ax.set_yticks([])
        else:
            sns.lineplot(data=d, x="x", y="mean_rel", hue="load", hue_order=hue_order, palette=colors, marker="o",
                         ax=ax)
        counts = common.mark_verdicts(ax, d["x"], d["mean_rel"], d["verdict"]) if len(d) else {}
        if qos is not None and len(qos) and not d.empty:
            q = common.with_verdicts(qos[(qos["model"] == model) & (qos["run"] == "qos")], QOS_MS)
            for _, r in q.iterrows():
                ax.scatter([xq], [r["mean_rel"]], marker="*", s=90, color=colors.get(r["load"], "k"), zorder=3)
            for v, n in common.mark_verdicts(ax, [xq] * len(q), q["mean_rel"], q["verdict"]).items():
                counts[v] = counts.get(v, 0) + n
            ax.set_xticks([x0, *pos, xq])
            ax.set_xticklabels(["0", *(f"{f:g}" for f in pos), "QoS"])
        else:
            ax.set_xticks([x0, *pos])
            ax.set_xticklabels(["0", *(f"{f:g}" for f in pos)])
        ax.minorticks_off()
        ax.set(title=model, xlabel="t_comp_wait_frac (* = the QoS rule)",
               ylabel="mean latency / no-stretch mean")
        common.marked_note(ax, counts)
    common.side_legend(fig, axes, "load")
    what = common.context(df, device, model=models, policy="dvabatch (Policy III's T_comp_wait swept)")
    load = (f"Poisson, low / medium / high = 1/4, 3/5, 9/10 of DelayBatch's peak ({common.rates_words(df['offered_qps'])}"
            f"); marked: p99 over {QOS_MS:g} ms or queries unfinished")
    fig.suptitle(f"Policy III's T_comp_wait: DVABatch's mean latency relative to no stretch\n{what}\nload: {load}")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)

if __name__ == "__main__":
    main()
