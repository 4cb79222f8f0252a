"""Capacity under a latency SLO: the highest offered rate whose ``percentile``-th latency stays within ``slo_ms``.

For any config with an open-loop rate (``[workload] kind = "poisson"`` or ``"uniform"``; the config's other
workload keys are kept), :func:`capacity` brackets the capacity and bisects it:

1. **Bracket.** From ``lo`` (default: 1 qps) and ``hi`` (default: twice the throughput bound of the table: the
   best ``b / T(b)`` of the slowest stage, times the instances), ``hi`` is doubled until a probe fails, at most
   ``max_doublings`` times; a bracket top that was never exceeded is flagged (``top_exceeded = false``: the
   capacity is at least the reported value).
2. **Bisect** in log scale until ``hi / lo - 1 <= resolution`` (default 2%); the capacity is ``lo``.

**A probe** (one offered rate) runs the config at that rate and decides whether the SLO holds *with confidence*,
in the spirit of MLPerf LoadGen's early stopping: the SLO holds when the fraction of queries slower than
``slo_ms`` (unfinished ones count as slower) is at most ``1 - percentile / 100``. With ``k`` slow queries out of
``n``, the one-sided Clopper-Pearson bounds at ``confidence`` (default 95%) on the true fraction decide: pass if
the upper bound is within the allowed fraction, fail if the lower bound is above it. Otherwise the probe runs
again with twice the queries (and a new seed), from ``min_queries`` (default: the fewest that can pass with no
slow query: ``ln(1 - confidence) / ln(percentile / 100)``, 299 for p99 at 95%, and at least 1,000) up to
``max_queries`` (default 64,000); still undecided there, the point estimate decides and the probe is marked
``decided_by = "estimate"``. A run whose throughput falls short of the offered rate (unstable) fails.

:func:`capacity` returns a dict (also written to ``capacity.json`` by ``dvasim capacity``): ``capacity_qps``, the
bracket, the resolution reached, ``top_exceeded``, the serving ``stack`` the probes ran on and every probe.
``stack`` (a stack's name, :mod:`dvasim.server`) and ``engine`` (an engine file from ``dvasim fit``) apply to every
probe, as ``dvasim run --stack / --engine`` does; the engine file is merged before ``overrides``.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import numpy as np
from scipy.stats import beta

from dvasim import config as cfgmod
from dvasim.errors import ConfigError, IncompleteRunWarning

RATE_KINDS = ("poisson", "uniform")


def clopper_pearson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """One-sided bounds ``(lower, upper)`` on a binomial fraction after ``k`` successes in ``n`` trials: each
    holds with probability ``confidence``."""
    a = 1.0 - confidence
    lower = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    upper = 1.0 if k == n else float(beta.ppf(1.0 - a, k + 1, n - k))
    return lower, upper


def min_queries_to_pass(percentile: float, confidence: float) -> int:
    """The fewest queries with which a probe without a single slow query passes."""
    return math.ceil(math.log(1.0 - confidence) / math.log(percentile / 100.0))


def throughput_bound_qps(profile, instances: int = 1) -> float:
    """An upper bound on any policy's throughput: the slowest stage's best ``b / T(b)``, times the instances."""
    seq = None if profile.seq_lens is None else int(profile.seq_lens[0])
    best = [max(b / profile.latency(s, b, seq) for b in profile.batch_sizes) for s in range(profile.n_stages)]
    return min(best) * 1000.0 * instances


def capacity(config, slo_ms: float, *, percentile: float = 99.0, overrides: list[str] | None = None,
             confidence: float = 0.95, resolution: float = 0.02, lo: float | None = None, hi: float | None = None,
             min_queries: int | None = None, max_queries: int = 64_000, max_doublings: int = 8,
             progress=None, stack: str | None = None, engine=None) -> dict[str, Any]:
    """The capacity of ``config`` under the SLO (see the module docstring). ``progress``: a callable given each
    probe as it is decided. ``stack``: the serving stack by name; ``engine``: an engine file (``dvasim fit``)."""
    from dvasim.api import load_profile

    _check_search(slo_ms, percentile, confidence, resolution, stack)
    raw = _rate_config(config, overrides, engine)
    cfg = cfgmod.resolve(raw)
    profile = load_profile(cfg["model"])
    bound = throughput_bound_qps(profile, cfg["engine"]["instances"])
    lo = 1.0 if lo is None else float(lo)
    hi = 2.0 * bound if hi is None else float(hi)
    if not 0 < lo < hi:
        raise ConfigError("--lo", f"need 0 < lo < hi, got lo={lo!r}, hi={hi!r}")
    n0 = max(1000, min_queries_to_pass(percentile, confidence)) if min_queries is None else int(min_queries)
    probe = Probe(raw, slo_ms, percentile, confidence, n0, max_queries, stack=stack, progress=progress)
    cap, bracket, top_exceeded, note = bracket_and_bisect(probe, lo, hi, max_doublings, resolution)
    return _result(cap, bracket, slo_ms, percentile, confidence, resolution, top_exceeded, probe.probes, bound,
                   probe.ran_on, note=note)


def _check_search(slo_ms, percentile, confidence, resolution, stack) -> None:
    """The search's settings checked before any run: each bad one a :class:`ConfigError` naming its flag."""
    if isinstance(slo_ms, bool) or not isinstance(slo_ms, (int, float)) or not math.isfinite(slo_ms) or slo_ms <= 0:
        raise ConfigError("--slo-ms", f"must be a number > 0 (ms), got {slo_ms!r}")
    if not 0 < percentile < 100:
        raise ConfigError("--percentile", f"must be in (0, 100), got {percentile!r}")
    if not 0.5 <= confidence < 1:
        raise ConfigError("--confidence", f"must be in [0.5, 1), got {confidence!r}")
    if not 0 < resolution < 1:
        raise ConfigError("--resolution", f"must be in (0, 1), e.g. 0.02, got {resolution!r}")
    if stack is not None:
        from dvasim.server.resolve import stack_by_name

        stack_by_name(stack, "--stack")


