"""Error bars (issue 24): the t interval against scipy and against its coverage on normal samples, the bootstrap's
coverage of a known mean, the Clopper-Pearson interval against its definition, and the tie rule on hand cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dvasim.reporting.intervals import (
    Interval,
    binomial,
    bootstrap,
    compare_label,
    from_replicates,
    over_seeds,
    relative_difference,
    single,
    tie,
)


def _binomial_band(p: float, trials: int, z: float = 4.0) -> tuple[float, float]:
    """Where a coverage estimate over ``trials`` lands with probability ~1 - 6e-5 (4 standard errors)."""
    se = math.sqrt(p * (1 - p) / trials)
    return p - z * se, p + z * se


@pytest.mark.parametrize("n", [2, 3, 5, 20])
def test_t_interval_equals_scipy(n):
    x = np.random.default_rng(n).normal(10.0, 3.0, n)
    iv = over_seeds(x, 0.9)
    lo, hi = stats.t.interval(0.9, n - 1, loc=x.mean(), scale=stats.sem(x))
    assert iv.point == pytest.approx(x.mean()) and iv.lo == pytest.approx(lo) and iv.hi == pytest.approx(hi)
    assert iv.n == n and iv.method == "t over seeds" and iv.confidence == 0.9


def test_t_interval_covers_the_normal_mean_95_percent_of_the_time():
    """4,000 samples of 5 normal values: the share whose 95% interval holds the true mean is within binomial
    error of 0.95 (a z interval, too narrow for n = 5, would cover only ~88%)."""
    rng = np.random.default_rng(7)
    trials = 4000
    x = rng.normal(3.0, 2.0, (trials, 5))
    hits = sum(over_seeds(row).contains(3.0) for row in x)
    lo, hi = _binomial_band(0.95, trials)
    assert lo <= hits / trials <= hi


def test_one_value_is_a_single_run():
    iv = over_seeds([412.3])
    assert (iv.point, iv.lo, iv.hi, iv.n, iv.method) == (412.3, 412.3, 412.3, 1, "single run")
    assert iv.half_width == 0.0 and str(iv) == "412.3 (single run)"
    with pytest.raises(ValueError):
        over_seeds([])
    assert math.isnan(over_seeds([1.0, math.inf]).lo)


def test_str_and_dict():
    iv = Interval(412.3, 405.1, 419.6, 5, 0.95, "t over seeds")
    assert str(iv) == "412.3 [405.1, 419.6]" and f"{iv:.0f}" == "412 [405, 420]"
    assert str(Interval(0.06323, 0.0601, 0.0667, 9, 0.95, "bootstrap over executions")) == \
        "0.06323 [0.06010, 0.06670]"
    assert iv.as_dict() == {"point": 412.3, "lo": 405.1, "hi": 419.6, "n": 5, "confidence": 0.95,
                            "method": "t over seeds"}
    assert iv.half_width == pytest.approx(7.25)


def test_bootstrap_covers_a_known_mean():
    """Exponential values (skewed), 60 at a time: the 90% percentile-bootstrap interval of the mean holds the true
    mean about 90% of the time (the percentile bootstrap runs a little narrow on small skewed samples: it must
    land within 4 binomial standard errors of 0.9 less 2 points)."""
    rng = np.random.default_rng(11)
    trials = 300
    hits = 0
    for k in range(trials):
        x = rng.exponential(2.0, 60)
        hits += bootstrap(x, np.mean, 0.9, n_boot=400, seed=k).contains(2.0)
    lo, hi = _binomial_band(0.9, trials)
    assert lo - 0.02 <= hits / trials <= hi


def test_bootstrap_is_seeded_and_matches_the_normal_theory_width():
    x = np.random.default_rng(3).normal(0.0, 1.0, 2000)
    a = bootstrap(x, np.mean, n_boot=1000, seed=5)
    assert a == bootstrap(x, np.mean, n_boot=1000, seed=5)
    assert a != bootstrap(x, np.mean, n_boot=1000, seed=6)
    # large n: the bootstrap's half-width is the normal theory's 1.96 s / sqrt(n) to within ~10%
    assert a.half_width == pytest.approx(1.96 * x.std(ddof=1) / math.sqrt(len(x)), rel=0.1)
    assert a.method == "bootstrap over queries" and a.n == 2000 and a.point == pytest.approx(x.mean())
    rows = np.stack([x, 2 * x], axis=1)  # rows resampled together
    b = bootstrap(rows, lambda r: float(np.mean(r[:, 1] - 2 * r[:, 0])), n_boot=50)
    assert b.lo == b.hi == pytest.approx(0.0, abs=1e-12)


def test_from_replicates_takes_percentiles_and_skips_nan():
    iv = from_replicates(5.0, [*range(101), math.nan], 0.9, n=7, method="bootstrap over executions")
    assert (iv.lo, iv.hi) == pytest.approx((5.0, 95.0)) and iv.n == 7


def test_clopper_pearson_tails_are_exact():
    """Each bound leaves (1 - c) / 2 of the binomial beyond the observed count: P(X >= k | lo) and P(X <= k | hi)."""
    iv = binomial(7, 200, 0.95)
    assert stats.binom.sf(6, 200, iv.lo) == pytest.approx(0.025, rel=1e-6)
    assert stats.binom.cdf(7, 200, iv.hi) == pytest.approx(0.025, rel=1e-6)
    assert binomial(0, 50).lo == 0.0 and binomial(50, 50).hi == 1.0 and iv.point == 7 / 200


def _iv(point, hw, n=5):
    return Interval(point, point - hw, point + hw, n, 0.95, "t over seeds")


def test_tie_rules_on_hand_cases():
    # the difference against the half-widths in quadrature: sqrt(3^2 + 4^2) = 5
    assert tie(_iv(100, 3), _iv(105, 4))          # 5 <= 5
    assert not tie(_iv(100, 3), _iv(105.01, 4))   # just beyond
    assert _iv(100, 3).overlaps(_iv(106, 4)) and not tie(_iv(100, 3), _iv(106, 4))  # overlap is looser
    # single runs tie only within the resolution: DVABatch 1.4% ahead of E-Ebird at 2% resolution
    a, b = single(101.4), single(100.0)
    assert not tie(a, b) and tie(a, b, resolution=0.02) and not tie(a, b, resolution=0.01)
    assert tie(single(3.0), single(3.0))
    assert not tie(single(math.nan), single(1.0))


def test_relative_difference_and_labels():
    a, b = _iv(106.1, 1.0), _iv(100.0, 1.0)
    d = relative_difference(a, b)
    assert d.point == pytest.approx(6.1) and d.half_width == pytest.approx(100 * math.sqrt(2) / 100.0)
    assert compare_label(a, b, ("dvabatch", "delaybatch")) == "dvabatch ahead by 6.1% [4.7, 7.5]"
    # latency: lower is better, so b leads
    assert compare_label(a, b, ("dvabatch", "delaybatch"), higher_is_better=False) == \
        "delaybatch ahead by 6.1% [4.7, 7.5]"
    assert compare_label(single(101.4), single(100.0), ("dvabatch", "e-ebird"), resolution=0.02) == \
        "tie (difference 1.4% within the search's resolution)"
    assert compare_label(_iv(101.4, 2), _iv(100.0, 2), ("a", "b")) == "tie (difference 1.4% within the interval)"
    assert compare_label(single(110.0), single(100.0), ("a", "b")) == "a ahead by 10.0% (single runs: no interval)"
    assert "no difference" in compare_label(single(1.0), single(0.0), ("a", "b"))


def test_a_count_interval_is_whole_counts_never_below_one():
    """Issue 34: replica counts of 1, 1, 2 over three seeds gave the t interval [-0.1, 2.8] (a count below zero);
    a count's interval is the whole numbers around the t interval, at least 1: [1, 3]. One seed stays a single run."""
    from dvasim.reporting.intervals import over_seeds, over_seeds_counts

    raw = over_seeds([1.0, 1.0, 2.0])
    assert raw.lo < 0 < raw.hi < 3
    iv = over_seeds_counts([1.0, 1.0, 2.0])
    assert (iv.lo, iv.hi) == (1.0, 3.0) and iv.point == raw.point
    assert iv.lo <= iv.point <= iv.hi and float(iv.lo).is_integer() and float(iv.hi).is_integer()
    same = over_seeds_counts([2.0, 2.0, 2.0])
    assert (same.lo, same.hi) == (2.0, 2.0)
    one = over_seeds_counts([3.0])
    assert one.method == "single run" and (one.lo, one.hi) == (3.0, 3.0)
