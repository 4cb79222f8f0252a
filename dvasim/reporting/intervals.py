"""Error bars: an interval next to every point value, and when a difference is a tie (issue 24).

Differences of 1-5% between batching systems were printed without any sense of their noise (DVABatch led E-Ebird
on VGG19 by 1.4%, inside the capacity search's 2% resolution). Every number a study compares carries an
:class:`Interval`, made one of three ways (its ``method``):

* ``"t over seeds"`` (:func:`over_seeds`): the mean of ``n`` independent repetitions (runs with seeds ``s, s+1,
  ...``; capacity searches that share no seed) and Student's t interval ``mean +- t(1 - a/2, n - 1) s / sqrt(n)``,
  ``a = 1 - confidence``. Exact for normal values, close for means of a few values that are roughly normal; sound
  for anything computed from whole independent runs (a run's mean or p99 latency, a capacity found by search).
* ``"bootstrap over queries"`` (:func:`bootstrap`; the fit's own ``"bootstrap over executions"``): the percentile
  bootstrap, ``n_boot`` resamples with replacement of the units, seeded (the same values and seed give the same
  interval). **Sound only where the units are independent, or nearly so** (i.i.d.-ish per-query or per-execution
  values: a replay's launch costs, copies, per-query service times). **Not** for the latencies of one queueing run
  (successive queries wait behind the same backlog: resampling them as if independent makes the interval far too
  narrow) and **not** for a capacity found by search (one number per search: there is nothing to resample); use
  seeds for those.
* ``"Clopper-Pearson"`` (:func:`binomial`): the exact two-sided binomial interval of a share ``k / n``.
* ``"single run"``: one value, no interval (``lo = hi = point``).

**Ties** (:func:`tie`): ``a`` and ``b`` tie when ``|a - b| <= sqrt(hw(a)^2 + hw(b)^2)`` (``hw`` the half-widths:
the difference is within its own interval, the two half-widths added in quadrature as for independent estimates,
which is conservative for paired runs that share seeds) **or** ``|a - b| <= resolution * max(|a|, |b|)`` (the
search's resolution: two capacities found to 2% cannot be told apart by less). Two single runs tie only within the
resolution (or when equal). Non-overlapping intervals never tie; overlapping ones may not either when their
overlap is small (:meth:`Interval.overlaps` is the looser test, kept for plots). :func:`compare_label` words it.

Uses numpy and scipy (the t and beta quantiles); no engine, no simpy, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

METHODS = ("t over seeds", "bootstrap over queries", "bootstrap over executions", "Clopper-Pearson", "single run")
N_BOOT = 2000  # the default resamples of bootstrap(): the 2.5% and 97.5% percentiles within ~1% of their limit


def _fmt(x: float, ref: float, digits: int = 4) -> str:
    """``x`` with as many decimals as ``ref`` (the point) needs for ``digits`` significant digits."""
    if not math.isfinite(x):
        return str(x)
    r = abs(ref) if math.isfinite(ref) and ref != 0 else abs(x)
    decimals = 0 if r == 0 else min(6, max(0, digits - 1 - math.floor(math.log10(r))))
    return f"{x:.{decimals}f}"


@dataclass(frozen=True)
class Interval:
    """A point value with its interval ``[lo, hi]`` at ``confidence``, from ``n`` values (seeds, queries,
    executions) by ``method`` (module docstring)."""

    point: float
    lo: float
    hi: float
    n: int
    confidence: float
    method: str

    @property
    def half_width(self) -> float:
        """Half the interval's width (0 for a single run)."""
        return (self.hi - self.lo) / 2.0

    def overlaps(self, other: Interval) -> bool:
        """Do the two intervals share a point? (A looser test than :func:`tie`.)"""
        return self.lo <= other.hi and other.lo <= self.hi

    def contains(self, x: float) -> bool:
        """Is ``x`` within ``[lo, hi]``?"""
        return self.lo <= x <= self.hi

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict of plain numbers and strings (for JSON)."""
        return {k: (float(v) if isinstance(v, float | np.floating) else v) for k, v in asdict(self).items()}

    def __str__(self) -> str:
        if self.method == "single run":
            return f"{_fmt(self.point, self.point)} (single run)"
        return f"{_fmt(self.point, self.point)} [{_fmt(self.lo, self.point)}, {_fmt(self.hi, self.point)}]"

    def __format__(self, spec: str) -> str:
        """``f"{iv:.1f}"`` formats the three numbers with ``.1f``; an empty spec is :meth:`__str__`."""
        if not spec:
            return str(self)
        if self.method == "single run":
            return f"{format(self.point, spec)} (single run)"
        return f"{format(self.point, spec)} [{format(self.lo, spec)}, {format(self.hi, spec)}]"


def _check_confidence(confidence: float) -> float:
    c = float(confidence)
    if not 0.0 < c < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return c


def single(point: float, n: int = 1) -> Interval:
    """A value without an interval (one run)."""
    p = float(point)
    return Interval(p, p, p, int(n), 0.0, "single run")


def over_seeds(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """The mean of ``values`` (one per seed: independent repetitions) and Student's t interval at ``confidence``;
    one value is a ``"single run"`` (``lo = hi = point``). A value that is not finite makes the interval NaN
    (the point is the mean, possibly infinite)."""
    from scipy.stats import t

    c = _check_confidence(confidence)
    x = np.asarray(values, dtype=float).ravel()
    if x.size == 0:
        raise ValueError("over_seeds: need at least one value")
    if x.size == 1:
        return single(x[0])
    point = float(np.mean(x))
    if not np.isfinite(x).all():
        return Interval(point, math.nan, math.nan, int(x.size), c, "t over seeds")
    half = float(t.ppf(0.5 + c / 2.0, x.size - 1) * np.std(x, ddof=1) / math.sqrt(x.size))
    return Interval(point, point - half, point + half, int(x.size), c, "t over seeds")


def over_seeds_counts(values: Sequence[float], confidence: float = 0.95, minimum: int = 1) -> Interval:
    """:func:`over_seeds` for counts (replicas, GPUs): the t interval widened to the whole numbers around it and
    never below ``minimum`` (issue 34: a replica count's interval read [-0.1, 2.8]; it is now [1, 3])."""
    iv = over_seeds(values, confidence)
    if iv.method == "single run" or not (math.isfinite(iv.lo) and math.isfinite(iv.hi)):
        return iv
    lo = max(float(minimum), float(math.floor(iv.lo + 1e-9)))
    hi = max(lo, float(math.ceil(iv.hi - 1e-9)))
    return Interval(iv.point, lo, hi, iv.n, iv.confidence, "t over seeds, widened to whole counts")


def from_replicates(point: float, replicates: Sequence[float], confidence: float = 0.95, *, n: int,
                    method: str = "bootstrap over queries") -> Interval:
    """The percentile interval of bootstrap ``replicates`` (NaN ones left out) around ``point``, from ``n`` units:
    for fits that resample their units once and compute many statistics from each resample."""
    c = _check_confidence(confidence)
    r = np.asarray(replicates, dtype=float)
    r = r[np.isfinite(r)]
    if r.size == 0:
        return Interval(float(point), math.nan, math.nan, int(n), c, method)
    lo, hi = np.quantile(r, [0.5 - c / 2.0, 0.5 + c / 2.0])
    return Interval(float(point), float(lo), float(hi), int(n), c, method)


def bootstrap(values, statistic: Callable[[np.ndarray], float], confidence: float = 0.95, n_boot: int = N_BOOT,
              seed: int = 0, method: str = "bootstrap over queries") -> Interval:
    """``statistic(values)`` and its percentile-bootstrap interval: ``n_boot`` resamples of ``values``' rows (its
    first axis: queries, executions) with replacement, from ``numpy.random.default_rng(seed)``, so the same values
    and seed give the same interval.

    Sound when the rows are independent or nearly so (per-query service times, a replay's per-execution launch
    costs); **not** for one queueing run's latencies (correlated: the interval comes out far too narrow) nor for a
    capacity found by search (one number per search): repeat those over seeds (:func:`over_seeds`)."""
    c = _check_confidence(confidence)
    x = np.asarray(values)
    if x.shape[0] == 0:
        raise ValueError("bootstrap: need at least one value")
    if int(n_boot) < 1:
        raise ValueError(f"bootstrap: n_boot must be at least 1, got {n_boot!r}")
    point = float(statistic(x))
    rng = np.random.default_rng(seed)
    n = x.shape[0]
    reps = [float(statistic(x[rng.integers(0, n, n)])) for _ in range(int(n_boot))]
    return from_replicates(point, reps, c, n=n, method=method)


def binomial(k: int, n: int, confidence: float = 0.95) -> Interval:
    """The share ``k / n`` and its exact two-sided Clopper-Pearson interval (each tail ``(1 - confidence) / 2``)."""
    from scipy.stats import beta

    c = _check_confidence(confidence)
    k, n = int(k), int(n)
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"binomial: need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    a = (1.0 - c) / 2.0
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1.0 - a, k + 1, n - k))
    return Interval(k / n, lo, hi, n, c, "Clopper-Pearson")


