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
# the one palette of every figure (dvasim.reporting.palette): re-exported here, where the figures take it from
from dvasim.reporting.palette import (  # noqa: E402, F401  (the figures' names for them)
    PALETTE,
    SHARE_COLOURS,
    SHARE_NAMES,
    STRATEGY_COLOURS,
    VERDICT_STYLE,
    label_palette,
    policy_colour,
    policy_colours,
    policy_order,
)

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
    try:
        float(text)
        return False  # a number ("0.29"), never a column
    except ValueError:
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


# ----------------------------------------------------------------------------- what a figure shows
def device_name(key) -> str:
    """A device's name in words: a GPU table's key (``titanrtx``) by its name (``NVIDIA Titan RTX``), ``cpu`` as
    ``CPU``, anything else as it is."""
    key = str(key or "")
    if key == "cpu":
        return "CPU"
    try:
        from dvasim.model.gpu_model import GPUS
    except Exception:  # pragma: no cover  (the model data missing)
        return key
    return GPUS[key].name if key in GPUS else key


def _join(values, many: str) -> str:
    values = [str(v) for v in dict.fromkeys(values) if v is not None and str(v) not in ("", "nan")]
    if not values:
        return ""
    return values[0] if len(values) == 1 else f"{many}: {', '.join(values)}"


def describe(*, model=None, device=None, stack=None, policy=None, load=None) -> str:
    """What a figure shows, in words: ``"<policy> on <model>, <device>, stack: <stack>, load: <load>"``, each
    part given as one value or several (``"models: a, b"``); the parts not given are left out."""
    def many(v):
        return [] if v is None else [v] if isinstance(v, str) or not hasattr(v, "__iter__") else list(v)

    pol, mod = _join(many(policy), "policies"), _join(many(model), "models")
    head = f"{pol} on {mod}" if pol and mod else pol or mod
    parts = [head, _join(many(device), "devices")]
    st = _join(many(stack), "stacks")
    parts.append(f"stack: {st}" if st and not st.startswith("stacks:") else st)
    ld = load if isinstance(load, str) else _join(many(load), "loads")
    parts.append(f"load: {ld}" if ld and not ld.startswith("load") else ld)
    return ", ".join(x for x in parts if x)


