"""Is a run stable? A verdict from the per-query arrays, per-level summaries of stepping runs, the offered rate.

An open-loop run whose offered rate exceeds what the server can serve never reaches a steady state: its queue,
and with it every query's latency, grows for as long as the run lasts, so its mean and percentiles say more about
the run's length than about the server (BERT-base under DelayBatch at 500 QPS: the mean latency doubles each time
the run doubles). :func:`stability` flags such runs. The rule (``stable`` is false if any part fails):

1. **Every query finished.** A query that never finished (a stuck run) has no latency; the statistics leave it out.
2. **Throughput keeps up with the offered load**: ``throughput_ratio`` = the measured queries' arrival span over
   their finish span (``a_last - a_first`` over ``f_last - f_first``), i.e. the rate at which they were served
   over the rate at which they were offered, each measured over the same queries. Unstable if it is below
   :data:`THROUGHPUT_MIN` (0.97) and also below ``1 - p99_first / (f_last - f_first)`` (the two together:
   ``throughput_ratio_min``). A stable run's finish span exceeds its arrival span by about the latency of its
   last queries, no small share of a short run; ``p99_first``, the 99th percentile latency of the first third of
   the measured queries, bounds that latency before an overload has added much to it. An overload by a factor
   ``rho > 1`` gives a ratio near ``1 / rho`` whatever the run's length (BERT-base, DelayBatch, 500 QPS against
   a capacity near 410: 0.74 to 0.81 at 1,500 to 6,000 queries; M/D/1 at ``rho = 1.2``: 0.81 to 0.85), while a
   stable run of a few thousand queries at up to 80% load stays above 0.99. 3% is the shortfall tolerated: well
   above that end effect and below the ratio of the mild overloads that matter (``rho = 1.05`` gives 0.95).
3. **Latency does not grow over the run**: ``latency_trend`` = the mean latency of the last third of the measured
   queries (by arrival) over that of the first third. Unstable if it exceeds :data:`TREND_MAX` (1.5) *and* the
   growth is significant: ``latency_trend_z`` = (last mean - first mean) / its standard error > :data:`TREND_Z`
   (4). The standard error comes from batch means (each third cut into 5 consecutive batches; the pooled
   variance of the batch means about their third's mean, 12 degrees of freedom), because successive latencies in
   a queue are strongly correlated and their plain standard error would be far too small. A queue that cannot
   keep up grows its latency linearly with time, so the last third's mean is several times the first's (4 to 15
   in the examples above) and ``z`` is large (8 to 12; a pure linear growth gives 15.5); a stationary queue's
   thirds agree to within their noise. The factor 1.5 keeps a stable run near saturation, whose thirds differ by
   chance (and by the first third's start from an empty system), from being called unstable on noise alone;
   ``z`` keeps a short run's one burst from counting as growth.

Calibration against an independent M/D/1 queue (Lindley's recursion, 400 seeds each): the share of runs called
unstable is 0 at ``rho = 0.5`` (200 to 6,000 queries); at ``rho = 0.8`` 6% with 200 queries, 0.5% with 500 and
at most 0.3% from 1,500 on; at ``rho = 0.9`` 0.5 to 0.7% from 1,500 on. Overloaded: ``rho = 1.05`` 91% at
1,500 queries, 96% at 3,000, 99% at 6,000; ``rho = 1.1`` 94% at 500 and all from 1,500 on; ``rho = 1.2`` all
from 500 on. Near ``rho = 1`` neither the shortfall nor the growth stands out of the noise of one run: a
verdict there is a coin toss, as it is for any finite run.

**Refused queries** (Triton's queue policy: ``status`` ``"rejected"`` at a full queue, ``"timed_out"`` past a
timeout; :mod:`dvasim.reporting.records`) left with an error and no answer. They are not "never finished" (rule
1 does not count them) and have no latency: rules 2 and 3 measure the served queries. A server that sheds load
with a bounded queue reaches a steady state however high the offered rate (its queue, and so its latency, stays
bounded; an M/D/1/K queue is stable at any load), so the verdict can be "stable" while it refuses many queries:
it says the statistics describe a steady state, not that the offered load was served. The reason then says how
many were refused (``refused_fraction``), and the run's summary counts them (``n_rejected``, ``n_timed_out``)
as QoS violations (``qos_violation_rate``): judge a load-shedding server on those, or on the capacity search
(``dvasim capacity``), where a refused query counts as a slow one.

Runs with fewer than :data:`MIN_QUERIES` measured queries are judged on rule 1 only (too few to measure a trend).
A closed loop is stable by construction (each client waits for its answer) and comes out so.

``warmup_fraction`` (``[qos] warmup_fraction``, default 0) leaves the first fraction of the queries (by arrival)
out of the measures: the start from an empty system is not steady state. It changes only the verdict, not the
run's latency statistics.

How this relates to the references (both measure a real server; ours is one finished simulation, so the
windows are cut afterwards): Triton's perf_analyzer repeats measurement windows until three consecutive ones
agree within ``--stability-percentage`` (10% by default) in both throughput and latency; MLPerf LoadGen's server
scenario reports the scheduled and the completed rate and calls a run INVALID when its latency percentile
exceeds the bound (an overloaded run does once its queue has grown far enough). Here throughput against the offered load is rule 2 and the
agreement of windows is rule 3, with a tolerance derived from the run's own noise instead of a fixed 10%, since a
Poisson load's windows of a few hundred queries differ by more than 10% in latency even when stable.

Nothing here imports simpy or torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from dvasim.reporting.records import REJECTED, TIMED_OUT, status_codes

THROUGHPUT_MIN = 0.97  # served over offered rate below this (and below the short-run allowance): unstable
TREND_MAX = 1.5  # last third's mean latency over the first third's above this ...
TREND_Z = 4.0  # ... and the growth this many standard errors above zero: unstable
MIN_QUERIES = 60  # fewer measured queries: judged on completion only
BATCHES_PER_THIRD = 5  # batch means for the trend's standard error
RATE_KINDS = ("poisson", "uniform", "gamma")  # workload kinds whose offered rate is rate_qps

__all__ = ["stability", "level_stats", "offered_rates", "THROUGHPUT_MIN", "TREND_MAX", "TREND_Z",
           "MIN_QUERIES"]


def _fmt_pct(x: float) -> str:
    return f"{100.0 * x:.1f}%"


def stability(arrival, finish, warmup_fraction: float = 0.0, status=None) -> dict:
    """The stability verdict of a run from its per-query ``arrival`` and ``finish`` times (ms; NaN ``finish``:
    never finished, or refused), in any order. ``status`` (the records' status codes or names, optional): which
    of the NaN ``finish`` were refused by a queue policy rather than never finished. Returns ``stable`` (bool),
    ``stability_reason`` (a short sentence), ``throughput_ratio`` and ``throughput_ratio_min`` (rule 2),
    ``latency_trend`` and ``latency_trend_z`` (rule 3), ``warmup_queries`` (how many of the earliest arrivals
    were left out) and, when some were refused, ``refused_fraction``. See the module docstring for the rule and
    its thresholds."""
    arrival = np.asarray(arrival, dtype=np.float64)
    finish = np.asarray(finish, dtype=np.float64)
    if arrival.shape != finish.shape or arrival.ndim != 1:
        raise ValueError("arrival and finish must be 1-D arrays of the same length")
    if not (0.0 <= warmup_fraction < 1.0):
        raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction!r}")
    n = len(arrival)
    n_refused = 0
    if status is not None:
        codes = status_codes(status)
        n_refused = int(np.count_nonzero((codes == REJECTED) | (codes == TIMED_OUT)))
    n_unfinished = int(np.count_nonzero(np.isnan(finish))) - n_refused
    w = int(math.floor(warmup_fraction * n))
    out = {"stable": True, "stability_reason": "", "throughput_ratio": math.nan, "throughput_ratio_min": math.nan,
           "latency_trend": math.nan, "latency_trend_z": math.nan, "warmup_queries": w}
    problems = []
    if n_unfinished:
        problems.append(f"{n_unfinished} of {n} queries never finished")
    if n_refused:
        out["refused_fraction"] = n_refused / n
        return _refused(_measure(out, problems, arrival, finish, w), n_refused, n)
    return _measure(out, problems, arrival, finish, w)


def _refused(out: dict, n_refused: int, n: int) -> dict:
    """The verdict's reason, with how many queries the queue policy refused."""
    out["stability_reason"] += (f"; refused {n_refused} of {n} queries ({_fmt_pct(n_refused / n)}: rejected or "
                                "timed out, not in the latency statistics)")
    return out


def _measure(out: dict, problems: list[str], arrival: np.ndarray, finish: np.ndarray, w: int) -> dict:
    """Rules 2 and 3 on the finished queries, after the first ``w`` arrivals; the verdict."""
    n = len(arrival)
    # the measured queries, in arrival order (query ids are in arrival order for open loops: no sort then)
    if n > 1 and np.any(np.diff(arrival) < 0):
        order = np.argsort(arrival, kind="stable")[w:]
        a, f = arrival[order], finish[order]
    else:
        a, f = arrival[w:], finish[w:]
    done = ~np.isnan(f)
    a, f = (a, f) if done.all() else (a[done], f[done])
    m = len(a)
    if m < MIN_QUERIES:
        return _verdict(out, problems, f"stable: all queries finished (too few measured queries, {m} < "
                                       f"{MIN_QUERIES}, to judge throughput and latency trend)")
    lat = f - a
    thirds = np.array_split(lat, 3)
    # rule 2: served over offered rate, with the short-run allowance
    span_in = float(a[-1] - a[0])
    span_out = float(f.max() - f.min())
    ratio = span_in / span_out if span_out > 0 else (1.0 if span_in == 0 else math.inf)
    allowance = float(np.percentile(thirds[0], 99)) / span_out if span_out > 0 else 0.0
    ratio_min = min(THROUGHPUT_MIN, 1.0 - allowance)
    out["throughput_ratio"] = ratio
    out["throughput_ratio_min"] = ratio_min
    if ratio < ratio_min:
        problems.append(f"served {_fmt_pct(ratio)} of the offered rate (< {_fmt_pct(ratio_min)})")
    # rule 3: growth of the mean latency from the first to the last third, against its batch-means error
    first, last = float(thirds[0].mean()), float(thirds[2].mean())
    trend = last / first if first > 0 else (1.0 if last == first else math.inf)
    batch_means = [np.array([b.mean() for b in np.array_split(t, BATCHES_PER_THIRD)]) for t in thirds]
    ss = sum(float(((bm - bm.mean()) ** 2).sum()) for bm in batch_means)
    dof = sum(len(bm) - 1 for bm in batch_means)
    se = math.sqrt(ss / dof) * math.sqrt(2.0 / BATCHES_PER_THIRD) if dof > 0 else 0.0
    diff = last - first
    z = diff / se if se > 0 else (0.0 if diff == 0 else math.copysign(math.inf, diff))
    out["latency_trend"] = trend
    out["latency_trend_z"] = z
    if trend > TREND_MAX and z > TREND_Z:
        problems.append(f"mean latency grew {trend:.2f}x from the first to the last third of the run "
                        f"(> {TREND_MAX:g}x, z = {z:.1f})")
    return _verdict(out, problems, f"stable: served {_fmt_pct(ratio)} of the offered rate, mean latency "
                                   f"{trend:.2f}x from the first to the last third")


def _verdict(out: dict, problems: list[str], stable_reason: str) -> dict:
    """Fill ``stable`` and ``stability_reason`` from the problems found (none: ``stable_reason``)."""
    out["stable"] = not problems
    out["stability_reason"] = "unstable: " + "; ".join(problems) if problems else stable_reason
    return out


def level_stats(latency, rates, qos_ms: float, pct: float = 99.0, arrival=None, finish=None,
                status=None) -> list[dict]:
    """Per offered-rate level of a stepping run (``rates``: each query's level, in query order; ``latency``: NaN
    for unfinished queries, which count as infinitely late): ``offered_qps``, ``n``, ``mean_latency_ms``,
    ``p{pct}_latency_ms``, ``within_qos`` (that percentile within ``qos_ms``); with ``arrival`` and ``finish``
    also ``throughput_qps`` (finished queries over first arrival to last finish, as in the run's summary),
    ``stable``, ``throughput_ratio`` and ``latency_trend`` (:func:`stability` of the level's queries; ``status``:
    the records' status, so that refused queries are not taken for unfinished ones)."""
    lat = np.asarray(latency, dtype=np.float64).copy()
    lat[np.isnan(lat)] = np.inf
    rates = np.asarray(rates, dtype=np.float64)
    codes = None if status is None else status_codes(status)
    if arrival is not None:
        arrival = np.asarray(arrival, dtype=np.float64)
        finish = np.asarray(finish, dtype=np.float64)
    key = f"p{pct:g}_latency_ms"
    out = []
    for r in np.unique(rates):
        mask = rates == r
        q = float(np.percentile(lat[mask], pct))
        row = {"offered_qps": float(r), "n": int(mask.sum()), "mean_latency_ms": float(np.mean(lat[mask])), key: q,
               "within_qos": bool(q <= qos_ms)}
        if arrival is not None:
            a, f = arrival[mask], finish[mask]
            done = ~np.isnan(f)
            span = float(f[done].max() - a.min()) if done.any() else math.nan
            row["throughput_qps"] = float(done.sum() / (span / 1000.0)) if span > 0 else math.nan
            v = stability(a, f, status=None if codes is None else codes[mask])
            row.update(stable=v["stable"], throughput_ratio=v["throughput_ratio"], latency_trend=v["latency_trend"])
        out.append(row)
    return out


def offered_rates(workload: Mapping, n: int) -> np.ndarray:
    """Each query's offered rate (QPS) under a ``[workload]`` section: its level's rate for ``stepping``, its
    phase's for ``phases``, ``rate_qps`` for the constant-rate kinds (:data:`RATE_KINDS`), NaN for the others
    (explicit, closed, trace: their rate is not a setting)."""
    kind = workload.get("kind")
    if kind == "stepping":
        from dvasim.workload import stepping_rates

        keys = ("start_qps", "end_qps", "step_queries", "n_queries")
        return stepping_rates(**{k: workload[k] for k in keys if k in workload})
    if kind == "phases":
        from dvasim.workload.arrivals import phases_rates

        return phases_rates(workload["phases"])
    if kind in RATE_KINDS:
        return np.full(n, float(workload["rate_qps"]))
    return np.full(n, math.nan)