def _scale(a: Interval, b: Interval) -> float:
    return max(abs(a.point), abs(b.point))


def tie(a: Interval, b: Interval, resolution: float = 0.0) -> bool:
    """Is the difference between ``a`` and ``b`` within the noise? ``|a - b| <= sqrt(hw(a)^2 + hw(b)^2)`` (the
    difference within its interval) or ``|a - b| <= resolution * max(|a|, |b|)`` (within the resolution of the
    search that found them). A NaN point or interval is never a tie (nothing can be said)."""
    d = abs(a.point - b.point)
    if not math.isfinite(d):
        return False
    if d <= float(resolution) * _scale(a, b):
        return True
    hw = math.hypot(a.half_width, b.half_width)
    return math.isfinite(hw) and d <= hw


def relative_difference(a: Interval, b: Interval) -> Interval:
    """``100 (a - b) / |b|`` (percent of ``b``) and its interval: the half-widths added in quadrature, over
    ``|b|`` (``b`` taken as exact in the denominator); ``"single run"`` when both are single runs."""
    if b.point == 0 or not math.isfinite(b.point):
        return Interval(math.nan, math.nan, math.nan, min(a.n, b.n), a.confidence, "relative difference")
    rel = 100.0 * (a.point - b.point) / abs(b.point)
    if a.method == "single run" and b.method == "single run":
        return single(rel)
    hw = 100.0 * math.hypot(a.half_width, b.half_width) / abs(b.point)
    return Interval(rel, rel - hw, rel + hw, min(a.n, b.n), max(a.confidence, b.confidence),
                    "relative difference (half-widths in quadrature)")


