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


FIGURE_MAX_POINTS = 200_000


def latency_figure(df: pd.DataFrame, path: str | Path, title: str = "", qos_target_ms: float | None = None) -> Path:
    """Per-query latency over arrival time (left) and the latency CDF (right). Runs of more than
    :data:`FIGURE_MAX_POINTS` finished queries are drawn from every k-th of them (in arrival order)."""
    plt, sns = _plt()
    done = df[df["finish_ms"].notna()]
    if len(done) > FIGURE_MAX_POINTS:
        done = done.iloc[:: -(-len(done) // FIGURE_MAX_POINTS)]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    sns.scatterplot(x=done["arrival_ms"] / 1000.0, y=done["latency_ms"], s=6, linewidth=0, ax=a)
    a.set(xlabel="arrival time (s)", ylabel="latency (ms)", title="per-query latency")
    sns.ecdfplot(x=done["latency_ms"], ax=b)
    b.set(xlabel="latency (ms)", ylabel="fraction of queries", title="latency CDF")
    if qos_target_ms:
        slo_line(a, qos_target_ms, "y")
        slo_line(b, qos_target_ms, "x")
    return save_figure(fig, path, title)


def slo_line(ax, slo_ms: float, axis: str = "y", reach: float = 1.5) -> None:
    """Mark the latency SLO on ``ax``'s latency ``axis`` without stretching it: a labelled dashed line when the
    SLO lies within ``reach`` times the data's top, else a note in the corner that it is off the scale."""
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    label = f"SLO {slo_ms:g} ms"
    if slo_ms <= hi * reach:
        line = ax.axhline if axis == "y" else ax.axvline
        line(slo_ms, color="red", ls="--", lw=1, label=label)
        if axis == "y":
            ax.set_ylim(lo, max(hi, slo_ms * 1.08))
            ax.annotate(label, xy=(1.0, slo_ms), xycoords=("axes fraction", "data"), xytext=(-4, 3),
                        textcoords="offset points", ha="right", va="bottom", color="red", fontsize=8)
        else:
            ax.set_xlim(lo, max(hi, slo_ms * 1.08))
            ax.annotate(label, xy=(slo_ms, 0.02), xycoords=("data", "axes fraction"), xytext=(3, 0),
                        textcoords="offset points", ha="left", va="bottom", color="red", fontsize=8, rotation=90)
    else:
        ax.annotate(f"{label}: above the scale ({slo_ms / hi:.0f}x the largest value)", xy=(0.99, 0.98),
                    xycoords="axes fraction", ha="right", va="top", color="red", fontsize=8)


def model_panels(models: list, width: float, height: float):
    """A figure with one panel per model, at most three a row: ``(plt, sns, fig, axes)`` (axes 2-D); the unused
    panels are hidden."""
    plt, sns = _plt()
    ncol = min(3, len(models))
    nrow = -(-len(models) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(width * ncol, height * nrow), squeeze=False)
    for ax in list(axes.flat)[len(models):]:
        ax.set_visible(False)
    return plt, sns, fig, axes


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


# One colour per policy label in every figure: the paper's three systems first, then Triton with two instances (a
# lighter shade of its base), DVABatch behind DelayBatch's window, and DVABatch's cumulative ablations (greens,
# darker = more of DVABatch).
PALETTE: dict[str, str] = {
    "zerobatch": "#4c72b0",
    "delaybatch": "#dd8452",
    "dvabatch": "#c44e52",
    "zerobatch-x2": "#a1c1e6",
    "delaybatch-x2": "#f4c29a",
    "dvabatch-window": "#8c4a9e",
    "dva-multientry": "#c7e9c0",
    "dva+stretch": "#74c476",
    "dva+split": "#31a354",
    "dva+input": "#006d2c",
    # the papers' peer systems
    "serial": "#8c8c8c",
    "graphbatch": "#937860",
    "lazybatch": "#64b5cd",
    "tfserving-nowait": "#ccb974",
    "tfserving-optwait": "#b8860b",
    "tfserving-static": "#7f6a00",
    "n-ebird": "#da8bc3",
    "e-ebird": "#a0317f",
}
_EXTRA = ("#937860", "#8c8c8c", "#ccb974", "#64b5cd", "#da8bc3")
# the attribution's steps, coloured like the variant each step ends at ("rest": DVABatch itself)
# short names of the attribution's steps, for tables and legends
SHARE_NAMES = {"share_multientry_pp": "multi-entry", "share_stretch_pp": "stretch", "share_split_pp": "split",
               "share_input_pp": "input clust.", "share_rest_pp": "rest"}
SHARE_COLOURS = {"share_multientry_pp": PALETTE["dva-multientry"], "share_stretch_pp": PALETTE["dva+stretch"],
                 "share_split_pp": PALETTE["dva+split"], "share_input_pp": PALETTE["dva+input"],
                 "share_rest_pp": PALETTE["dvabatch"]}


def policy_order(labels) -> list[str]:
    """``labels`` in :data:`PALETTE` order, unknown ones after them (sorted)."""
    present = set(labels)
    return [p for p in PALETTE if p in present] + sorted(present - set(PALETTE))


def policy_colours(labels) -> dict[str, str]:
    """A colour for every label: :data:`PALETTE`'s, and a fixed cycle for labels it does not know."""
    extra = iter(_EXTRA * 4)
    return {p: PALETTE[p] if p in PALETTE else next(extra) for p in policy_order(labels)}


def policy_bars(results: pd.DataFrame, metric: str, path: str | Path, title: str = "", device: str | None = None,
                slo_ms: float | None = None) -> Path:
    """Figures 14 / 16 of the paper: ``metric`` per load and policy (every variant present, coloured by
    :data:`PALETTE`), one panel per model; each load's tick says its offered rate (``offered_qps``), the title
    the ``device``, and ``slo_ms`` is marked (labelled, without stretching the axis to it)."""
    plt, sns = _plt()
    order = [x for x in ("low", "medium", "high") if x in set(results["load"])]
    hue = policy_order(results["policy"])
    g = sns.catplot(data=results, x="load", y=metric, hue="policy", col="model", kind="bar", order=order,
                    hue_order=hue, palette=policy_colours(hue), col_wrap=min(3, results["model"].nunique()),
                    sharex=False, sharey=False, height=2.8, aspect=1.1 if len(hue) <= 3 else 1.8)
    g.set_axis_labels("load (offered queries/s)", metric.replace("_", " "))
    for model, ax in g.axes_dict.items():
        if "offered_qps" in results:
            qps = results[results["model"] == model].groupby("load")["offered_qps"].first()
            ax.set_xticks(range(len(order)))
            ax.set_xticklabels([f"{ld}\n{qps.get(ld, float('nan')):.0f} qps" for ld in order])
        if slo_ms:
            slo_line(ax, slo_ms, "y")
    head = title + (f" on {device}" if device else "")
    if head:
        g.figure.suptitle(head, y=1.02)
    path = Path(path)
    g.figure.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(g.figure)
    return path


def attribution_bars(att: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """The attribution (:func:`dvasim.studies.evaluation.attribution`): per model and load, the shares of DVABatch's reduction
    against DelayBatch stacked (gains up, losses down; points of DelayBatch's mean), the total as a black tick."""
    models = list(dict.fromkeys(att["model"]))
    plt, _, fig, axes = model_panels(models, 3.6, 2.9)
    loads = [x for x in ("low", "medium", "high") if x in set(att["load"])]
    shares = [c for c in SHARE_COLOURS if c in att.columns and att[c].notna().any()]
    for ax, model in zip(axes.flat, models):
        g = att[att["model"] == model].set_index("load").reindex(loads)
        up = [0.0] * len(loads)
        down = [0.0] * len(loads)
        for c in shares:
            vals = g[c].fillna(0.0).tolist()
            bottoms = [u if v >= 0 else d for v, u, d in zip(vals, up, down)]
            ax.bar(loads, vals, bottom=bottoms, color=SHARE_COLOURS[c], label=SHARE_NAMES[c], width=0.6)
            up = [u + max(v, 0.0) for v, u in zip(vals, up)]
            down = [d + min(v, 0.0) for v, d in zip(vals, down)]
        ax.scatter(loads, g["reduction_%"], marker="_", s=400, color="black", zorder=3, label="total")
        ax.axhline(0.0, color="black", lw=0.6)
        ax.set(title=model, xlabel="load", ylabel="points of DelayBatch's mean")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(labels), frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def label_palette(labels) -> tuple[list[str], dict[str, str] | None]:
    """The sweep labels in order and their colours: when every label names a different policy first (its first
    word), that policy's colour (labels then in :data:`PALETTE` order); else ``None`` (seaborn's own)."""
    labels = list(dict.fromkeys(labels))
    heads = [lb.split(" ", 1)[0] for lb in labels]
    if len(set(heads)) != len(heads) or not all(h in PALETTE for h in heads):
        return labels, None
    order = list(PALETTE)
    return sorted(labels, key=lambda lb: order.index(lb.split(" ", 1)[0])), {lb: PALETTE[h] for lb, h in
                                                                              zip(labels, heads)}


def sweep_figure(table: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """Mean and p99 latency against the offered load of a sweep's runs (:func:`dvasim.studies.sweep.sweep`'s table):
    one line per ``label`` (the swept values other than the load and the seed), the mean over seeds with its 95%
    interval when there are several. Lines labelled by policy alone get the policies' colours."""
    plt, sns = _plt()
    df = table.copy()
    df["label"] = df["label"].replace("", "all runs")
    labels, palette = label_palette(df["label"])
    # the nominal rate when it was swept (seeds then average at one point), else the measured offered rate
    x = "workload.rate_qps" if "workload.rate_qps" in df else "offered_qps"
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric, name in zip(axes, ("mean_latency_ms", "p99_latency_ms"), ("mean", "p99")):
        sns.lineplot(data=df, x=x, y=metric, hue="label", hue_order=labels, palette=palette, marker="o",
                     errorbar=("ci", 95), ax=ax)
        ax.set(xlabel="offered load (queries/s)", ylabel=f"{name} latency (ms)", title=f"{name} latency")
        ax.legend(fontsize=8)
    return save_figure(fig, path, title or "sweep: latency against offered load")


def capacity_figure(table: pd.DataFrame, path: str | Path, slo_ms: float | None = None, title: str = "") -> Path:
    """The capacity of each point of a capacity sweep (``label`` on the x axis, seeds averaged with their 95%
    interval); policies keep their colours."""
    plt, sns = _plt()
    df = table.copy()
    df["label"] = df["label"].replace("", "all")
    labels, palette = label_palette(df["label"])
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(labels) + 2), 3.8))
    sns.barplot(data=df, x="label", y="capacity_qps", hue="label", order=labels, palette=palette, errorbar=("ci", 95),
                legend=False, ax=ax)
    ax.set(xlabel="", ylabel="capacity (queries/s)")
    ax.tick_params(axis="x", rotation=20)
    return save_figure(fig, path, title or (f"capacity with p99 <= {slo_ms:g} ms" if slo_ms else "capacity"))


def run_title(summary: dict) -> str:
    """A figure's title: the policy, the model and the serving stack the run simulated."""
    stack = summary.get("stack")
    return f"{summary.get('policy')} on {summary.get('model', '')}" + (f" [stack: {stack}]" if stack else "")
