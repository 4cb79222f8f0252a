"""Table 5 of the characterization study (batching-characterization-2024 §6.1): throughput of the eight
reorchestrating strategies (stretch, split and pipelined execution each on or off) for ResNet, BERT and LinkNet at
low / medium / high load.

**Strategies.** Table 5's rows, in its order (its columns Stretch, Split, Pipeline read as bits): I = 000 (naive
batching), II = 001, III = 010, IV = 011, V = 100, VI = 101, VII = 110, VIII = 111. Each is ``dvabatch`` with
``policies = []`` (no Policy I clustering: Table 5's strategies are only about the three operations) and the flags
``stretch``, ``split``, ``pipeline`` of :class:`dvasim.policies.dvabatch.DVABatch` set to the strategy's bits.
``pipeline = false``: a new batch enters only when the pipeline holds no batch (no overlap across stages).

**Models.** ResNet = ``resnet152`` (4 stages), BERT = ``bert_base`` (2 stages, GLUE RTE lengths), LinkNet =
``linknet`` (4 stages), on the Titan RTX tables (``[model] device = "titanrtx"``), ``bs_max`` 64, QoS 200 ms.

**Loads.** Low / medium / high = 1/4, 3/5, 9/10 (``dvasim.studies.evaluation.LOADS``) of the peak throughput of strategy VIII
(everything on) found by :func:`dvasim.studies.capacity.capacity` (p99 within 200 ms, Poisson; ``study.peak_by_capacity``).
Table 5's own loads fit these fractions: its low / medium throughputs (all strategies equal, so = offered) are in
the ratio 0.415 (ResNet 1083 / 2608, LinkNet 830 / 1974), i.e. 1/4 : 3/5, and at high load the best strategies
reach about 9/10 of four times the low load. At high load, a strategy whose capacity is below the offered rate
saturates and its measured throughput (finished queries over first arrival to last finish) falls below the
offered rate: that is where Table 5's strategies differ. In the simulator the strategies' saturation throughputs
lie closer together than their p99-bounded peaks, so 9/10 of VIII's peak saturates few of them; a fourth level,
*overload* (``--overload``, default 1.5 x the same peak, not in Table 5), saturates every strategy and so measures
each one's throughput capacity; it is compared with Table 5's high-load column.

Every point is the mean over ``--seeds`` Poisson runs of ``--queries`` queries. Writes ``table5_strategies.csv``
(one row per model, load and strategy, means over the seeds, with the paper's throughput where Table 5 gives it),
``table5_strategies_runs.csv`` (one row per seed) and ``table5_strategies.png`` (one panel per model), and prints
the table in Table 5's layout and a comparison of the orderings at high load with the paper's.

Every run serves on ``--stack`` (default: ``triton-tensorrt-21.10``, the stack the Titan RTX tables imply); the CSVs have
a ``stack`` column and the figure names it.

    .venv/bin/python experiments/table5_strategies.py [--quick] [--out DIR] [--queries N] [--seeds K] [--stack NAME]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from dvasim.reporting.plots import save_figure  # noqa: E402
from dvasim.studies import characterization as ch  # noqa: E402
from dvasim.studies import evaluation as study  # noqa: E402
from dvasim.studies.compare import stack_title  # noqa: E402  (" [stack: NAME]" for a figure title)

LABELS = tuple(ch.TABLE5_STRATEGIES)  # Table 5's rows in its order
PAPER_NAME = ch.PAPER_NAMES
PAPER_LOAD = {"low": "low", "medium": "medium", "high": "high", "overload": "high"}  # Table 5's column compared

# Table 5's throughputs (queries/s): model -> load -> one value per strategy I..VIII
PAPER = {
    "resnet152": {"low": [1083.14, 1081.07, 1083.07, 1081.04, 1081.12, 1080.92, 1080.89, 1080.88],
                  "medium": [2608.62, 2603.97, 2607.60, 2604.87, 2605.03, 2602.08, 2604.82, 2602.44],
                  "high": [3455.97, 3867.68, 3087.69, 3740.58, 3854.02, 3866.82, 3756.22, 3867.37]},
    "bert_base": {"low": [319.32, 319.33, 319.34, 319.35, 319.30, 319.33, 319.34, 319.33],
                  "medium": [698.61, 692.98, 697.34, 695.63, 696.19, 686.51, 695.99, 681.77],
                  "high": [999.95, 749.00, 999.47, 997.73, 995.43, 752.64, 993.90, 737.95]},
    "linknet": {"low": [830.10, 830.02, 829.97, 829.98, 830.03, 829.91, 829.94, 829.99],
                "medium": [1974.27, 1974.22, 1974.36, 1974.86, 1974.49, 1973.39, 1974.31, 1974.06],
                "high": [2315.73, 2774.40, 2409.07, 2351.10, 2368.43, 2764.35, 2322.81, 2746.51]},
}


def run_one(model: str, policy: dict, rate: float, n: int, seed: int, stack: str | None = None) -> dict:
    wl = {"kind": "poisson", "rate_qps": float(rate), "n_queries": int(n), "seed": seed}
    s = study.run_config(study.make_config(model, policy, wl, stack=stack)).summary
    keys = ("stack", "throughput_qps", "mean_latency_ms", "p99_latency_ms", "qos_violation_rate", "mean_exit_batch_size",
            "n_stretch", "n_split", "mean_batches_in_flight", "n_completed", "n_queries")
    return {k: s[k] for k in keys}


def main(argv=None) -> dict[str, pd.DataFrame]:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--queries", type=int, default=None, help="queries per run (default 5000; quick 400)")
    p.add_argument("--seeds", type=int, default=None, help="runs per point (default 3; quick 1)")
    p.add_argument("--overload", type=float, default=1.5,
                   help="the overload level as a multiple of strategy VIII's peak (default 1.5; 0 = none)")
    args = common.parse(p, argv)
    models = args.models or (["resnet152", "linknet"] if args.quick else list(ch.MODELS))
    n = args.queries or (400 if args.quick else 5000)
    seeds = range(1, 1 + (args.seeds or (1 if args.quick else 3)))
    clock = common.Stopwatch()
    rows = []
    for model in models:
        ref, _ = study.peak_by_capacity(model, ch.strategy_policy("VIII"), seed=args.seed,
                                        refine=1 if args.quick else 4, stack=args.stack)
        loads = {**study.LOADS, **({"overload": args.overload} if args.overload > 0 else {})}
        for load, frac in loads.items():
            rate = frac * ref
            for label, (st, sp, pl) in ch.TABLE5_STRATEGIES.items():
                for seed in seeds:
                    r = run_one(model, ch.strategy_policy(label), rate, n, seed, args.stack)
                    rows.append({"model": model, "stack": r["stack"], "load": load, "strategy": label, "stretch": st, "split": sp,
                                 "pipeline": pl, "reference_peak_qps": ref, "offered_qps": rate, "seed": seed, **r})
        print(f"{model} done (strategy VIII peak {ref:.1f} qps) [{clock}]", flush=True)
    runs = pd.DataFrame(rows)
    keys = ["model", "stack", "load", "strategy", "stretch", "split", "pipeline"]
    mean = runs.groupby(keys, sort=False).mean(numeric_only=True).reset_index().drop(columns="seed")
    mean["throughput_rel_I"] = mean["throughput_qps"] / mean.groupby(["model", "load"])["throughput_qps"].transform(
        "first")
    mean["paper_throughput_qps"] = [PAPER[r.model][PAPER_LOAD[r.load]][LABELS.index(r.strategy)]
                                    if r.model in PAPER else np.nan for r in mean.itertuples()]
    mean["paper_rel_I"] = mean["paper_throughput_qps"] / mean.groupby(["model", "load"])[
        "paper_throughput_qps"].transform("first")
    common.save(runs, args.out, "table5_strategies_runs.csv")
    common.save(mean, args.out, "table5_strategies.csv")
    plot(mean, args.out / "table5_strategies.png")
    wide = mean.pivot_table(index="strategy", columns=["model", "load"], values="throughput_qps", sort=False)
    wide.columns = [f"{PAPER_NAME.get(m, m)} {ld}" for m, ld in wide.columns]
    common.show(wide.reset_index(), f"Table 5: throughput (queries/s) per strategy, model and load{stack_title(mean)}",
                digits=1)
    common.show(mean[["model", "load", "strategy", "offered_qps", "throughput_qps", "mean_latency_ms",
                      "p99_latency_ms", "n_stretch", "n_split", "mean_batches_in_flight"]],
                "per strategy: throughput, mean / p99 latency (ms), meta operations, batches in flight", digits=2)
    compare(mean)
    print(f"total {clock}")
    return {"runs": runs, "mean": mean, "comparison": comparison(mean)}


def comparison(mean: pd.DataFrame) -> pd.DataFrame:
    """Per model and load: the simulator's and the paper's throughput relative to strategy I, and the rank
    correlation (Spearman) of the two orderings of the eight strategies."""
    rows = []
    for (model, load), g in mean.groupby(["model", "load"], sort=False):
        sim, pap = g["throughput_qps"].rank(), g["paper_throughput_qps"].rank()
        rows.append({"model": model, "load": load,
                     "sim_best": ",".join(g.loc[g["throughput_rel_I"] >= g["throughput_rel_I"].max() - 0.01,
                                                "strategy"]),
                     "paper_best": ",".join(g.loc[g["paper_rel_I"] >= g["paper_rel_I"].max() - 0.01, "strategy"]),
                     "sim_spread_%": 100 * (g["throughput_qps"].max() / g["throughput_qps"].min() - 1),
                     "paper_spread_%": 100 * (g["paper_throughput_qps"].max() / g["paper_throughput_qps"].min() - 1),
                     # only where the simulator's strategies differ by more than run-to-run noise (0.5%)
                     "spearman": float(np.corrcoef(sim, pap)[0, 1])
                     if g["throughput_qps"].max() > 1.005 * g["throughput_qps"].min() else np.nan})
    return pd.DataFrame(rows)


def compare(mean: pd.DataFrame) -> None:
    cmp = comparison(mean)
    common.show(cmp, "vs the paper's Table 5: best strategies (within 1% of the best), spread max/min - 1, "
                     "rank correlation of the eight strategies' throughputs (where they differ by > 0.5%)", digits=2)
    for load in ("high", "overload"):
        _relative(mean, load)
    print("\nTable 5's low and medium loads leave every strategy at the offered rate (spread < 2.5%); the "
          "differences are at high load. Our tables are modelled Titan RTX tables of resnet152 / bert_base / linknet "
          "under the simulator's device-sharing model, not the study's measurements, so absolute rates differ; "
          "compare the orderings. The overload rows are compared with Table 5's high-load column.")


def _relative(mean: pd.DataFrame, load: str) -> None:
    high = mean[mean["load"] == load]
    if not len(high):
        return
    rel = high.pivot_table(index="strategy", columns="model", values=["throughput_rel_I", "paper_rel_I"], sort=False)
    rel.columns = [f"{PAPER_NAME.get(m, m)} {'sim' if k == 'throughput_rel_I' else 'paper'}" for k, m in rel.columns]
    common.show(rel[sorted(rel.columns)].reset_index(), f"{load} load: throughput relative to strategy I "
                "(paper: Table 5's high load)", digits=3)


QOS_MS = 200.0  # the study's p99 target (the loads' reference capacity is searched under it)
LOAD_WORDS = "Poisson, low / medium / high / overload = 1/4, 3/5, 9/10, 1.5 x strategy VIII's capacity"


def plot(mean: pd.DataFrame, path: Path, device: str = common.DEVICE) -> None:
    """Throughput per load and strategy, one panel per model; each load's tick says its offered rate, a bar whose
    runs were over the 200 ms p99 (or left queries unfinished) carries its verdict's marker at its top. The title
    names the models, the ``device``, the stack, the policy (DVABatch with the strategies' flags) and the load."""
    plt, sns = common.plt_sns()
    models = list(dict.fromkeys(mean["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.4), squeeze=False)
    order = [ld for ld in PAPER_LOAD if ld in set(mean["load"])]
    hue = [lb for lb in LABELS if lb in set(mean["strategy"])]
    width = 0.8 / max(len(hue), 1)  # seaborn's dodged bars: 0.8 wide in all, one slot per strategy
    for ax, model in zip(axes.flat, models):
        d = common.with_verdicts(mean[mean["model"] == model], QOS_MS)
        sns.barplot(data=d, x="load", y="throughput_qps", hue="strategy", order=order, hue_order=hue,
                    palette=common.STRATEGY_COLOURS, saturation=1, errorbar=None, ax=ax)
        qps = d.groupby("load")["offered_qps"].first()
        ax.set_xticks(range(len(order)))
        ax.set_xticklabels([f"{ld}\n{qps.get(ld, float('nan')):.0f} qps" for ld in order])
        ax.set(title=f"{PAPER_NAME.get(model, model)} ({model})", xlabel="load (offered queries/s)",
               ylabel="throughput (queries/s)")
        rows = [r for r in d.to_dict("records") if r["load"] in order and r["strategy"] in hue]
        counts = common.mark_verdicts(ax, [order.index(r["load"]) - 0.4 + width * (hue.index(r["strategy"]) + 0.5)
                                           for r in rows], [r["throughput_qps"] for r in rows],
                                      [r["verdict"] for r in rows])
        common.marked_note(ax, counts)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    leg = common.verdict_legend(axes.flat[-1], "strategy (stretch, split, pipeline)")
    for text in leg.get_texts() if leg is not None else []:
        if text.get_text() in ch.TABLE5_STRATEGIES:
            text.set_text(f"{text.get_text()} ({''.join(str(b) for b in ch.TABLE5_STRATEGIES[text.get_text()])})")
    what = common.context(mean, device, model=models, policy="dvabatch with Table 5's strategies I-VIII")
    save_figure(fig, path, f"Table 5's eight strategies: throughput (marked: p99 over {QOS_MS:g} ms or queries "
                           f"unfinished)\n{what}\nload: {LOAD_WORDS}")

if __name__ == "__main__":
    main()