def compare_label(a: Interval, b: Interval, names: Sequence[str], *, higher_is_better: bool = True,
                  resolution: float = 0.0) -> str:
    """One phrase for ``a`` against ``b`` (``names``: theirs), percentages of ``b``'s value: ``"dvabatch ahead by
    6.1% [3.2, 9.0]"``, or ``"tie (difference 1.4% within the interval)"`` (or ``"... within the search's
    resolution"``) when :func:`tie`. ``higher_is_better``: capacity (True) or latency (False)."""
    name_a, name_b = names[0], names[1]
    d = relative_difference(a, b)
    if not math.isfinite(d.point):
        return f"{name_a} vs {name_b}: no difference can be given ({name_b}'s value is {b.point:g})"
    if tie(a, b, resolution):
        within = abs(a.point - b.point) <= float(resolution) * _scale(a, b)
        why = "the search's resolution" if within and resolution > 0 else "the interval"
        return f"tie (difference {abs(d.point):.1f}% within {why})"
    sign = 1.0 if higher_is_better else -1.0
    ahead = sign * d.point > 0
    winner = name_a if ahead else name_b
    pct = abs(d.point)
    if d.method == "single run":
        return f"{winner} ahead by {pct:.1f}% (single runs: no interval)"
    lo, hi = sorted((abs(d.lo), abs(d.hi))) if d.lo * d.hi > 0 else (0.0, max(abs(d.lo), abs(d.hi)))
    return f"{winner} ahead by {pct:.1f}% [{lo:.1f}, {hi:.1f}]"


