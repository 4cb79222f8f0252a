"""Figure 19 (paper §8.6): DVABatch's mean latency with 1..5 buffer pairs at the peak load, for the six models.

"Peak load" is read two ways, both run: the tuned DelayBatch's peak throughput (the 100 % of the paper's low /
medium / high loads, ``load = "delaybatch_peak"``) and 9/10 of DVABatch's own peak with two buffer pairs
(``load = "dvabatch_peak"``; at exactly its peak the p99 sits on the QoS target and the mean is dominated by
queueing noise). One buffer pair is the serial manner: the stages run one at a time.

Writes ``fig19_buffer_pairs.csv`` and ``fig19_buffer_pairs.png``.

Every run serves on ``--stack`` (default: ``triton-tensorrt-21.10``, the stack the Titan RTX tables imply); a
``--calib-from`` CSV must come from the same stack.

    .venv/bin/python experiments/fig19_buffer_pairs.py [--quick] [--out DIR] [--calib-from fig15_peaks.csv] [--stack NAME]
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from dvasim.studies.compare import stack_title  # noqa: E402  (" [stack: NAME]" for a figure title)


def main(argv=None) -> dict[str, pd.DataFrame]:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, nargs="+", default=None, help="buffer pairs (default 1 2 3 4 5)")
    p.add_argument("--queries", type=int, default=None, help="queries per run (default 4000; quick 600)")
    args = common.parse(p, argv)
    models = args.models or (["bert_base", "linknet"] if args.quick else list(common.ALL_MODELS))
    pairs = args.pairs or ([1, 2, 3] if args.quick else [1, 2, 3, 4, 5])
    n = args.queries or (600 if args.quick else 4000)
    kw = {"stack": args.stack}  # every run's serving stack (None: the one the Titan RTX tables imply)
    calib = common.read_calib(args.calib_from, {m: common.stack_label(m, args.stack) for m in models})
    clock = common.Stopwatch()
    rows = []
    for model in models:
        c = common.calib_for(model, calib, quick=args.quick, seed=args.seed, **kw)
        for load, rate in (("delaybatch_peak", c["peak_delaybatch"]), ("dvabatch_peak", 0.9 * c["peak_dvabatch"])):
            for bp in pairs:
                s = common.poisson(model, {"name": "dvabatch"}, rate, n, seed=1, buffer_pairs=bp, **kw)
                rows.append({"model": model, "stack": s["stack"], "load": load, "offered_qps": rate,
                             "buffer_pairs": bp, **s})
        print(f"{model} done [{clock}]", flush=True)
    df = pd.DataFrame(rows)
    best = df.loc[df.groupby(["model", "load"])["mean_latency_ms"].idxmin(), ["model", "load", "buffer_pairs"]]
    df["best"] = df.index.isin(best.index)
    common.save(df, args.out, "fig19_buffer_pairs.csv")
    plot(df, args.out / "fig19_buffer_pairs.png")
    piv = df.pivot_table(index=["model", "stack", "load"], columns="buffer_pairs", values="mean_latency_ms").reset_index()
    piv.columns = [str(c) if not isinstance(c, str) else c for c in piv.columns]
    common.show(piv, f"Figure 19: DVABatch mean latency (ms) by buffer pairs{stack_title(df)}")
    print(f"total {clock}")
    return {"buffer_pairs": df}


def plot(df: pd.DataFrame, path: Path) -> None:
    plt, sns = common.plt_sns()
    g = sns.catplot(data=df, x="model", y="mean_latency_ms", hue="buffer_pairs", col="load", kind="bar",
                    height=4, aspect=1.6, sharey=False, palette="crest")
    g.set(yscale="log")
    g.set_axis_labels("", "mean latency (ms, log)")
    g.set_xticklabels(rotation=20)
    common.readable(g)
    g.figure.suptitle(f"DVABatch's mean latency by buffer pairs\n{common.context(df, policy='dvabatch')}")
    g.figure.subplots_adjust(top=0.78)  # two title lines above the panels' own
    g.figure.savefig(path, dpi=110)
    plt.close(g.figure)


if __name__ == "__main__":
    main()