def rates_words(rates) -> str:
    """Offered rates in words: one rate, or the range of several (``"50 to 400 queries/s"``)."""
    v = np.asarray(pd.to_numeric(pd.Series(list(rates)), errors="coerce"), dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return ""
    lo, hi = float(v.min()), float(v.max())
    return f"{lo:.4g} queries/s" if math.isclose(lo, hi, rel_tol=1e-9) else f"{lo:.4g} to {hi:.4g} queries/s"


def table_context(df: pd.DataFrame, configs=None, skip=()) -> str:
    """:func:`describe` of a table of runs (a sweep's, a capacity sweep's): its models, devices (a ``device``
    column, else the runs' ``configs``: :func:`run_device`), stacks, policies and offered load, each part left
    out when it is in ``skip``."""
    def col(name):
        return list(df[name]) if name in df and name not in skip else None

    devices = col("device")
    if devices is None and configs and "device" not in skip:
        devices = [run_device(c) for c in configs]
    load = None
    if "load" not in skip:
        rate = "workload.rate_qps" if "workload.rate_qps" in df else "offered_qps" if "offered_qps" in df else None
        kinds = [((c or {}).get("workload") or {}).get("kind") for c in configs or []]
        kind = _join(kinds, "kinds")
        words = rates_words(df[rate]) if rate else ""
        load = " ".join(x for x in (f"{kind} arrivals" if kind and ":" not in kind else "", words) if x) or None
    return describe(model=col("model"), device=[device_name(d) for d in devices] if devices else None,
                    stack=col("stack"), policy=col("policy"), load=load)


def row_verdict(row) -> str:
    """A result row's verdict (:data:`dvasim.reporting.verdict.VERDICTS`): its ``verdict``; else from the columns
    older tables carry: some of its runs not stable (``stable`` false, ``stable_runs`` < ``runs``) ``unstable``,
    metastable probes (``n_metastable``) ``metastable``, refused queries over the SLO's allowance
    (``rejecting``), its percentile over the SLO (``within_qos`` / ``within_slo`` false) ``over-SLO``."""
    get = row.get if hasattr(row, "get") else (lambda k, d=None: getattr(row, k, d))

    def val(k):
        v = get(k, None)
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else v

    if val("verdict") in VERDICT_STYLE or val("verdict") == "stable":
        return str(val("verdict"))
    if val("stable") is not None and not _truthy(val("stable")):
        return "unstable"
    if val("stable_runs") is not None and val("runs") is not None and val("stable_runs") < val("runs"):
        return "unstable"
    if val("n_metastable") is not None and val("n_metastable") > 0:
        return "metastable"
    for k in ("within_qos", "within_slo"):
        if val(k) is not None and not _truthy(val(k)):
            return "over-SLO"
    return "stable"


def _truthy(v) -> bool:
    return v.strip().lower() in ("true", "1", "yes") if isinstance(v, str) else bool(v)


MARKER_GID = "dvasim-verdict-"


def mark_verdicts(ax, x, y, verdicts, legend: bool = True) -> dict[str, int]:
    """Mark the points ``(x, y)`` whose verdict is not ``stable`` with a hollow marker of their verdict
    (:data:`VERDICT_STYLE`: unstable, over-SLO, metastable, rejecting), labelled for the legend (``legend``) and
    tagged ``gid = "dvasim-verdict-<verdict>"``. Returns how many points of each verdict were marked."""
    x, y, verdicts = list(x), list(y), list(verdicts)
    counts = {}
    for verdict, style in VERDICT_STYLE.items():
        pts = [(a, b) for a, b, v in zip(x, y, verdicts) if v == verdict and b is not None and np.isfinite(b)]
        if not pts:
            continue
        counts[verdict] = len(pts)
        xs, ys = zip(*pts)
        ax.scatter(xs, ys, marker=style["marker"], s=style["s"], facecolors="none", edgecolors=style["color"],
                   linewidths=1.6, zorder=5, label=verdict if legend else None, gid=MARKER_GID + verdict,
                   clip_on=False)
    return counts


def marked(ax) -> dict[str, int]:
    """The verdict markers :func:`mark_verdicts` drew on ``ax``: ``{verdict: points}``."""
    out: dict[str, int] = {}
    for c in ax.collections:
        gid = c.get_gid() or ""
        if gid.startswith(MARKER_GID):
            out[gid[len(MARKER_GID):]] = out.get(gid[len(MARKER_GID):], 0) + len(c.get_offsets())
    return out


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
DENSITY_MIN_POINTS = 20_000  # above this many finished queries the latency panel is a density, not a scatter
DENSITY_GID = "dvasim-density"


def latency_figure(df: pd.DataFrame, path: str | Path, title: str = "", qos_target_ms: float | None = None,
                   n_queries: int | None = None) -> Path:
    """Per-query latency over arrival time (left) and the latency CDF (right), the SLO marked at the axes' edges
    and the axes fitted to the bulk of the latencies (:func:`fit_outliers`). Runs of more than
    :data:`FIGURE_MAX_POINTS` finished queries are drawn from every k-th of them (in arrival order); above
    :data:`DENSITY_MIN_POINTS` the left panel is a density (a hexagonal 2-D histogram, log counts: a scatter of
    that many points is a solid blob), and its title says so. ``n_queries``: the run's queries when ``df`` is a
    sample of them (the panel's title then says how many the sample stands for)."""
    plt, sns = _plt()
    done = df[df["finish_ms"].notna()]
    n_done = len(done)
    if len(done) > FIGURE_MAX_POINTS:
        done = done.iloc[:: -(-len(done) // FIGURE_MAX_POINTS)]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    x, y = done["arrival_ms"].to_numpy(dtype=float) / 1000.0, done["latency_ms"].to_numpy(dtype=float)
    of = f" (a sample of {int(n_queries):,} queries)" if n_queries and n_queries > len(df) else ""
    if len(done) > DENSITY_MIN_POINTS:
        cap = 3.0 * float(np.percentile(y, 99)) if len(y) else 0.0
        keep = y <= cap if cap > 0 else np.ones(len(y), bool)  # the outliers fit_outliers leaves off the axis
        hb = a.hexbin(x[keep], y[keep], gridsize=(90, 45), bins="log", mincnt=1, cmap="viridis", linewidths=0)
        hb.set_gid(DENSITY_GID)
        fig.colorbar(hb, ax=a, pad=0.01).set_label("queries per cell (log)")
        a.set_title(f"per-query latency: density of {len(done):,} queries{of}")
    else:
        sns.scatterplot(x=x, y=y, s=6, linewidth=0, ax=a)
        a.set_title("per-query latency" + (f": {len(done):,} of {n_done:,} queries (every "
                                           f"{-(-n_done // len(done))}th)" if len(done) < n_done else "") + of)
    a.set_xlabel("arrival time (s)")
    a.set_ylabel("latency (ms)")
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
    from ``config``, the rate offered from ``summary``); a line when the run was interrupted or stuck
    (``summary["interrupted"]``, ``summary["stuck"]``), and one naming its verdict when it is not stable
    (``summary["verdict"]``: unstable, over-SLO, metastable, rejecting)."""
    config = config or {}
    model = summary.get("model") or (config.get("model") or {}).get("name") or "?"
    head = f"{summary.get('policy') or (config.get('policy') or {}).get('name', '?')} on {model}"
    device = run_device(config)
    stack = summary.get("stack") or (config.get("server") or {}).get("name")
    head += (f", {device}" if device else "") + (f", stack: {stack}" if stack else "")
    lines = [head, _load_words(config.get("workload") or {}, summary.get("offered_qps")), _incomplete(summary),
             _verdict_words(summary)]
    return "\n".join(line for line in lines if line)


def _verdict_words(summary: dict) -> str:
    """A line naming a run's verdict when it is not stable (``summary["verdict"]``, the first of its reasons)."""
    verdict = summary.get("verdict")
    if not verdict or verdict == "stable":
        return ""
    why = str(summary.get("verdict_reason") or "").split(";", 1)[0].removeprefix(f"{verdict}: ")
    why = why if len(why) <= 80 else why[:79] + "..."
    return f"verdict: {str(verdict).upper()}" + (f" ({why})" if why else "")


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
            _mark_bars(ax, mine, metric, order, hue, slo_ms)
    head = title + (f" on {device_name(device)}" if device else "")
    if head:
        g.figure.suptitle(head, y=1.02)
    g.tight_layout()
    return _write(g.figure, path, bbox_inches="tight")


def bar_verdict(row: dict, slo_ms: float | None = None) -> str:
    """A compare row's verdict: :func:`row_verdict`'s, else ``unstable`` when some of its queries never finished
    (``n_completed`` < ``n_queries``), ``over-SLO`` when its p99 is over ``slo_ms``."""
    v = row_verdict(row)
    if v != "stable":
        return v
    done, n = row.get("n_completed"), row.get("n_queries")
    if done is not None and n is not None and done == done and n == n and done < n:
        return "unstable"
    p99 = row.get("p99_latency_ms")
    if slo_ms and p99 is not None and p99 == p99 and p99 > slo_ms:
        return "over-SLO"
    return "stable"


def _mark_bars(ax, mine: pd.DataFrame, metric: str, order: list, hue: list, slo_ms: float | None) -> dict:
    """Mark :func:`policy_bars`' bars whose run was not stable (:func:`bar_verdict`) at the bar's top."""
    width = 0.8 / max(len(hue), 1)  # seaborn's dodged bars: 0.8 wide in all, one slot per hue level
    xs, ys, vs = [], [], []
    for row in mine.to_dict("records"):
        if row.get("load") not in order or row.get("policy") not in hue:
            continue
        xs.append(order.index(row["load"]) - 0.4 + width * (hue.index(row["policy"]) + 0.5))
        ys.append(row.get(metric))
        vs.append(bar_verdict(row, slo_ms))
    counts = mark_verdicts(ax, xs, ys, vs)
    if counts:
        axis_note(ax, "marked: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
    return counts


def _stack_bars(ax, g: pd.DataFrame, loads: list, shares: list) -> tuple[float, float]:
    """One panel of :func:`attribution_bars`: the shares stacked (gains up, losses down; every segment edged, so
    that a thin one stays visible), the total as a black tick; returns the lowest and highest values drawn."""
    up = [0.0] * len(loads)
    down = [0.0] * len(loads)
    x = list(range(len(loads)))
    for c in shares:
        vals = g[c].fillna(0.0).tolist()
        bottoms = [u if v >= 0 else d for v, u, d in zip(vals, up, down)]
        ax.bar(x, vals, bottom=bottoms, color=SHARE_COLOURS[c], label=SHARE_NAMES[c], width=0.6, edgecolor="0.2",
               linewidth=0.5)
        up = [u + max(v, 0.0) for v, u in zip(vals, up)]
        down = [d + min(v, 0.0) for v, d in zip(vals, down)]
    totals = [t for t in g["reduction_%"].tolist() if isinstance(t, (int, float)) and math.isfinite(t)]
    ax.scatter(x, g["reduction_%"], marker="_", s=400, color="black", linewidths=2, zorder=3, label="total")
    ax.axhline(0.0, color="black", lw=0.6)
    return min([0.0, *down, *totals]), max([0.0, *up, *totals])


def attribution_bars(att: pd.DataFrame, path: str | Path, title: str = "", device: str | None = None,
                     offered: pd.DataFrame | None = None) -> Path:
    """The attribution (:func:`dvasim.studies.evaluation.attribution`): per model and load, the shares of
    DVABatch's reduction against DelayBatch stacked (gains up, losses down; points of DelayBatch's mean), the total
    as a black tick. Each panel's axis covers every stacked bar and tick with a margin. The title names the
    ``device`` and the loads; ``offered`` (the compare table: ``model``, ``load``, ``offered_qps``) puts each
    load's offered rate under its tick. A share too small to see (under 2% of the panel's span) is named in a
    note above its panel."""
    models = list(dict.fromkeys(att["model"]))
    plt, _, fig, axes = model_panels(models, 3.8, 3.0)
    loads = [x for x in ("low", "medium", "high") if x in set(att["load"])]
    shares = [c for c in SHARE_COLOURS if c in att.columns and att[c].notna().any()]
    qps = (offered.groupby(["model", "load"])["offered_qps"].first()
           if offered is not None and {"model", "load", "offered_qps"} <= set(offered.columns) else None)
    for ax, model in zip(axes.flat, models):
        g = att[att["model"] == model].set_index("load").reindex(loads)
        lo, hi = _stack_bars(ax, g, loads, shares)
        pad = 0.08 * max(hi - lo, 1.0)
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_xticks(range(len(loads)))
        ax.set_xticklabels([f"{ld}\n{qps.get((model, ld), float('nan')):.0f} qps" if qps is not None else ld
                            for ld in loads])
        with plt.rc_context(FIXED_TITLES):
            ax.set(title=model, xlabel="load" + (" (offered queries/s)" if qps is not None else ""),
                   ylabel="points of DelayBatch's mean")
        thin = [SHARE_NAMES[c] for c in shares
                if 0 < g[c].abs().max() < 0.02 * max(hi - lo, 1.0)]
        if thin:
            axis_note(ax, f"{', '.join(thin)}: under 2% of the axis")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(labels), frameon=False)
    what = describe(model=models, device=device_name(device) if device else None,
                    stack=list(offered["stack"]) if offered is not None and "stack" in offered
                    and "stack:" not in title else None,
                    load=f"{', '.join(loads)} (Poisson)")
    fig.suptitle("\n".join(x for x in (title, what) if x))
    fig.tight_layout()
    return _write(fig, path, bbox_inches="tight")


def mark_groups(ax, df: pd.DataFrame, x: str, y: str, by: str | None = None, positions=None) -> dict[str, int]:
    """Mark a line plot's points by their runs' verdicts (:func:`mark_verdicts`): each point is the mean of ``y``
    over the rows of one ``x`` (and ``by``, the line's column) and takes the most severe verdict of those rows
    (:func:`row_verdict`: one unstable seed makes the point unstable). ``positions``: where each ``x`` value is
    drawn along a categorical axis (``{value: position}``)."""
    from dvasim.reporting.verdict import worst

    if not len(df):
        return {}
    v = df.assign(_verdict=[row_verdict(r) for r in df.to_dict("records")])
    keys = [x] + ([by] if by else [])
    g = v.groupby(keys, sort=False, dropna=False).agg(_y=(y, "mean"), _verdict=("_verdict", lambda s: worst(s)))
    g = g.reset_index()
    xs = [positions[k] if positions is not None else k for k in g[x]]
    return mark_verdicts(ax, xs, g["_y"], g["_verdict"])


def verdict_legend(ax, title: str | None = None, **kw):
    """``ax``'s legend with its verdict markers (:func:`mark_verdicts`) after the lines, outside the plotting area
    at the right (a legend never sits on the data)."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return None
    return ax.legend(handles, labels, title=title, fontsize=8, title_fontsize=8, loc="upper left",
                     bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, **kw)


def sweep_figure(table: pd.DataFrame, path: str | Path, title: str = "", configs=None) -> Path:
    """Mean and p99 latency against the offered load of a sweep's runs (:func:`dvasim.studies.sweep.sweep`'s table):
    one line per ``label`` (the swept values other than the load and the seed), the mean over seeds with its 95%
    interval when there are several. Lines labelled by policy alone get the policies' colours; a point whose runs
    were not stable (unstable, over-SLO, metastable, rejecting: :func:`row_verdict`) carries its verdict's marker.
    The title names the models, devices (``configs``: the runs' configs), stacks, policies and load
    (:func:`table_context`) after ``title``."""
    plt, sns = _plt()
    df = table.copy()
    df["label"] = df["label"].replace("", "all runs")
    labels, palette = label_palette(df["label"])
    # the nominal rate when it was swept (seeds then average at one point), else the measured offered rate
    x = "workload.rate_qps" if "workload.rate_qps" in df else "offered_qps"
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, metric, name in zip(axes, ("mean_latency_ms", "p99_latency_ms"), ("mean", "p99")):
        sns.lineplot(data=df, x=x, y=metric, hue="label", hue_order=labels, palette=palette, marker="o",
                     errorbar=("ci", 95), ax=ax)
        ax.set(xlabel="offered load (queries/s)", ylabel=f"{name} latency (ms)", title=f"{name} latency")
        mark_groups(ax, df, x, metric, "label")
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    verdict_legend(axes[1], "runs")
    head = title or "latency against offered load"
    return save_figure(fig, path, f"{head}\n{table_context(df, configs)}")


def capacity_figure(table: pd.DataFrame, path: str | Path, slo_ms: float | None = None, title: str = "",
                    configs=None) -> Path:
    """The capacity of each point of a capacity sweep (``label`` on the x axis, seeds averaged with their 95%
    interval); policies keep their colours. A point whose search met a metastable or otherwise failing rate
    (:func:`row_verdict`: ``n_metastable``, a ``verdict``) carries its verdict's marker at its bar's top, and one
    whose search reached its top rate (``top_exceeded`` false: the capacity is only a lower bound) says so. The
    title names the models, devices, stacks and policies (:func:`table_context`)."""
    plt, sns = _plt()
    df = table.copy()
    df["label"] = df["label"].replace("", "all")
    labels, palette = label_palette(df["label"])
    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(labels) + 2), 3.8))
    sns.barplot(data=df, x="label", y="capacity_qps", hue="label", order=labels, palette=palette, errorbar=("ci", 95),
                saturation=1, legend=False, ax=ax)
    ax.set(xlabel="", ylabel="capacity (queries/s)")
    ax.tick_params(axis="x", rotation=20)
    if mark_groups(ax, df, "label", "capacity_qps", positions={lb: i for i, lb in enumerate(labels)}):
        verdict_legend(ax, "probes")
    if "top_exceeded" in df:
        low = [lb for lb, g in df.groupby("label") if not g["top_exceeded"].map(_truthy).all()]
        if low:
            axis_note(ax, f"{', '.join(map(str, low))}: the search's top rate held (a lower bound)")
    head = title or (f"capacity with p99 <= {slo_ms:g} ms" if slo_ms else "capacity")
    return save_figure(fig, path, f"{head}\n{table_context(df, configs, skip=('load',))}")
