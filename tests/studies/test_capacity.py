"""dvasim capacity (issue 13): against a queue whose capacity is known exactly, the confidence rule against the
binomial truth, the flag for a bracket top never exceeded, and the CLI; (issue 23) every setting and the config
checked before the first probe, the limits (resolution, queries a probe, rates, doublings, bisections, seeds), and
capacity.json written whole."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import binom

from dvasim.cli import main
from dvasim.errors import ConfigError, DvasimError
from dvasim.studies.capacity import (
    MAX_BISECTIONS,
    MIN_RESOLUTION,
    OPTIONS,
    bracket_and_bisect,
    capacity,
    check_options,
    clopper_pearson,
    min_queries_to_pass,
    throughput_bound_qps,
)
from dvasim.workload.config import MAX_SEED

# probes of 2 s of arrivals where the probe rules are not what a test checks (tests/studies/test_probe_rules.py
# checks the 60 s default)
FAST = {"min_duration_s": 2.0}


def one_stage(tmp_path, t_ms=2.0, kind="uniform"):
    table = tmp_path / "t.csv"
    table.write_text(f"stage,batch_size,latency_ms\n0,1,{t_ms}\n0,2,{t_ms * 1.5}\n")
    return {"model": {"table": str(table)}, "policy": {"name": "zerobatch", "max_batch_size": 1},
            "workload": {"kind": kind, "rate_qps": 10.0, "n_queries": 100, "seed": 0}}


def test_capacity_of_a_deterministic_queue_is_its_service_rate(tmp_path):
    """D/D/1 with service time 2 ms: every query takes exactly 2 ms below 500 qps, and the queue grows without
    bound above it; with an SLO of 3 ms the capacity is 500 qps, found within the asked resolution from below."""
    # near 500 qps a backlog needs seconds to clear; the search alone (its confirmation: test_capacity_confirm.py)
    res = capacity(one_stage(tmp_path), 3.0, resolution=0.01, confirm_factor=0)
    assert res["top_exceeded"] and res["resolution"] <= 0.01
    assert 500.0 / 1.01 <= res["capacity_qps"] <= 500.0
    lo, hi = res["bracket_qps"]
    assert lo == res["capacity_qps"] and hi > 500.0 * 0.999
    assert all(p["within_slo"] == (p["rate_qps"] <= 500.0) for p in res["probes"])
    assert res["throughput_bound_qps"] == pytest.approx(2 / 3.0 * 1000.0)  # best b/T(b): batch 2 in 3 ms


def test_capacity_of_a_poisson_queue_is_below_its_service_rate(tmp_path):
    """M/D/1 with 2 ms service: p99 <= 20 ms needs utilisation well below 1 (Pollaczek-Khinchine mean wait at
    rho = 0.9 is 9 ms, its p99 far above it), so the capacity lies clearly inside (0, 500) qps."""
    res = capacity(one_stage(tmp_path, kind="poisson"), 20.0, resolution=0.05, **FAST)
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
    assert main(["capacity", str(cfg), "--slo-ms", "3", "--out", str(tmp_path / "o"), "--resolution", "0.05",
                 "--min-duration-s", "2"]) == 0
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


# ----------------------------------------------------------------------------- issue 23: limits, checked first
@pytest.mark.parametrize("kw,field", [
    ({"max_queries": 0}, "--max-queries"),
    ({"max_queries": "many"}, "--max-queries"),
    ({"max_queries": 458}, "--max-queries"),  # below the first probe's 459 queries (LoadGen: p99 at 0.99)
    ({"max_queries": 30_000_000}, "--max-queries"),
    ({"min_queries": 5000, "max_queries": 4000}, "--max-queries"),
    ({"percentile": 99.99999, "confidence": 0.9999}, "--max-queries"),  # no probe could ever pass
    ({"resolution": 1e-300}, "--resolution"),
    ({"resolution": float("nan")}, "--resolution"),
    ({"percentile": "99"}, "--percentile"),
    ({"confidence": 1.0}, "--confidence"),
    ({"lo": float("inf")}, "--lo"),
    ({"hi": float("inf")}, "--hi"),
    ({"hi": 1e300}, "--hi"),
    ({"lo": 50.0, "hi": 50.0}, "--lo"),
    ({"lo": 5000.0}, "--lo"),  # above the default top of the bracket (twice the table's bound: 1333 qps)
    ({"max_doublings": 1000}, "--max-doublings"),
    ({"stack": "nosuch"}, "--stack"),
])
def test_bad_settings_are_one_line_naming_the_flag_before_any_probe(tmp_path, kw, field):
    probes = []
    with pytest.raises(DvasimError) as e:
        capacity(one_stage(tmp_path), 3.0, progress=probes.append, **kw)
    assert e.value.field == field and probes == []


def test_the_config_is_checked_as_a_probe_would_run_it_before_any_probe(tmp_path):
    probes = []
    cfg = one_stage(tmp_path)
    cfg["workload"]["start_ms"] = -1.0  # only the workload builder says so
    with pytest.raises(ConfigError) as e:
        capacity(cfg, 3.0, progress=probes.append)
    assert e.value.field == "workload.start_ms" and probes == []
    cfg = one_stage(tmp_path)
    cfg["workload"]["seed"] = MAX_SEED  # a probe that doubles its queries takes the next seed
    with pytest.raises(ConfigError) as e:
        capacity(cfg, 3.0, max_queries=4000, progress=probes.append)
    assert e.value.field == "workload.seed" and f"at most {MAX_SEED - 3}" in e.value.message and probes == []
    cfg["workload"]["seed"] = MAX_SEED - 3  # 459 queries doubled three times within 4,000
    # the long run's seed: past the top, the one before the search's (test_capacity_confirm.py)
    assert capacity(cfg, 3.0, max_queries=4000, resolution=0.2, **FAST)["confirmation"]["seeds"] == [MAX_SEED - 4]


def test_the_limits_are_the_sweeps_too():
    from dvasim.studies.sweep import SWEEP_CAPACITY

    for k in SWEEP_CAPACITY.keys:
        assert k is OPTIONS[k.name]
    assert OPTIONS["resolution"].minimum == MIN_RESOLUTION
    assert check_options({"slo_ms": 5.0}) == 459  # LoadGen's early stopping: ln .01 / ln .99 at 0.99
    assert check_options({"slo_ms": 5.0, "percentile": 99.9, "max_queries": 5000}) == 4603  # ln .01 / ln .999
    assert check_options({"slo_ms": 5.0, "percentile": 99.9, "confidence": 0.95}) == 2995  # ln .05 / ln .999
    assert check_options({"slo_ms": 5.0, "percentile": 50.0}) == 100  # LoadGen's min_query_count
    with pytest.raises(ConfigError) as e:
        check_options({"slo_ms": 5.0, "percentile": 99.9, "max_queries": 2000}, where="sweep.capacity")
    assert e.value.field == "sweep.capacity.max_queries" and "4,603" in e.value.message


def test_bisection_stops_after_its_cap_whatever_the_resolution():
    calls = []

    def probe(rate):
        calls.append(rate)
        return rate <= 123.456

    cap, (lo, hi), top, note = bracket_and_bisect(probe, 1.0, 1000.0, 0, 1e-300)
    assert len(calls) == 2 + MAX_BISECTIONS and top
    assert lo <= 123.456 < hi and cap == lo and f"after {MAX_BISECTIONS} bisections" in note
    calls.clear()
    cap, (lo, hi), top, note = bracket_and_bisect(probe, 1.0, 1000.0, 0, MIN_RESOLUTION)
    assert note == "" and hi / lo - 1 <= MIN_RESOLUTION and len(calls) < 2 + MAX_BISECTIONS


def test_cli_capacity_limits_are_one_line_and_nothing_is_written(tmp_path, capsys):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[model]\ntable = "{tmp_path / "t.csv"}"\n[policy]\nname = "zerobatch"\nmax_batch_size = 1\n'
                   '[workload]\nkind = "uniform"\nrate_qps = 10\nn_queries = 100\n')
    one_stage(tmp_path)
    for bad, field in [(["--resolution", "1e-300"], "--resolution"), (["--max-queries", "0"], "--max-queries"),
                       (["--max-queries", "many"], "--max-queries"), (["--hi", "inf"], "--hi"),
                       (["--set", "workload.start_ms=-1"], "workload.start_ms")]:
        assert main(["capacity", str(cfg), "--slo-ms", "3", "--out", str(tmp_path / "x"), *bad]) == 2
        out, err = capsys.readouterr()
        assert err.strip().startswith(f"dvasim: error: {field}") and err.strip().count("\n") == 0
        assert "qps" not in out  # no probe ran
    assert not (tmp_path / "x").exists()


def test_cli_capacity_json_is_written_whole(tmp_path, capsys, monkeypatch):
    import errno
    from pathlib import Path

    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[model]\ntable = "{tmp_path / "t.csv"}"\n[policy]\nname = "zerobatch"\nmax_batch_size = 1\n'
                   '[workload]\nkind = "uniform"\nrate_qps = 10\nn_queries = 100\n')
    one_stage(tmp_path)
    args = ["capacity", str(cfg), "--slo-ms", "3", "--min-duration-s", "2", "--out", str(tmp_path / "o"),
            "--resolution", "0.2"]
    assert main(args) == 0
    before = (tmp_path / "o" / "capacity.json").read_text()
    real = Path.write_text

    def full_disk(self, text, *a, **k):
        real(self, text[:10], *a, **k)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    assert main([*args[:-1], "0.1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"dvasim: error: {tmp_path / 'o' / 'capacity.json'}: ") and "no space left" in err
    monkeypatch.undo()
    assert (tmp_path / "o" / "capacity.json").read_text() == before  # the old result, whole
    assert [p.name for p in (tmp_path / "o").iterdir()] == ["capacity.json"]
