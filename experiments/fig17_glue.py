"""Figure 17 (paper §8.4): peak throughput of DVABatch and DelayBatch for BertBase and BertLarge when the inputs
have the sequence lengths of each GLUE task (the same stepping load as Figure 15).

DelayBatch runs the model whole (one stage, Triton running the TensorRT engine, §8.1); its window is re-tuned
for every task, over three windows: the model's RTE-tuned window (from
``--calib-from fig15_peaks.csv``, else tuned here on RTE) and half and twice it. The peak search stops the
stepping load at the first level at or above twice the model's RTE peak for the policy (only the levels up to
the first one over QoS matter; if all kept levels are within QoS the whole ladder is run).

``dvabatch_at_ladder_top`` marks a DVABatch peak that is the top of the ladder (4,000 QPS, every level within
QoS): a lower bound, not a measured peak (DelayBatch's peaks never reach it here).

Writes ``fig17_glue.csv`` (one row per model and task) and ``fig17_glue.png``.

Every run serves on ``--stack`` (default: ``triton-tensorrt-21.10``, the stack the Titan RTX tables imply); a
``--calib-from`` CSV must come from the same stack.

    .venv/bin/python experiments/fig17_glue.py [--quick] [--out DIR] [--calib-from fig15_peaks.csv] [--stack NAME]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from dvasim.reporting.plots import policy_colours  # noqa: E402  (one colour per policy in every figure)
from dvasim.studies.compare import stack_title  # noqa: E402  (" [stack: NAME]" for a figure title)

PAPER = {"bert_base": 1.468, "bert_large": 1.37}  # §8.4: average over the tasks (+46.8 %, 1.37x)


def main(argv=None) -> dict[str, pd.DataFrame]:
    from dvasim.workload import glue_tasks, load_lengths

    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--tasks", nargs="+", default=None, help="subset of the GLUE tasks")
    args = common.parse(p, argv)
    models = args.models or (["bert_base"] if args.quick else ["bert_base", "bert_large"])
    tasks = args.tasks or (["RTE", "SST-2"] if args.quick else list(glue_tasks()))
    kw = {"stack": args.stack}  # every run's serving stack (None: the one the Titan RTX tables imply)
    stacks = {m: common.stack_label(m, args.stack) for m in models}
    calib = common.read_calib(args.calib_from, stacks)
    clock = common.Stopwatch()
    rows = []
    for model in models:
        c = common.calib_for(model, calib, quick=args.quick, seed=args.seed, **kw)
        w0 = c["window"]
        windows = [w0] if args.quick else [w0 / 2, w0, w0 * 2]
        for task in tasks:
            dist = f"glue:{task}"
            lens = load_lengths(dist)
            tuned = common.tune_window(model, quick=args.quick, windows=windows, seq_len_dist=dist, seed=args.seed,
                                       cap_qps=None if args.quick else 2.0 * c["peak_delaybatch"], stages=1, **kw)
            best = tuned.loc[tuned["best"]].iloc[0]
            dva = common.peak(model, {"name": "dvabatch"}, quick=args.quick, seq_len_dist=dist, seed=args.seed,
                              cap_qps=None if args.quick else 2.0 * c["peak_dvabatch"], **kw)
            row = {"model": model, "stack": stacks[model], "task": task, "mean_len": float(np.mean(lens)),
                   "p95_len": float(np.percentile(lens, 95)), "max_len": int(np.max(lens)),
                   "cv_len": float(np.std(lens) / np.mean(lens)),
                   "delaybatch_window_ms": float(best["max_queue_delay_ms"]),
                   "peak_qps_delaybatch": float(best["peak_qps"]), "peak_qps_dvabatch": dva.peak_qps,
                   "dvabatch_at_ladder_top": dva.at_ladder_top}
            row["dva_over_delay"] = row["peak_qps_dvabatch"] / row["peak_qps_delaybatch"]
            rows.append(row)
            print(f"{model} [{stacks[model]}] {task}: delaybatch {row['peak_qps_delaybatch']:.1f} (window "
                  f"{row['delaybatch_window_ms']:.3f}), dvabatch {row['peak_qps_dvabatch']:.1f}, "
                  f"x{row['dva_over_delay']:.2f}  [{clock}]", flush=True)
    df = pd.DataFrame(rows)
    common.save(df, args.out, "fig17_glue.csv")
    plot(df, args.out / "fig17_glue.png")
    common.show(df[["model", "stack", "task", "mean_len", "max_len", "cv_len", "peak_qps_delaybatch", "peak_qps_dvabatch",
                    "dva_over_delay"]], f"Figure 17: peak throughput (QPS) per GLUE task{stack_title(df)}")
    avg = df.groupby(["model", "stack"])["dva_over_delay"].mean().rename("mean_dva_over_delay").reset_index()
    avg["paper"] = avg["model"].map(PAPER)
    common.show(avg, "average DVABatch / DelayBatch peak over the tasks")
    print(f"total {clock}")
    return {"glue": df, "average": avg}


def plot(df: pd.DataFrame, path: Path) -> None:
    plt, sns = common.plt_sns()
    long = df.melt(id_vars=["model", "task"], value_vars=["peak_qps_delaybatch", "peak_qps_dvabatch"],
                   var_name="policy", value_name="peak_qps")
    long["policy"] = long["policy"].str.replace("peak_qps_", "")
    models = list(dict.fromkeys(df["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 4), squeeze=False)
    for ax, model in zip(axes.flat, models):
        sns.barplot(data=long[long["model"] == model], x="task", y="peak_qps", hue="policy",
                    palette=policy_colours(long["policy"].unique()), saturation=1, ax=ax)
        ax.set(title=f"{model}, {common.context(df[df['model'] == model])}", xlabel="GLUE task (input lengths)", ylabel="peak throughput (QPS)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
