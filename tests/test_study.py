"""The evaluation methodology's pieces: stepping levels, the peak bracket, reductions; and one small real peak."""

import numpy as np
import pandas as pd
import pytest

from dvasim import study


def test_level_stats_and_bracket():
    rates = np.repeat([100.0, 200.0, 400.0, 800.0], 100)
    lat = np.concatenate([np.full(100, 10.0), np.full(100, 50.0), np.full(100, 150.0), np.full(100, 900.0)])
    lat[150] = np.nan  # an unfinished query counts as infinitely late: it breaks its level's p99
    df = pd.DataFrame({"latency_ms": lat})
    lv = study.level_stats(df, rates, qos_ms=200.0)
    assert lv["within_qos"].tolist() == [True, False, True, False]
    assert lv["mean_latency_ms"].iloc[0] == pytest.approx(10.0)
    # a violation at a lower level caps the peak there, even if a higher level looks fine
    assert study.stepping_bracket(lv) == (100.0, 200.0)
    lv.loc[1, "within_qos"] = True
    assert study.stepping_bracket(lv) == (400.0, 800.0)


def test_reductions_sign_and_value():
    res = pd.DataFrame({"model": ["m"] * 3, "load": ["low"] * 3, "policy": list(study.POLICIES),
                        "mean_latency_ms": [10.0, 20.0, 5.0]})
    red = study.reductions(res)
    assert red["vs_zerobatch_%"].iloc[0] == pytest.approx(50.0)
    assert red["vs_delaybatch_%"].iloc[0] == pytest.approx(75.0)


def test_peak_throughput_of_a_saturating_model_is_near_capacity():
    # ResNet152 on the Titan RTX table saturates the GPU from batch 2 on: the peak under a 200 ms p99 must lie
    # below the best throughput the table allows (64 / T(64)) and above half of it
    from dvasim.calibration.models import resolve_model

    table = resolve_model({"name": "resnet152", "device": "titanrtx", "stages": 4}).table
    capacity = 64 / table.total(64) * 1000.0
    p = study.peak_throughput("resnet152", {"name": "zerobatch"}, refine=2, refine_queries=2000)
    assert 0.5 * capacity < p.peak_qps <= capacity
    lo, hi = p.bracket
    assert lo <= p.peak_qps <= hi and hi / lo < 1.2
