"""Seaborn figures of runs and studies, readable as they stand.

* One colour per policy everywhere: :data:`PALETTE` (:func:`policy_colours` for seaborn's ``palette=``) is the one
  mapping the command line's figures, the experiments' scripts and the notebooks take their colours from.
* Axis labels in words with units, never raw column names: :func:`axis_label` (:data:`LABELS`); :func:`readable`
  relabels a seaborn figure drawn from raw columns (axis labels, legend titles, facet titles).
* The latency SLO never sits on the data: :func:`slo_line` draws it dashed and labels it at the axis edge, outside
  the plotting area (a CDF's: in a legend in its empty corner), or, when it lies far above the data, says so in a
  note above the axes instead of stretching the axis. A few outliers never flatten an axis: :func:`fit_outliers` ends it above the bulk of the data and says,
  in a note above the axes (:func:`axis_note`), how many points lie off it; :func:`policy_bars` turns a panel
  logarithmic when one bar dwarfs the others; every bar and its label lie within the axes.
* Titles say what was run: :func:`run_title` names the policy, the model, the device, the serving stack and the
  load, and says when the run was interrupted or stuck.
* Figures are written whole: to a temporary name, renamed when complete (:func:`dvasim.outputs.atomic_path`).
* Inside IPython / Jupyter the notebook's own backend is kept, so its plots show inline; elsewhere, without a
  display, figures are drawn with Agg.
"""

from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from dvasim.outputs import atomic_path


