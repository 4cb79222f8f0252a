"""Figures a reader can use (issues 13 and 23): one colour per policy everywhere (the command line, the experiments'
scripts, the notebooks), titles naming the model, device, stack and load (and an interrupted or stuck run), words
with units instead of column names, the SLO labelled off the data, axes that fit outliers, no bar clipped, files
written whole, and a notebook's backend left alone. Properties of the figures, not pixels."""

from __future__ import annotations

import errno
import re
import sys
import types
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from dvasim.errors import OutputError  # noqa: E402
from dvasim.reporting import plots  # noqa: E402
from dvasim.reporting.plots import (  # noqa: E402
    PALETTE,
    attribution_bars,
    axis_label,
    latency_figure,
    policy_bars,
    policy_colours,
    readable,
    run_title,
    slo_line,
)
from tests.experiments import load_experiment  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXP = ROOT / "experiments"


def _texts(ax):
    return [t.get_text() for t in ax.texts]


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _slo_labels(fig):
    return [(ax, t) for ax in fig.axes for t in ax.texts if t.get_text().startswith("SLO ")]


# ----------------------------------------------------------------------------- the SLO
def test_an_slo_far_above_the_data_does_not_stretch_the_axis_and_is_named_above_it():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [5, 12])
    top = ax.get_ylim()[1]
    assert slo_line(ax, 200.0) is None
    assert ax.get_ylim()[1] == top < 200
    note = [t for t in ax.texts if "SLO 200 ms off the axis" in t.get_text()]
    fig.canvas.draw()
    assert note and note[0].get_window_extent().y0 >= ax.bbox.y1  # above the plotting area
    plt.close(fig)


def test_an_slo_near_the_data_is_drawn_and_labelled_outside_the_plotting_area():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [5, 12])
    label = slo_line(ax, 15.0)
    assert ax.get_ylim()[1] >= 15.0 and "SLO 15 ms" in _texts(ax)
    assert any(line.get_label() == "SLO 15 ms" for line in ax.get_lines())
    fig.canvas.draw()
    assert label.get_window_extent().x0 >= ax.bbox.x1  # right of the axes, not on the data
    plt.close(fig)


def test_the_latency_figures_slo_labels_sit_off_every_panel(tmp_path, drawn):
    rng = np.random.default_rng(0)
    lat = rng.gamma(4.0, 4.0, 3000)
    df = pd.DataFrame({"arrival_ms": np.arange(3000) * 2.0, "finish_ms": 1.0, "latency_ms": lat})
    latency_figure(df, tmp_path / "l.png", "t", qos_target_ms=float(np.percentile(lat, 90)))
    (fig,) = drawn
    a, b = fig.axes[:2]
    (label,) = [t for _, t in _slo_labels(fig)]
    box = label.get_window_extent()
    assert not any(_overlaps(box, ax.bbox) for ax in fig.axes)
    # the CDF's SLO is in a legend in its lower right corner, where a CDF has no data
    legend = b.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == [label.get_text()]
    lb = legend.get_window_extent().transformed(b.transData.inverted())
    x = np.sort(lat)
    cdf = np.arange(1, len(x) + 1) / len(x)
    inside = (x >= lb.x0) & (x <= lb.x1)
    assert (cdf[inside] > lb.y1).all()  # the curve passes above the legend


def test_the_compare_figures_slo_labels_touch_no_other_panel(tmp_path, drawn):
    rows = [{"model": m, "load": ld, "policy": p, "offered_qps": 10.0, "p99_latency_ms": v * f}
            for m, v in (("m1", 150.0), ("m2", 180.0), ("m3", 120.0), ("m4", 170.0))
            for ld, f in (("low", 0.3), ("high", 1.0)) for p in ("zerobatch", "dvabatch")]
    policy_bars(pd.DataFrame(rows), "p99_latency_ms", tmp_path / "f.png", slo_ms=200.0)
    (fig,) = drawn
    labels = _slo_labels(fig)
    assert len(labels) == 4
    for own, text in labels:
        box = text.get_window_extent()
        assert not _overlaps(box, own.bbox)
        for other in fig.axes:
            if other is not own:
                assert not _overlaps(box, other.get_tightbbox()), (own.get_title(), other.get_title())


