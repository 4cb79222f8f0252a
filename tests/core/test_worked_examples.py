"""The paper's worked examples (Figure 3 Cases I to III, and Figure 8's new / stretch / split sequence), each run
from a config a user could write (experiments/worked_examples/*.toml) with DVABatch's default parameters wherever
the paper gives none, against golden per-query timelines derived by hand in each test's docstring (T = 1 ms)."""

from pathlib import Path

import pytest

import dvasim
from dvasim.config import load_toml

EX = Path(__file__).resolve().parents[2] / "experiments" / "worked_examples"


def run(name, policy=None, **policy_params):
    cfg = load_toml(EX / name)
    if policy is not None:
        cfg["policy"] = policy
    cfg["policy"].update(policy_params)
    return dvasim.run(cfg)


def finishes(r):
    return r.queries["finish_ms"].tolist()


def test_case1_input_diversity_clusters_4T_to_2_5T():
    """Queries 1-3 (length 32, T/2 a stage) and 4 (length 64, T a stage) arrive at 0; bs_max = 4, so the batch
    leaves at once. The defaults identify input diversity: padding a batch of 4 such lengths wastes 26% of its
    time (P(max = 32) = 0.75^4). Policy I clusters {1,2,3} and {4}; with two instances they run side by side
    (each demands half the device): the short batch exits at 4 x T/2 = 2T, the long one at 4T.
    Mean (3 x 2 + 4) / 4 = 2.5T; one padded batch: 4T for all."""
    base = run("case1_input.toml", {"name": "zerobatch", "max_batch_size": 4})
    assert finishes(base) == pytest.approx([4.0] * 4)
    dva = run("case1_input.toml")
    assert dva.config["policy"]["policies"] == ["input"]
    assert finishes(dva) == pytest.approx([2.0, 2.0, 2.0, 4.0])
    assert dva.summary["mean_latency_ms"] == pytest.approx(2.5)
    assert dva.summary["n_batches"] == 2
    # batches in flight: 2 during [0, 2T], 1 during [2T, 4T] -> 1.5
    assert dva.summary["mean_batches_in_flight"] == pytest.approx(1.5)


def test_case1_with_one_instance_pipelines_the_clusters():
    """One instance, two buffer pairs: the short batch runs stages 0-3 at T/2 each (exits 2T); the long batch
    enters stage 0 at T/2 and then follows one stage behind, each of its stages T long, the first overlapping
    the short one's: it starts stage s at max(its stage s-1 end, short batch's stage s end) -> 0.5, 1.5, 2.5,
    3.5, exits 4.5T. Mean (3 x 2 + 4.5) / 4 = 2.625T."""
    cfg = load_toml(EX / "case1_input.toml")
    cfg["engine"]["instances"] = 1
    r = dvasim.run(cfg)
    assert finishes(r) == pytest.approx([2.0, 2.0, 2.0, 4.5])
    assert r.summary["mean_latency_ms"] == pytest.approx(2.625)


def test_case2_operator_diversity_split_serial_4T_to_2_875T():
    """Four queries at 0; A takes T at any batch size, B, C, D take T/4 per query. The defaults identify operator
    diversity (preferred batch sizes 4, 1, 1, 1). After A (at T) Policy II halves the batch while
    T_remain(bs) >= 2 T_remain(bs/2) (3T >= 2 x 1.5T, 1.5T >= 2 x 0.75T): four batches of 1, run in the serial
    manner with the default two buffer pairs, each through B, C, D (0.75T) before the next is handed on:
    exits 1.75, 2.5, 3.25, 4.0; mean 2.875T. One batch of 4: 4T for all."""
    base = run("case2_operator.toml", {"name": "zerobatch", "max_batch_size": 4})
    assert finishes(base) == pytest.approx([4.0] * 4)
    dva = run("case2_operator.toml")
    assert dva.config["policy"]["policies"] == ["operator", "load"]
    assert dva.config["engine"]["buffer_pairs"] == 2
    assert sorted(finishes(dva)) == pytest.approx([1.75, 2.5, 3.25, 4.0])
    q = dva.queries.sort_values("finish_ms")
    assert q["s1_start_ms"].tolist() == pytest.approx([1.0, 1.75, 2.5, 3.25])  # each B after the previous exit
    assert dva.summary["mean_latency_ms"] == pytest.approx(2.875)
    assert dva.summary["n_split"] == 1  # one split into [1, 1, 1, 1] (the recursive halving of Policy II)
    # rows in flight: 1 during [0, T], then 4, 3, 2, 1 sub-batches for 0.75T each -> (1 + 7.5) / 4
    assert dva.summary["mean_batches_in_flight"] == pytest.approx(8.5 / 4)


