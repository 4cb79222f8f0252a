"""dvasim capacity --seeds K and --policies (issue 24): K independent searches, their mean and t interval against
the M/D/1 queue's exact capacity (Crommelin's waiting-time distribution), one search exactly as before, seeds
that no two searches share, and policies compared with ties where the systems are the same."""

from __future__ import annotations

import json
import math

import pytest
from scipy.optimize import brentq

from dvasim.cli import main
from dvasim.errors import ConfigError
from dvasim.reporting.intervals import over_seeds
from dvasim.studies.capacity import MAX_SEEDS, capacity, compare_policies, doublings, search_seeds

# probes of 2 s of arrivals where the probe rules are not what a test checks (tests/studies/test_probe_rules.py
# checks the 60 s default): the seeds, intervals and comparisons do not depend on a probe's length
FAST = {"min_duration_s": 2.0}


def one_stage(tmp_path, kind="poisson", seed=0):
    """ZeroBatch one query at a time on a 2 ms stage: an M/D/1 queue under Poisson arrivals."""
    table = tmp_path / "t.csv"
    table.write_text("stage,batch_size,latency_ms\n0,1,2.0\n0,2,3.0\n")
    return {"model": {"table": str(table)}, "policy": {"name": "zerobatch", "max_batch_size": 1},
            "workload": {"kind": kind, "rate_qps": 10.0, "n_queries": 100, "seed": seed}}


