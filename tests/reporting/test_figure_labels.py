"""Issue 37, item 6: every figure kind says what it shows and marks what went wrong. Each kind is drawn on a tiny
input (Agg) and its Figure / Axes inspected: titles name the model, device, stack, policy and load where they
apply; a point whose run was not stable carries its verdict's marker; colours come from the one palette
(:mod:`dvasim.reporting.palette`); a large run is drawn as a density; a partial timeline names its window."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from dvasim.reporting import palette, plots  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXP = ROOT / "experiments"
TITAN = "NVIDIA Titan RTX"


@pytest.fixture
def figs(monkeypatch):
    """The figures the next calls save, not rendered (an empty file stands for each; inspected as objects, closed
    at the end)."""
    kept = []
    real_close = plt.close

    def keep(fig, fname=None, *a, **k):
        kept.append(fig)
        if isinstance(fname, (str, Path)):
            Path(fname).write_bytes(b"")

    monkeypatch.setattr(plt.Figure, "savefig", keep)
    monkeypatch.setattr(plt, "close", lambda *a, **k: None)
    yield kept
    for f in kept:
        real_close(f)


def _suptitle(fig) -> str:
    return fig._suptitle.get_text() if fig._suptitle is not None else ""


def _all_titles(fig) -> str:
    return "\n".join([_suptitle(fig), *(ax.get_title() for ax in fig.axes)])


def _exp(name: str):
    from tests.experiments import load_experiment

    return load_experiment(name)


def _sweep_table():
    rows = []
    for pol in ("zerobatch", "dvabatch"):
        for rate, verdict in ((50.0, "stable"), (200.0, "over-SLO"), (400.0, "unstable")):
            rows.append({"workload.rate_qps": rate, "policy.name": pol, "label": pol, "model": "vgg19_titanrtx",
                         "policy": pol, "stack": "triton-tensorrt", "offered_qps": rate * 0.98,
                         "mean_latency_ms": rate / 10, "p99_latency_ms": rate / 5, "qos_target_ms": 200.0,
                         "verdict": verdict, "stable": verdict == "stable"})
    configs = [{"model": {"name": "vgg19", "device": "titanrtx"}, "workload": {"kind": "poisson"}}] * len(rows)
    return pd.DataFrame(rows), configs


# ----------------------------------------------------------------------------- sweeps, capacity, compare
def test_a_sweep_figure_names_what_was_run_and_marks_unstable_and_over_slo_points(tmp_path, figs):
    table, configs = _sweep_table()
    plots.sweep_figure(table, tmp_path / "s.png", configs=configs)
    (fig,) = figs
    title = _suptitle(fig)
    for word in ("vgg19", TITAN, "stack: triton-tensorrt", "zerobatch", "dvabatch", "poisson", "queries/s"):
        assert word in title, (word, title)
    assert "sweep:" not in title
    for ax in fig.axes[:2]:
        assert plots.marked(ax) == {"over-SLO": 2, "unstable": 2}  # one point of each line, at 200 and 400 qps
        colours = {to_hex(line.get_color()) for line in ax.get_lines() if line.get_label() in palette.PALETTE}
        assert colours <= {palette.PALETTE["zerobatch"], palette.PALETTE["dvabatch"]}
    # a stable sweep carries no marker
    plots.sweep_figure(table.assign(verdict="stable", stable=True), tmp_path / "t.png", configs=configs)
    assert plots.marked(figs[1].axes[0]) == {}


def test_the_sweep_commands_figure_names_what_was_run_and_marks_verdicts(tmp_path, figs):
    from dvasim.studies.sweep import Point, latency_figure

    table, configs = _sweep_table()
    points = [Point({"workload.rate_qps": r["workload.rate_qps"], "policy.name": r["policy.name"]}, c, str(i))
              for i, (r, c) in enumerate(zip(table.to_dict("records"), configs))]
    latency_figure(table, points, tmp_path / "l.png")
    (fig,) = figs
    title = _suptitle(fig)
    for word in ("latency against offered load", "vgg19", TITAN, "stack: triton-tensorrt", "zerobatch",
                 "dvabatch", "50 to 400 queries/s"):
        assert word in title, (word, title)
    assert not title.startswith("sweep:")
    assert plots.marked(fig.axes[1]) == {"over-SLO": 2, "unstable": 2}


def test_a_capacity_figure_marks_a_metastable_point_and_names_the_stack(tmp_path, figs):
    table = pd.DataFrame([{"label": "zerobatch", "capacity_qps": 100.0, "n_metastable": 0, "top_exceeded": True,
                           "model": "bert_base", "policy": "zerobatch", "stack": "gpu-only"},
                          {"label": "dvabatch", "capacity_qps": 180.0, "n_metastable": 2, "top_exceeded": False,
                           "model": "bert_base", "policy": "dvabatch", "stack": "gpu-only"}])
    plots.capacity_figure(table, tmp_path / "c.png", slo_ms=200.0)
    (fig,) = figs
    assert "bert_base" in _suptitle(fig) and "stack: gpu-only" in _suptitle(fig)
    ax = fig.axes[0]
    assert plots.marked(ax) == {"metastable": 1}
    assert any("lower bound" in t.get_text() for t in ax.texts)


def test_compare_bars_mark_runs_over_the_slo_and_name_the_device(tmp_path, figs):
    rows = [{"model": "m1", "load": ld, "policy": p, "offered_qps": q, "p99_latency_ms": v, "n_completed": 10,
             "n_queries": 10} for ld, q, v in (("low", 10.0, 20.0), ("high", 90.0, 250.0))
            for p in ("zerobatch", "dvabatch")]
    plots.policy_bars(pd.DataFrame(rows), "p99_latency_ms", tmp_path / "f.png", "p99", device="titanrtx",
                      slo_ms=200.0)
    (fig,) = figs
    assert TITAN in _suptitle(fig)
    assert plots.marked(fig.axes[0]) == {"over-SLO": 2}


def test_the_attribution_names_device_and_loads_and_has_its_own_distinct_colours(tmp_path, figs):
    rows = [{"model": "vgg19", "load": ld, "reduction_%": 30.0, "share_multientry_pp": 25.0,
             "share_stretch_pp": -5.0, "share_split_pp": 9.0, "share_input_pp": 0.2, "share_rest_pp": 0.8}
            for ld in ("low", "medium", "high")]
    offered = pd.DataFrame([{"model": "vgg19", "load": ld, "offered_qps": q, "stack": "triton-tensorrt-21.10"}
                            for ld, q in (("low", 57.0), ("medium", 138.0), ("high", 207.0))])
    plots.attribution_bars(pd.DataFrame(rows), tmp_path / "a.png", "attribution", device="titanrtx",
                           offered=offered)
    (fig,) = figs
    title = _suptitle(fig)
    assert TITAN in title and "low, medium, high" in title and "triton-tensorrt-21.10" in title
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["low\n57 qps", "medium\n138 qps", "high\n207 qps"]
    colours = list(palette.SHARE_COLOURS.values())
    assert len(set(colours)) == len(colours)
    assert palette.SHARE_COLOURS["share_rest_pp"] not in palette.PALETTE.values()  # not DVABatch's red
    assert any("input clust." in t.get_text() for t in ax.texts)  # a sliver is named in a note
    assert all(p.get_edgecolor()[3] > 0 for p in ax.patches)  # every segment edged: a thin one stays visible


# ----------------------------------------------------------------------------- one run
def test_a_large_run_is_drawn_as_a_density_and_says_so(tmp_path, figs):
    n = plots.DENSITY_MIN_POINTS + 1000
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"arrival_ms": np.arange(n, dtype=float), "finish_ms": 1.0,
                       "latency_ms": rng.gamma(4.0, 2.0, n)})
    plots.latency_figure(df, tmp_path / "big.png", "t", n_queries=2_500_000)
    a = figs[0].axes[0]
    assert [c.get_gid() for c in a.collections] == [plots.DENSITY_GID]
    assert "density" in a.get_title() and "2,500,000" in a.get_title()
    small = df.iloc[:500]
    plots.latency_figure(small, tmp_path / "small.png", "t")
    assert plots.DENSITY_GID not in [c.get_gid() for c in figs[1].axes[0].collections]


def test_a_run_title_names_the_verdict_of_an_unstable_run():
    summary = {"policy": "dvabatch", "model": "vgg19", "stack": "s", "verdict": "unstable",
               "verdict_reason": "unstable: served 60% of the offered rate; over-SLO: p99 9e+03 ms > 200 ms"}
    t = plots.run_title(summary, {"model": {"device": "titanrtx"}})
    assert "verdict: UNSTABLE (served 60% of the offered rate)" in t and "titanrtx" in t
    assert "verdict" not in plots.run_title({**summary, "verdict": "stable"})


def test_a_partial_timeline_names_its_window(tmp_path, figs):
    from dvasim.reporting.timeline import gantt_figure, window_words

    tl = pd.DataFrame({"lane": 0, "stage": np.arange(200) % 2, "start_ms": np.arange(200) * 7.5,
                       "end_ms": np.arange(200) * 7.5 + 7.0, "batch_id": np.arange(200) // 2, "batch_size": 1,
                       "seq_len": 0, "first_query": 0})
    gantt_figure(tl, tmp_path / "g.png", window_ms=140.0)
    assert "first 142 ms of 1,500 ms" in figs[0].axes[0].get_title()
    assert window_words(1500.0, 1500.0) == "all 1,500 ms"


# ----------------------------------------------------------------------------- the experiments' figures
def test_fig15_names_the_device_does_not_cap_latencies_and_marks_over_slo_levels(tmp_path, figs):
    f15 = _exp("fig15_stepping")
    rows = []
    for pol in f15.POLICIES:
        for qid in range(0, 400, 4):
            rate = 66.0 if qid < 200 else 4000.0
            rows.append({"model": "bert_base", "stack": "gpu-only", "policy": pol, "qid": qid, "offered_qps": rate,
                         "latency_ms": 5.0 if qid < 200 else 30_000.0 + qid})
    f15.plot_stepping(pd.DataFrame(rows), tmp_path / "f.png")
    fig = figs[0]
    ax = fig.axes[0]
    assert TITAN in ax.get_title() and "stack: gpu-only" in ax.get_title()
    assert ax.get_ylim()[1] > 30_400  # the overloaded queries are drawn where they are, not piled at 10^4
    assert plots.marked(ax) == {"over-SLO": 3}  # the 4000-qps level of each policy


def test_fig21s_overhead_panel_shows_values_and_says_what_its_legend_means(tmp_path, figs):
    f21 = _exp("fig21_closed_loop")
    df = pd.DataFrame([{"model": m, "stack": "triton-tensorrt", "x_setting": 0, "launch_overhead_ms": 0.0,
                        "zerobatch_mean_ms": 2.0, "dvabatch_mean_ms": 2.0 + o, "overhead_ms": o,
                        "expected_overhead_ms": 0.2, "n_completed_dvabatch": 100}
                       for m, o in (("vgg19", 1e-13), ("linknet", 0.1))])
    f21.plot(df, tmp_path / "f.png")
    fig = figs[0]
    a, b = fig.axes[:2]
    assert a.get_legend() is not None and [t.get_text() for t in a.get_legend().get_texts()] == ["zerobatch",
                                                                                                 "dvabatch"]
    texts = [t.get_text() for t in b.get_legend().get_texts()]
    assert "measured" in texts and not any(t in ("0", "launch overhead x") for t in texts)
    assert {t.get_text() for t in b.texts} >= {"0 us", "100 us"}
    assert TITAN in _suptitle(fig) and "1 client" in _suptitle(fig)


def test_e2bird_fig14_says_where_a_bar_is_missing_and_keeps_its_legend_off_the_bars(tmp_path, figs):
    e2 = _exp("e2bird_figs13_14")
    caps = pd.DataFrame([{"model": m, "stack": "tfserving", "system": s, "capacity_qps": 0.0 if
                          (m, s) == ("vgg19", "Static") else 100.0} for m in ("resnet152", "vgg19")
                         for s in e2.system_colours()])
    e2.plot14(caps, tmp_path / "c.png", "tfserving")
    fig = figs[0]
    ax = fig.axes[0]
    assert any("vgg19 Static" in t.get_text() for t in ax.texts)
    assert TITAN in ax.get_title() and "tfserving" in ax.get_title()
    fig.canvas.draw()
    assert ax.get_legend().get_window_extent().x0 >= ax.bbox.x1  # beside the axes, not on a bar


def test_lazyb_fig12s_legend_is_off_the_data_and_unstable_points_are_marked(tmp_path, figs):
    lz = _exp("lazyb_figs12_15")
    rows = [{"model": "bert_base", "stack": "triton-tensorrt", "policy": p, "rate_qps": r, "mean_latency_ms": v,
             "latency_p25": v, "latency_p75": v, "throughput_qps": r, "throughput_p25": r, "throughput_p75": r,
             "stable_runs": 3 if r < 300 else 1, "runs": 3} for p, v in (("LazyB", 5.0), ("Serial", 9.0))
            for r in (100.0, 400.0)]
    fig14 = pd.DataFrame({"model": "bert_base", "stack": "triton-tensorrt", "policy": "LazyB", "quantile": [0.5, 1.0],
                          "latency_ms": [1.0, 2.0]})
    fig15 = pd.DataFrame({"model": "bert_base", "stack": "triton-tensorrt", "policy": "LazyB",
                          "sla_ms_paper": [20, 40], "violation_rate": [0.1, 0.0]})
    monkey = pd.DataFrame(rows)
    lz._plots(tmp_path, ["bert_base"], monkey, monkey, fig14, fig15, "triton-tensorrt")
    fig = figs[0]
    ax = fig.axes[0]
    assert "NVIDIA H100" in _suptitle(fig)
    assert plots.marked(ax) == {"unstable": 2}
    fig.canvas.draw()
    assert ax.get_legend().get_window_extent().x0 >= ax.bbox.x1


# ----------------------------------------------------------------------------- one palette
def test_one_palette_module_serves_every_figure():
    assert plots.PALETTE is palette.PALETTE and plots.policy_colours is palette.policy_colours
    common = _exp("common")
    assert common.PALETTE is palette.PALETTE and common.policy_colour is palette.policy_colour
    assert palette.policy_colour("dvabatch+window") == palette.PALETTE["dvabatch-window"]
    assert palette.policy_colour("GraphB(50)") == palette.PALETTE["graphbatch"]
    assert palette.policy_colour("N-Ebird") == palette.PALETTE["n-ebird"]
    for v in palette.VERDICT_STYLE.values():  # the markers stand apart from every policy's colour
        assert v["color"] not in palette.PALETTE.values()


# ----------------------------------------------------------------------------- the studies' and sweeps' figures
A100 = "NVIDIA A100"


def test_table5_names_device_stack_policy_and_load_and_marks_over_slo_bars(tmp_path, figs):
    t5 = _exp("table5_strategies")
    rows = [{"model": "resnet152", "stack": "triton-tensorrt-21.10", "load": ld, "strategy": s, "offered_qps": q,
             "throughput_qps": q, "p99_latency_ms": 900.0 if ld == "overload" and s == "I" else 10.0,
             "n_completed": 10, "n_queries": 10} for ld, q in (("low", 100.0), ("overload", 600.0))
            for s in t5.LABELS]
    t5.plot(pd.DataFrame(rows), tmp_path / "t5.png")
    fig = figs[0]
    title = _suptitle(fig)
    for word in (TITAN, "stack: triton-tensorrt-21.10", "dvabatch", "resnet152", "load: Poisson"):
        assert word in title, (word, title)
    ax = fig.axes[0]
    assert plots.marked(ax) == {"over-SLO": 1}
    assert [t.get_text() for t in ax.get_xticklabels()] == ["low\n100 qps", "overload\n600 qps"]
    bars = {to_hex(p.get_facecolor()) for p in ax.patches if p.get_height() > 0}
    assert bars == set(palette.STRATEGY_COLOURS.values())  # one colour per strategy, from the palette
    assert len(set(palette.STRATEGY_COLOURS.values())) == 8


def test_study_window_and_maxbs_name_the_a100_and_mark_unstable_points(tmp_path, figs):
    sw, mb = _exp("study_window"), _exp("study_maxbs")
    rows = [{"model": "bert_base", "stack": "triton-tensorrt", "window_ms": w, "rate_fraction": f, "mark": "",
             "offered_qps": 100.0 * f, "throughput_qps": 100.0 * min(f, 1.0), "p99_latency_ms": 5.0,
             "stable": f <= 1.0} for w in (0.01, 2.0) for f in (0.25, 1.5)]
    sw.plot(pd.DataFrame(rows), tmp_path / "w.png")
    fig = figs[0]
    assert A100 in _suptitle(fig) and "stack: triton-tensorrt" in _suptitle(fig) and "delaybatch" in _suptitle(fig)
    assert plots.marked(fig.axes[0]) == {"unstable": 2}  # one point per window at 1.5 x
    rows = [{"model": "bert_base", "stack": "gpu-only", "arrivals": "uniform", "load": ld, "max_bs": b,
             "offered_qps": 100.0, "throughput_qps": 90.0, "mean_latency_ms": 3.0, "collected_bs": 1.0,
             "stable": not (ld == "high" and b == 1), "paper_throughput_qps": 80.0, "paper_latency_ms": 4.0,
             "paper_collected_bs": 1.0} for ld in ("low", "high") for b in (1, 64)]
    mb.plot(pd.DataFrame(rows), tmp_path / "m.png")
    fig = figs[1]
    assert A100 in _suptitle(fig) and "stack: gpu-only" in _suptitle(fig) and "load: evenly spaced" in _suptitle(fig)
    assert plots.marked(fig.axes[0]) == {"unstable": 1} and plots.marked(fig.axes[1]) == {"unstable": 1}
    assert all(ax.get_legend() is None for ax in fig.axes) and len(fig.legends) == 1  # one legend, off the data


def test_study_slicing_figures_name_what_was_run_and_mark_unstable_fixed_load_runs(tmp_path, figs):
    sl = _exp("study_slicing")
    rows = [{"model": "resnet152", "stack": "gpu-only", "stages": k, "launch_overhead_ms": ov, "strategy": s,
             "capacity_qps": 100.0 * k, "capacity_at_bracket_top": (k, s) == (2, "I"), "load_qps": 90.0,
             "mean_latency_ms": 3.0, "p99_latency_ms": 5.0, "stable_at_load": (k, s) != (2, "VIII")}
            for k in (1, 2) for ov in (0.0, 0.29) for s in ("I", "II", "VIII")]
    sl.plot_lines(pd.DataFrame(rows), "stages", "capacity_qps", tmp_path / "l.png", sl.FIG12_TITLE,
                  style="launch_overhead_ms")
    fig = figs[0]
    title = _suptitle(fig)
    for word in (A100, "stack: gpu-only", "dvabatch", "resnet152", "90 queries/s"):
        assert word in title, (word, title)
    top, bottom = fig.axes[:2]
    assert plots.marked(bottom) == {"unstable": 2} and plots.marked(top) == {}
    assert any("lower bound" in t.get_text() for t in top.texts)
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "0.29" in texts  # a number is never read as a column name
    lines = {lb: to_hex(h.get_color()) for h, lb in zip(*top.get_legend_handles_labels()) if lb in ("I", "VIII")}
    assert lines == {"I": palette.STRATEGY_COLOURS["I"], "VIII": palette.STRATEGY_COLOURS["VIII"]}
    micro = [{"figure": f, "model": "resnet152", "stack": "triton-tensorrt", "ratio": r, "bs0": b, "bs1": b,
              "baseline": "naive", "speedup": 1.1} for f in (15, 16) for r in (0.1, 0.5) for b in (1, 2)]
    sl.plot_micro(pd.DataFrame(micro), tmp_path / "s.png", "stretch")
    fig = figs[1]
    assert A100 in _suptitle(fig) and "stack: triton-tensorrt" in _suptitle(fig)
    assert fig.axes[0].get_title().startswith("ResNet (resnet152)")  # not cut at its " = " by readable()


def test_tcomp_wait_sweep_names_device_stack_and_load_and_marks_over_slo_runs(tmp_path, figs):
    tc = _exp("tcomp_wait_sweep")
    rows = [{"model": "vgg19", "stack": "triton-tensorrt-21.10", "load": ld, "offered_qps": q, "run": "sweep",
             "frac": f, "policies": "load", "mean_rel": 1.0 + f, "p99_latency_ms": 300.0 if f == 8.0 else 10.0,
             "n_completed": 10, "n_queries": 10} for ld, q in (("low", 50.0), ("high", 180.0)) for f in (0.0, 8.0)]
    qos = pd.DataFrame([{**rows[0], "run": "qos", "frac": float("nan"), "mean_rel": 1.1, "n_completed": 9}])
    tc.plot(pd.DataFrame(rows), tmp_path / "t.png", qos)
    fig = figs[0]
    title = _suptitle(fig)
    for word in (TITAN, "stack: triton-tensorrt-21.10", "dvabatch", "vgg19", "50 to 180 queries/s"):
        assert word in title, (word, title)
    assert plots.marked(fig.axes[0]) == {"over-SLO": 2, "unstable": 1}
    assert fig.axes[0].get_legend() is None and len(fig.legends) == 1


def test_stack_question_names_the_h100_and_the_stacks_and_marks_metastable_searches(tmp_path, figs):
    sq = _exp("stack_question")
    rows = [{"server": sv, "stack": st, "stages": k, "policy": p, "gpus": 2, "at_holds": True,
             "metastable_probes": 3 if (sv, p) == ("gpu-only", "dvabatch") else 0}
            for sv, st in (("gpu-only", "gpu-only"), ("fitted engine", "custom")) for k in sq.STAGES
            for p in sq.POLICIES]
    sq.plot(pd.DataFrame(rows), tmp_path / "q.png")
    fig = figs[0]
    title = _suptitle(fig)
    for word in ("NVIDIA H100", "stacks: gpu-only, custom", "bert_base", "zerobatch", "5,000 queries/s"):
        assert word in title, (word, title)
    assert [plots.marked(ax) for ax in fig.axes[:2]] == [{"metastable": 1}, {"metastable": 1}]