def in_notebook() -> bool:
    """Whether this process runs IPython (a Jupyter kernel or an IPython shell)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        return ipython.get_ipython() is not None
    except Exception:  # pragma: no cover  (a broken IPython install)
        return False


def _headless() -> bool:
    if sys.platform in ("win32", "darwin"):
        return False
    return not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _plt():
    """``(pyplot, seaborn)`` with the theme set. The backend is forced to Agg only outside IPython / Jupyter and
    without a display: a notebook keeps its inline backend (forcing Agg there would silence every later plot)."""
    import matplotlib

    if not in_notebook() and _headless():
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="notebook")
    return plt, sns


# seaborn's optional scipy: scipy.stats (kdeplot's gaussian_kde) and scipy.cluster (clustermap), half a second to import
SEABORN_OPTIONAL_SCIPY = ("scipy.stats", "scipy.cluster")


def import_seaborn_without_scipy():
    """:func:`_plt` (``(pyplot, seaborn)``, the theme set) with seaborn imported without the parts of scipy it
    imports only for what dvasim's bar figures never draw (:data:`SEABORN_OPTIONAL_SCIPY`, most of the import time
    of a process that draws: ``dvasim compare``'s figures). While seaborn imports they are unavailable, so seaborn
    takes its documented path without scipy (its own copy of ``gaussian_kde``; no cumulative KDE, no clustermap
    without fastcluster); importing them later works. For processes that draw only dvasim's figures: a notebook or
    script that wants seaborn's KDE or clustermap imports seaborn itself. Once seaborn is imported it is
    :func:`_plt`; a module of the list already imported stays."""
    hidden = [] if "seaborn" in sys.modules else [m for m in SEABORN_OPTIONAL_SCIPY if m not in sys.modules]
    for m in hidden:
        sys.modules[m] = None  # type: ignore[assignment]  # an import of it raises ImportError
    try:
        return _plt()
    finally:
        for m in hidden:
            if m in sys.modules and sys.modules[m] is None:
                del sys.modules[m]


FIGURE_MAX_POINTS = 200_000
# Panel titles at the top of their axes (matplotlib's axes.titley 1.0; its default, None, searches every draw for
# tick labels or an axis offset at the top of the axes to lift the title above: about a fifth of the time a figure
# of many panels takes to draw). For figures with none there (the compare figures), where the search puts the title
FIXED_TITLES = {"axes.titley": 1.0}
SLO_COLOUR = "red"

# ----------------------------------------------------------------------------- colours
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
    "dvabatch-built": "#7a1f22",  # DVABatch as its authors built it: a darker DVABatch red
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
    # LazyBatching's ideal batcher (its paper's Oracle)
    "oracle": "#3b3b3b",
}
_EXTRA = ("#937860", "#8c8c8c", "#ccb974", "#64b5cd", "#da8bc3")
# short names of the attribution's steps, for tables and legends
SHARE_NAMES = {"share_multientry_pp": "multi-entry", "share_stretch_pp": "stretch", "share_split_pp": "split",
               "share_input_pp": "input clust.", "share_rest_pp": "rest"}
# the attribution's steps, coloured like the variant each step ends at ("rest": DVABatch itself)
SHARE_COLOURS = {"share_multientry_pp": PALETTE["dva-multientry"], "share_stretch_pp": PALETTE["dva+stretch"],
                 "share_split_pp": PALETTE["dva+split"], "share_input_pp": PALETTE["dva+input"],
                 "share_rest_pp": PALETTE["dvabatch"]}


def policy_order(labels) -> list[str]:
    """``labels`` in :data:`PALETTE` order, unknown ones after them (sorted)."""
    present = set(labels)
    return [p for p in PALETTE if p in present] + sorted(present - set(PALETTE))


def policy_colours(labels) -> dict[str, str]:
    """A colour for every label, for seaborn's ``palette=``: :data:`PALETTE`'s, and a fixed cycle for labels it
    does not know."""
    extra = iter(_EXTRA * 4)
    return {p: PALETTE[p] if p in PALETTE else next(extra) for p in policy_order(labels)}


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


# ----------------------------------------------------------------------------- words for columns
LABELS: dict[str, str] = {
    "latency_ms": "latency (ms)",
    "mean_latency_ms": "mean latency (ms)",
    "p50_latency_ms": "median latency (ms)",
    "p90_latency_ms": "p90 latency (ms)",
    "p95_latency_ms": "p95 latency (ms)",
    "p99_latency_ms": "p99 latency (ms)",
    "max_latency_ms": "largest latency (ms)",
    "mean_ms": "mean latency (ms)",
    "p99_ms": "p99 latency (ms)",
    "mean_queue_ms": "mean wait in the queue (ms)",
    "arrival_ms": "arrival time (ms)",
    "finish_ms": "finish time (ms)",
    "throughput_qps": "throughput (queries/s)",
    "offered_qps": "offered load (queries/s)",
    "rate_qps": "offered load (queries/s)",
    "capacity_qps": "capacity (queries/s)",
    "peak_qps": "peak throughput (queries/s)",
    "qos_violation_rate": "queries over the SLO (fraction)",
    "mean_exit_batch_size": "mean batch size at exit",
    "exit_batch": "mean batch size at exit",
    "device_busy_fraction": "device busy (fraction of the time)",
    "max_queue_delay_ms": "batch window (ms)",
    "launch_overhead_ms": "launch overhead per stage (ms)",
    "max_batch_size": "largest batch",
    "buffer_pairs": "buffer pairs",
    "batch_size": "batch size",
    "n_sub": "sub-batches",
    "bs0": "BS_0 (batch size)",
    "bs1": "BS_1 (batch size)",
    "within_slo": "p99 within the SLO",
    "reduction_%": "reduction (% of DelayBatch's mean)",
    "n_stretch": "stretches",
    "n_split": "splits",
    "system": "batching system",
    "stack": "serving stack",
    **{c: f"{n} (points of DelayBatch's mean)" for c, n in SHARE_NAMES.items()},
}
_UNITS = (("_ms", "ms"), ("_qps", "queries/s"), ("_pp", "points"), ("_%", "%"), ("_fraction", "fraction"),
          ("_s", "s"))


def axis_label(column) -> str:
    """Words with units for a column name: :data:`LABELS`'s; a dotted config key (``policy.max_queue_delay_ms``)
    by its last part; else the name with spaces for underscores and its unit suffix (``_ms``, ``_qps``...) in
    brackets."""
    name = str(column)
    key = name.rsplit(".", 1)[-1]
    for k in (name, key):
        if k in LABELS:
            return LABELS[k]
    for suffix, unit in _UNITS:
        if key.endswith(suffix) and len(key) > len(suffix):
            return f"{key[: -len(suffix)].replace('_', ' ')} ({unit})"
    return key.replace("_", " ")


def _raw(text: str) -> bool:
    """Whether ``text`` looks like a column name rather than words (no space; an underscore, a dot or a known
    column)."""
    return bool(text) and " " not in text and ("_" in text or "." in text or text in LABELS)


def readable(obj):
    """Relabel a figure drawn from raw columns (a matplotlib Axes or Figure, or a seaborn grid): axis labels,
    legend titles and legend headings that are column names become :func:`axis_label`'s words, and facet titles
    ``"model = vgg19"`` become ``"vgg19"``. Returns ``obj``."""
    import matplotlib.axes

    fig = obj.figure if isinstance(obj, matplotlib.axes.Axes) or hasattr(obj, "facet_data") else obj
    axes = [obj] if isinstance(obj, matplotlib.axes.Axes) else list(fig.axes)
    legends = [ax.get_legend() for ax in axes] + list(getattr(fig, "legends", []))
    for ax in axes:
        for get, put in ((ax.get_xlabel, ax.set_xlabel), (ax.get_ylabel, ax.set_ylabel)):
            if _raw(get()):
                put(axis_label(get()))
        title = ax.get_title()
        if " = " in title:
            ax.set_title(", ".join(part.split(" = ", 1)[-1] for part in title.split(" | ")))
    for leg in legends:
        if leg is None:
            continue
        for text in [leg.get_title(), *leg.get_texts()]:
            if _raw(text.get_text()) and (text.get_text() in LABELS or "." in text.get_text()
                                           or text is leg.get_title()):
                text.set_text(axis_label(text.get_text()))
    return obj


NOTE_GID = "dvasim-axis-note"


def axis_note(ax, note: str):
    """Add ``note`` to the line of notes just above ``ax``'s top spine (left-aligned, small, under the panel's
    title, which moves up to make room): what the axes leave out is said outside the plotting area."""
    for text in ax.texts:
        if text.get_gid() == NOTE_GID:
            text.set_text(f"{text.get_text()}; {note}")
            return text
    text = ax.annotate(note, xy=(0.0, 1.0), xycoords="axes fraction", xytext=(0, 3), textcoords="offset points",
                       ha="left", va="bottom", fontsize=7.5, color="0.25", annotation_clip=False, gid=NOTE_GID)
    ax.set_title(ax.get_title(), pad=16)
    return text


# ----------------------------------------------------------------------------- SLO, outliers
def slo_line(ax, slo_ms: float, axis: str = "y", reach: float = 1.5):
    """Mark the latency SLO on ``ax``'s latency ``axis`` without stretching the axis and without writing on the
    data. Within ``reach`` times the axis' top: a dashed line named ``SLO <x> ms``, labelled at the axis edge
    outside the plotting area for a horizontal line (the label is returned), in a legend at the lower right for a
    vertical one (a CDF's empty corner; the legend is returned). Farther: no line, and a note above the axes
    (:func:`axis_note`) says where the SLO lies (``None`` returned)."""
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    label = f"SLO {slo_ms:g} ms"
    if hi > 0 and slo_ms > hi * reach:
        axis_note(ax, f"{label} off the axis ({slo_ms / hi:.0f}x its top)")
        return None
    below = slo_ms - 0.05 * max(hi - lo, abs(slo_ms), 1e-9)  # an SLO under the data: the axis reaches down to it
    if axis == "y":
        ax.axhline(slo_ms, color=SLO_COLOUR, ls="--", lw=1, label=label)
        ax.set_ylim(min(lo, below), max(hi, slo_ms * 1.08))
        return ax.annotate(label, xy=(1.0, slo_ms), xycoords=("axes fraction", "data"), xytext=(3, 0),
                           textcoords="offset points", ha="left", va="center", color=SLO_COLOUR, fontsize=8,
                           annotation_clip=False)
    line = ax.axvline(slo_ms, color=SLO_COLOUR, ls="--", lw=1, label=label)
    ax.set_xlim(min(lo, below), max(hi, slo_ms * 1.08))
    return ax.legend(handles=[line], loc="lower right", fontsize=8)


def fit_outliers(ax, values, axis: str = "y", q: float = 99.0, factor: float = 3.0, unit: str = "ms") -> int:
    """Fit ``ax``'s ``axis`` to the bulk of ``values`` when a few outliers would flatten it: the values over
    ``factor`` times the ``q``-th percentile are outliers; when there are any, the axis spans the others (with a
    5% margin) and a note above the axes (:func:`axis_note`) says how many points lie off it and the largest.
    Returns how many lie off the axis (0: the axis is left as it is)."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return 0
    cut = factor * float(np.percentile(v, q))
    rest = v[v <= cut]
    if cut <= 0 or len(rest) == len(v) or not len(rest):
        return 0
    lo, hi = float(rest.min()), float(rest.max())
    pad = 0.05 * max(hi - lo, abs(hi), 1e-9)
    (ax.set_ylim if axis == "y" else ax.set_xlim)(lo - pad, hi + pad)
    n = len(v) - len(rest)
    axis_note(ax, f"{n:,} point{'s' * (n != 1)} off the axis (up to {float(v.max()):,.4g} {unit})")
    return n


def _log_if_outlier(ax, values, factor: float = 10.0) -> bool:
    """A logarithmic ``y`` axis when the largest of ``values`` is over ``factor`` times their median (one bar
    would flatten the others); a note above the axes says so."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v) & (v > 0)]
    if len(v) < 2 or v.max() <= factor * np.median(v):
        return False
    ax.set_yscale("log")
    ax.autoscale(axis="y")
    axis_note(ax, "log scale: one bar dwarfs the others")
    return True


# ----------------------------------------------------------------------------- writing
def _write(fig, path: str | Path, **savefig) -> Path:
    """Save ``fig`` to ``path`` whole (a temporary name, renamed when complete), 110 dpi, and close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", dpi=110, **savefig)
    finally:
        plt.close(fig)
    return path


def save_figure(fig, path: str | Path, title: str = "") -> Path:
    """Title, lay out, write (110 dpi, whole) and close ``fig``; returns the path."""
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _write(fig, path, bbox_inches="tight")


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


# ----------------------------------------------------------------------------- one run
def latency_figure(df: pd.DataFrame, path: str | Path, title: str = "", qos_target_ms: float | None = None) -> Path:
    """Per-query latency over arrival time (left) and the latency CDF (right), the SLO marked at the axes' edges
    and the axes fitted to the bulk of the latencies (:func:`fit_outliers`). Runs of more than
    :data:`FIGURE_MAX_POINTS` finished queries are drawn from every k-th of them (in arrival order)."""
    plt, sns = _plt()
    done = df[df["finish_ms"].notna()]
    if len(done) > FIGURE_MAX_POINTS:
        done = done.iloc[:: -(-len(done) // FIGURE_MAX_POINTS)]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    sns.scatterplot(x=done["arrival_ms"] / 1000.0, y=done["latency_ms"], s=6, linewidth=0, ax=a)
    a.set_xlabel("arrival time (s)")
    a.set_ylabel("latency (ms)")
    a.set_title("per-query latency")
    sns.ecdfplot(x=done["latency_ms"], ax=b)
    b.set_xlabel("latency (ms)")
    b.set_ylabel("fraction of queries")
    b.set_title("latency CDF")
    fit_outliers(a, done["latency_ms"], "y")
    fit_outliers(b, done["latency_ms"], "x")
    if qos_target_ms:
        slo_line(a, qos_target_ms, "y")
        slo_line(b, qos_target_ms, "x")
    return save_figure(fig, path, title)


def run_device(config: dict | None) -> str:
    """The device a run's resolved ``config`` ran or modelled: the replay's (``replayed on cuda``), else its table's
    (the provenance's device, without its "(modelled ...)" note), else the model section's ``device``."""
    config = config or {}
    replay = config.get("replay") or {}
    if replay.get("device"):
        return f"replayed on {replay['device']}"
    model = config.get("model") or {}
    prov = model.get("provenance") or {}
    name = prov.get("device") or prov.get("gpu") or prov.get("cpu") or model.get("device")
    return re.sub(r"\s*\((?:modelled|measured)[^)]*\)", "", str(name)).strip() if name else ""


def _load_words(wl: dict, offered) -> str:
    """The load of a run in words: the workload's kind and nominal rate, and the rate actually offered."""
    kind, rate = wl.get("kind"), wl.get("rate_qps")
    at = f" at {rate:g} queries/s" if isinstance(rate, (int, float)) else ""
    if kind == "stepping":
        words = f"stepping load, {wl.get('start_qps', 66.0):g} to {wl.get('end_qps', 4000.0):g} queries/s"
    elif kind == "closed":
        n = wl.get("clients", 1)
        words = f"closed loop, {n} client{'s' * (n != 1)}"
    elif kind == "phases":
        words = f"{len(wl.get('phases') or [])} load phases"
    elif kind == "trace":
        words = f"trace {Path(str(wl.get('path', ''))).name.removeprefix('trace:')}{at}"
    else:
        words = f"{kind} arrivals{at}" if kind else ""
    if isinstance(offered, (int, float)) and math.isfinite(offered):
        words += f"{', ' if words else ''}{offered:.4g} queries/s offered"
    return f"load: {words}" if words else ""


def _incomplete(summary: dict) -> str:
    """A line saying that a run did not finish (interrupted, or some queries stuck); ``""`` for a complete run."""
    stuck = str(summary.get("stuck") or "")
    if not summary.get("interrupted") and not stuck:
        return ""
    what = "INTERRUPTED" if summary.get("interrupted") or stuck.startswith("interrupted") else "STUCK"
    why = stuck.split(";", 1)[0]
    why = why[len("interrupted "):] if why.startswith("interrupted ") else why
    why = why if len(why) <= 70 else why[:69] + "..."
    sep = " " if why.startswith("at ") else ": "
    return f"{what}{sep + why if why else ''} -- only the queries that finished are shown"


def run_title(summary: dict, config: dict | None = None) -> str:
    """A figure's title naming what was run: the policy, the model, the device (from the resolved ``config``:
    :func:`run_device`), the serving stack, and on a second line the load (the workload's kind and nominal rate
    from ``config``, the rate offered from ``summary``); a third line when the run was interrupted or stuck
    (``summary["interrupted"]``, ``summary["stuck"]``)."""
    config = config or {}
    model = summary.get("model") or (config.get("model") or {}).get("name") or "?"
    head = f"{summary.get('policy') or (config.get('policy') or {}).get('name', '?')} on {model}"
    device = run_device(config)
    stack = summary.get("stack") or (config.get("server") or {}).get("name")
    head += (f", {device}" if device else "") + (f", stack: {stack}" if stack else "")
    lines = [head, _load_words(config.get("workload") or {}, summary.get("offered_qps")), _incomplete(summary)]
    return "\n".join(line for line in lines if line)


# ----------------------------------------------------------------------------- many runs
def policy_bars(results: pd.DataFrame, metric: str, path: str | Path, title: str = "", device: str | None = None,
                slo_ms: float | None = None) -> Path:
    """Figures 14 / 16 of the paper: ``metric`` per load and policy (every variant present, coloured by
    :data:`PALETTE`; a bar per row, the mean of the rows without an interval where there are several), one panel
    per model; each load's tick says its offered rate (``offered_qps``), the title the ``device``, and ``slo_ms``
    is marked (labelled at the axis edge, without stretching the axis to it). A panel where one bar is over ten
    times the median is drawn on a log scale (its label says so)."""
    plt, sns = _plt()
    order = [x for x in ("low", "medium", "high") if x in set(results["load"])]
    hue = policy_order(results["policy"])
    with plt.rc_context(FIXED_TITLES):
        # compare's tables have one row per (model, load, policy): a bar is its row's value, no interval to draw
        g = sns.catplot(data=results, x="load", y=metric, hue="policy", col="model", kind="bar", order=order,
                        hue_order=hue, palette=policy_colours(hue), saturation=1, errorbar=None, sharex=False,
                        sharey=False, col_wrap=min(3, results["model"].nunique()), height=2.8,
                        aspect=1.45 if len(hue) <= 3 else 1.8)
        g.set_axis_labels("load (offered queries/s)", axis_label(metric))
        g.set_titles("{col_name}")
        for model, ax in g.axes_dict.items():
            mine = results[results["model"] == model]
            if "offered_qps" in results:
                qps = mine.groupby("load")["offered_qps"].first()
                ax.set_xticks(range(len(order)))
                ax.set_xticklabels([f"{ld}\n{qps.get(ld, float('nan')):.0f} qps" for ld in order])
            _log_if_outlier(ax, mine[metric])
            if slo_ms:
                slo_line(ax, slo_ms, "y")
    head = title + (f" on {device}" if device else "")
    if head:
        g.figure.suptitle(head, y=1.02)
    g.tight_layout()
    return _write(g.figure, path, bbox_inches="tight")


def _stack_bars(ax, g: pd.DataFrame, loads: list, shares: list) -> tuple[float, float]:
    """One panel of :func:`attribution_bars`: the shares stacked (gains up, losses down), the total as a black
    tick; returns the lowest and highest values drawn."""
    up = [0.0] * len(loads)
    down = [0.0] * len(loads)
    for c in shares:
        vals = g[c].fillna(0.0).tolist()
        bottoms = [u if v >= 0 else d for v, u, d in zip(vals, up, down)]
        ax.bar(loads, vals, bottom=bottoms, color=SHARE_COLOURS[c], label=SHARE_NAMES[c], width=0.6)
        up = [u + max(v, 0.0) for v, u in zip(vals, up)]
        down = [d + min(v, 0.0) for v, d in zip(vals, down)]
    totals = [t for t in g["reduction_%"].tolist() if isinstance(t, (int, float)) and math.isfinite(t)]
    ax.scatter(loads, g["reduction_%"], marker="_", s=400, color="black", zorder=3, label="total")
    ax.axhline(0.0, color="black", lw=0.6)
    return min([0.0, *down, *totals]), max([0.0, *up, *totals])


def attribution_bars(att: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """The attribution (:func:`dvasim.studies.evaluation.attribution`): per model and load, the shares of
    DVABatch's reduction against DelayBatch stacked (gains up, losses down; points of DelayBatch's mean), the total
    as a black tick. Each panel's axis covers every stacked bar and tick with a margin."""
    models = list(dict.fromkeys(att["model"]))
    plt, _, fig, axes = model_panels(models, 3.6, 2.9)
    loads = [x for x in ("low", "medium", "high") if x in set(att["load"])]
    shares = [c for c in SHARE_COLOURS if c in att.columns and att[c].notna().any()]
    for ax, model in zip(axes.flat, models):
        lo, hi = _stack_bars(ax, att[att["model"] == model].set_index("load").reindex(loads), loads, shares)
        pad = 0.08 * max(hi - lo, 1.0)
        ax.set_ylim(lo - pad, hi + pad)
        with plt.rc_context(FIXED_TITLES):
            ax.set(title=model, xlabel="load", ylabel="points of DelayBatch's mean")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(labels), frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _write(fig, path, bbox_inches="tight")


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
        ax.legend(fontsize=8, title="runs")
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
                saturation=1, legend=False, ax=ax)
    ax.set(xlabel="", ylabel="capacity (queries/s)")
    ax.tick_params(axis="x", rotation=20)
    return save_figure(fig, path, title or (f"capacity with p99 <= {slo_ms:g} ms" if slo_ms else "capacity"))