def _rate_config(config, overrides, engine) -> dict[str, Any]:
    """The raw config the probes vary: ``config`` (a file or a dict, copied) with the engine file merged and then
    the overrides, as ``run(engine=)`` does; its workload must have an open-loop rate."""
    raw = cfgmod.load_toml(config) if not isinstance(config, dict) else copy.deepcopy(config)
    raw = cfgmod.apply_engine_file(raw, None if engine is None else str(engine))  # as run(engine=): before --set
    raw = cfgmod.apply_overrides(raw, overrides)
    wl = raw.get("workload", {})
    if wl.get("kind") not in RATE_KINDS:
        raise ConfigError("workload.kind", f"capacity needs an open-loop rate: kind = one of {', '.join(RATE_KINDS)}, "
                                           f"got {wl.get('kind')!r}")
    return raw


class Probe:
    """The probes of one capacity search: calling it with an offered rate runs the config at that rate, with more
    queries until the SLO's verdict is confident (module docstring), and returns whether the SLO holds. Every
    decided probe is kept in ``probes`` (and given to ``progress``); ``ran_on`` holds the stack they ran on."""

    def __init__(self, raw: dict[str, Any], slo_ms: float, percentile: float, confidence: float, n0: int,
                 max_queries: int, *, stack: str | None = None, progress=None):
        self.raw, self.slo_ms, self.percentile, self.confidence = raw, slo_ms, percentile, confidence
        self.n0, self.max_queries, self.stack, self.progress = n0, max_queries, stack, progress
        self.allowed = 1.0 - percentile / 100.0
        self.seed0 = int(raw.get("workload", {}).get("seed", 0))
        self.probes: list[dict[str, Any]] = []
        self.ran_on: list[str] = []  # the stack the probes ran on (summary["stack"])

    def __call__(self, rate: float) -> bool:
        n, attempt = self.n0, 0
        while True:
            res = self._run(rate, n, attempt)
            lat = res.queries["latency_ms"].to_numpy()
            slow = int(np.count_nonzero(~(lat <= self.slo_ms)))  # NaN (never finished) counts as slow
            lower, upper = clopper_pearson(slow, n, self.confidence)
            s = res.summary
            served = s["throughput_qps"] / s["offered_qps"] if s.get("offered_qps") else math.nan
            unstable = bool(s.get("stable") is False) or (math.isfinite(served) and served < 0.9) or bool(res.stuck)
            if unstable or lower > self.allowed:
                ok, how = False, "unstable" if unstable else "confident"
            elif upper <= self.allowed:
                ok, how = True, "confident"
            elif n * 2 <= self.max_queries:
                n, attempt = n * 2, attempt + 1
                continue
            else:
                ok, how = slow / n <= self.allowed, "estimate"
            rec = {"rate_qps": float(rate), "n_queries": int(n), "slow": slow, "slow_fraction": slow / n,
                   "slow_bounds": [lower, upper], f"p{self.percentile:g}_latency_ms": float(np.percentile(
                       np.where(np.isnan(lat), np.inf, lat), self.percentile)),
                   "served_fraction": served, "within_slo": ok, "decided_by": how}
            self.probes.append(rec)
            if self.progress is not None:
                self.progress(rec)
            return ok

    def _run(self, rate: float, n: int, attempt: int):
        """One run of the config at ``rate`` with ``n`` queries and the attempt's seed."""
        from dvasim.api import run

        trial = copy.deepcopy(self.raw)
        trial["workload"].update(rate_qps=float(rate), n_queries=int(n), seed=self.seed0 + attempt)
        trial.setdefault("engine", {})["progress"] = False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", IncompleteRunWarning)
            res = run(trial, progress=False, stack=self.stack)
        if not self.ran_on:
            self.ran_on.append(str(res.summary.get("stack")))
        return res


