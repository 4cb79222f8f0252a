"""Tables 2-4 of the characterization study (batching-characterization-2024 §4.2): the Triton baseline with MAX-BS
1 ... 64 for ResNet, BERT and LinkNet at low / medium / high load: throughput, mean latency, collected batch size.

**Setup** (``dvasim.studies.characterization`` says how the study maps onto dvasim): the modelled A100 tables
(the study's GPU), ResNet = ``resnet152``, BERT = ``bert_base`` at sequence length 384, LinkNet = ``linknet``;
Triton = ``delaybatch`` with the study's windows (500 us ResNet, 10 us BERT and LinkNet) and ``max_batch_size`` =
MAX-BS, the model run whole. Loads: 1/4, 3/5, 9/10 of DVABatch's peak (the study's reference, §3.1), here the
capacity under a 200 ms p99 of Table 5's strategy VIII (study-default slicing: ResNet and LinkNet 4 stages, BERT
2) under the same arrivals. Arrivals: evenly spaced (the study's client, ``uniform``: deterministic, one run per
point) and, as a check of how much the arrival process matters, Poisson (``--seeds`` runs averaged; the capacity
reference is then found under Poisson arrivals too).

"Collected-BS" = queries / batches (the mean size of the batches the batcher formed); "throughput" = completed
queries over first arrival to last finish, so a saturated configuration serves less than the offered rate, and
its latency grows with the run's length (``stable`` is then false: the study's client, with 64 threads, bounds
the queue; an open-loop run does not). Writes ``study_maxbs.csv`` (one row per model, load, MAX-BS and arrival
process, with the paper's values), ``study_maxbs.png`` and prints the tables in the study's layout.

Every run serves on ``--stack`` (default: ``triton-tensorrt``, the stack the a100 tables imply, the study's
Triton + TensorRT); the CSV has a ``stack`` column.

    .venv/bin/python experiments/study_maxbs.py [--quick] [--out DIR] [--queries N] [--seeds K] [--stack NAME]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import dvasim  # noqa: E402
from dvasim.reporting.plots import save_figure  # noqa: E402
from dvasim.studies import characterization as ch  # noqa: E402
from dvasim.studies import evaluation as study  # noqa: E402

# Tables 2-4: model -> load -> rows (MAX-BS 1..64) of (throughput, latency ms, collected BS)
PAPER = {
    "resnet152": {
        "low": [(211.40, 406.73, 1), (414.65, 214.52, 2), (798.72, 109.98, 4), (1082.94, 8.33, 6),
                (1083.26, 8.32, 6), (1082.79, 8.34, 6), (1083.20, 8.38, 6)],
        "medium": [(212.76, 410.08, 1), (415.43, 218.64, 2), (810.27, 114.45, 4), (1475.22, 63.29, 8),
                   (2356.09, 38.30, 16), (2604.12, 13.35, 22), (2606.72, 13.63, 22)],
        "high": [(212.37, 411.79, 1), (413.89, 220.13, 2), (801.31, 116.01, 4), (1476.97, 63.67, 8),
                 (2485.64, 37.93, 16), (3458.38, 27.19, 32), (3463.90, 27.28, 47)]},
    "bert_base": {
        "low": [(319.33, 2.83, 1), (319.37, 2.95, 1), (319.33, 2.83, 1), (319.32, 2.75, 1), (319.30, 2.93, 1),
                (319.32, 2.83, 1), (319.32, 2.84, 1)],
        "medium": [(664.29, 64.48, 1), (702.70, 4.17, 1), (700.26, 7.56, 2), (700.13, 13.19, 4), (696.00, 22.00, 3),
                   (695.00, 22.00, 3), (697.06, 22.41, 5)],
        "high": [(663.88, 91.08, 1), (797.73, 74.48, 2), (889.94, 65.50, 4), (1002.18, 37.82, 8),
                 (1000.02, 50.39, 13), (989.57, 53.73, 18), (1003.20, 48.88, 23)]},
    "linknet": {
        "low": [(830.63, 1.37, 1), (830.34, 1.47, 1), (830.27, 1.45, 1), (830.18, 1.55, 1), (830.31, 1.61, 1),
                (830.31, 1.75, 1), (829.64, 2.26, 1)],
        "medium": [(1977.77, 1.80, 1), (1976.69, 2.52, 2), (1975.77, 4.15, 3), (1974.40, 8.74, 5),
                   (1967.48, 16.67, 10), (1964.68, 24.64, 16), (1966.96, 23.27, 16)],
        "high": [(2044.28, 30.63, 1), (2453.50, 25.37, 2), (2541.31, 24.58, 4), (2570.41, 24.44, 8),
                 (2195.27, 28.68, 13), (2006.76, 31.41, 21), (1947.94, 32.37, 20)]},
}
TABLE_NO = {"resnet152": 2, "bert_base": 3, "linknet": 4}


def reference(model: str, arrivals: str, quick: bool, seed: int, stack: str | None = None) -> float:
    stages = study.MODELS[model]["stages"]
    cfg = ch.config(ch.model_cfg(model, stages=stages), ch.strategy_policy("VIII"),
                    ch.workload(model, 100.0, 1000, kind=arrivals, seed=seed), stack=stack)
    return ch.capacity_qps(cfg, quick=quick)[0]


def run_point(model: str, max_bs: int, rate: float, n: int, arrivals: str, seed: int,
              window_ms: float | None = None, stack: str | None = None) -> dict:
    """One run of the Triton baseline (the study's window unless ``window_ms`` is given), model run whole."""
    policy = ch.triton_policy(model, max_bs)
    if window_ms is not None:
        policy["max_queue_delay_ms"] = window_ms
    cfg = ch.config(ch.model_cfg(model, stages=1), policy, ch.workload(model, rate, n, kind=arrivals, seed=seed),
                    stack=stack)
    s = dvasim.run(cfg).summary
    return {"stack": s["stack"], "throughput_qps": s["throughput_qps"], "mean_latency_ms": s["mean_latency_ms"],
            "p99_latency_ms": s["p99_latency_ms"], "collected_bs": s["n_queries"] / s["n_batches"],
            "mean_queue_ms": s["mean_queue_ms"], "mean_inference_ms": s["mean_latency_ms"] - s["mean_queue_ms"],
            "stable": bool(s["steady_state"]), "n_completed": s["n_completed"]}


def main(argv=None) -> dict[str, pd.DataFrame]:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--queries", type=int, default=None, help="queries per run (default 4000; quick 300)")
    p.add_argument("--seeds", type=int, default=None, help="Poisson runs per point (default 3; quick: none)")
    args = common.parse(p, argv)
    models = args.models or (["resnet152", "bert_base"] if args.quick else list(ch.MODELS))
    n = args.queries or (300 if args.quick else 4000)
    n_seeds = 0 if args.quick and args.seeds is None else (args.seeds or 3)
    processes = [("uniform", [args.seed + 1])] + ([("poisson", list(range(1, 1 + n_seeds)))] if n_seeds else [])
    clock = common.Stopwatch()
    rows = []
    for model in models:
        for arrivals, seeds in processes:
            ref = reference(model, arrivals, args.quick, args.seed, args.stack)
            for load, frac in ch.LOADS.items():
                for k, mbs in enumerate(ch.MAX_BS):
                    runs = pd.DataFrame([run_point(model, mbs, frac * ref, n, arrivals, s, stack=args.stack)
                                         for s in seeds])
                    r = {"stack": runs["stack"].iloc[0], **runs.mean(numeric_only=True).to_dict()}
                    r["stable"] = bool(runs["stable"].all())
                    pt, pl, pb = PAPER[model][load][k]
                    rows.append({"model": model, "stack": r["stack"], "paper_name": ch.PAPER_NAMES[model], "arrivals": arrivals,
                                 "load": load, "max_bs": mbs, "reference_peak_qps": ref, "offered_qps": frac * ref,
                                 "paper_offered_qps": frac * ch.STUDY_PEAK_QPS[model], "n_seeds": len(seeds), **r,
                                 "paper_throughput_qps": pt, "paper_latency_ms": pl, "paper_collected_bs": pb})
            print(f"{model} {arrivals}: reference (strategy VIII capacity) {ref:.1f} qps [{clock}]", flush=True)
    df = pd.DataFrame(rows)
    common.save(df, args.out, "study_maxbs.csv")
    plot(df, args.out / "study_maxbs.png")
    for model in models:
        for arrivals in df["arrivals"].unique():
            g = df[(df["model"] == model) & (df["arrivals"] == arrivals)]
            if not len(g):
                continue
            wide = layout(g)
            common.show(wide, f"Table {TABLE_NO[model]} ({ch.PAPER_NAMES[model]} = {model}, A100 tables, "
                              f"stack {g['stack'].iloc[0]}, {arrivals} "
                              f"arrivals): ours / paper -- throughput (qps), mean latency (ms), collected BS; "
                              f"offered {', '.join(f'{ld} {r:.0f}' for ld, r in g.groupby('load', sort=False)['offered_qps'].first().items())}"
                              " qps", digits=1)
    findings(df)
    print(f"total {clock}")
    return {"maxbs": df}


def layout(g: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({"MAX-BS": list(ch.MAX_BS)})
    for load in ch.LOADS:
        h = g[g["load"] == load].set_index("max_bs").loc[list(ch.MAX_BS)]
        out[f"{load} thr"] = [f"{a:.0f}{'' if s else '*'} / {b:.0f}" for a, b, s in
                              zip(h["throughput_qps"], h["paper_throughput_qps"], h["stable"], strict=True)]
        out[f"{load} lat"] = [f"{a:.1f} / {b:.1f}" for a, b in zip(h["mean_latency_ms"], h["paper_latency_ms"],
                                                                   strict=True)]
        out[f"{load} BS"] = [f"{a:.1f} / {b:g}" for a, b in zip(h["collected_bs"], h["paper_collected_bs"],
                                                                strict=True)]
    return out


def findings(df: pd.DataFrame) -> None:
    """Finding 3 (throughput rises with MAX-BS, then plateaus) and 4 (LinkNet at high load peaks at a middle MAX-BS)
    checked on our rows and the paper's, with uniform arrivals."""
    rows = []
    for (model, load), g in df[df["arrivals"] == "uniform"].groupby(["model", "load"], sort=False):
        g = g.sort_values("max_bs")
        for who, col in (("ours", "throughput_qps"), ("paper", "paper_throughput_qps")):
            t = g[col].to_numpy()
            best = int(g["max_bs"].to_numpy()[int(np.argmax(t >= 0.99 * t.max()))])
            rows.append({"model": model, "load": load, "who": who, "thr_at_1": t[0], "thr_max": t.max(),
                         "best_max_bs": best, "thr_at_64_rel_max": t[-1] / t.max(),
                         "monotone_within_1%": bool(np.all(np.diff(t) >= -0.01 * t.max()))})
    common.show(pd.DataFrame(rows), "Findings 3-4: throughput over MAX-BS (best MAX-BS = the smallest within 1% of the "
                                    "highest throughput; a drop after the best = Finding 4's shape)", digits=3)


def plot(df: pd.DataFrame, path: Path, device: str = ch.DEVICE) -> None:
    """Throughput, mean latency and collected batch size over MAX-BS (uniform arrivals; dashed: the study's Tables
    2-4), one column per model; a point whose run was not stable (``stable`` false: saturated, its queue growing)
    carries its verdict's marker. The title names the models, the ``device`` (the A100 tables), the stack, the
    policy and the load."""
    plt, sns = common.plt_sns()
    models = list(dict.fromkeys(df["model"]))
    fig, axes = plt.subplots(3, len(models), figsize=(5 * len(models), 10.5), squeeze=False)
    u = common.with_verdicts(df[df["arrivals"] == "uniform"])
    for j, model in enumerate(models):
        g = u[u["model"] == model]
        for i, (col, pcol, label) in enumerate((("throughput_qps", "paper_throughput_qps", "throughput (qps)"),
                                                ("mean_latency_ms", "paper_latency_ms", "mean latency (ms)"),
                                                ("collected_bs", "paper_collected_bs", "collected batch size"))):
            ax = axes[i, j]
            sns.lineplot(data=g, x="max_bs", y=col, hue="load", marker="o", ax=ax)
            for load, h in g.groupby("load", sort=False):
                ax.plot(h["max_bs"], h[pcol], ls="--", marker="x", alpha=0.5, label=f"{load} (paper)")
            ax.set(xscale="log", title=f"{ch.PAPER_NAMES[model]} ({model})" if i == 0 else "",
                   xlabel="MAX-BS", ylabel=label)
            if col == "mean_latency_ms":
                ax.set_yscale("log")
            counts = common.mark_groups(ax, g, "max_bs", col, "load")
            if i == 0:
                common.marked_note(ax, counts, "marked (not stable: the queue grows)")
    common.side_legend(fig, axes, "load (solid: dvasim; dashed: the study)", y=0.85)
    qps = u.groupby("load", sort=False)["offered_qps"].agg(["min", "max"])
    load = ("evenly spaced arrivals, low / medium / high = 1/4, 3/5, 9/10 of strategy VIII's capacity ("
            + ", ".join(f"{ld} {r['min']:.0f}-{r['max']:.0f}" for ld, r in qps.iterrows()) + " queries/s)")
    what = common.context(df, device, model=models, policy="delaybatch (Triton's batcher, the model run whole)")
    save_figure(fig, path, "Triton with varying MAX-BS (solid: dvasim, uniform arrivals; dashed: the study's Tables "
                           f"2-4; marked: not stable)\n{what}\nload: {load}")

if __name__ == "__main__":
    main()
