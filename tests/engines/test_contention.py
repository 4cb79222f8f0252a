"""Contention of overlapped executions (``[engine] contention``): hand-worked finish times of the "overlap" model,
"none" leaving every run as it was, the share calibrated on the H100's four-thread co-run (the two batch-1 rows
fitted, the batch-8 row predicted), and the config's one-line refusals."""

import pytest
import simpy

import dvasim
from dvasim.config import resolve
from dvasim.config.sections import OVERLAP_SHARE_H100
from dvasim.engines.sim.device import Device
from dvasim.errors import ConfigError
from dvasim.studies.contention import calibrate_share, four_threads, load_overlaps
from tests.engines.test_device import finish_times as device_finish_times


def finish_times(jobs, contention="overlap", share=0.5, slowdown=1.0):
    """jobs: (start, work, demand) -> the finish time of each, on the fluid device."""
    return device_finish_times("fluid", jobs, slowdown, contention=contention, contention_share=share)


# ------------------------------------------------------------------------------------------ (a) by hand
def test_one_execution_alone_runs_at_its_standalone_speed():
    for d in (1e-6, 0.3, 1.0):
        assert finish_times([(0, 7.0, d)], share=0.9) == [7.0]  # exactly: the rate is 1 whatever the share
        assert finish_times([(0, 7.0, d)], share=0.9) == finish_times([(0, 7.0, d)], contention="none")


def test_two_identical_executions_started_together():
    # k = 0.5, d = 0.5: each claims 0.5 + 0.5 * 0.5 = 0.75, together 1.5 -> rate 1/1.5: both end at 10 * 1.5 = 15
    assert finish_times([(0, 10.0, 0.5), (0, 10.0, 0.5)]) == pytest.approx([15.0, 15.0], rel=1e-12)
    # the fluid model alone: 0.5 + 0.5 = 1 fits, no slowdown
    assert finish_times([(0, 10.0, 0.5), (0, 10.0, 0.5)], contention="none") == [10.0, 10.0]
    # small demands: d = 0.2 claims 0.6 each, together 1.2 -> 12; k = 0.4 claims 0.52 each, 1.04 -> 10.4
    assert finish_times([(0, 10.0, 0.2), (0, 10.0, 0.2)]) == pytest.approx([12.0, 12.0], rel=1e-12)
    assert finish_times([(0, 10.0, 0.2), (0, 10.0, 0.2)], share=0.4) == pytest.approx([10.4, 10.4], rel=1e-12)
    # k = 0.3: 2 * (0.3 + 0.7 * 0.2) = 0.88 <= 1: two fit, as in the fluid model
    assert finish_times([(0, 10.0, 0.2), (0, 10.0, 0.2)], share=0.3) == [10.0, 10.0]


def test_three_staggered_executions():
    """k = 0.5, every d = 0.2 (claims 0.6): A (work 10) at 0, B (10) at 2, C (4) at 4.
    [0, 2) A alone, rate 1: A has 8 left. [2, 4) A and B, 1.2 -> rate 1/1.2: each does 5/3 (A 19/3, B 25/3 left).
    [4, ...) all three, 1.8 -> rate 1/1.8: C (4 left) ends first at 4 + 4 * 1.8 = 11.2 (A 7/3, B 13/3 left).
    [11.2, ...) A and B, rate 1/1.2: A ends at 11.2 + 7/3 * 1.2 = 14.0 (B 2 left). B alone: ends at 16.0."""
    jobs = [(0, 10.0, 0.2), (2, 10.0, 0.2), (4, 4.0, 0.2)]
    assert finish_times(jobs) == pytest.approx([14.0, 16.0, 11.2], rel=1e-12)
    assert finish_times(jobs, contention="none") == pytest.approx([10.0, 12.0, 8.0], rel=1e-12)


def test_saturated_demands_and_the_slowdown_compose():
    # d = 1: claims 1 whatever k: two share as in the fluid model (rate 1/2), times corun_slowdown 1.5 -> 6
    assert finish_times([(0, 2.0, 1.0), (0, 2.0, 1.0)], share=0.7) == pytest.approx([4.0, 4.0], rel=1e-12)
    assert finish_times([(0, 2.0, 1.0), (0, 2.0, 1.0)], share=0.7, slowdown=1.5) == pytest.approx([6.0, 6.0])


