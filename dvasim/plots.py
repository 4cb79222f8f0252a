"""Seaborn figures of runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    return plt, sns


def latency_figure(df: pd.DataFrame, path: str | Path, title: str = "", qos_target_ms: float | None = None) -> Path:
    """Per-query latency over arrival time (left) and the latency CDF (right)."""
    plt, sns = _plt()
    done = df[df["finish_ms"].notna()]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    sns.scatterplot(x=done["arrival_ms"] / 1000.0, y=done["latency_ms"], s=6, linewidth=0, ax=a)
    a.set(xlabel="arrival time (s)", ylabel="latency (ms)", title="per-query latency")
    sns.ecdfplot(x=done["latency_ms"], ax=b)
    b.set(xlabel="latency (ms)", ylabel="fraction of queries", title="latency CDF")
    if qos_target_ms:
        a.axhline(qos_target_ms, color="red", ls="--", lw=1)
        b.axvline(qos_target_ms, color="red", ls="--", lw=1)
    return save_figure(fig, path, title)


def save_figure(fig, path: str | Path, title: str = "") -> Path:
    """Title, lay out, write (110 dpi) and close ``fig``; returns the path."""
    plt, _ = _plt()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def policy_bars(results: pd.DataFrame, metric: str, path: str | Path, title: str = "") -> Path:
    """Figures 14 / 16 of the paper: ``metric`` per load and policy, one panel per model."""
    plt, sns = _plt()
    order = [x for x in ("low", "medium", "high") if x in set(results["load"])]
    hue = [p for p in ("zerobatch", "delaybatch", "dvabatch") if p in set(results["policy"])]
    g = sns.catplot(data=results, x="load", y=metric, hue="policy", col="model", kind="bar", order=order,
                    hue_order=hue, col_wrap=min(3, results["model"].nunique()), sharey=False, height=2.8,
                    aspect=1.1)
    g.set_axis_labels("load", metric.replace("_", " "))
    if title:
        g.figure.suptitle(title, y=1.02)
    path = Path(path)
    g.figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(g.figure)
    return path