def md1_capacity_qps(service_ms: float, slo_ms: float, pct: float = 99.0) -> float:
    """The highest Poisson rate at which an M/D/1 queue's sojourn time (wait + D) meets ``slo_ms`` at ``pct``:
    the waiting time's distribution is Crommelin's, P(W <= t) = (1 - rho) sum_{k <= t/D} (lam (kD - t))^k / k!
    exp(-lam (kD - t))."""
    D, t = service_ms, slo_ms - service_ms

    def cdf(lam):
        return (1 - lam * D) * sum((lam * (k * D - t)) ** k / math.factorial(k) * math.exp(-lam * (k * D - t))
                                   for k in range(int(t // D) + 1))

    return 1000.0 * brentq(lambda lam: cdf(lam) - pct / 100.0, 1e-9, 1.0 / D - 1e-12)


@pytest.mark.slow  # (15 s) five 60 s-probe searches; the interval's arithmetic is checked below in the default suite
def test_seeds_interval_holds_the_md1_capacity(tmp_path):
    """Five searches on M/D/1 (2 ms, p99 <= 20 ms: 386.7 qps exactly): the capacity is their mean, the interval
    Student's t over them, and it holds the truth to within the search's resolution (each search reports the
    bottom of its final bracket, a probe passes only when confident: every capacity sits a little below)."""
    truth = md1_capacity_qps(2.0, 20.0)
    assert truth == pytest.approx(386.74, abs=0.01)
    res = capacity(one_stage(tmp_path), 20.0, resolution=0.05, max_queries=8000, seeds=5)
    iv = res["capacity_interval"]
    assert res["capacity_by_seed"] and len(res["capacity_by_seed"]) == 5 and iv["n"] == 5
    assert iv == over_seeds(res["capacity_by_seed"]).as_dict() and res["capacity_qps"] == iv["point"]
    assert iv["method"] == "t over seeds" and iv["lo"] < iv["point"] < iv["hi"]
    assert iv["lo"] / 1.05 <= truth <= iv["hi"] * 1.05
    assert len({p["search_seed"] for p in res["probes"]}) == 5 and res["n_probes"] == len(res["probes"])
    assert [s["capacity_qps"] for s in res["searches"]] == res["capacity_by_seed"]


def test_a_deterministic_queue_has_a_zero_width_interval(tmp_path):
    """D/D/1 (uniform arrivals): every seed finds the same capacity, so the interval has no width."""
    res = capacity(one_stage(tmp_path, kind="uniform"), 3.0, resolution=0.1, seeds=3, **FAST)
    assert len(set(res["capacity_by_seed"])) == 1 and 500 / 1.1 <= res["capacity_qps"] <= 500
    assert res["capacity_interval"]["lo"] == pytest.approx(res["capacity_interval"]["hi"])


def test_one_seed_is_the_search_as_before_and_the_first_of_several(tmp_path):
    """The searches alone (``confirm_factor = 0``; tests/studies/test_capacity_confirm.py confirms them)."""
    cfg = one_stage(tmp_path, seed=4)
    kw = dict(resolution=0.1, max_queries=4000, confirm_factor=0, **FAST)
    one = capacity(cfg, 20.0, **kw)
    assert capacity(cfg, 20.0, seeds=1, **kw) == one
    assert set(one) == {"capacity_qps", "stack", "slo_ms", "percentile", "confidence", "bracket_qps", "resolution",
                        "resolution_asked", "top_exceeded", "throughput_bound_qps", "n_probes", "probes", "note",
                        "seeds", "capacity_by_seed", "capacity_interval", "n_metastable", "rules",
                        "capacity_searched_qps", "confirmation"}
    assert one["confirmation"] is None and one["capacity_searched_qps"] == one["capacity_qps"]
    assert one["seeds"] == [4] and one["capacity_by_seed"] == [one["capacity_qps"]]
    assert one["capacity_interval"]["method"] == "single run"
    assert all("search_seed" not in p for p in one["probes"])
    three = capacity(cfg, 20.0, seeds=3, **kw)
    first = three["searches"][0]
    assert first["seed"] == 4 and first["capacity_qps"] == one["capacity_qps"]
    assert [{k: v for k, v in p.items() if k != "search_seed"} for p in three["probes"][:one["n_probes"]]] == \
        one["probes"]


def test_searches_never_share_a_seed():
    """A probe doubles its queries from 1,000 to 64,000 with seeds s .. s+6: the next search starts at s+7."""
    assert search_seeds(5, 1, 1000, 64000) == [5]
    seeds = search_seeds(5, 3, 1000, 64000)
    assert seeds == [5, 12, 19]
    used = [set(range(s, s + 7)) for s in seeds]
    assert not (used[0] & used[1]) and not (used[1] & used[2])
    assert search_seeds(0, 2, 1000, 1000) == [0, 1]
    assert doublings(1000, 64000) == 6 and doublings(1000, 63999) == 5 and doublings(1000, 1999) == 0


@pytest.mark.parametrize("seeds", [0, MAX_SEEDS + 1, 2.5])
def test_seeds_out_of_range_is_one_line_before_any_probe(tmp_path, seeds):
    probes = []
    with pytest.raises(ConfigError) as e:
        capacity(one_stage(tmp_path), 20.0, seeds=seeds, progress=probes.append)
    assert e.value.field == "--seeds" and probes == []


def test_identical_policies_tie_and_a_better_one_leads(tmp_path):
    """Serial and ZeroBatch one query at a time are the same queue: a tie. ZeroBatch with batches of two clears
    the 2 ms stage's queue twice as fast at 3 ms a pair: ahead, its interval clear of zero."""
    cfg = one_stage(tmp_path)
    seen = []
    res = compare_policies(cfg, 20.0, ["zerobatch", "serial"], resolution=0.1, max_queries=4000, seeds=3,
                           confirm_factor=0, progress=seen.append, **FAST)
    (c,) = res["comparisons"]
    assert c["tie"] and " tie with " in c["label"] and res["ranking"] in ("zerobatch = serial", "serial = zerobatch")
    assert {p["policy"] for p in seen} == {"zerobatch", "serial"}
    cfg["policy"]["max_batch_size"] = 2
    res = compare_policies(cfg, 20.0, ["serial", "zerobatch"], resolution=0.1, max_queries=4000, seeds=3,
                           confirm_factor=0, **FAST)
    (c,) = res["comparisons"]
    # against the best (zerobatch), whichever was listed first: serial below it, its interval clear of zero
    assert c["against"] == "zerobatch" and c["policy"] == "serial" and res["ranking"] == "zerobatch > serial"
    assert not c["tie"] and c["label"].startswith("serial: ") and " below zerobatch [" in c["label"]
    assert c["difference_interval_%"][1] < 0
    assert res["by_policy"]["zerobatch"]["capacity_qps"] > 1.3 * res["by_policy"]["serial"]["capacity_qps"]


@pytest.mark.parametrize("policies,why", [(["zerobatch", "nosuch"], "nosuch"), (["serial", "serial"], "twice"),
                                          ([], "no policy")])
def test_bad_policies_are_one_line_before_any_probe(tmp_path, policies, why):
    seen = []
    with pytest.raises(ConfigError) as e:
        compare_policies(one_stage(tmp_path), 20.0, policies, progress=seen.append)
    assert e.value.field == "--policies" and why in e.value.message and seen == []


def test_cli_seeds_and_policies(tmp_path, capsys):
    one_stage(tmp_path)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[model]\ntable = "{tmp_path / "t.csv"}"\n[policy]\nname = "zerobatch"\nmax_batch_size = 1\n'
                   '[workload]\nkind = "uniform"\nrate_qps = 10\nn_queries = 100\n')
    args = ["capacity", str(cfg), "--slo-ms", "3", "--resolution", "0.1", "--min-duration-s", "2"]
    assert main([*args, "--out", str(tmp_path / "a"), "--seeds", "2"]) == 0
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "a" / "capacity.json").read_text())
    assert res["seeds"] == [0, 4] and len(res["capacity_by_seed"]) == 2  # a probe may take 4 seeds (3 doublings)
    assert "(mean of 2 seeds, 95% t interval; per seed: " in out and "seed 4 " in out
    assert main([*args, "--out", str(tmp_path / "b"), "--policies", "zerobatch,serial"]) == 0
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "b" / "capacity.json").read_text())
    assert res["policies"] == ["zerobatch", "serial"] and res["comparisons"][0]["tie"]
    assert "ranking (each against the best; = a tie): zerobatch = serial" in out
    assert "serial: tie with zerobatch (difference 0.0% within the search's resolution)" in out
    assert main([*args, "--out", str(tmp_path / "c"), "--seeds", "0"]) == 2
    assert capsys.readouterr().err.strip().startswith("dvasim: error: --seeds:")
    assert not (tmp_path / "c").exists()