def test_the_engines_callback_path_gives_the_same_times():
    """Device.start (the engine's way in, planned at settle) against Device.run, the staggered case."""
    env = simpy.Environment()
    dev = Device(env, "fluid", contention="overlap", contention_share=0.5)
    ends = {}

    def start_at(t, name, work):
        def go(_ev):
            dev.start(work, 0.2, lambda: ends.__setitem__(name, env.now))
            dev.settle()
        env.timeout(t).callbacks.append(go)

    for t, name, work in ((0, "A", 10.0), (2, "B", 10.0), (4, "C", 4.0)):
        start_at(t, name, work)
    env.run()
    assert ends == pytest.approx({"A": 14.0, "B": 16.0, "C": 11.2}, rel=1e-12)


def test_four_threads_by_hand():
    # four stages of 1 ms and (almost) no demand, no host cost, k = 0.5: together they claim 2 -> every call takes
    # 2 ms; alone 1 ms: overlap = 4 * 100 / 200 = 2 = 1 / k (the fluid model: 4)
    specs = [(1.0, 0.0)] * 4
    got = four_threads(specs, "overlap", 0.5, calls=100, launch_ms=0.0)
    assert got["alone_ms"] == [1.0] * 4 and got["overlap"] == pytest.approx(2.0, rel=1e-9)
    assert four_threads(specs, "none", calls=100, launch_ms=0.0)["overlap"] == pytest.approx(4.0, rel=1e-12)


def test_bad_device_arguments():
    env = simpy.Environment()
    with pytest.raises(ValueError, match="contention"):
        Device(env, "fluid", contention="magic")
    with pytest.raises(ValueError, match="fluid"):
        Device(env, "exclusive", contention="overlap")
    with pytest.raises(ValueError, match="contention_share"):
        Device(env, "fluid", contention="overlap", contention_share=1.5)


# ------------------------------------------------------------------------------ (b) "none" changes nothing
def _config(**engine):
    return {"model": {"name": "resnet152", "device": "h100", "stages": 4}, "policy": {"name": "dvabatch"},
            "workload": {"kind": "poisson", "rate_qps": 1500.0, "n_queries": 300, "seed": 3},
            "engine": {"buffer_pairs": 2, **engine}}


def _same(a, b):
    sa = {k: v for k, v in a.summary.items() if "wall" not in k}
    sb = {k: v for k, v in b.summary.items() if "wall" not in k}
    assert sa == sb
    assert a.queries.equals(b.queries)


@pytest.mark.parametrize("stack", ["gpu-only", "cudagraph"])
def test_contention_none_is_the_run_without_it(stack):
    unset = dvasim.run(_config(), stack=stack)
    none = dvasim.run(_config(contention="none"), stack=stack)
    _same(unset, none)
    assert unset.summary["contention"] == "none" and "contention_share" not in unset.summary
    over = dvasim.run(_config(contention="overlap"), stack=stack)
    assert over.summary["contention"] == "overlap" and over.summary["contention_share"] == OVERLAP_SHARE_H100
    # small batches overlap at this load: contention makes them slower
    assert over.summary["mean_latency_ms"] > none.summary["mean_latency_ms"]


def test_overlap_with_no_share_is_the_fluid_model():
    zero = dvasim.run(_config(contention="overlap", contention_share=0.0), stack="cudagraph")
    assert zero.summary["contention"] == "overlap" and zero.summary.pop("contention_share") == 0.0
    zero.summary["contention"] = "none"
    _same(zero, dvasim.run(_config(), stack="cudagraph"))


# ----------------------------------------------------------------- (c) calibrated on the four-thread co-run
CALIBRATED_TOL = 0.05  # the source gives the overlaps to one decimal (2.2: 2.15-2.25, 2.3% either side), and more
HELD_OUT_TOL = 0.10  # a prediction: the measured 1.3 is 1.25-1.35 by rounding alone (4%); host timings moved more


