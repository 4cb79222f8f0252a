"""Figures a reader can use (issue 13): the latency axis follows the data with the SLO labelled, every policy has
one colour everywhere, the compare figures say each load's rate and the device."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from dvasim.reporting.plots import PALETTE, policy_bars, policy_colours, slo_line  # noqa: E402


def _texts(ax):
    return [t.get_text() for t in ax.texts]


def test_an_slo_far_above_the_data_does_not_stretch_the_axis():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [5, 12])
    top = ax.get_ylim()[1]
    slo_line(ax, 200.0)
    assert ax.get_ylim()[1] == top < 200
    assert any("SLO 200 ms: above the scale" in t for t in _texts(ax))
    plt.close(fig)


def test_an_slo_near_the_data_is_drawn_and_labelled():
    fig, ax = plt.subplots()
    ax.plot([0, 1], [5, 12])
    slo_line(ax, 15.0)
    assert ax.get_ylim()[1] >= 15.0 and "SLO 15 ms" in _texts(ax)
    assert any(line.get_label() == "SLO 15 ms" for line in ax.get_lines())
    plt.close(fig)


def test_policy_colours_are_the_palettes_and_stable():
    a = policy_colours(["dvabatch", "zerobatch", "mystery"])
    b = policy_colours(["zerobatch", "mystery", "delaybatch", "dvabatch"])
    assert a["dvabatch"] == b["dvabatch"] == PALETTE["dvabatch"] and a["zerobatch"] == PALETTE["zerobatch"]


def test_compare_figure_ticks_carry_each_models_rates(tmp_path, monkeypatch):
    rows = []
    for model, base in (("m1", 100.0), ("m2", 40.0)):
        for load, f in (("low", 0.25), ("high", 0.9)):
            for pol in ("zerobatch", "dvabatch"):
                rows.append({"model": model, "load": load, "policy": pol, "offered_qps": base * f,
                             "p99_latency_ms": 10.0 * f})
    seen = {}
    orig = plt.Figure.savefig

    def spy(fig, *a, **k):
        for ax in fig.axes:
            seen[ax.get_title()] = [t.get_text() for t in ax.get_xticklabels()]
        seen["title"] = fig._suptitle.get_text() if fig._suptitle else ""
        return orig(fig, *a, **k)

    monkeypatch.setattr(plt.Figure, "savefig", spy)
    policy_bars(pd.DataFrame(rows), "p99_latency_ms", tmp_path / "f.png", "p99", device="h100", slo_ms=200.0)
    assert seen["model = m1"] == ["low\n25 qps", "high\n90 qps"] and seen["model = m2"] == ["low\n10 qps",
                                                                                             "high\n36 qps"]
    assert seen["title"] == "p99 on h100"
