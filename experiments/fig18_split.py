"""Figure 18 (paper §8.5): mean latency of LinkNet and UNet at low / medium / high load (1/4, 3/5, 9/10 of the
tuned DelayBatch's peak throughput) with DVABatch, DVABatch-split (only *split*) and DelayBatch.

DelayBatch runs the model whole (one stage: Triton running the TensorRT engine, §8.1; on a stack with per-batch
host costs the sliced model would hide a batch's input copy behind its first stage only). DVABatch-split runs
behind the tuned DelayBatch window (the paper's DVABatch-split is DVABatch with only split
enabled, fed by Triton's batcher); ``dvabatch`` uses its defaults (window 0 for these models). Every point is the
mean over ``--seeds`` Poisson runs of ``--queries`` queries.

Writes ``fig18_split.csv`` (one row per model, load, policy, seed), ``fig18_split_mean.csv`` (averaged over the
seeds, with the reductions vs DelayBatch) and ``fig18_split.png``.

Every run serves on ``--stack`` (default: ``triton-tensorrt-21.10``, the stack the Titan RTX tables imply); a
``--calib-from`` CSV must come from the same stack.

    .venv/bin/python experiments/fig18_split.py [--quick] [--out DIR] [--calib-from fig15_peaks.csv] [--stack NAME]
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from dvasim.reporting.plots import policy_colours  # noqa: E402  (one colour per policy in every figure)
from dvasim.studies import evaluation as study  # noqa: E402
from dvasim.studies.compare import stack_title  # noqa: E402  (" [stack: NAME]" for a figure title)

POLICIES = ("dvabatch", "dvabatch-split", "delaybatch")


def main(argv=None) -> dict[str, pd.DataFrame]:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--queries", type=int, default=None, help="queries per run (default 5000; quick 600)")
    p.add_argument("--seeds", type=int, default=None, help="runs per point (default 3; quick 1)")
    args = common.parse(p, argv)
    models = args.models or (["linknet"] if args.quick else ["linknet", "unet"])
    n = args.queries or (600 if args.quick else 5000)
    seeds = range(1, 1 + (args.seeds or (1 if args.quick else 3)))
    kw = {"stack": args.stack}  # every run's serving stack (None: the one the Titan RTX tables imply)
    calib = common.read_calib(args.calib_from, {m: common.stack_label(m, args.stack) for m in models})
    clock = common.Stopwatch()
    rows = []
    for model in models:
        c = common.calib_for(model, calib, quick=args.quick, seed=args.seed, **kw)
        pols = {"dvabatch": {"name": "dvabatch"},
                "dvabatch-split": {"name": "dvabatch-split", "max_queue_delay_ms": c["window"]},
                "delaybatch": common.delaybatch(c["window"])}
        for load, frac in study.LOADS.items():
            rate = frac * c["peak_delaybatch"]
            for name, pol in pols.items():
                for seed in seeds:
                    whole = {"stages": 1} if name == "delaybatch" else {}  # Triton runs the engine whole (§8.1)
                    s = common.poisson(model, pol, rate, n, seed=seed, **kw, **whole)
                    rows.append({"model": model, "stack": s["stack"], "load": load, "offered_qps": rate, "policy": name,
                                 "seed": seed,
                                 "window_ms": pol.get("max_queue_delay_ms", 0.0), **s})
        print(f"{model} done [{clock}]", flush=True)
    df = pd.DataFrame(rows)
    mean = (df.groupby(["model", "stack", "load", "policy"], sort=False)
            [["offered_qps", "mean_latency_ms", "p99_latency_ms", "mean_exit_batch_size", "n_split", "n_stretch"]]
            .mean().reset_index())
    base = mean[mean["policy"] == "delaybatch"].set_index(["model", "load"])["mean_latency_ms"]
    mean["reduction_vs_delaybatch_%"] = [100 * (1 - r.mean_latency_ms / base[(r.model, r.load)])
                                         for r in mean.itertuples()]
    common.save(df, args.out, "fig18_split.csv")
    common.save(mean, args.out, "fig18_split_mean.csv")
    plot(mean, args.out / "fig18_split.png")
    common.show(mean, f"Figure 18: mean latency (ms), mean over seeds{stack_title(df)}")
    high = mean[(mean["load"] == "high") & (mean["policy"] == "dvabatch-split")]
    print(f"\nDVABatch-split vs DelayBatch at high load: {high['reduction_vs_delaybatch_%'].mean():.1f}% "
          "(paper: 15.0%)")
    print(f"total {clock}")
    return {"runs": df, "mean": mean}


def plot(mean: pd.DataFrame, path: Path) -> None:
    plt, sns = common.plt_sns()
    models = list(dict.fromkeys(mean["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4), squeeze=False)
    for ax, model in zip(axes.flat, models):
        sns.barplot(data=mean[mean["model"] == model], x="load", y="mean_latency_ms", hue="policy",
                    hue_order=list(POLICIES), palette=policy_colours(POLICIES), saturation=1, ax=ax)
        ax.set(title=f"{model}, {common.context(mean[mean['model'] == model])}", xlabel="load", ylabel="mean latency (ms)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
