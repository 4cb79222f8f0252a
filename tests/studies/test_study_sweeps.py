"""The characterization study's sweeps (``experiments/study_maxbs.py``, ``experiments/study_slicing.py``) and their
helpers (``dvasim.studies.characterization``): ratio grids, ratio-sliced tables checked against the unsliced model
and the operator table, the scripted split / stretch scenarios against hand-worked timelines (the study's own
Figure 1(a) example among them), a saturated Triton batcher against B / T(B), and the scripts' --quick runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import dvasim
from dvasim.api import load_profile
from dvasim.model.catalog import load_op_table
from dvasim.model.table import LatencyTable
from dvasim.studies import characterization as ch
from tests.experiments import load_experiment as load


# ----------------------------------------------------------------------------- ratio grids and sliced tables
def test_ratio_grid():
    assert ch.ratio_grid(0.25) == [0.25, 0.5, 0.75]
    g = ch.ratio_grid(0.05)
    assert len(g) == 19 and g[0] == 0.05 and g[-1] == 0.95 and all(0 < r < 1 for r in g)
    assert ch.ratio_grid(0.1, 0.05, 0.95) == [0.05, 0.15, 0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.85, 0.95]
    for bad in ({"step": 0}, {"step": 1.5}, {"step": 0.1, "lo": 0.0}, {"step": 0.1, "lo": 0.6, "hi": 0.4}):
        with pytest.raises(ValueError):
            ch.ratio_grid(**bad)


def _reference_op_times(model):
    """Operator times at batch 1 (and, for BERT, the slicing's reference length: the lower median of the profiled
    lengths), read straight from the operator table."""
    ops = load_op_table(model, ch.DEVICE)
    sl = None
    if ops.seq_lens is not None:
        lens = sorted(int(x) for x in ops.seq_lens)
        sl = lens[(len(lens) - 1) // 2]
    return np.array([ops.latency(i, 1, sl) for i in range(ops.n_stages)]), sl


@pytest.mark.parametrize("model", ch.MODELS)
def test_ratio_slicing_follows_the_ratio(model):
    """Every ratio of the grid gives two stages whose times add up to the unsliced model's at every batch size, and
    Stage_0's share of the reference (batch-1) time is the ratio within half the largest operator (the cut sits
    at the operator boundary nearest the target)."""
    op_t, ref_sl = _reference_op_times(model)
    tol = op_t.max() / op_t.sum() / 2 + 1e-12
    whole = load_profile(ch.model_cfg(model, stages=1))
    sl = ch.seq_len_of(model)
    for r in ch.ratio_grid(0.1, 0.05, 0.95):
        prof = load_profile(ch.model_cfg(model, ratio=r))
        assert prof.n_stages == 2
        for b in (1, 7, 32, 64):
            total = prof.latency(0, b, sl) + prof.latency(1, b, sl)
            assert total == pytest.approx(whole.latency(0, b, sl), rel=1e-9)
        share = ch.stage_shares(prof, 1, ref_sl)[0]
        assert abs(share - r) <= tol, (model, r, share)
    # the shares really move with the ratio
    lo, hi = (ch.stage_shares(load_profile(ch.model_cfg(model, ratio=r)), 1, ref_sl)[0] for r in (0.05, 0.95))
    assert lo < 0.15 and hi > 0.85


def test_model_cfg_needs_one_of_ratio_or_stages():
    with pytest.raises(ValueError):
        ch.model_cfg("resnet152")
    with pytest.raises(ValueError):
        ch.model_cfg("resnet152", ratio=0.5, stages=2)
    assert ch.model_cfg("linknet", ratio=0.3)["ratios"] == [0.3, 0.7]


# ----------------------------------------------------------------------------- scripted scenarios
def _two_stage(t0, t1, max_bs=8):
    """A two-stage table: t0(b), t1(b) for b = 1..max_bs."""
    rows = [{"stage": s, "batch_size": b, "latency_ms": float(f(b))} for s, f in ((0, t0), (1, t1))
            for b in range(1, max_bs + 1)]
    return LatencyTable.from_frame(pd.DataFrame(rows), name="two-stage")


def test_split_reproduces_the_studys_figure_1a():
    """The study's Figure 1(a): operator A (preferred batch 4) runs the batch of 4 in T, then B, C, D (preferred
    batch 1, T/4 per query each) run four sub-batches of 1 one after another: mean latency 4T -> 2.875T."""
    table = _two_stage(lambda b: 1.0, lambda b: 0.75 * b, max_bs=4)
    d = ch.split_scenario(table, 4, n_sub=4)
    assert d["naive_mean_ms"] == pytest.approx(4.0, abs=1e-9)
    assert d["split_mean_ms"] == pytest.approx(2.875, abs=1e-9)
    assert d["speedup"] == pytest.approx(4 / 2.875)


@pytest.mark.parametrize("model,ratio,batch,n_sub", [("resnet152", 0.05, 64, 2), ("bert_base", 0.3, 16, 4),
                                                     ("linknet", 0.7, 8, 8), ("linknet", 0.5, 4, 2)])
def test_split_scenario_matches_the_hand_timeline(model, ratio, batch, n_sub):
    """Naive: everyone leaves at T0(N) + T1(N). Split: sub-batch k (1..n) leaves at T0(N) + k T1(N/n), so the
    mean is T0(N) + (n+1)/2 T1(N/n)."""
    prof = load_profile(ch.model_cfg(model, ratio=ratio))
    sl = ch.seq_len_of(model)

    def t(s, b):
        return prof.latency(s, b, sl)

    d = ch.split_scenario(prof, batch, n_sub, sl)
    assert d["naive_mean_ms"] == pytest.approx(t(0, batch) + t(1, batch), rel=1e-9)
    assert d["split_mean_ms"] == pytest.approx(t(0, batch) + (n_sub + 1) / 2 * t(1, batch // n_sub), rel=1e-9)


@pytest.mark.parametrize("model,ratio,bs0,bs1", [("resnet152", 0.05, 1, 1), ("bert_base", 0.5, 8, 2),
                                                 ("linknet", 0.9, 4, 16)])
def test_stretch_scenario_matches_the_hand_timeline(model, ratio, bs0, bs1):
    """Stretch: BS_0 runs Stage_0, BS_1 catches up through Stage_0, the merged batch runs Stage_1: everyone leaves
    at T0(b0) + T0(b1) + T1(b0 + b1). Naive batching: BS_0 leaves at T(b0), BS_1 at T(b0) + T(b1). BS_1 arrives
    STRETCH_GAP_MS after BS_0, and its latency counts from then."""
    prof = load_profile(ch.model_cfg(model, ratio=ratio))
    sl = ch.seq_len_of(model)

    def t(s, b):
        return prof.latency(s, b, sl)

    gap, n = ch.STRETCH_GAP_MS, bs0 + bs1
    end = t(0, bs0) + t(0, bs1) + t(1, n)
    d = ch.stretch_scenario(prof, bs0, bs1, sl)
    assert d["stretch_mean_ms"] == pytest.approx((bs0 * end + bs1 * (end - gap)) / n, rel=1e-9)
    t_b0, t_b1 = t(0, bs0) + t(1, bs0), t(0, bs1) + t(1, bs1)
    assert d["without_mean_ms"] == pytest.approx((bs0 * t_b0 + bs1 * (t_b0 + t_b1 - gap)) / n, rel=1e-9)


def test_stretch_tends_to_three_quarters_when_stage_1_vanishes():
    """Finding 14's limit: with no Stage_1 time and a flat Stage_0 (T for any batch), naive batching gives
    (T + 2T) / 2 and stretch 2T: speedup 0.75."""
    table = _two_stage(lambda b: 1.0, lambda b: 1e-9)
    assert ch.stretch_scenario(table, 2, 2)["speedup"] == pytest.approx(0.75, abs=1e-3)


def test_scripted_policy_refuses_an_uneven_split():
    table = _two_stage(lambda b: 1.0, lambda b: 1.0)
    with pytest.raises(Exception, match="equal sub-batches"):
        ch.split_scenario(table, 6, n_sub=4)


# ----------------------------------------------------------------------------- the Triton baseline
def test_saturated_triton_at_max_bs_1_serves_one_over_t1():
    """MAX-BS = 1 far above capacity: a batch of one every T(1) on the GPU alone, so the throughput is 1 / T(1)
    (the study's Table 2 rows of MAX-BS 1 are such a plateau). On the study's own stack (Triton + TensorRT, the
    A100 table's implied one) each batch also pays its entry on the host (request, gather, copy), which Triton
    does while the previous batch runs: on the host, beside the GPU's work, as its kernels' launching is (157
    operators of 5 us, about as long as T(1) on an A100); its answer goes to a completion thread, so the cycle is
    max(entry + launch, T(1))."""
    from dvasim.server.costs import model_io
    from dvasim.server.stacks import STACKS

    model = "resnet152"
    t1 = load_profile(ch.model_cfg(model, stages=1)).latency(0, 1)
    cfg = ch.config(ch.model_cfg(model, stages=1), ch.triton_policy(model, 1), ch.workload(model, 3000.0, 2000))
    s = dvasim.run(cfg, stack="gpu-only").summary
    assert s["n_queries"] == s["n_batches"]  # every batch holds one query
    assert s["throughput_qps"] == pytest.approx(1000.0 / t1, rel=0.01)
    assert not s["stable"]
    st = STACKS["triton-tensorrt"]
    in_bytes = model_io(model)[0][0]
    entry = st.request_ms + st.gather_per_row_ms + in_bytes / (st.gather_gbps * 1e6) + in_bytes / (st.h2d_gbps * 1e6)
    launch = st.launch_fixed_ms + 157 * st.launch_per_op_ms
    s = dvasim.run(cfg).summary
    assert s["stack"] == "triton-tensorrt" and not st.idle_between_batches
    assert s["throughput_qps"] == pytest.approx(1000.0 / max(entry + launch, t1), rel=0.01)


# ----------------------------------------------------------------------------- the scripts' quick runs
@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("study")


def test_study_maxbs_quick(out):
    res = load("study_maxbs").main(["--quick", "--out", str(out)])
    df = pd.read_csv(out / "study_maxbs.csv")
    assert len(df) == len(res["maxbs"]) == 2 * 3 * 7  # two models, three loads, seven MAX-BS
    assert (out / "study_maxbs.png").stat().st_size > 0
    assert (df["collected_bs"] <= df["max_bs"] + 1e-9).all() and (df["collected_bs"] >= 1).all()
    assert (df.loc[df["max_bs"] == 1, "collected_bs"] == 1).all()
    assert (df["throughput_qps"] <= df["offered_qps"] * 1.02).all()
    assert df["paper_throughput_qps"].notna().all()
    # loads are the study's fractions of one reference per model
    for _, g in df.groupby("model"):
        rel = np.sort((g["offered_qps"] / g["reference_peak_qps"]).round(4).unique())  # the CSV keeps 6 digits
        assert rel == pytest.approx([0.25, 0.6, 0.9], abs=1e-4)
    # a saturated MAX-BS (1 at high load) serves less than one that is not (64)
    hi = df[(df["load"] == "high")].set_index(["model", "max_bs"])
    for model in df["model"].unique():
        # at 0.9 of a capacity that holds in a long run both keep up: batching serves at least as much (to noise)
        assert hi.loc[(model, 1), "throughput_qps"] <= 1.001 * hi.loc[(model, 64), "throughput_qps"]


def test_study_window_quick(out):
    """Figure 9 (Findings 5-6): below saturation throughput follows the request rate whatever the window; beyond
    the GPU's capacity every window serves less than offered, in batches growing towards MAX-BS."""
    res = load("study_window").main(["--quick", "--out", str(out)])
    df = pd.read_csv(out / "study_fig9_window.csv")
    assert len(df) == len(res["window"]) == 2 * 3 * 2  # two models, three rates, two windows
    assert (out / "study_fig9_window.png").stat().st_size > 0
    assert (df["throughput_qps"] <= df["offered_qps"] * 1.02).all()
    assert (df["collected_bs"] <= df["max_bs"] + 1e-9).all()
    low = df[df["rate_fraction"] <= 0.6]
    assert ((low["throughput_qps"] / low["offered_qps"]).between(0.97, 1.02)).all()
    over = df[df["rate_fraction"] > 1.0]
    assert (over["throughput_qps"] < 0.9 * over["offered_qps"]).all()
    # saturated, the batches grow towards MAX-BS whatever the window (they are about one query at L)
    at_low = df[df["rate_fraction"] == 0.25].set_index(["model", "window_ms"])["collected_bs"]
    for _, r in over.iterrows():
        assert r["collected_bs"] > 4 * at_low[(r["model"], r["window_ms"])]


@pytest.mark.slow  # (18 s) the slicing experiment's smoke test; its GPU model's properties: tests/model
def test_study_slicing_quick(out):
    # the GPU model's slicing properties (on a host-bound stack the cut also moves work between launch-bound and
    # GPU-bound stages: ResNet152 on the A100 at batch 1 launches for about as long as it computes)
    res = load("study_slicing").main(["--quick", "--out", str(out), "--stack", "gpu-only"])
    for name in ("study_fig10_slice_position", "study_fig12_stages", "study_fig13_split", "study_fig15_stretch"):
        assert (out / f"{name}.csv").stat().st_size > 0 and (out / f"{name}.png").stat().st_size > 0, name
    f10 = res["fig10"]
    assert set(f10["strategy"]) == set(ch.STRATEGIES) and (f10["capacity_qps"] > 0).all()
    # naive batching runs the whole model at once: its capacity hardly depends on where the model is cut
    naive = f10[f10["strategy"] == "I"]["capacity_qps"]
    assert naive.max() / naive.min() < 1.06
    f13 = res["fig13"]
    # split: more benefit the earlier it happens (Finding 11) -- the speedup falls with the ratio
    for (_, _, _), g in f13.groupby(["model", "batch_size", "n_sub"]):
        s = g.sort_values("ratio")["speedup"].to_numpy()
        assert s[0] > s[-1] and abs(s[-1] - 1) < 0.05
    f15 = res["fig15"]
    assert set(f15["stack"]) == {"gpu-only"}  # --stack reaches every run, the scripted scenarios too
    near_one = f15[(f15["figure"] == 15) & (f15["ratio"] == 0.95)]
    # a late stretch never pays: near Finding 14's limit (0.75 on the GPU alone; the stack's per-batch costs of
    # the batch of its own that the stretch saves move it a little)
    assert (near_one["speedup"] < 0.8).all() and (near_one["speedup"] > 0.72).all()
    gpu = load("study_slicing").main(["--quick", "--out", str(out / "gpu-only"), "--figures", "15",
                                      "--stack", "gpu-only"])["fig15"]
    assert set(gpu["stack"]) == {"gpu-only"}
    near_one = gpu[(gpu["figure"] == 15) & (gpu["ratio"] == 0.95)]
    assert ((near_one["speedup"] - 0.75).abs() < 0.03).all()  # Finding 14's limit, on the GPU alone
