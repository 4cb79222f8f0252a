"""Figure 9 of the characterization study (batching-characterization-2024 §4.3): Triton's throughput against the
request rate for several batching time windows, and its Findings 5 and 6.

**Setup** (as ``study_maxbs.py``; ``dvasim.studies.characterization`` says how the study maps onto dvasim): the
modelled A100 tables, ResNet = ``resnet152``, BERT = ``bert_base`` at sequence length 384, LinkNet = ``linknet``;
Triton = ``delaybatch`` run whole with the study's MAX-BS of §4.3 (64, 16 and 8) and the time window swept over
:data:`WINDOWS_MS` (the study does not list its windows: ours span its §4.2 defaults, 10 us and 500 us, up to 10
ms); evenly spaced arrivals (the study's client). Request rates: :data:`RATE_FRACTIONS` of the reference peak (the
capacity under a 200 ms p99 of Table 5's strategy VIII, as in ``study_maxbs.py``); L, M and H are 1/4, 3/5 and
9/10 of it, as the study marks them. Throughput = completed queries over first arrival to last finish.

Writes ``study_fig9_window.csv`` (one row per model, window and rate) and ``study_fig9_window.png``, and checks
Finding 5 (at low and medium rates the window hardly changes throughput, which follows the request rate) and
Finding 6 (at high rates the window matters, less for BERT, which saturates the GPU with small batches, than for
ResNet and LinkNet).

Every run serves on ``--stack`` (default: ``triton-tensorrt``, the stack the a100 tables imply).

    .venv/bin/python experiments/study_window.py [--quick] [--out DIR] [--queries N] [--stack NAME]
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from study_maxbs import reference, run_point  # noqa: E402

from dvasim.reporting.plots import save_figure  # noqa: E402
from dvasim.studies import characterization as ch  # noqa: E402

MAX_BS = {"resnet152": 64, "bert_base": 16, "linknet": 8}  # the study's §4.3
WINDOWS_MS = (0.01, 0.1, 0.5, 2.0, 10.0)
RATE_FRACTIONS = (0.1, 0.25, 0.4, 0.6, 0.75, 0.9, 1.05, 1.25, 1.5)
MARKS = {0.25: "L", 0.6: "M", 0.9: "H"}
LOW_MEDIUM = 0.6  # rates up to M are "medium to low workloads" (Finding 5)


def main(argv=None) -> dict[str, pd.DataFrame]:
    p = common.parser(__doc__.split("\n\n")[0])
    p.add_argument("--queries", type=int, default=None, help="queries per run (default 3000; quick 300)")
    args = common.parse(p, argv)
    models = args.models or (["resnet152", "bert_base"] if args.quick else list(ch.MODELS))
    n = args.queries or (300 if args.quick else 3000)
    fractions = (0.25, 0.6, 1.25) if args.quick else RATE_FRACTIONS
    windows = (0.01, 2.0) if args.quick else WINDOWS_MS
    clock = common.Stopwatch()
    rows = []
    for model in models:
        ref = reference(model, "uniform", args.quick, args.seed, args.stack)
        for frac in fractions:
            for w in windows:
                r = run_point(model, MAX_BS[model], frac * ref, n, "uniform", 1, window_ms=w, stack=args.stack)
                rows.append({"model": model, "stack": r["stack"], "paper_name": ch.PAPER_NAMES[model],
                             "max_bs": MAX_BS[model], "window_ms": w, "rate_fraction": frac,
                             "mark": MARKS.get(frac, ""), "reference_peak_qps": ref, "offered_qps": frac * ref, **r})
        print(f"{model}: reference (strategy VIII capacity) {ref:.1f} qps [{clock}]", flush=True)
    df = pd.DataFrame(rows)
    common.save(df, args.out, "study_fig9_window.csv")
    plot(df, args.out / "study_fig9_window.png")
    summary = findings(df)
    common.show(summary, "Findings 5-6: throughput's spread over the windows, (max - min) / max, per rate; "
                         "served = mean throughput / offered", digits=3)
    print(f"total {clock}")
    return {"window": df, "findings": summary}


def findings(df: pd.DataFrame) -> pd.DataFrame:
    """Per model and rate: the spread of throughput over the windows and the share of the offered rate served."""
    rows = []
    for (model, stack, frac), g in df.groupby(["model", "stack", "rate_fraction"], sort=False):
        t = g["throughput_qps"].to_numpy()
        rows.append({"model": model, "stack": stack, "rate_fraction": frac, "mark": MARKS.get(frac, ""),
                     "offered_qps": float(g["offered_qps"].iloc[0]), "spread_over_windows": (t.max() - t.min()) / t.max(),
                     "served": float(t.mean() / g["offered_qps"].iloc[0]),
                     "best_window_ms": float(g["window_ms"].to_numpy()[int(np.argmax(t))])})
    return pd.DataFrame(rows)


QOS_MS = 200.0  # the study's p99 target (the reference capacity is searched under it)


def plot(df: pd.DataFrame, path: Path, device: str = ch.DEVICE) -> None:
    """Throughput against the request rate, one line per window, one panel per model; a point whose run was not
    stable (``stable`` false) or whose p99 was over 200 ms carries its verdict's marker. The title names the
    models, the ``device`` (the A100 tables), the stack, the policy and the load."""
    plt, sns = common.plt_sns()
    models = list(dict.fromkeys(df["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        g = common.with_verdicts(df[df["model"] == model], QOS_MS)
        g["window"] = g["window_ms"].map(lambda w: f"{w:g} ms")
        sns.lineplot(data=g, x="offered_qps", y="throughput_qps", hue="window", marker="o", ax=ax)
        top = g["offered_qps"].max()
        ax.plot([0, top], [0, top], ls=":", color="grey", label="throughput = request rate")
        for frac, mark in MARKS.items():
            h = g[g["rate_fraction"] == frac]
            if len(h):
                ax.annotate(mark, (h["offered_qps"].iloc[0], h["throughput_qps"].max()), textcoords="offset points",
                            xytext=(0, 6), ha="center")
        ax.set(title=f"{ch.PAPER_NAMES[model]} ({model}), MAX-BS {MAX_BS[model]}", xlabel="request rate (qps)",
               ylabel="throughput (qps)")
        common.marked_note(ax, common.mark_groups(ax, g, "offered_qps", "throughput_qps", "window"))
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    common.verdict_legend(axes[0, -1], "time window")
    what = common.context(df, device, model=models, policy="delaybatch (Triton's batcher, the model run whole)")
    load = (f"evenly spaced arrivals, {common.rates_words(df['offered_qps'])} (0.1 to 1.5 x strategy VIII's "
            "capacity; L, M, H = 1/4, 3/5, 9/10)")
    save_figure(fig, path, "Triton's throughput against the request rate per batching time window (the study's "
                           f"Figure 9; marked: not stable, or p99 over {QOS_MS:g} ms)\n{what}\nload: {load}")

if __name__ == "__main__":
    main()
