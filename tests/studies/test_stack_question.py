"""experiments/stack_question.py: one GPU's capacity under each serving stack (fast pieces of it)."""

from __future__ import annotations

import math

from tests.experiments import load_experiment as load


def test_one_gpu_per_stack_and_the_fitted_engine():
    mod = load("stack_question")
    alone = mod.one_gpu({"name": "zerobatch"}, 4, "gpu-only", quick=True, seed=0)
    fitted = mod.one_gpu({"name": "zerobatch"}, 4, "fitted engine", quick=True, seed=0)
    assert alone["stack"] == "gpu-only" and fitted["stack"] == "custom"  # the engine file's own host model
    for r in (alone, fitted):
        assert 0 < r["sustained_qps"] <= r["capacity_qps"]
    # the GPU alone is the lower bound of any server's cost: it serves more
    assert alone["sustained_qps"] > fitted["sustained_qps"]
    assert math.ceil(mod.TARGET_QPS / alone["sustained_qps"]) == 1


def test_fitted_engine_runs_at_two_stages():
    # the engine file was fitted on 4-stage replays (15/16/16/15 operators); its launch law fits any slicing
    mod = load("stack_question")
    r = mod.one_gpu({"name": "zerobatch"}, 2, "fitted engine", quick=True, seed=0)
    assert r["stack"] == "custom" and r["sustained_qps"] > 0
