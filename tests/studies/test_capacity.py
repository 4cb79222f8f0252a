"""dvasim capacity (issue 13): against a queue whose capacity is known exactly, the confidence rule against the
binomial truth, the flag for a bracket top never exceeded, and the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import binom

from dvasim.cli import main
from dvasim.errors import ConfigError
from dvasim.studies.capacity import capacity, clopper_pearson, min_queries_to_pass, throughput_bound_qps


def one_stage(tmp_path, t_ms=2.0, kind="uniform"):
    table = tmp_path / "t.csv"
    table.write_text(f"stage,batch_size,latency_ms\n0,1,{t_ms}\n0,2,{t_ms * 1.5}\n")
    return {"model": {"table": str(table)}, "policy": {"name": "zerobatch", "max_batch_size": 1},
            "workload": {"kind": kind, "rate_qps": 10.0, "n_queries": 100, "seed": 0}}


def test_capacity_of_a_deterministic_queue_is_its_service_rate(tmp_path):
    """D/D/1 with service time 2 ms: every query takes exactly 2 ms below 500 qps, and the queue grows without
    bound above it; with an SLO of 3 ms the capacity is 500 qps, found within the asked resolution from below."""
    res = capacity(one_stage(tmp_path), 3.0, resolution=0.01)
    assert res["top_exceeded"] and res["resolution"] <= 0.01
    assert 500.0 / 1.01 <= res["capacity_qps"] <= 500.0
    lo, hi = res["bracket_qps"]
    assert lo == res["capacity_qps"] and hi > 500.0 * 0.999
    assert all(p["within_slo"] == (p["rate_qps"] <= 500.0) for p in res["probes"])
    assert res["throughput_bound_qps"] == pytest.approx(2 / 3.0 * 1000.0)  # best b/T(b): batch 2 in 3 ms


def test_capacity_of_a_poisson_queue_is_below_its_service_rate(tmp_path):
    """M/D/1 with 2 ms service: p99 <= 20 ms needs utilisation well below 1 (Pollaczek-Khinchine mean wait at
    rho = 0.9 is 9 ms, its p99 far above it), so the capacity lies clearly inside (0, 500) qps."""
    res = capacity(one_stage(tmp_path, kind="poisson"), 20.0, resolution=0.05)
    assert 250.0 < res["capacity_qps"] < 500.0 * 0.97
    assert res["top_exceeded"]


def test_a_bracket_top_that_was_never_exceeded_is_flagged(tmp_path):
    res = capacity(one_stage(tmp_path), 3.0, hi=100.0, max_doublings=1)
    assert not res["top_exceeded"] and res["capacity_qps"] == 200.0 and res["bracket_qps"][1] is None
    assert "never exceeded" in res["note"]


def test_the_confidence_rule_matches_the_binomial():
    assert min_queries_to_pass(99.0, 0.95) == 299
    assert clopper_pearson(0, 299, 0.95)[1] <= 0.01 < clopper_pearson(0, 298, 0.95)[1]
    for k, n in [(0, 1000), (4, 1000), (12, 1000), (30, 2000)]:
        lo, hi = clopper_pearson(k, n, 0.95)
        # the bounds are where seeing k (or fewer / more) becomes a 5% event
        assert binom.sf(k - 1, n, lo) == pytest.approx(0.05, rel=1e-6) if k else lo == 0.0
        assert binom.cdf(k, n, hi) == pytest.approx(0.05, rel=1e-6)


def test_throughput_bound_is_an_upper_bound_on_what_a_run_serves(tmp_path):
    import dvasim
    from dvasim.api import load_profile

    cfg = {"model": {"name": "vgg19", "device": "titanrtx", "stages": 4},
           "policy": {"name": "delaybatch", "max_batch_size": 32, "max_queue_delay_ms": 5.0},
           "workload": {"kind": "poisson", "rate_qps": 5000.0, "n_queries": 3000, "seed": 1}}
    bound = throughput_bound_qps(load_profile(cfg["model"]))
    assert dvasim.run(cfg).summary["throughput_qps"] <= bound


def test_cli_capacity_writes_capacity_json_and_rejects_bad_input(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[model]\ntable = "{tmp_path / "t.csv"}"\n[policy]\nname = "zerobatch"\nmax_batch_size = 1\n'
                   '[workload]\nkind = "uniform"\nrate_qps = 10\nn_queries = 100\n')
    one_stage(tmp_path)
    assert main(["capacity", str(cfg), "--slo-ms", "3", "--out", str(tmp_path / "o"), "--resolution", "0.05"]) == 0
    res = json.loads((tmp_path / "o" / "capacity.json").read_text())
    assert 500 / 1.05 <= res["capacity_qps"] <= 500 and res["slo_ms"] == 3.0 and res["percentile"] == 99.0
    assert "qps with p99 <= 3 ms" in capsys.readouterr().out
    for bad, field in [(["--slo-ms", "-1"], "--slo-ms"), (["--slo-ms", "3", "--percentile", "100"], "--percentile"),
                       (["--slo-ms", "3", "--set", 'workload.kind="closed"'], "workload.kind")]:
        assert main(["capacity", str(cfg), *bad, "--out", str(tmp_path / "x")]) == 2
        err = capsys.readouterr().err.strip()
        assert field in err and err.count("\n") == 0
    with pytest.raises(ConfigError):
        capacity({**one_stage(tmp_path), "workload": {"kind": "stepping"}}, 3.0)
    assert not math.isnan(np.float64(res["capacity_qps"]))