# ----------------------------------------------------------------------------- outliers, bars
def test_one_outlier_does_not_flatten_the_latency_axes(tmp_path, drawn):
    lat = np.linspace(5.0, 15.0, 2000)
    lat[7] = 5000.0
    df = pd.DataFrame({"arrival_ms": np.arange(2000) * 1.0, "finish_ms": 1.0, "latency_ms": lat})
    latency_figure(df, tmp_path / "l.png")
    (fig,) = drawn
    a, b = fig.axes[:2]
    assert 15.0 <= a.get_ylim()[1] < 20.0 and 15.0 <= b.get_xlim()[1] < 20.0
    for ax in (a, b):
        assert any("1 point off the axis (up to 5,000 ms)" in t for t in _texts(ax))


def test_no_outlier_leaves_the_axis_alone(tmp_path, drawn):
    lat = np.linspace(5.0, 15.0, 2000)
    df = pd.DataFrame({"arrival_ms": np.arange(2000) * 1.0, "finish_ms": 1.0, "latency_ms": lat})
    latency_figure(df, tmp_path / "l.png")
    a = drawn[0].axes[0]
    assert a.get_ylim()[1] >= 15.0 and not any("off the axis" in t for t in _texts(a))


def _bars(ax):
    return [p for p in ax.patches if isinstance(p, Rectangle) and p.get_height() != 0 and np.isfinite(p.get_height())]


def test_a_bar_that_dwarfs_the_others_turns_its_panel_logarithmic_and_fits(tmp_path, drawn):
    rows = []
    for model in ("bert_base", "vgg19"):
        for load, f in (("low", 0.3), ("medium", 0.6), ("high", 0.9)):
            for pol in ("zerobatch", "delaybatch", "dvabatch"):
                v = 3000.0 if (model, load, pol) == ("bert_base", "high", "zerobatch") else 10.0 * f
                rows.append({"model": model, "load": load, "policy": pol, "offered_qps": 100 * f, "mean_latency_ms": v})
    policy_bars(pd.DataFrame(rows), "mean_latency_ms", tmp_path / "f.png", "mean latency", device="h100")
    (fig,) = drawn
    axes = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    assert set(axes) == {"bert_base", "vgg19"}  # facet titles without "model = "
    assert axes["bert_base"].get_yscale() == "log" and axes["vgg19"].get_yscale() == "linear"
    assert any("log scale" in t for t in _texts(axes["bert_base"]))
    for ax in axes.values():
        lo, hi = ax.get_ylim()
        assert all(p.get_y() + p.get_height() <= hi for p in _bars(ax))
    assert axes["bert_base"].get_ylim()[1] >= 3000.0


def test_attribution_axes_cover_every_stacked_bar_and_total(tmp_path, drawn):
    rows = []
    for model, k in (("linknet", 1.0), ("vgg19", 2.0)):
        for load in ("low", "medium", "high"):
            rows.append({"model": model, "load": load, "reduction_%": 30.0 * k, "share_multientry_pp": 60.0 * k,
                         "share_stretch_pp": -45.0 * k, "share_split_pp": 20.0 * k, "share_input_pp": 0.0,
                         "share_rest_pp": -5.0 * k})
    attribution_bars(pd.DataFrame(rows), tmp_path / "a.png", "attribution")
    (fig,) = drawn
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        lo, hi = ax.get_ylim()
        bars = _bars(ax)
        assert bars
        tops = [max(p.get_y(), p.get_y() + p.get_height()) for p in bars]
        bottoms = [min(p.get_y(), p.get_y() + p.get_height()) for p in bars]
        # strictly inside: a margin above the highest stack and below the lowest
        assert max(tops) < hi and min(bottoms) > lo


# ----------------------------------------------------------------------------- words, titles
def test_column_names_become_words_with_units():
    assert axis_label("p99_latency_ms") == "p99 latency (ms)"
    assert axis_label("policy.max_queue_delay_ms") == "batch window (ms)"
    assert axis_label("workload.rate_qps") == "offered load (queries/s)"
    assert axis_label("queue_depth_qps") == "queue depth (queries/s)"  # unknown: its unit suffix in brackets
    assert axis_label("share_stretch_pp") == "stretch (points of DelayBatch's mean)"


