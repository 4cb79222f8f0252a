"""The paper's worked examples (Figure 3), each run from a config a user could write
(experiments/worked_examples/*.toml), with the baselines they are compared against."""

from pathlib import Path

import pytest

import dvasim
from dvasim.config import load_toml

EX = Path(__file__).resolve().parent.parent / "experiments" / "worked_examples"


def run(name, policy=None):
    cfg = load_toml(EX / name)
    if policy is not None:
        cfg["policy"] = policy
    return dvasim.run(cfg)


def test_case2_operator_diversity_split_4T_to_2_875T():
    base = run("case2_operator.toml", {"name": "zerobatch", "max_batch_size": 4})
    assert base.queries["latency_ms"].tolist() == pytest.approx([4.0] * 4)
    dva = run("case2_operator.toml")
    assert sorted(dva.queries["finish_ms"]) == pytest.approx([1.75, 2.5, 3.25, 4.0])
    assert dva.summary["mean_latency_ms"] == pytest.approx(2.875)
    assert dva.summary["n_split"] == 1


def test_case3_load_diversity_stretch_8T_to_5_25T():
    base = run("case3_load.toml", {"name": "delaybatch", "max_batch_size": 4, "max_queue_delay_ms": 4.0})
    assert base.queries["latency_ms"].tolist() == pytest.approx([8.0] * 4)
    dva = run("case3_load.toml")
    assert dva.queries["finish_ms"].tolist() == pytest.approx([9.0] * 4)
    assert dva.summary["mean_latency_ms"] == pytest.approx(5.25)
    assert dva.summary["n_stretch"] == 1
    # query 1 waited after A (it finished stage 0 at 5T, entered stage 1 merged at 6T)
    q1 = dva.queries.iloc[0]
    assert (q1["s0_finish_ms"], q1["s1_start_ms"]) == pytest.approx((5.0, 6.0))


def test_case3_no_stretch_once_past_t_comp_wait():
    cfg = load_toml(EX / "case3_load.toml")
    cfg["policy"]["t_comp_wait_ms"] = 0.5  # query 1's batch has been processed for 1T at 5T
    r = dvasim.run(cfg)
    assert r.summary["n_stretch"] == 0 and r.summary["mean_latency_ms"] > 5.25


def test_case1_input_diversity_clusters_4T_to_2_5T():
    base = run("case1_input.toml", {"name": "zerobatch", "max_batch_size": 4})
    assert base.queries["latency_ms"].tolist() == pytest.approx([4.0] * 4)
    dva = run("case1_input.toml")
    assert dva.queries["finish_ms"].tolist() == pytest.approx([2.0, 2.0, 2.0, 4.0])
    assert dva.summary["mean_latency_ms"] == pytest.approx(2.5)
    assert dva.summary["n_batches"] == 2


def test_case1_with_one_instance_pipelines_the_clusters():
    cfg = load_toml(EX / "case1_input.toml")
    cfg["engine"]["instances"] = 1
    cfg["engine"]["buffer_pairs"] = 2
    r = dvasim.run(cfg)
    # short batch (T/2 per stage) first, the long one (T per stage) one stage behind: exits 2T and 4.5T
    assert r.queries["finish_ms"].tolist() == pytest.approx([2.0, 2.0, 2.0, 4.5])
    assert r.summary["mean_latency_ms"] == pytest.approx(2.625)