def bracket_and_bisect(probe, lo: float, hi: float, max_doublings: int,
                       resolution: float) -> tuple[float, tuple[float, float], bool, str]:
    """The search (module docstring): ``(capacity, bracket, top_exceeded, note)``, ``probe`` deciding each rate."""
    if not probe(lo):
        return 0.0, (0.0, lo), True, f"the SLO does not hold even at {lo:g} qps"
    top_exceeded = False
    for _ in range(max_doublings + 1):
        if not probe(hi):
            top_exceeded = True
            break
        lo, hi = hi, hi * 2.0
    if not top_exceeded:
        return lo, (lo, math.inf), False, (f"the SLO still held at {lo:g} qps (the top of the bracket was never "
                                           f"exceeded): the capacity is at least that")
    while hi / lo - 1.0 > resolution:
        mid = math.sqrt(lo * hi)
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return lo, (lo, hi), True, ""


def _result(cap, bracket, slo_ms, percentile, confidence, resolution, top_exceeded, probes, bound, ran_on=(),
            note=""):
    lo, hi = bracket
    return {"capacity_qps": cap, "stack": ran_on[0] if ran_on else None, "slo_ms": float(slo_ms),
            "percentile": float(percentile),
            "confidence": confidence, "bracket_qps": [lo, hi if math.isfinite(hi) else None],
            "resolution": (hi / lo - 1.0) if lo > 0 and math.isfinite(hi) else None,
            "resolution_asked": resolution, "top_exceeded": top_exceeded,
            "throughput_bound_qps": bound, "n_probes": len(probes), "probes": probes, "note": note}


def sustained_capacity(config: dict[str, Any], slo_ms: float, top: float, *, steps: int = 12,
                       n_queries: int = 2000, share_slow: float = 0.01, stack: str | None = None, engine=None,
                       **capacity_kw) -> tuple[float, float]:
    """The highest rate that meets the SLO with every lower rate of a ladder meeting it too.

    :func:`capacity` assumes that a rate which meets the SLO means every lower one does. A policy whose latency is
    not monotone in the load breaks that (LazyBatching under a stack's per-launch costs misses its SLA at medium
    load and meets it again at high load; so do long GraphB windows). This walks the ladder ``top * 0.8**j``
    (``j = steps .. 1``, slowest first, ``n_queries`` each; more than ``share_slow`` of queries slower than
    ``slo_ms``, unfinished ones included, fails a rung) and, at the first failing rung, bisects with
    :func:`capacity` between the last rung that passed and it. Returns ``(sustained, first_fail)``: ``top`` and NaN
    when every rung passes."""
    from dvasim.api import run

    passed, first_fail = 0.0, math.nan
    for j in range(steps, 0, -1):
        rate = top * 0.8 ** j
        if rate < 1.0:
            continue
        trial = {**config, "workload": {**config["workload"], "rate_qps": rate, "n_queries": n_queries}}
        lat = run(trial, progress=False, stack=stack, engine=engine).queries["latency_ms"].to_numpy()
        if np.mean(~(lat <= slo_ms)) > share_slow:
            first_fail = rate
            break
        passed = rate
    if not math.isfinite(first_fail):
        return top, first_fail
    lo = passed if passed > 0 else min(1.0, first_fail / 2)
    res = capacity(config, slo_ms, percentile=100.0 * (1.0 - share_slow), stack=stack, engine=engine, lo=lo,
                   hi=first_fail, max_doublings=0, **capacity_kw)
    return res["capacity_qps"], first_fail