def test_the_shipped_share_is_the_calibration_and_reproduces_the_measurements():
    cal = calibrate_share()
    assert cal["share"] == OVERLAP_SHARE_H100
    assert (cal["n_parameters"], cal["n_calibration_points"], cal["n_held_out"]) == (1, 2, 1)
    t = cal["table"]
    fitted, held = t[t.calibrated], t[~t.calibrated]
    assert sorted(zip(fitted.model, fitted.batch_size)) == [("bert_base", 1), ("resnet152", 1)]
    assert list(zip(held.model, held.batch_size)) == [("resnet152", 8)]
    assert (fitted.rel_error.abs() <= CALIBRATED_TOL).all(), fitted
    assert (held.rel_error.abs() <= HELD_OUT_TOL).all(), held
    # the fluid model alone misses all three by far more: 3.7x for 2.2x, 1.6x for 1.3x
    assert ((t["none"] / t["overlap"] - 1) > 0.2).all(), t
    # the simulated stages alone take about the measured per-call times (the h100 tables' GPU time): ResNet152's
    # longest stage within 10%; BERT-base's 28% short (the table is fitted at lengths 32 and 128, and length 64
    # measured slower than 128: stage_times.csv), which moves its overlap little (a ratio of times)
    ratio = (t.sim_alone_ms_max / t.alone_ms_max).to_numpy()
    assert all(abs(r - 1) < (0.3 if m == "bert_base" else 0.1) for r, m in zip(ratio, t.model)), ratio


def test_the_measurements_file_names_its_source():
    df = load_overlaps(modules=None)
    prov = df.attrs["provenance"]
    assert "Host-side diagnostics" in prov["source"] and "H100 80GB HBM3" in prov["machine"]
    assert "2026-11-22" in prov["machine"] and "torch 2.11.0+cu130" in prov["machine"]
    assert set(df.modules) == {"eager", "torchscript", "cudagraph"} and len(df) == 9
    graphs = df[df.modules == "cudagraph"].set_index(["model", "batch_size"])["overlap"]
    assert graphs.to_dict() == {("bert_base", 1): 2.2, ("resnet152", 1): 2.2, ("resnet152", 8): 1.3}


# ---------------------------------------------------------------------------------- (d) the config refuses
@pytest.mark.parametrize("engine, field", [
    ({"contention": "bogus"}, "engine.contention"),
    ({"contention": True}, "engine.contention"),
    ({"contention": "overlap", "contention_share": 1.5}, "engine.contention_share"),
    ({"contention": "overlap", "contention_share": -0.1}, "engine.contention_share"),
    ({"contention": "overlap", "contention_share": "0.3"}, "engine.contention_share"),
    ({"contention": "overlap", "sharing": "exclusive"}, "engine.contention"),
    ({"contention_share": 0.3}, "engine.contention_share"),
    ({"contention": "none", "contention_share": 0.3}, "engine.contention_share"),
])
def test_bad_values_are_refused_in_one_line(engine, field):
    with pytest.raises(ConfigError) as e:
        resolve(_config(**engine))
    assert e.value.field == field and "\n" not in str(e.value)


@pytest.mark.parametrize("measured", [1.0, 1.5, 2.0, 3.0])
def test_host_cores_from_a_co_run_of_host_bound_stages(measured):
    """Four host-bound stages (1 ms of host work a call against 0.1 ms on the GPU): processor sharing on c cores
    overlaps them min(c, 4) times, so a measured overlap of m calibrates about m cores (hand-worked), and the
    simulated co-run at the fitted cores gives the measurement back."""
    from dvasim.studies.contention import fit_host_cores, four_threads

    specs = [(0.1, 0.2)] * 4
    c = fit_host_cores(specs, [1.0] * 4, 50, measured)
    assert c == pytest.approx(measured, abs=0.05)
    again = four_threads(specs, "none", calls=50, launch_ms=[1.0] * 4, cores=c)["overlap"]
    assert again == pytest.approx(measured, rel=0.02)
    assert four_threads(specs, "none", calls=50, launch_ms=[1.0] * 4, cores=16)["overlap"] == pytest.approx(4.0, rel=0.02)
