"""Figure 15 (paper §8.3): the six models under the stepping load, DelayBatch (window tuned for peak throughput)
vs DVABatch; per-query latency against query id with the offered load on a right axis, and the peak throughputs.

DelayBatch runs the model whole (one stage, as Triton runs a TensorRT engine, §8.1), DVABatch on the model's
default slicing. Also run: DVABatch behind the same front-door window as the tuned DelayBatch ("dvabatch+window"). In the paper
DVABatch is a Triton backend, so Triton's batcher (and its window) sits in front of it; our ``dvabatch`` uses
window 0 for models without input diversity (Policy I's first-stage window for BERT), which is the lead's choice.

Writes ``fig15_peaks.csv`` (one row per model; usable as ``--calib-from`` by the other scripts),
``fig15_tuning.csv`` (DelayBatch's peak per candidate window), ``fig15_levels.csv`` (mean / p99 latency per
stepping level), ``fig15_queries.csv.gz`` (every 4th query of the stepping runs), ``fig15_stepping.png`` and
``fig15_peaks.png``.

Every run serves on ``--stack`` (default: the stack the Titan RTX tables imply, ``triton-tensorrt-21.10``, the paper's
Triton + TensorRT); every CSV has a ``stack`` column and the figures name it.

    .venv/bin/python experiments/fig15_stepping.py [--quick] [--out DIR] [--window-from fig15_peaks.csv] [--stack NAME]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from dvasim.studies.compare import stack_title  # noqa: E402  (" [stack: NAME]" for a figure title)

PAPER_GAIN = {"bert_base": 1.4681, "bert_large": 1.37}  # §8.3: +46.81 %, 1.37x; equal peaks for the others
POLICIES = ("delaybatch", "dvabatch", "dvabatch+window")
# DelayBatch is Triton running the whole TensorRT engine (§8.1): the model unsliced, one launch per batch. On the GPU
# alone that is the same as one batch at a time through the sliced stages; on a stack with per-batch host costs it
# is not: the batch's entry (input gathering and copy) runs beside the GPU's work of the batch's first stage only.
WHOLE = {"stages": 1}


def policy_dict(name: str, window: float) -> dict:
    if name == "delaybatch":
        return common.delaybatch(window)
    if name == "dvabatch":
        return {"name": "dvabatch"}
    return {"name": "dvabatch", "max_queue_delay_ms": float(window)}


def main(argv=None) -> dict[str, pd.DataFrame]:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--every", type=int, default=4, help="keep every k-th query in fig15_queries.csv.gz")
    args = common.parse(p, argv)
    models = args.models or (["bert_base", "linknet"] if args.quick else list(common.ALL_MODELS))
    kw = {"stack": args.stack}  # every run's serving stack (None: the one the Titan RTX tables imply)
    stacks = {m: common.stack_label(m, args.stack) for m in models}
    calib = common.read_calib(args.calib_from, stacks)
    clock = common.Stopwatch()
    peaks, tuning, levels, queries = [], [], [], []
    for model in models:
        if calib is not None and model in calib.index:
            window = float(calib.loc[model, "delaybatch_window_ms"])
        else:
            tuned = common.tune_window(model, quick=args.quick, seed=args.seed, **kw, **WHOLE)
            tuning.append(tuned.assign(stack=stacks[model]))
            window = float(tuned.loc[tuned["best"], "max_queue_delay_ms"].iloc[0])
        row = {"model": model, "stack": stacks[model], "delaybatch_stages": WHOLE["stages"],
               "delaybatch_window_ms": window}
        for name in POLICIES:
            res = common.peak(model, policy_dict(name, window), quick=args.quick, seed=args.seed, **kw,
                              **(WHOLE if name == "delaybatch" else {}))
            row[f"peak_qps_{name}"] = res.peak_qps
            row[f"wall_s_{name}"] = res.wall_s
            row[f"at_ladder_top_{name}"] = res.at_ladder_top
            lv = res.levels.assign(model=model, stack=stacks[model], policy=name)
            levels.append(lv)
            st = res.stepping
            keep = st.iloc[:: args.every]
            queries.append(pd.DataFrame({"model": model, "stack": stacks[model], "policy": name,
                                         "qid": keep.index.to_numpy(),
                                         "offered_qps": keep["offered_qps"].to_numpy(),
                                         "latency_ms": keep["latency_ms"].to_numpy()}))
        row["dva_over_delay"] = row["peak_qps_dvabatch"] / row["peak_qps_delaybatch"]
        row["dvawin_over_delay"] = row["peak_qps_dvabatch+window"] / row["peak_qps_delaybatch"]
        row["paper_dva_over_delay"] = PAPER_GAIN.get(model, 1.0)
        peaks.append(row)
        print(f"{model} [{stacks[model]}]: window {window:.3f} ms, peaks " + ", ".join(
            f"{n} {row[f'peak_qps_{n}']:.1f}" for n in POLICIES) + f"  [{clock}]", flush=True)
    peaks = pd.DataFrame(peaks).rename(columns={"peak_qps_dvabatch+window": "peak_qps_dvabatch_window",
                                                "wall_s_dvabatch+window": "wall_s_dvabatch_window",
                                                "at_ladder_top_dvabatch+window": "at_ladder_top_dvabatch_window"})
    levels = pd.concat(levels, ignore_index=True)[["model", "stack", "policy", "offered_qps", "n", "mean_latency_ms",
                                                   "p99_latency_ms", "within_qos"]]
    queries = pd.concat(queries, ignore_index=True)
    tuning = pd.concat(tuning, ignore_index=True) if tuning else pd.DataFrame(
        columns=["model", "max_queue_delay_ms", "peak_qps", "best", "stack"])
    common.save(peaks, args.out, "fig15_peaks.csv")
    common.save(levels, args.out, "fig15_levels.csv")
    common.save(tuning, args.out, "fig15_tuning.csv")
    queries.to_csv(args.out / "fig15_queries.csv.gz", index=False, float_format="%.5g")
    plot_stepping(queries, args.out / "fig15_stepping.png")
    plot_peaks(peaks, args.out / "fig15_peaks.png")
    common.show(peaks[["model", "stack", "delaybatch_window_ms", "peak_qps_delaybatch", "peak_qps_dvabatch",
                       "peak_qps_dvabatch_window", "dva_over_delay", "paper_dva_over_delay"]],
                f"Figure 15: peak throughput (QPS, p99 <= 200 ms){stack_title(peaks)}")
    print(f"total {clock}")
    return {"peaks": peaks, "levels": levels, "tuning": tuning, "queries": queries}


def plot_stepping(q: pd.DataFrame, path: Path, device: str = common.DEVICE) -> None:
    """Per-query latency against query id (log scale, up to the largest latency: no cap that piles the overloaded
    queries into a line), the offered load on a right axis; each stepping level whose p99 is over the SLO is marked
    (a hollow over-SLO circle at the level's p99, per policy), and queries that never finished (none in the
    committed runs) as crosses at the top edge. Panel titles name the model, device and stack."""
    models = list(dict.fromkeys(q["model"]))
    plt, sns, fig, axes = common.model_panels(models, 5.2, 3.8)
    # the policies' colours of every figure ("dvabatch+window" is the variant dvabatch-window)
    colors = {name: common.policy_colour(name) for name in POLICIES}
    top = float(np.nanmax(q["latency_ms"])) if q["latency_ms"].notna().any() else 1e4
    for ax, model in zip(axes.flat, models):
        d = q[q["model"] == model]
        for name in POLICIES:
            e = d[d["policy"] == name]
            done = e["latency_ms"].notna()
            ax.scatter(e["qid"][done], e["latency_ms"][done], s=1.5, color=colors[name], label=name,
                       rasterized=True, alpha=0.6)
            if (~done).any():
                ax.scatter(e["qid"][~done], np.full(int((~done).sum()), top * 1.4), marker="x", s=8,
                           color=colors[name], clip_on=False, label=f"{name}: never finished")
            lv = e.assign(lat=e["latency_ms"].fillna(np.inf)).groupby("offered_qps", sort=False).agg(
                qid=("qid", "median"), p99=("lat", lambda v: float(np.percentile(v, 99))))
            over = lv[lv["p99"] > study_qos()]
            common.mark_verdicts(ax, over["qid"], over["p99"].clip(upper=top * 1.4), ["over-SLO"] * len(over),
                                 legend=ax is axes.flat[0] and name == POLICIES[0])
        ax.set_yscale("log")
        ax.set_ylim(1, top * 1.6)
        # the SLO is named in the figure's legend (the right edge holds the offered load's axis)
        ax.axhline(study_qos(), color=common.SLO_COLOUR, ls="--", lw=0.8, label=f"SLO {study_qos():g} ms")
        ax.set(title=f"{model}, {common.context(d, device)}", xlabel="query id (the load steps up every 2,000 "
               "queries)", ylabel="latency (ms)")
        ax.title.set_fontsize(9)
        ax2 = ax.twinx()
        first = d[d["policy"] == POLICIES[0]]
        ax2.plot(first["qid"], first["offered_qps"], color="black", lw=1, label="offered load")
        ax2.set_yscale("log")
        ax2.set_ylabel("offered load (QPS, black line)")
        ax2.grid(False)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    labels = [("over-SLO level (its p99)" if lb == "over-SLO" else lb) for lb in labels]
    leg = fig.legend(handles, labels, loc="upper center", ncol=len(labels), bbox_to_anchor=(0.5, 0.985))
    for h, lb in zip(leg.legend_handles, labels):
        if lb in POLICIES:
            h.set_sizes([30])
            h.set_alpha(1.0)
    rates = q["offered_qps"]
    every = max(1, round(2000 / max(1.0, float(q.groupby(["model", "policy", "offered_qps"]).size().median()))))
    fig.suptitle(f"Figure 15: per-query latency under the stepping load ({rates.min():.0f} to {rates.max():.0f} "
                 f"queries/s; every {every}th query drawn), policies: {', '.join(POLICIES)}", y=1.0, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def study_qos() -> float:
    """The QoS target of the stepping runs (ms)."""
    from dvasim.studies import evaluation as study

    return float(study.QOS_MS)


def plot_peaks(peaks: pd.DataFrame, path: Path, device: str = common.DEVICE) -> None:
    plt, sns = common.plt_sns()
    long = peaks.melt(id_vars="model", value_vars=["peak_qps_delaybatch", "peak_qps_dvabatch",
                                                   "peak_qps_dvabatch_window"],
                      var_name="policy", value_name="peak_qps")
    long["policy"] = long["policy"].str.replace("peak_qps_", "").str.replace("dvabatch_window", "dvabatch+window")
    fig, ax = plt.subplots(figsize=(9, 4))
    sns.barplot(data=long, x="model", y="peak_qps", hue="policy", ax=ax, saturation=1,
                palette={name: common.PALETTE[name.replace("+", "-")] for name in POLICIES})
    ax.set(ylabel="peak throughput (QPS)", xlabel="",
           title=f"peak throughput under the stepping load (p99 <= 200 ms)\n{common.context(peaks, device)}")
    # a peak at the ladder's top is only a lower bound: marked as such
    for name in POLICIES:
        col = "at_ladder_top_" + name.replace("dvabatch+window", "dvabatch_window")
        if col in peaks and peaks[col].astype(str).str.lower().eq("true").any():
            common.axis_note(ax, f"{name}: {', '.join(peaks.loc[peaks[col].astype(str).str.lower().eq('true'), 'model'])}"
                                 " held the ladder's top (a lower bound)")
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1.01, 1.0), title="policy", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