def against_best(values: dict[str, Interval], *, higher_is_better: bool = True, resolution: float = 0.0,
                 unit: str = "") -> dict:
    """Every entry against the best one (issue 34: never against whichever came first, never a percentage of zero
    or of a negative base). The best is the highest point (``higher_is_better``; else the lowest), the earlier
    listed on equal points. Returns ``best``, ``rows`` (one per other entry: ``name``, ``against``,
    ``difference_%`` of the best's value and its interval, ``tie`` (:func:`tie` at ``resolution``) and a
    ``label`` such as ``"delaybatch: 18.2% below dvabatch [12.0, 24.4]"`` or ``"zerobatch: tie with dvabatch
    (difference 1.4% within the interval)"``) and ``ranking``: the names best first (``>``: better than), ``=``
    before an entry tied with the best or with the entry just before it, ``>`` otherwise
    (``"dvabatch = delaybatch > zerobatch = graphbatch"``; every entry tied: all ``=``).
    When the best's value is zero or not finite, percentages cannot be given: the rows say the raw values."""
    names = list(values)
    if not names:
        return {"best": None, "rows": [], "ranking": ""}
    sign = 1.0 if higher_is_better else -1.0
    order = sorted(range(len(names)), key=lambda i: (-sign * values[names[i]].point
                                                     if math.isfinite(values[names[i]].point) else math.inf, i))
    best = names[order[0]]
    b = values[best]
    rows = []
    for i in order[1:]:
        name = names[i]
        a = values[name]
        same = tie(a, b, resolution)
        d = relative_difference(a, b) if b.point > 0 and math.isfinite(b.point) else None
        if d is None or not math.isfinite(d.point):
            label = (f"{name}: tie with {best}" if same else f"{name}: {a.point:g}{unit} against {best}'s "
                     f"{b.point:g}{unit} (no percentage of {b.point:g})")
            rows.append({"name": name, "against": best, "difference_%": math.nan,
                         "difference_interval_%": [math.nan, math.nan], "tie": same, "label": label})
            continue
        if same:
            within = abs(a.point - b.point) <= float(resolution) * _scale(a, b)
            why = "the search's resolution" if within and resolution > 0 else "the interval"
            label = f"{name}: tie with {best} (difference {abs(d.point):.1f}% within {why})"
        else:
            word = "below" if higher_is_better else "above"
            lo, hi = sorted((abs(d.lo), abs(d.hi))) if d.lo * d.hi > 0 else (0.0, max(abs(d.lo), abs(d.hi)))
            span = " (single runs: no interval)" if d.method == "single run" else f" [{lo:.1f}, {hi:.1f}]"
            label = f"{name}: {abs(d.point):.1f}% {word} {best}{span}"
        rows.append({"name": name, "against": best, "difference_%": d.point, "difference_interval_%": [d.lo, d.hi],
                     "tie": same, "label": label})
    ranking, before = best, b
    for r in rows:
        a = values[r["name"]]
        ranking += (" = " if r["tie"] or tie(a, before, resolution) else " > ") + r["name"]
        before = a
    return {"best": best, "rows": rows, "ranking": ranking}


BATCHES = 30  # consecutive batches of a probe's queries for the late share's variance (batch means)


def inflation(late: np.ndarray, batches: int = BATCHES) -> float:
    """How much more the late share of a run varies than independent queries' would: the variance of the late
    share over ``batches`` consecutive batches of queries (batch means), over the binomial variance ``p (1 - p) /
    m`` of a batch of ``m``; at least 1. Successive latencies in a queue are correlated (late queries come in
    busy periods), so ``k`` late of ``n`` carry the evidence of ``k / f`` of ``n / f`` independent ones: the probe's
    bounds use those (LoadGen's early stopping assumes independent queries and makes up for it with 600 s runs;
    a 10 s probe cannot). With no late query, or all, there is no variance to measure: 1."""
    n = late.size
    k = int(np.count_nonzero(late))
    if k == 0 or k == n or n < 2 * batches:
        return 1.0
    m = n // batches
    shares = late[:m * batches].reshape(batches, m).mean(axis=1)
    p = k / n
    return max(1.0, float(shares.var(ddof=1)) * m / (p * (1.0 - p)))


def clopper_pearson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """One-sided bounds ``(lower, upper)`` on a binomial fraction after ``k`` successes in ``n`` trials: each
    holds with probability ``confidence``."""
    # imported here: scipy.stats takes half a second, and the command line's parser imports this module (its help)
    from scipy.stats import beta

    a = 1.0 - confidence
    lower = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    upper = 1.0 if k == n else float(beta.ppf(1.0 - a, k + 1, n - k))
    return lower, upper
