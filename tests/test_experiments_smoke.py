"""Smoke tests of the figure scripts in ``experiments/``: each runs its ``--quick`` mode in-process (``main(argv)``)
into a temporary directory; the CSVs must have the expected columns and rows, sane values, and one property per
figure that the simulator could get wrong."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.experiments import load_experiment

EXP = Path(__file__).resolve().parent.parent / "experiments"


load = load_experiment


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("experiments")


@pytest.fixture(scope="module")
def fig15(out):
    """The quick Figure 15 run (bert_base, linknet); its fig15_peaks.csv calibrates the other scripts."""
    res = load("fig15_stepping").main(["--quick", "--out", str(out)])
    return res, out / "fig15_peaks.csv"


def test_fig15_stepping(fig15, out):
    res, calib = fig15
    peaks = pd.read_csv(calib)
    assert list(peaks["model"]) == ["bert_base", "linknet"]
    assert set(peaks["stack"]) == {"triton-tensorrt-21.10"}  # the stack the Titan RTX tables imply (no --stack)
    for col in ("delaybatch_window_ms", "peak_qps_delaybatch", "peak_qps_dvabatch", "peak_qps_dvabatch_window"):
        assert (peaks[col] > 0).all(), col
    levels = pd.read_csv(out / "fig15_levels.csv")
    assert set(levels["policy"]) == {"delaybatch", "dvabatch", "dvabatch+window"}
    assert levels.groupby(["model", "policy"]).size().eq(16).all()  # the 16 levels of the stepping ladder
    assert levels.loc[levels["offered_qps"] == 66.0, "within_qos"].all()  # the lowest level is always served
    q = pd.read_csv(out / "fig15_queries.csv.gz")
    assert (q["latency_ms"].dropna() > 0).all()
    assert (out / "fig15_stepping.png").stat().st_size > 0 and (out / "fig15_peaks.png").stat().st_size > 0
    assert "quick run" in (out / "QUICK_RUN.txt").read_text()  # a quick run is labelled as one
    # input diversity: DVABatch removes BERT's padding, so its peak is at least DelayBatch's
    bb = peaks.set_index("model").loc["bert_base"]
    assert bb["peak_qps_dvabatch"] >= bb["peak_qps_delaybatch"]


def test_fig17_glue(fig15, out):
    _, calib = fig15
    res = load("fig17_glue").main(["--quick", "--out", str(out), "--calib-from", str(calib)])
    df = pd.read_csv(out / "fig17_glue.csv")
    assert list(df["task"]) == ["RTE", "SST-2"] and set(df["model"]) == {"bert_base"}
    assert (df[["peak_qps_delaybatch", "peak_qps_dvabatch", "mean_len"]] > 0).all().all()
    # shorter inputs (SST-2, mean 22 tokens) support a higher load than RTE's (mean 54) under both policies
    d = df.set_index("task")
    assert d.loc["SST-2", "peak_qps_delaybatch"] > d.loc["RTE", "peak_qps_delaybatch"]
    assert (df["peak_qps_dvabatch"] >= df["peak_qps_delaybatch"]).all()
    assert "average" in res


def test_fig18_split(fig15, out):
    _, calib = fig15
    load("fig18_split").main(["--quick", "--out", str(out), "--calib-from", str(calib)])
    mean = pd.read_csv(out / "fig18_split_mean.csv")
    assert len(mean) == 3 * 3  # linknet x 3 loads x 3 policies
    assert set(mean["policy"]) == {"dvabatch", "dvabatch-split", "delaybatch"}
    assert (mean["mean_latency_ms"] > 0).all()
    m = mean.set_index(["load", "policy"])["mean_latency_ms"]
    # at low load DelayBatch waits out its window while DVABatch (window 0) starts at once
    assert m[("low", "dvabatch")] < m[("low", "delaybatch")]
    runs = pd.read_csv(out / "fig18_split.csv")
    assert (runs.loc[runs["policy"] == "delaybatch", "n_split"] == 0).all()
    # LinkNet's stages prefer different batch sizes, so DVABatch identifies operator diversity and splits too
    assert runs.loc[runs["policy"] == "dvabatch", "n_split"].sum() > 0


def test_a_calibration_from_another_stack_is_refused(fig15, out):
    _, calib = fig15  # found on triton-tensorrt-21.10
    with pytest.raises(SystemExit, match="calibrated on stack 'triton-tensorrt-21.10'"):
        load("fig18_split").main(["--quick", "--out", str(out / "refused"), "--calib-from", str(calib),
                                  "--stack", "gpu-only"])


def test_fig19_buffer_pairs(fig15, out):
    _, calib = fig15
    load("fig19_buffer_pairs").main(["--quick", "--out", str(out), "--calib-from", str(calib)])
    df = pd.read_csv(out / "fig19_buffer_pairs.csv")
    assert len(df) == 2 * 2 * 3  # 2 models x 2 loads x buffer pairs 1..3
    assert (df["mean_latency_ms"] > 0).all()
    piv = df.pivot_table(index=["model", "load"], columns="buffer_pairs", values="mean_latency_ms")
    # one buffer pair is the serial manner: stages cannot overlap, so two pairs are faster (bert_base; linknet's
    # quick "peak" is the top of the short ladder, an overload where latency is all queueing)
    assert (piv.loc["bert_base", 1] > piv.loc["bert_base", 2]).all()


@pytest.mark.parametrize("stack, overheads", [(None, [0.0]), ("gpu-only", [0.29, 0.0])])
def test_fig20_stages(out, stack, overheads):
    d_out = out / f"fig20_{stack}"
    load("fig20_stages").main(["--quick", "--out", str(d_out)] + (["--stack", stack] if stack else []))
    df = pd.read_csv(d_out / "fig20_stages.csv")
    # the paper's stack carries its own launch cost, so nothing is added on top; gpu-only runs 0.29 ms and 0
    assert set(df["stack"]) == {stack or "triton-tensorrt-21.10"}
    assert list(dict.fromkeys(df["launch_overhead_ms"])) == overheads
    assert len(df) == len(overheads) * 3  # stages 1, 2, 4 (resnet152)
    assert (df["peak_qps"] > 0).all() and (df["mean_latency_fixed_ms"] > 0).all()
    d = df[df["launch_overhead_ms"] == overheads[0]].set_index("stages")
    # slicing lets DVABatch stretch batches already running: at the same load 2+ stages beat 1 stage
    assert d.loc[2, "mean_latency_fixed_ms"] < d.loc[1, "mean_latency_fixed_ms"]
    assert d.loc[4, "mean_latency_fixed_ms"] < d.loc[1, "mean_latency_fixed_ms"]


def test_fig21_closed_loop(out):
    load("fig21_closed_loop").main(["--quick", "--out", str(out), "--queries", "60", "--stack", "gpu-only"])
    df = pd.read_csv(out / "fig21_closed_loop.csv")
    assert len(df) == 6 * 3 and set(df["stack"]) == {"gpu-only"}
    assert (df["zerobatch_mean_ms"] > 0).all() and (df["n_completed_dvabatch"] == 60).all()
    # with one client the mechanism adds no waiting: the overhead is exactly (N - 1) launches
    assert np.allclose(df["overhead_ms"], df["expected_overhead_ms"], atol=1e-6)
    assert np.allclose(df.loc[df["launch_overhead_ms"] == 0, "overhead_ms"], 0.0, atol=1e-6)


def test_fig21_closed_loop_on_the_papers_stack(out):
    """On triton-tensorrt-21.10 nothing is added to the stack's own launch cost, which a launch pays on a host core while
    the GPU runs the stage: the overhead is at most the fully exposed (N - 1) fixed launch costs, and never
    negative."""
    d_out = out / "fig21_triton"
    load("fig21_closed_loop").main(["--quick", "--out", str(d_out), "--queries", "60"])
    df = pd.read_csv(d_out / "fig21_closed_loop.csv")
    assert len(df) == 6 and set(df["stack"]) == {"triton-tensorrt-21.10"} and (df["launch_overhead_ms"] == 0).all()
    assert (df["n_completed_dvabatch"] == 60).all()
    assert (df["overhead_ms"] >= -1e-6).all() and (df["overhead_ms"] <= df["expected_overhead_ms"] + 1e-6).all()


@pytest.mark.slow
def test_truncated_stepping_gives_the_study_peak():
    """``common.peak`` with ``cap_qps`` (the stepping load stopped early) finds the same peak as
    ``dvasim.studies.evaluation.peak_throughput`` (the whole ladder)."""
    from dvasim.studies import evaluation as study

    common = load("common")
    full = study.peak_throughput("resnet152", {"name": "dvabatch"})
    cut = common.peak("resnet152", {"name": "dvabatch"}, cap_qps=800.0)
    assert len(cut.stepping) < len(full.stepping)
    assert cut.peak_qps == pytest.approx(full.peak_qps, rel=1e-9)
    assert cut.bracket == pytest.approx(full.bracket, rel=1e-9)


def test_validation_matrix_configs_are_valid_and_match_the_calibration():
    """The committed fidelity-matrix configs simulate, and carry the calibration's fitted engine parameters."""
    import json

    from dvasim.api import run

    vdir = EXP / "validation"
    cal = json.loads((vdir / "calibration.json").read_text())["models"]
    configs = sorted((vdir / "configs").glob("*.toml"))
    assert len(configs) == 27
    for path in configs[::4]:
        r = run(path, overrides=["workload.n_queries=60"])
        assert r.summary["n_completed"] == 60
        eng = r.config["engine"]
        model = r.config["model"]["name"]
        assert eng["sharing"] == "cores" and eng["corun_slowdown"] == pytest.approx(cal[model]["corun_slowdown"], abs=1e-3)
        assert eng["launch_overhead_ms"] == pytest.approx(cal[model]["launch_overhead_ms"], abs=1e-3)