def test_case2_pipelined_manner_overlaps_and_is_slower():
    """The overlapping variant (``split_manner = "pipelined"``, kept for studies): the four sub-batches follow
    each other stage by stage, sharing a saturated device (B, C, D demand all of it at batch 1), so the later
    ones finish no sooner and the first ones later than in the serial manner."""
    serial = run("case2_operator.toml")
    piped = run("case2_operator.toml", split_manner="pipelined")
    q = piped.queries
    overlaps = ((q["s2_start_ms"].iloc[0] < q["s1_finish_ms"].iloc[1])
                or (q["s1_start_ms"].iloc[1] < q["s3_finish_ms"].iloc[0]))
    assert overlaps
    assert piped.summary["mean_latency_ms"] > serial.summary["mean_latency_ms"] + 0.1
    assert max(finishes(piped)) == pytest.approx(4.0)


def test_case3_load_diversity_stretch_8T_to_5_25T():
    """Only the paper's 4T window is set. Query 1 arrives at 0, waits the window, runs A in [4T, 5T]. Queries
    2-4 arrive at 5T: the batch has been processed for 1T <= T_comp_wait (default: a fraction of the 4T batch-1
    latency, at least 1T), so they stretch it and catch up through A in [5T, 6T] (query 1 waits after A); the
    four run B, C, D together and exit at 9T. Mean (9 + 3 x 4) / 4 = 5.25T. DelayBatch: query 1 exits at 8T,
    queries 2-4 open a window to 9T and exit at 13T: 8T each."""
    base = run("case3_load.toml", {"name": "delaybatch", "max_batch_size": 4, "max_queue_delay_ms": 4.0})
    assert base.queries["latency_ms"].tolist() == pytest.approx([8.0] * 4)
    cfg = load_toml(EX / "case3_load.toml")
    assert set(cfg["policy"]) == {"name", "max_batch_size", "max_queue_delay_ms"}
    dva = dvasim.run(cfg)
    assert dva.config["policy"]["policies"] == ["load"]
    assert dva.config["policy"]["t_comp_wait_ms"] >= 1.0
    assert finishes(dva) == pytest.approx([9.0] * 4)
    assert dva.summary["mean_latency_ms"] == pytest.approx(5.25)
    assert dva.summary["n_stretch"] == 1 and dva.summary["n_stretch_started"] == 1
    q1 = dva.queries.iloc[0]
    assert (q1["s0_finish_ms"], q1["s1_start_ms"]) == pytest.approx((5.0, 6.0))


def test_case3_no_stretch_once_past_t_comp_wait():
    """With T_comp_wait = 0.5T the batch (processed 1T at 5T) is not stretched. Queries 2-4 form a new batch
    when the first stage is free and their window has passed (4T, to 9T): stages [9T, 13T], exit 13T; query 1
    exits at 8T. Mean (8 + 3 x 8) / 4 = 8T, as DelayBatch."""
    r = run("case3_load.toml", t_comp_wait_ms=0.5)
    assert r.summary["n_stretch"] == 0
    assert finishes(r) == pytest.approx([8.0, 13.0, 13.0, 13.0])


def test_fig8_new_stretch_split_on_one_batch():
    """Queries 1-2 arrive at 0 and are made a batch by *new* (size 2 would not be split: stage 3 takes 3T at
    both 1 and 2, so it is not splittable and may be stretched). It runs stage 0 in [0, T] and stage 1 in
    [T, 2T]. Queries 3-4 arrive at 1.25T: the batch has been processed 1.25T <= T_comp_wait (default, at least
    1/4 of the 6T batch-1 latency = 1.5T), so they *stretch* it. At size 4 it passes the split test before stage
    3 (T_remain = 6T >= 2 x 3T), so it is marked splittable (no further stretch). The newcomers' catch-up rows
    use the batch's own buffer pair, busy until stage 1 has read it: they run stage 0 in [2T, 3T] and stage 1 in
    [3T, 4T] while queries 1-2 wait after stage 1. Merged, the four run stage 2 in [4T, 5T]; then the batch is
    *split* into two batches of 2 (3T >= 2 x 3T fails, so no further halving), which run stage 3 serially:
    [5T, 8T] and [8T, 11T]. Latencies 8, 8, 9.75, 9.75; mean 8.875T. Without split all exit at 11T (10.375T)."""
    r = run("fig8_sequence.toml")
    assert r.config["policy"]["policies"] == ["operator", "load"]
    assert [op for op in ("n_batches", "n_stretch", "n_split") if r.summary[op] == 1] == ["n_batches",
                                                                                       "n_stretch", "n_split"]
    q = r.queries
    assert finishes(r) == pytest.approx([8.0, 8.0, 11.0, 11.0])
    assert q["s0_start_ms"].tolist() == pytest.approx([0.0, 0.0, 2.0, 2.0])
    assert q["s1_finish_ms"].tolist() == pytest.approx([2.0, 2.0, 4.0, 4.0])
    assert q["s2_start_ms"].tolist() == pytest.approx([4.0] * 4)
    assert q["exit_batch_size"].tolist() == [2, 2, 2, 2]
    assert r.summary["mean_latency_ms"] == pytest.approx(8.875)
    no_split = run("fig8_sequence.toml", policies=["load"])
    assert no_split.summary["mean_latency_ms"] == pytest.approx(10.375)
