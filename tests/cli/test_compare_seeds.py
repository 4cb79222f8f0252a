"""dvasim compare --seeds K (issue 24): every (model, load, policy) run repeated over K seeds, compare.csv's means
with their t intervals (against scipy), the reductions' intervals and ties on hand cases, and one seed exactly as
before. The peaks are stubbed (the loads are 1/4, 3/5 and 9/10 of 100 qps) to keep the runs small."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from dvasim.studies import evaluation as ev

KW = dict(windows={"vgg19": 2.0}, policies=["zerobatch", "delaybatch", "dvabatch"], n_queries=300, workers=1,
          progress=False)


@pytest.fixture
def stub_peaks(monkeypatch):
    monkeypatch.setattr(ev, "_peak_job", lambda job: (100.0, (90.0, 110.0)))


def test_seeds_repeat_every_run_and_the_first_is_the_one_seed_run(stub_peaks):
    one, _ = ev.compare(["vgg19"], seed=5, **KW)
    three, _ = ev.compare(["vgg19"], seed=5, seeds=3, **KW)
    by_seed = pd.DataFrame(three.attrs["by_seed"])
    assert len(one) == len(three) == 9 and len(by_seed) == 27 and set(by_seed["seed"]) == {5, 6, 7}
    first = by_seed[by_seed["seed"] == 5].drop(columns="seed").reset_index(drop=True)
    pd.testing.assert_frame_equal(first, one)  # seed 5 of three is the one-seed study, run for run
    assert "mean_latency_ms_lo" not in one.columns and "n_seeds" not in one.columns
    for (model, load, policy), g in by_seed.groupby(["model", "load", "policy"]):
        row = three[(three["model"] == model) & (three["load"] == load) & (three["policy"] == policy)].iloc[0]
        assert row["n_seeds"] == 3 and row["stack"] == g["stack"].iloc[0]
        for m in ("mean_latency_ms", "p99_latency_ms"):
            x = g[m].to_numpy()
            lo, hi = stats.t.interval(0.95, 2, loc=x.mean(), scale=stats.sem(x))
            assert row[m] == pytest.approx(x.mean()) and (row[f"{m}_lo"], row[f"{m}_hi"]) == pytest.approx((lo, hi))
        assert row["throughput_qps"] == pytest.approx(g["throughput_qps"].mean())
    cols = list(three.columns)
    assert cols.index("mean_latency_ms_lo") == cols.index("mean_latency_ms") + 1


def _row(policy, point, hw, n=5):
    return {"model": "m", "load": "high", "policy": policy, "mean_latency_ms": point,
            "mean_latency_ms_lo": point - hw, "mean_latency_ms_hi": point + hw, "n_seeds": n}


@pytest.mark.parametrize("dva,base,tied,lo,hi", [
    # DVABatch 10 +- 1 against 20 +- 1: a 50% reduction, +- 100 sqrt(2) / 20 = 7.07 points
    ((10.0, 1.0), (20.0, 1.0), False, 50 - 7.0711, 50 + 7.0711),
    # 19 +- 3 against 20 +- 4: the 1 ms difference is within sqrt(3^2 + 4^2) = 5: a tie
    ((19.0, 3.0), (20.0, 4.0), True, 5 - 25.0, 5 + 25.0),
])
def test_reductions_give_intervals_and_ties(dva, base, tied, lo, hi):
    res = pd.DataFrame([_row("dvabatch", *dva), _row("zerobatch", *base)])
    red = ev.reductions(res, "mean_latency_ms")
    r = red.iloc[0]
    assert r["vs_zerobatch_tie"] == tied
    assert (r["vs_zerobatch_%_lo"], r["vs_zerobatch_%_hi"]) == pytest.approx((lo, hi), abs=1e-3)
    assert math.isnan(r["vs_delaybatch_%_lo"])  # not run


def test_one_seed_reductions_have_no_interval_columns():
    res = pd.DataFrame([{"model": "m", "load": "low", "policy": p, "mean_latency_ms": v}
                        for p, v in (("dvabatch", 10.0), ("zerobatch", 20.0), ("delaybatch", 12.5))])
    red = ev.reductions(res)
    assert list(red.columns) == ["model", "load", "vs_zerobatch_%", "vs_delaybatch_%"]
    assert red.iloc[0]["vs_delaybatch_%"] == pytest.approx(20.0)


def test_cli_compare_seeds_writes_intervals_and_prints_ties(stub_peaks, tmp_path, capsys):
    from dvasim.cli.compare import cli_compare

    out = tmp_path / "c"
    assert cli_compare(["--models", "vgg19", "--policies", "zerobatch,delaybatch,dvabatch", "--queries", "300",
                        "--workers", "1", "--seeds", "2", "--out", str(out)]) == 0
    res = pd.read_csv(out / "compare.csv")
    assert {"mean_latency_ms_lo", "p99_latency_ms_hi", "n_seeds"} <= set(res.columns) and (res["n_seeds"] == 2).all()
    assert len(pd.read_csv(out / "compare_seeds.csv")) == 2 * len(res)
    red = pd.read_csv(out / "reductions.csv")
    assert {"vs_zerobatch_%_lo_mean", "vs_delaybatch_tie_p99"} <= set(red.columns)
    text = capsys.readouterr().out
    table = text.split("mean latency (ms) and DVABatch's reduction (%) over 2 seeds")[1].split("average")[0]
    cells = [ln for ln in table.splitlines() if "triton-tensorrt" in ln]  # one row per load
    assert len(cells) == 3 and all(ln.count("[") + ln.count("tie (") == 2 for ln in cells)
    assert np.all(res["mean_latency_ms_lo"] <= res["mean_latency_ms"])
    assert "18 runs in" in text


@pytest.mark.parametrize("argv,field", [(["--seeds", "0"], "--seeds"), (["--seeds", "101"], "--seeds"),
                                        (["--seed", str(2 ** 63 - 1), "--seeds", "2"], "--seeds")])
def test_cli_compare_bad_seeds_is_one_line(argv, field, tmp_path, capsys):
    from dvasim.cli.compare import cli_compare

    assert cli_compare([*argv, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert field in err and err.count("\n") == 0 and not (tmp_path / "x").exists()