def test_tcomp_wait_sweep(out):
    load("tcomp_wait_sweep").main(["--quick", "--out", str(out / "tcw")])
    df = pd.read_csv(out / "tcw" / "tcomp_wait_sweep.csv")
    fracs = [0.0, 0.125, 0.25, 0.5, 1.0, 2.0, 8.0]
    # bert_base selects "input", so stretch is off: one no-stretch run per load; linknet: 7 fracs + the reference
    assert len(df) == 2 * 1 + 2 * (len(fracs) + 1)
    bb = df[df["model"] == "bert_base"]
    assert (bb["run"] == "no-stretch").all() and not bb["policies"].str.contains("load").any()
    assert (bb["note"].str.len() > 0).all()
    ln = df[df["model"] == "linknet"]
    ref = ln[ln["run"] == "no-stretch"]
    assert len(ref) == 2 and (ref["n_stretch"] == 0).all() and not ref["policies"].str.contains("load").any()
    assert np.allclose(ref["mean_rel"], 1.0)
    for level, g in ln[ln["run"] == "sweep"].groupby("load"):
        g = g.set_index("frac").sort_index()
        assert list(g.index) == fracs and g["policies"].str.contains("load").all()
        assert np.allclose(g["t_comp_wait_ms"] / g["t_comp_wait_ms"].loc[1.0], g.index)  # frac x batch-1 latency
        # T_comp_wait = 0: only batches not yet started are stretched; a longer wait lets started ones be stretched
        started = g["n_stretch_started"]
        assert started.loc[0.0] == 0 and started.loc[8.0] > started.loc[0.25] > 0
        if level == "low":  # a stable load: a longer wait never stretches fewer (an overloaded one may: the
            assert started.is_monotonic_increasing  # calibration's high load is over Triton-TensorRT's capacity)
    assert df["complete"].all() and (df["n_completed"] == 800).all()  # no run may stall with queries unfinished
    assert (out / "tcw" / "tcomp_wait_sweep.png").stat().st_size > 0