def test_readable_relabels_a_seaborn_grid():
    import seaborn as sns

    df = pd.DataFrame({"offered_qps": [1, 2, 1, 2], "mean_latency_ms": [1.0, 2.0, 3.0, 4.0],
                       "workload.rate_qps": [5, 5, 9, 9], "device": ["a", "a", "b", "b"]})
    g = sns.catplot(data=df, x="offered_qps", y="mean_latency_ms", hue="workload.rate_qps", col="device", kind="bar")
    readable(g)
    ax = g.axes.flat[0]
    assert ax.get_xlabel() == "offered load (queries/s)" and ax.get_ylabel() == "mean latency (ms)"
    assert [a.get_title() for a in g.axes.flat] == ["a", "b"]
    assert g.legend.get_title().get_text() == "offered load (queries/s)"
    plt.close(g.figure)


def test_compare_figure_ticks_carry_each_models_rates_and_words(tmp_path, drawn):
    rows = []
    for model, base in (("m1", 100.0), ("m2", 40.0)):
        for load, f in (("low", 0.25), ("high", 0.9)):
            for pol in ("zerobatch", "dvabatch"):
                rows.append({"model": model, "load": load, "policy": pol, "offered_qps": base * f,
                             "p99_latency_ms": 10.0 * f})
    policy_bars(pd.DataFrame(rows), "p99_latency_ms", tmp_path / "f.png", "p99", device="h100", slo_ms=200.0)
    (fig,) = drawn
    seen = {ax.get_title(): [t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes}
    assert seen["m1"] == ["low\n25 qps", "high\n90 qps"] and seen["m2"] == ["low\n10 qps", "high\n36 qps"]
    assert fig._suptitle.get_text() == "p99 on NVIDIA H100 (SXM5 80GB)"  # the device in words
    labels = [ax.get_ylabel() for ax in fig.axes] + [ax.get_xlabel() for ax in fig.axes]
    assert "p99 latency (ms)" in labels[0]
    assert not any("_" in lb for lb in labels)


def _run(cfg):
    import dvasim

    return dvasim.run(cfg)


def test_run_titles_name_the_model_device_stack_and_load():
    r = _run({"model": {"table": str(ROOT / "traces/default/vgg16_titanx_4stages.csv")},
              "policy": {"name": "dvabatch"}, "workload": {"kind": "poisson", "rate_qps": 150.0, "n_queries": 200}})
    t = run_title(r.summary, r.config)
    assert "dvabatch" in t and "vgg16_titanx_4stages" in t and "NVIDIA TITAN X (Pascal)" in t
    assert "stack: as-profiled" in t and "poisson arrivals at 150 queries/s" in t
    assert f"{r.summary['offered_qps']:.4g} queries/s offered" in t
    r = _run({"model": {"name": "resnet152", "device": "h100", "stages": 2}, "policy": {"name": "zerobatch"},
              "workload": {"kind": "stepping", "start_qps": 50.0, "end_qps": 400.0, "step_queries": 50,
                           "n_queries": 200}})
    t = run_title(r.summary, r.config)
    assert "zerobatch on resnet152" in t and "NVIDIA H100" in t and "modelled" not in t
    assert "stack: cudagraph" in t and "stepping load, 50 to 400 queries/s" in t
    assert "INTERRUPTED" not in t and "STUCK" not in t


def test_interrupted_and_stuck_runs_say_so_in_the_title():
    base = {"policy": "dvabatch", "model": "m", "stack": "s"}
    assert "INTERRUPTED" in run_title({**base, "interrupted": True})
    t = run_title({**base, "stuck": "interrupted at simulated time 12.000 ms; 3 of 5 queries had not arrived"})
    assert "INTERRUPTED at simulated time 12.000 ms" in t and "had not arrived" not in t
    t = run_title({**base, "stuck": "2 of 9 queries never finished (first ids [3, 4]); " + "x" * 500})
    assert t.splitlines()[-1].startswith("STUCK: 2 of 9 queries never finished") and len(t) < 300
    assert run_title(base) == "dvabatch on m, stack: s"  # the old call, a summary alone, still works


def test_replayed_runs_name_the_replay_device():
    cfg = {"replay": {"device": "cuda"}, "model": {"device": "h100"}, "workload": {"kind": "poisson", "rate_qps": 9}}
    assert "replayed on cuda" in run_title({"policy": "p", "model": "m"}, cfg)


# ----------------------------------------------------------------------------- one palette
def test_policy_colours_are_the_palettes_and_stable():
    a = policy_colours(["dvabatch", "zerobatch", "mystery"])
    b = policy_colours(["zerobatch", "mystery", "delaybatch", "dvabatch"])
    assert a["dvabatch"] == b["dvabatch"] == PALETTE["dvabatch"] and a["zerobatch"] == PALETTE["zerobatch"]


def test_the_experiments_take_every_colour_from_the_one_palette():
    common = load_experiment("common")
    assert common.PALETTE is PALETTE and common.policy_colours is policy_colours
    for path in sorted(EXP.glob("*.py")):
        assert not re.findall(r"#[0-9a-fA-F]{6}\b", path.read_text()), f"{path.name}: a colour of its own"
    e2bird = load_experiment("e2bird_figs13_14")
    assert {k: v for k, v in e2bird.system_colours().items()} == {
        "NO_Wait": PALETTE["tfserving-nowait"], "OPT_Wait": PALETTE["tfserving-optwait"],
        "Static": PALETTE["tfserving-static"], "N-Ebird": PALETTE["n-ebird"], "E-Ebird": PALETTE["e-ebird"]}
    lazyb = load_experiment("lazyb_figs12_15")
    assert lazyb._style("LazyB")["color"] == PALETTE["lazybatch"] and lazyb._style("Serial")["color"] == PALETTE[
        "serial"] and lazyb._style("GraphB(50)")["color"] == PALETTE["graphbatch"]


def test_an_experiments_bars_have_their_policies_colours(tmp_path, drawn):
    e2bird = load_experiment("e2bird_figs13_14")
    caps = pd.read_csv(EXP / "results" / "e2bird_fig14_capacity.csv")
    e2bird.plot14(caps, tmp_path / "c.png", "tfserving")
    (fig,) = drawn
    handles, labels = fig.axes[0].get_legend_handles_labels()
    got = {lb: matplotlib.colors.to_hex(h.get_facecolor()) for h, lb in zip(handles, labels)}
    assert got == e2bird.system_colours()


# ----------------------------------------------------------------------------- files, backend
def test_a_figure_that_cannot_be_written_leaves_nothing_and_says_so(tmp_path, monkeypatch):
    def full(fig, *a, **k):
        Path(a[0]).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(plt.Figure, "savefig", full)
    df = pd.DataFrame({"arrival_ms": [0.0, 1.0], "finish_ms": [1.0, 2.0], "latency_ms": [1.0, 1.0]})
    with pytest.raises(OutputError, match="no space left"):
        latency_figure(df, tmp_path / "latency.png")
    assert list(tmp_path.iterdir()) == []


def test_a_figure_is_written_under_its_own_name_only(tmp_path):
    df = pd.DataFrame({"arrival_ms": [0.0, 1.0], "finish_ms": [1.0, 2.0], "latency_ms": [1.0, 1.5]})
    path = latency_figure(df, tmp_path / "latency.png", "t", qos_target_ms=1.2)
    assert [p.name for p in tmp_path.iterdir()] == ["latency.png"] and path.read_bytes()[:4] == b"\x89PNG"


def test_inside_a_notebook_the_backend_is_left_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(matplotlib, "use", lambda *a, **k: calls.append(a))
    monkeypatch.setattr(plots, "_headless", lambda: True)
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: object()))
    plots._plt()
    assert calls == []  # a Jupyter kernel keeps its inline backend, display or not
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: None))
    plots._plt()
    assert calls == [("Agg",)]  # a plain process without a display draws with Agg
    monkeypatch.setattr(plots, "_headless", lambda: False)
    plots._plt()
    assert calls == [("Agg",)]  # with a display: matplotlib's own choice


def test_no_display_means_headless_on_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    assert plots._headless()
    monkeypatch.setenv("WAYLAND_DISPLAY", "wayland-0")
    assert not plots._headless()


def test_seaborn_imports_without_its_scipy_for_the_compare_figures_and_scipy_still_imports_after():
    import subprocess

    code = ("import sys; from dvasim.reporting import plots; plots.import_seaborn_without_scipy(); "
            "assert 'seaborn' in sys.modules and not {'scipy.stats', 'scipy.cluster'} & set(sys.modules); "
            "import scipy.stats, scipy.cluster; assert sys.modules['scipy.stats'] is not None; print('ok')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
