"""One set of verdicts for every run, probe and answer: ``stable``, ``over-SLO``, ``rejecting``, ``metastable``,
``unstable`` (:data:`VERDICTS`, the most severe last).

A run is **stable** only when all of these hold; otherwise its verdict is the most severe that fails, and the
reason names every one that failed:

* **unstable**: the run reached no steady state (:func:`dvasim.reporting.stability.stability`: a query never
  finished, throughput fell short of the offered rate, or the latency grew over the run);
* **metastable**: it served the load from an empty queue (none of the other verdicts), but not after a trigger:
  the same run with a backlog
  (``[workload] backlog``, :func:`recovery`) did not recover. A system that serves a load only when it starts empty
  is not serving it (Bronson et al., HotOS '21; Huang et al., OSDI '22: a trigger pushes it into a state it
  cannot leave by itself). Only a run given a trigger test can get this verdict (``[qos] trigger``; the capacity
  search and ``plan`` test every rate they accept);
* **rejecting**: the queue policy refused (rejected or timed out) more queries than the SLO allows to be late:
  a refused query is a late one, so more than ``1 - percentile / 100`` of them misses the SLO whatever the rest do;
* **over-SLO**: the ``percentile``-th latency of the measured queries exceeds the target (``[qos] target_ms``,
  ``[qos] percentile``: 99 by default, MLPerf LoadGen's Server percentile, ``loadgen/mlperf.conf:83``).

``steady_state`` keeps the stability rule's own answer (``stable`` before issue 34, which printed "stable True"
beside 64% of queries over their target, or 23% refused).

Nothing here imports simpy or torch.
"""

from __future__ import annotations

import math

import numpy as np

from dvasim.reporting.records import REJECTED, TIMED_OUT, status_codes
from dvasim.reporting.stability import level_stats, stability

VERDICTS = ("stable", "over-SLO", "rejecting", "metastable", "unstable")  # least to most severe
RECOVERY_CONFIDENCE = 0.99  # LoadGen's early-stopping confidence (loadgen/results.cc:157), for the recovery test

__all__ = ["VERDICTS", "judge", "recovery", "run_verdict", "worst", "default_backlog", "percentile_ms"]


def worst(verdicts) -> str:
    """The most severe of several verdicts (``stable`` for none)."""
    return max(verdicts, key=VERDICTS.index, default="stable")


def percentile_ms(latency, pct: float) -> float:
    """The ``pct``-th percentile of latencies, an unfinished query (NaN) counting as infinitely late."""
    lat = np.asarray(latency, dtype=np.float64)
    if lat.size == 0:
        return math.nan
    done = lat[~np.isnan(lat)]
    pos = float(pct) / 100.0 * (lat.size - 1)  # numpy's linear rank among all the queries
    if math.ceil(pos) >= done.size:  # the rank reaches the unfinished ones (numpy would say inf - x = nan)
        return math.inf
    return float(np.percentile(done, 100.0 * pos / (done.size - 1))) if done.size > 1 else float(done[0])


def judge(steady: dict, *, latency, slo_ms: float, percentile: float, refused_fraction: float = 0.0,
          trigger: dict | None = None) -> dict:
    """The verdict of a run: ``steady`` is :func:`~dvasim.reporting.stability.stability`'s answer, ``latency`` the
    measured finished queries' latencies (ms), ``refused_fraction`` the share the queue policy refused, ``trigger``
    :func:`recovery`'s answer (or ``None``: no trigger test). Returns ``verdict``, ``verdict_reason``, ``stable``
    (the verdict is ``stable``) and ``steady_state`` (the stability rule's own answer)."""
    allowed = 1.0 - float(percentile) / 100.0
    found: list[tuple[str, str]] = []
    if not steady["stable"]:
        found.append(("unstable", steady["stability_reason"].removeprefix("unstable: ")))
    if refused_fraction > allowed:
        found.append(("rejecting", f"refused {100 * refused_fraction:.1f}% of the queries, more than the "
                                   f"{100 * allowed:.3g}% the p{percentile:g} SLO allows to be late"))
    p = percentile_ms(latency, percentile)
    if p > slo_ms:  # an unfinished query is infinitely late; NaN (nothing measured) is not over
        found.append(("over-SLO", f"p{percentile:g} {p:.4g} ms > {slo_ms:g} ms"))
    if trigger is not None and not trigger["recovered"] and not found:  # it holds from empty, not after a backlog
        found.append(("metastable", trigger["reason"]))
    if not found:
        why = f"steady ({steady['stability_reason'].removeprefix('stable: ')}); p{percentile:g} {p:.4g} ms <= " \
              f"{slo_ms:g} ms"
        if trigger is not None:
            why += f"; {trigger['reason']}"
        return {"verdict": "stable", "verdict_reason": why, "stable": True, "steady_state": bool(steady["stable"])}
    verdict = worst(v for v, _ in found)
    return {"verdict": verdict, "verdict_reason": "; ".join(f"{v}: {r}" for v, r in found), "stable": False,
            "steady_state": bool(steady["stable"])}