def test_scripts_write_outside_the_committed_results_by_default():
    common = load("common")
    args = common.parser("x").parse_args([])
    assert args.out == Path("results") / "experiments" and args.out.resolve() != common.RESULTS.resolve()


def test_table5_strategies(out):
    mod = load("table5_strategies")
    res = mod.main(["--quick", "--out", str(out / "t5")])
    df = pd.read_csv(out / "t5" / "table5_strategies.csv")
    assert len(df) == 2 * 4 * 8 and list(dict.fromkeys(df["strategy"])) == list(mod.LABELS)
    assert set(df["load"]) == {"low", "medium", "high", "overload"}
    assert (df["n_completed"] == df["n_queries"]).all()
    assert (df.loc[df["stretch"] == 0, "n_stretch"] == 0).all() and (df.loc[df["split"] == 0, "n_split"] == 0).all()
    assert (df.loc[(df["pipeline"] == 0) & (df["split"] == 0), "mean_batches_in_flight"] <= 1 + 1e-9).all()
    assert df.loc[df["pipeline"] == 1, "mean_batches_in_flight"].max() > 1
    # the paper's numbers are attached in Table 5's order (strategy I, ResNet, high: 3455.97)
    row = df[(df["model"] == "resnet152") & (df["load"] == "high") & (df["strategy"] == "I")].iloc[0]
    assert row["paper_throughput_qps"] == pytest.approx(3455.97)
    # low load: every strategy serves the same queries, so the throughputs agree
    low = df[df["load"] == "low"].groupby("model")["throughput_qps"]
    assert ((low.max() / low.min() - 1) < 0.01).all()
    assert len(res["comparison"]) == 2 * 4 and (out / "t5" / "table5_strategies.png").stat().st_size > 0