def default_backlog(rate_qps: float, slo_ms: float, factor: float = 1.0) -> int:
    """The trigger's backlog, sized from the SLO: the queries that arrive at the offered rate within ``factor``
    SLOs (``ceil(factor * rate * slo)``, at least 1). Served at the offered rate, the last of them waits exactly
    ``factor`` SLOs: with ``factor = 1`` the largest queue a server meeting its SLO at that rate could ever have
    to work off, so a server that cannot work it off cannot be trusted with the load."""
    return max(1, math.ceil(factor * float(rate_qps) * float(slo_ms) / 1000.0))


def recovery(arrival, finish, backlog: int, slo_ms: float, percentile: float, status=None) -> dict:
    """Did a run started with ``backlog`` queries waiting (its first ``backlog`` queries by id) recover? The stream
    after the backlog (the other queries) is judged on its second half by arrival: recovered when that half is in a
    steady state (:func:`~dvasim.reporting.stability.stability`) and its share of queries slower than ``slo_ms``
    (unfinished ones included) is not above the allowed ``1 - percentile / 100`` with 99% confidence (the
    one-sided Clopper-Pearson lower bound; LoadGen's early-stopping confidence), the late queries counted as
    fewer by the variance of their batch means as a probe counts them
    (:func:`dvasim.reporting.intervals.inflation`: late queries come in busy periods, and a short stream's share
    of them swings; counted as independent, an M/D/1 queue at 73% load "failed to recover" in 1 s streams). A server that works the backlog
    off is back to its steady state long before the stream's midpoint (at 98% load a one-SLO backlog takes 49
    SLOs); one that collapsed under it stays collapsed. Returns ``recovered``, ``reason``, ``backlog``,
    ``slow_fraction`` and ``n_judged``."""
    from dvasim.reporting.intervals import clopper_pearson, inflation

    a = np.asarray(arrival, dtype=np.float64)[backlog:]
    f = np.asarray(finish, dtype=np.float64)[backlog:]
    st = None if status is None else np.asarray(status)[backlog:]
    order = np.argsort(a, kind="stable")
    half = order[len(order) // 2:]
    a, f = a[half], f[half]
    st = None if st is None else st[half]
    lat = f - a
    n = len(lat)
    late = ~(lat <= slo_ms)
    slow = int(np.count_nonzero(late))
    allowed = 1.0 - float(percentile) / 100.0
    vif = inflation(late)  # (in arrival order) late queries cluster in busy periods, as in a probe
    lower = clopper_pearson(slow / vif, n / vif, RECOVERY_CONFIDENCE)[0] if n else 1.0
    steady = stability(a, f, status=st) if n else {"stable": False, "stability_reason": "no query to judge"}
    ok = bool(steady["stable"]) and lower <= allowed
    frac = slow / n if n else math.nan
    if ok:
        reason = (f"recovered from a backlog of {backlog} queries ({100 * frac:.2f}% over {slo_ms:g} ms in the "
                  f"stream's second half)")
    else:
        what = f"{100 * frac:.1f}% of its queries over {slo_ms:g} ms"
        if not steady["stable"]:
            what += "; " + steady["stability_reason"].removeprefix("unstable: ")
        reason = (f"did not recover from a backlog of {backlog} queries (the stream's second half: {what}); it "
                  f"holds the load only from an empty queue")
    return {"recovered": ok, "reason": reason, "backlog": int(backlog), "slow_fraction": frac, "n_judged": n,
            "variance_inflation": vif}


def run_verdict(store, cfg: dict, offered: np.ndarray, trigger: dict | None = None) -> dict:
    """The summary keys a run adds: :func:`stability` of its measured queries (with ``[qos] warmup_fraction``;
    an interrupted run's queries that had not arrived are left out), the verdict
    (:func:`dvasim.reporting.verdict.judge`: ``verdict``, ``verdict_reason``, ``stable``, ``steady_state``; with
    ``trigger``, :func:`~dvasim.reporting.verdict.recovery`'s answer) and for a stepping load the ``levels`` list
    (:func:`level_stats` of each level)."""
    qos = cfg["qos"]
    arrival, _, finish, _ = store.measured()
    status = store.measured_status()
    out = stability(arrival, finish, qos.get("warmup_fraction", 0.0), status=status)
    w = out["warmup_queries"]
    codes = status_codes(status)
    refused = (codes == REJECTED) | (codes == TIMED_OUT)
    lat = (finish - arrival)[w:][~refused[w:]] if len(arrival) > w else np.empty(0)
    out.update(judge(out, latency=lat, slo_ms=qos["target_ms"], percentile=qos.get("percentile", 99.0),
                     refused_fraction=out.get("refused_fraction", 0.0), trigger=trigger))
    if trigger is not None:
        out["trigger"] = trigger
    if cfg["workload"].get("kind") == "stepping":
        out["levels"] = level_stats(finish - arrival, offered[:len(arrival)], qos["target_ms"],
                                    arrival=arrival, finish=finish, status=status)
    return out
