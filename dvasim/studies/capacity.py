"""Capacity under a latency SLO: the highest offered rate whose ``percentile``-th latency stays within ``slo_ms``.

For any config with an open-loop rate (``[workload] kind = "poisson"``, ``"uniform"``, ``"gamma"`` or ``"trace"``,
a trace scaled to the probe's rate; the config's other workload keys are kept), :func:`capacity` brackets the
capacity and bisects it:

1. **Bracket.** From ``lo`` (default: 1 qps) and ``hi`` (default: twice the throughput bound of the table: the
   best ``b / T(b)`` of the slowest stage, times the instances and ``[cluster] replicas``), ``hi`` is doubled until
   a probe fails, at most
   ``max_doublings`` times; a bracket top that was never exceeded is flagged (``top_exceeded = false``: the
   capacity is at least the reported value).
2. **Bisect** in log scale until ``hi / lo - 1 <= resolution`` (default 2%); the capacity is ``lo``.

**A probe** (one offered rate) runs the config at that rate and decides whether the SLO holds by MLPerf LoadGen's
Server-scenario rules (mlcommons/inference b66003e):

* **Length.** At least ``min_duration_s`` simulated seconds of arrivals (``rate x min_duration_s`` queries;
  default 60 s, a tenth of LoadGen's Server rule of 600 s, ``loadgen/mlperf.conf:85``: give ``min_duration_s =
  600`` for it; LoadGen's library default of 10 s, ``test_settings.h:197``, was shown too short:
  :data:`MIN_DURATION_S`) and at least ``min_queries``
  (default the fewest that can pass at all, 459 for p99 at 99%, and at least LoadGen's ``min_query_count`` of
  100, ``test_settings.h:199``).
* **Early stopping** (``loadgen/results.cc:232-256``, ``early_stopping.cc``): with ``k`` of ``n`` queries slower
  than ``slo_ms`` (unfinished and refused ones count as slower), the SLO holds when the one-sided binomial bound
  on the late share at ``confidence`` (LoadGen's 0.99) is within ``1 - percentile / 100``: LoadGen's ``n >= h(k)
  + k`` exactly (tested against its formula). It fails when the lower bound is above the allowed share; otherwise
  the probe runs again with twice the queries (and a new seed), at most ``max_queries`` (default 8x its first);
  still undecided there, the point estimate decides. A run that is not in a steady state fails
  (:func:`dvasim.reporting.stability.stability`).
* **Trigger** (``trigger = "backlog"``, the default): an accepted rate is probed again with a backlog of
  ``trigger_slos`` SLOs of arrivals waiting at the start (``[workload] backlog``); a rate the server holds from an
  empty queue but not after the backlog (:func:`dvasim.reporting.verdict.recovery`) is **metastable** and fails.
  (Bronson et al., HotOS '21; Huang et al., OSDI '22: a system that serves a load only when it starts empty is not
  serving it.)

**Confirmation** (``confirm_factor``, default :data:`CONFIRM_FACTOR` = 10; issue 34: an answer must hold in a run
ten times longer): the searches' answer is probed again ``confirm_factor`` times a probe's length (600 s for the
default 60 s probes: LoadGen's Server rule itself), one long run per search with fresh seeds, each decided by the
same rules without doubling (undecided at its length, the estimate decides) and with its trigger test a probe
long. It holds when every long run is ``stable``; while it fails the rate steps down in growing steps and the
bracket is bisected to ``resolution`` (:func:`step_down`), as ``dvasim plan`` steps its counts. The capacity is the
highest rate whose long runs held; ``capacity_searched_qps`` keeps the searches' answer and ``confirmation`` every
long run. On issue 34's Titan RTX case with 2 s probes the searches say ~875 qps and the long runs ~770.
``confirm_factor = 0`` is the search alone.

Each probe's record says its ``verdict`` (:data:`dvasim.reporting.verdict.VERDICTS`) and ``decided_by``, the rule
that decided it; the result's ``rules`` say the rules every probe ran under. Issue 34 chose the defaults so that
no answer of the issue's cases flips in a run ten times longer (``experiments/long_run_check.py``); the old rule
(1,000 queries doubling to 64,000 at 95%, no duration, no trigger) accepted rates that collapse later.

:func:`capacity` returns a dict (also written to ``capacity.json`` by ``dvasim capacity``): ``capacity_qps`` (the
confirmed capacity), ``capacity_searched_qps``, ``confirmation``, the
bracket, the resolution reached, ``top_exceeded``, the serving ``stack`` the probes ran on and every probe.
``stack`` (a stack's name, :mod:`dvasim.server`) and ``engine`` (an engine file from ``dvasim fit``) apply to every
probe, as ``dvasim run --stack / --engine`` does; the engine file is merged before ``overrides``.

**Seeds** (``seeds = K``, ``dvasim capacity --seeds K``, 1..:data:`MAX_SEEDS`): ``K`` independent searches (on
``workers`` processes, default one per core, or a Dask cluster: :mod:`dvasim.studies.parallel`; the result does
not depend on them), the
``i``-th from workload seed ``seed + i * a`` (``a`` the seeds one probe may take while it doubles its queries:
:func:`search_seeds`; searches that shared a seed would replay the same arrivals and not be independent). The
result's ``capacity_qps`` is their mean, ``capacity_interval`` its Student-t interval at 95%
(:func:`dvasim.reporting.intervals.over_seeds`; a capacity found by search is one number per search, so seeds are
the sound way to its noise, not a bootstrap over queries), ``capacity_by_seed`` each search's, ``searches`` each
search's bracket and note, and every probe says its search's ``search_seed``. One search (the default) is exactly
the search as it always was, with ``seeds``, ``capacity_by_seed`` and a ``"single run"`` interval added.
:func:`compare_policies` finds the capacity under several policies and words each against the best (the highest
capacity; never against whichever came first, never a percentage of zero): the difference with its interval, or a
tie when the difference is within the intervals or the searches' resolution
(:func:`dvasim.reporting.intervals.against_best`), and a ranking with the ties shown (``a = b > c``).

**Limits**, all checked (with the config itself, built as a probe would build it) before the first probe runs, each
bad setting a one-line :class:`~dvasim.errors.ConfigError` naming its flag: the search's settings are declared once
in :data:`OPTIONS` (a sweep's ``[capacity]`` takes five of them); the resolution is at least
:data:`MIN_RESOLUTION` (1e-4) and the bisection stops after :data:`MAX_BISECTIONS` steps whatever it reached; the
bracket's ``lo`` and ``hi`` are finite rates up to :data:`MAX_RATE_QPS`, and ``hi`` doubles at most
:data:`MAX_DOUBLINGS` times; a probe runs at most ``MAX_QUERIES`` queries (20 million, as any run), and
``max_queries`` must allow the first probe's ``min_queries``.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

import numpy as np

from dvasim import config as cfgmod
from dvasim.errors import ConfigError, IncompleteRunWarning
from dvasim.reporting.intervals import Interval, against_best, clopper_pearson, inflation, over_seeds
from dvasim.reporting.verdict import default_backlog, percentile_ms, recovery
from dvasim.schema import MIN_QPS, Key, Section
from dvasim.workload.arrivals import MAX_QUERIES

RATE_KINDS = ("poisson", "uniform", "gamma", "trace")  # a rate a probe can set (a trace: scaled to it)
MIN_RESOLUTION = 1e-4  # finer than this the probes' own noise decides, not the bisection
MAX_BISECTIONS = 64  # from MAX_RATE_QPS * 2**MAX_DOUBLINGS down to 1e-4 takes under 30
MAX_DOUBLINGS = 30
MAX_RATE_QPS = 1e9
MAX_SEEDS = 100  # independent searches of one capacity (--seeds)
MIN_DURATION_S = 60.0  # a tenth of LoadGen's Server rule (600 s, loadgen/mlperf.conf:85); its library default is 10 s
# (test_settings.h:197), which issue 34's Titan RTX case showed too short: 10 s probes put DVABatch's capacity at
# 789 qps, where 100 s runs are over the SLO (its bad episodes recur every ~10 s); 60 s probes say 760, and 600 s
# runs there hold (experiments/long_run_check.py)
MAX_DURATION_S = 86_400.0
LOADGEN_MIN_QUERY_COUNT = 100  # LoadGen's default min_query_count (loadgen/test_settings.h:199)
PROBE_DOUBLINGS = 3  # an undecided probe doubles its queries at most this often by default (8 x its first)
QUICK_LOOK = 2000  # queries a probe runs first, to fail an overloaded rate without its full length (its prefix)
INTERVAL_CONFIDENCE = 0.95  # of the interval over seeds (each probe's verdict has its own ``confidence``)
CONFIRM_FACTOR = 10  # an answer's long run: this many times a probe's length (60 s probes: LoadGen's 600 s Server
# rule, loadgen/mlperf.conf:85); issue 34: an answer must hold in a run 10x longer

OPTIONS = Section("capacity", "the capacity search's settings (dvasim capacity's flags; a sweep's [capacity])", (
    Key("slo_ms", "number", "the latency objective (ms); required", minimum=0, strict=True),
    Key("percentile", "number", "the percentile that must meet it", default=99.0, minimum=0, maximum=100,
        strict=True, strict_max=True),
    Key("confidence", "number", "confidence of each probe's verdict (LoadGen's early stopping: 0.99)", default=0.99,
        minimum=0.5, maximum=1, strict_max=True),
    Key("resolution", "number", "relative width of the final bracket (hi / lo - 1)", default=0.02,
        minimum=MIN_RESOLUTION, maximum=1, strict_max=True),
    Key("min_duration_s", "number", "simulated seconds of arrivals a probe runs at least (60; LoadGen's Server "
        "rule 600)", default=MIN_DURATION_S, minimum=0, maximum=MAX_DURATION_S),
    Key("max_queries", "int", "most queries of one probe as it doubles them (default: 8 x its first)",
        minimum=1, maximum=MAX_QUERIES),
    Key("min_queries", "int", "fewest queries of a probe (default: max(100, the fewest that can pass: 459 for p99 "
        "at 0.99))", minimum=1, maximum=MAX_QUERIES),
    Key("trigger", "choice", 'the trigger test of every accepted rate: "backlog" (the probe again with '
        'trigger_slos SLOs of arrivals waiting; no recovery: metastable) or "none"', default="backlog",
        choices=("backlog", "none")),
    Key("trigger_slos", "number", "the trigger's backlog, in SLOs of arrivals at the probed rate", default=1.0,
        minimum=0, strict=True, maximum=1000),
    Key("confirm_factor", "int", "the answer's confirmation: run it this many times a probe's length (with fresh "
        "seeds), stepping down while it fails (10: 600 s for 60 s probes, LoadGen's Server rule; 0: none)",
        default=CONFIRM_FACTOR, minimum=0, maximum=100),
    Key("max_doublings", "int", "most doublings of the bracket's top", default=8, minimum=0, maximum=MAX_DOUBLINGS),
    Key("lo", "number", "bottom of the first bracket (qps)", minimum=MIN_QPS, maximum=MAX_RATE_QPS),
    Key("hi", "number", "top of the first bracket (qps)", minimum=MIN_QPS, maximum=MAX_RATE_QPS),
    Key("seeds", "int", "independent searches (workload seeds apart); the capacity their mean, with its t interval",
        default=1, minimum=1, maximum=MAX_SEEDS),
    Key("workers", "int", "processes running independent searches at once (default: one per core, at most the "
        "searches)", minimum=1, maximum=256),
))


def min_queries_to_pass(percentile: float, confidence: float) -> int:
    """The fewest queries with which a probe without a single slow query passes."""
    return math.ceil(math.log(1.0 - confidence) / math.log(percentile / 100.0))


def throughput_bound_qps(profile, instances: int = 1) -> float:
    """An upper bound on any policy's throughput: the slowest stage's best ``b / T(b)``, times the instances."""
    seq = None if profile.seq_lens is None else int(profile.seq_lens[0])
    best = [max(b / profile.latency(s, b, seq) for b in profile.batch_sizes) for s in range(profile.n_stages)]
    return min(best) * 1000.0 * instances


def capacity(config, slo_ms: float, *, percentile: float = 99.0, overrides: list[str] | None = None,
             confidence: float = 0.99, resolution: float = 0.02, lo: float | None = None, hi: float | None = None,
             min_queries: int | None = None, max_queries: int | None = None, max_doublings: int = 8,
             min_duration_s: float = MIN_DURATION_S, trigger: str = "backlog", trigger_slos: float = 1.0,
             confirm_factor: int = CONFIRM_FACTOR, progress=None, stack: str | None = None, engine=None,
             seeds: int = 1, workers: int | None = None, dask=None) -> dict[str, Any]:
    """The capacity of ``config`` under the SLO (see the module docstring). ``progress``: a callable given each
    probe as it is decided. ``stack``: the serving stack by name; ``engine``: an engine file (``dvasim fit``).
    ``seeds``: independent searches (:func:`search_seeds`), their mean the capacity, with its t interval."""
    plan = prepare(config, slo_ms, percentile=percentile, overrides=overrides, confidence=confidence,
                   resolution=resolution, lo=lo, hi=hi, min_queries=min_queries, max_queries=max_queries,
                   max_doublings=max_doublings, min_duration_s=min_duration_s, trigger=trigger,
                   trigger_slos=trigger_slos, confirm_factor=confirm_factor, stack=stack, engine=engine,
                   seeds=seeds, workers=workers, dask=dask)
    return search(plan, progress)


def prepare(config, slo_ms: float, *, percentile: float = 99.0, overrides: list[str] | None = None,
            confidence: float = 0.99, resolution: float = 0.02, lo: float | None = None, hi: float | None = None,
            min_queries: int | None = None, max_queries: int | None = None, max_doublings: int = 8,
            min_duration_s: float = MIN_DURATION_S, trigger: str = "backlog", trigger_slos: float = 1.0,
            confirm_factor: int = CONFIRM_FACTOR, stack: str | None = None, engine=None, seeds: int = 1,
            workers: int | None = None, dask=None) -> dict[str, Any]:
    """Everything :func:`capacity` checks before its first probe, done: the settings, the config as a probe would
    run it and the seeds of its searches; returns the plan :func:`search` runs."""
    from dvasim.api import load_profile

    n0 = check_options({"slo_ms": slo_ms, "percentile": percentile, "confidence": confidence,
                        "resolution": resolution, "min_queries": min_queries, "max_queries": max_queries,
                        "max_doublings": max_doublings, "lo": lo, "hi": hi, "seeds": seeds,
                        "min_duration_s": min_duration_s, "trigger": trigger, "trigger_slos": trigger_slos,
                        "confirm_factor": confirm_factor, "workers": workers}, stack=stack)
    raw = _rate_config(config, overrides, engine)
    cfg = cfgmod.resolve(raw)
    profile = load_profile(cfg["model"])
    bound = throughput_bound_qps(profile, cfg["engine"]["instances"]) * cfg["cluster"]["replicas"]
    default_hi = hi is None
    lo = 1.0 if lo is None else float(lo)
    hi = 2.0 * float(bound) if hi is None else float(hi)
    if not MIN_QPS <= lo < hi:  # a rate's physical range (dvasim.schema): the probes never go below lo
        raise ConfigError("--lo", f"need {MIN_QPS:g} <= lo < hi, got lo={lo!r}, hi={hi!r}"
                                  + (" (the default: twice the table's throughput bound)" if default_hi else ""))
    check_probe_config(raw, stack, lo, n0, max_queries)
    seed0 = raw.get("workload", {}).get("seed", 0)
    return {"raw": raw, "slo_ms": slo_ms, "percentile": percentile, "confidence": confidence,
            "resolution": resolution, "n0": n0, "max_queries": max_queries, "max_doublings": max_doublings,
            "lo": lo, "hi": hi, "bound": bound, "stack": stack, "workers": workers, "dask": dask,
            "rules": {"min_duration_s": float(min_duration_s), "min_queries": n0, "max_queries": max_queries,
                      "confidence": confidence, "trigger": trigger, "trigger_slos": float(trigger_slos),
                      "confirm_factor": int(confirm_factor)},
            "seeds": search_seeds(seed0, int(seeds), n0, max_queries), "confirm_seeds": confirm_seeds(seed0, int(seeds), n0, max_queries) if confirm_factor else []}


def search(plan: dict[str, Any], progress=None) -> dict[str, Any]:
    """The searches of a plan (:func:`prepare`), one per seed, on ``plan["workers"]`` processes
    (:func:`dvasim.studies.parallel.map_jobs`; the result does not depend on them): one search is
    :func:`capacity`'s result with ``seeds``, ``capacity_by_seed`` and ``capacity_interval`` added; several are
    combined (:func:`_combined`)."""
    from dvasim.studies.parallel import map_jobs

    many = len(plan["seeds"]) > 1
    portable = {k: v for k, v in plan.items() if k != "dask"}  # what travels to a worker (a Client does not)
    results = map_jobs(_one_search, [(portable, s, many) for s in plan["seeds"]], workers=plan.get("workers"),
                       dask=plan.get("dask"), progress=progress, records=lambda r: r["probes"])
    if not many:
        res = results[0]
        res.update(seeds=list(plan["seeds"]), capacity_by_seed=[res["capacity_qps"]],
                   capacity_interval=over_seeds([res["capacity_qps"]]).as_dict())
    else:
        res = _combined(results, plan["seeds"])
    return confirmed(plan, res, progress)


def confirmed(plan: dict[str, Any], res: dict[str, Any], progress=None) -> dict[str, Any]:
    """The searches' answer ``res`` confirmed by long runs (issue 34: an answer must hold in a run ten times
    longer; ``dvasim plan`` confirms its counts the same way): the answer is probed again ``confirm_factor`` times
    a probe's length (60 s probes: 600 s, LoadGen's Server rule), once per search with fresh seeds
    (``plan["confirm_seeds"]``), and holds when every one is ``stable`` (:class:`Probe` with ``long_factor``: the
    same verdict rules, no doubling, its trigger test a probe's length). While it fails the rate steps down
    (:func:`step_down`), and the capacity is the highest rate whose long runs held. ``res`` gains
    ``capacity_searched_qps`` (the searches' answer), ``confirmation`` (every long run) and, when the long runs
    overturned the searches, ``capacity_qps`` becomes the confirmed rate and ``capacity_interval`` the searches'
    interval scaled to it (``capacity_searched_interval`` keeps theirs)."""
    factor = int(plan["rules"].get("confirm_factor", 0))
    res["capacity_searched_qps"] = res["capacity_qps"]
    if not factor or res["capacity_qps"] <= 0:
        res["confirmation"] = None
        return res
    from dvasim.studies.parallel import map_jobs

    portable = {k: v for k, v in plan.items() if k != "dask"}
    runs: list[dict[str, Any]] = []

    def holds(rate: float) -> bool:
        jobs = [(portable, s, rate) for s in plan["confirm_seeds"]]
        recs = map_jobs(_long_probe, jobs, workers=plan.get("workers"), dask=plan.get("dask"), progress=progress,
                        records=lambda r: [r])
        runs.extend(recs)
        return all(r["within_slo"] for r in recs)

    searched = res["capacity_qps"]
    cap, note = step_down(holds, searched, plan["lo"], plan["resolution"])
    res["confirmation"] = {"factor": factor, "seeds": list(plan["confirm_seeds"]), "searched_qps": searched,
                           "confirmed_qps": cap, "overturned": cap != searched, "runs": runs, "note": note}
    if cap != searched:
        iv = Interval(**res["capacity_interval"])
        res["capacity_searched_interval"] = iv.as_dict()
        k = cap / searched
        res["capacity_qps"] = cap
        res["capacity_interval"] = Interval(cap, iv.lo * k, iv.hi * k, iv.n, iv.confidence,
                                            iv.method + ", scaled to the long runs' capacity").as_dict()
        res["note"] = "; ".join(x for x in (res["note"], note or f"the searches answered {searched:.4g} qps; runs "
                                            f"{factor}x a probe long hold from {cap:.4g} qps") if x)
    return res


def _long_probe(job: tuple[dict[str, Any], Any, float], progress=None) -> dict[str, Any]:
    """One long run of a confirmation (a job of :func:`confirmed`): the record of a :class:`Probe` with
    ``long_factor`` at ``rate`` from workload seed ``s``."""
    plan, s, rate = job
    raw = copy.deepcopy(plan["raw"])
    raw["workload"]["seed"] = s
    probe = make_probe(raw, plan, progress=progress, tag={"confirmation": True, "search_seed": s},
                       long_factor=plan["rules"]["confirm_factor"])
    probe(rate)
    return probe.probes[-1]


def step_down(holds, rate: float, floor: float, resolution: float) -> tuple[float, str]:
    """The highest rate at or below ``rate`` that ``holds`` (a long run's verdict), assuming lower rates hold when
    a higher one does: ``rate`` itself when it holds; else the rate steps down in growing steps (``rate / (1 +
    resolution) ** 2**k``, ``k = 0, 1, ...``) until one holds, and the bracket between it and the last that failed
    is bisected (in log scale) to ``resolution``, as the search does. The lowest rate tried is ``floor``; when
    that fails too: 0 and a note."""
    if holds(rate):
        return rate, ""
    hi, k = rate, 0
    while True:
        lo = max(rate / (1.0 + resolution) ** (2 ** k), floor)
        if holds(lo):
            break
        if lo <= floor or k >= MAX_DOUBLINGS:
            return 0.0, f"no rate down to {lo:g} qps held a long run"
        hi, k = lo, k + 1
    return bisect(holds, lo, hi, resolution)[0], ""


def bisect(holds, lo: float, hi: float, resolution: float) -> tuple[float, float]:
    """The bracket ``(lo, hi)`` (``lo`` holds, ``hi`` does not) bisected in log scale until ``hi / lo - 1 <=
    resolution``, at most :data:`MAX_BISECTIONS` times: the final bracket."""
    for _ in range(MAX_BISECTIONS):
        if hi / lo - 1.0 <= resolution:
            break
        mid = math.sqrt(lo * hi)
        if holds(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi


def _one_search(job: tuple[dict[str, Any], Any, bool], progress=None) -> dict[str, Any]:
    """One search of a plan from workload seed ``s`` (a job of :func:`search`)."""
    plan, s, many = job
    raw = plan["raw"]
    if many:
        raw = copy.deepcopy(raw)
        raw["workload"]["seed"] = s
    probe = make_probe(raw, plan, progress=progress, tag={"search_seed": s} if many else None)
    cap, bracket, top_exceeded, note = bracket_and_bisect(probe, plan["lo"], plan["hi"], plan["max_doublings"],
                                                          plan["resolution"])
    res = _result(cap, bracket, plan["slo_ms"], plan["percentile"], plan["confidence"], plan["resolution"],
                  top_exceeded, probe.probes, plan["bound"], probe.ran_on, note=note)
    res["rules"] = plan["rules"]
    return res


def make_probe(raw: dict[str, Any], plan: dict[str, Any], *, progress=None, tag=None, cls=None, **kw):
    """The :class:`Probe` (or ``cls``) of a plan's rules for ``raw``."""
    rules = plan["rules"]
    return (cls or Probe)(raw, slo_ms=plan["slo_ms"], percentile=plan["percentile"], confidence=plan["confidence"],
                          n0=plan["n0"], max_queries=plan["max_queries"], stack=plan["stack"], progress=progress,
                          tag=tag, min_duration_s=rules["min_duration_s"], trigger=rules["trigger"],
                          trigger_slos=rules["trigger_slos"], **kw)


def search_seeds(seed0, k: int, n0: int, max_queries: int) -> list:
    """The workload seeds of ``k`` independent searches from ``seed0``: ``seed0 + i * a`` (``i = 0 .. k-1``), ``a``
    the seeds one probe may take (it doubles its queries from ``n0`` up to ``max_queries``, with the next seed
    each time). Searches never share a seed: a probe with the seed of another's doubled probe would replay the
    first half of its arrivals, and the searches would not be independent. One search keeps ``seed0`` as given."""
    if k == 1:
        return [seed0]
    a = 1 + probe_doublings(n0, max_queries)
    from dvasim.workload.config import MAX_SEED

    seed0 = int(seed0)
    top = seed0 + k * a - 1
    if top > MAX_SEED:
        raise ConfigError("--seeds", f"{k} searches from workload.seed = {seed0} take seeds up to {top} ({a} a "
                                     f"search), beyond 2**63 - 1; give fewer seeds or a workload.seed of at most "
                                     f"{MAX_SEED - k * a + 1}")
    return [seed0 + i * a for i in range(k)]


def confirm_seeds(seed0, k: int, n0: int, max_queries: int | None) -> list:
    """The workload seeds of the long runs confirming ``k`` searches from ``seed0``: fresh ones, never a search's
    (a long run never doubles, so each takes one): the ``k`` after the searches' seeds, or, where those would pass
    2**63 - 1, the ``k`` before ``seed0``. A trace's runs do not depend on the seed."""
    from dvasim.workload.config import MAX_SEED

    if not isinstance(seed0, int) or isinstance(seed0, bool):
        return [seed0] * k
    after = seed0 + k * (1 + probe_doublings(n0, max_queries))
    return list(range(after, after + k)) if after + k - 1 <= MAX_SEED else list(range(seed0 - k, seed0))


def probe_doublings(n0: int, max_queries: int | None) -> int:
    """The most times a probe may double its queries: :data:`PROBE_DOUBLINGS` by default, else as many as
    ``max_queries`` allows from ``n0`` (a probe's duration may start it higher: fewer then)."""
    return PROBE_DOUBLINGS if max_queries is None else doublings(n0, max_queries)


def doublings(n0: int, max_queries: int) -> int:
    """How many times a probe may double its queries from ``n0`` within ``max_queries`` (each time with the next
    seed, as :class:`Probe` does)."""
    k, n = 0, int(n0)
    while n * 2 <= max_queries:
        n, k = n * 2, k + 1
    return k


def _combined(results: list[dict[str, Any]], seeds: list) -> dict[str, Any]:
    """Several searches as one result: ``capacity_qps`` their mean, ``capacity_interval`` its t interval
    (:func:`dvasim.reporting.intervals.over_seeds`), ``capacity_by_seed``, every probe (each with its search's
    ``search_seed``), ``searches`` (each search's result without its probes) and the union of the brackets."""
    caps = [r["capacity_qps"] for r in results]
    iv = over_seeds(caps, INTERVAL_CONFIDENCE)
    his = [r["bracket_qps"][1] for r in results]
    res_reached = [r["resolution"] for r in results]
    notes = [f"seed {s}: {r['note']}" for s, r in zip(seeds, results) if r["note"]]
    return {"capacity_qps": iv.point, "capacity_interval": iv.as_dict(), "capacity_by_seed": caps,
            "seeds": list(seeds), "stack": results[0]["stack"], "slo_ms": results[0]["slo_ms"],
            "percentile": results[0]["percentile"], "confidence": results[0]["confidence"],
            "bracket_qps": [min(r["bracket_qps"][0] for r in results), None if None in his else max(his)],
            "resolution": None if None in res_reached else max(res_reached),
            "resolution_asked": results[0]["resolution_asked"],
            "top_exceeded": all(r["top_exceeded"] for r in results),
            "throughput_bound_qps": results[0]["throughput_bound_qps"],
            "n_probes": sum(r["n_probes"] for r in results), "n_metastable": sum(r["n_metastable"] for r in results),
            "rules": results[0]["rules"], "probes": [p for r in results for p in r["probes"]],
            "searches": [{"seed": s, **{k: v for k, v in r.items() if k != "probes"}} for s, r in zip(seeds, results)],
            "note": "; ".join(notes)}


def compare_policies(config, slo_ms: float, policies: list[str], *, overrides: list[str] | None = None,
                     engine=None, progress=None, **kw) -> dict[str, Any]:
    """The capacity of ``config`` under each of ``policies`` (names; the first is the reference), each as
    :func:`capacity` finds it (``kw``: its settings, ``seeds`` included), and each other policy against the first:
    the difference with its interval or a tie (:func:`dvasim.reporting.intervals.tie`, at the searches'
    resolution). A policy runs with the config's ``[policy]`` when it is the config's own, else with its defaults
    (``[policy] name = X``); ``overrides`` (``--set``) apply to every one. Every policy's config and every setting
    is checked before the first probe; a bad policy is an error naming ``--policies``."""
    if not policies:
        raise ConfigError("--policies", "no policy given; e.g. --policies delaybatch,dvabatch")
    twice = sorted({p for p in policies if policies.count(p) > 1})
    if twice:
        raise ConfigError("--policies", f"{twice[0]!r} is given twice")
    base = cfgmod.load_toml(config) if not isinstance(config, dict) else copy.deepcopy(config)
    plans = {}
    for name in policies:
        raw = copy.deepcopy(base)
        if not isinstance(raw.get("policy"), dict) or raw["policy"].get("name") != name:
            raw["policy"] = {"name": name}
        try:
            plans[name] = prepare(raw, slo_ms, overrides=overrides, engine=engine, **kw)
        except ConfigError as e:
            if not e.field.startswith("policy"):
                raise
            raise ConfigError("--policies", f"{name}: {e.field}: {e.message}") from None
    by_policy = {}
    for name, plan in plans.items():
        by_policy[name] = search(plan, None if progress is None else (lambda p, n=name: progress({**p, "policy": n})))
    comps = policy_comparisons(by_policy, kw.get("resolution", 0.02))
    return {"policies": list(policies), "by_policy": by_policy, "comparisons": comps,
            "ranking": comps[0]["ranking"] if comps else policies[0]}


def policy_comparisons(by_policy: dict[str, dict[str, Any]], resolution: float) -> list[dict[str, Any]]:
    """Each policy's capacity against the best one's (:func:`dvasim.reporting.intervals.against_best`): the
    difference (percent of the best's capacity, its interval), whether it is a tie at ``resolution`` (or at the
    resolution a search reached, when coarser) and the phrase; each row also holds the ``ranking`` (ties shown
    with ``=``)."""
    reached = [v["resolution"] for v in by_policy.values() if v["resolution"] is not None]
    res = max([float(resolution), *reached])
    cmp = against_best({k: Interval(**v["capacity_interval"]) for k, v in by_policy.items()}, resolution=res,
                       unit=" qps")
    return [{"policy": r["name"], "against": r["against"], "difference_%": r["difference_%"],
             "difference_interval_%": r["difference_interval_%"], "resolution": res, "tie": r["tie"],
             "label": r["label"], "ranking": cmp["ranking"]} for r in cmp["rows"]]


def flag(name: str) -> str:
    """The command-line flag of a search setting (``max_queries`` -> ``--max-queries``)."""
    return "--" + name.replace("_", "-")


def check_options(options: dict[str, Any], *, stack: str | None = None, where: str | None = None) -> int:
    """The search's settings (:data:`OPTIONS`' names; ``None`` for a default) checked before any run: a bad one is
    a :class:`ConfigError` naming its flag (``--max-queries``), or ``where.max_queries`` when ``where`` is given (a
    sweep's ``sweep.capacity``). Returns the first probe's queries (``min_queries`` or its default), which
    ``max_queries`` must allow."""
    def name(key: str) -> str:
        return flag(key) if where is None else f"{where}.{key}"

    given = {k: v.item() if isinstance(v, np.generic) else v for k, v in options.items() if v is not None}
    for k, v in given.items():
        if k not in OPTIONS.by_name:
            raise ConfigError(name(k), f"unknown setting; allowed: {', '.join(OPTIONS.by_name)}")
        try:
            OPTIONS[k].check("capacity", v)
        except ConfigError as e:
            raise ConfigError(name(k), e.message) from None
    if "slo_ms" not in given:
        raise ConfigError(name("slo_ms"), "missing; the latency objective (ms), e.g. 50")
    pct = float(given.get("percentile", OPTIONS.default("percentile")))
    conf = float(given.get("confidence", OPTIONS.default("confidence")))
    most = given.get("max_queries", MAX_QUERIES)
    first = given.get("min_queries", max(LOADGEN_MIN_QUERY_COUNT, min_queries_to_pass(pct, conf)))
    if first > most:
        why = (f"the first probe's queries (min_queries = {first:,})" if "min_queries" in given else
               f"the fewest with which a probe can pass p{pct:.12g} at {conf:.12g} confidence ({first:,})")
        fix = (f"give at least {first:,}" if first <= MAX_QUERIES else
               f"more than the {MAX_QUERIES:,} one run takes: lower the percentile or the confidence")
        raise ConfigError(name("max_queries"), f"must be at least {why}, got {most:,}; {fix}")
    if "lo" in given and "hi" in given and not float(given["lo"]) < float(given["hi"]):
        raise ConfigError(name("lo"), f"need lo < hi, got lo={given['lo']!r}, hi={given['hi']!r}")
    if stack is not None:
        from dvasim.server.resolve import stack_by_name

        stack_by_name(stack, "--stack")
    return int(first)


def probe_config(raw: dict[str, Any], rate: float, n: int, seed: int) -> dict[str, Any]:
    """The config of one probe: ``raw`` (copied) at ``rate`` with ``n`` queries and ``seed``, without progress."""
    trial = copy.deepcopy(raw)
    trial["workload"].pop("time_scale", None)  # a trace is scaled to the probe's rate instead
    trial["workload"].pop("backlog", None)  # the probe's trigger sets its own
    trial["workload"].update(rate_qps=float(rate), n_queries=int(n), seed=seed)
    trial.setdefault("engine", {})["progress"] = False
    if isinstance(trial.get("qos"), dict):
        trial["qos"]["trigger"] = "none"  # the probe tests accepted rates itself
    return trial


def check_probe_config(raw: dict[str, Any], stack: str | None = None, rate: float = 1.0, n: int = 1000,
                       max_queries: int | None = None) -> None:
    """Everything a probe of ``raw`` would check before it runs, without running it: an open-loop rate, and the
    config resolved and built as :func:`dvasim.run` builds it (model, stack, policy, workload, pipeline) at ``rate``
    with ``n`` queries and the last seed a probe may take (a probe starts with ``n`` queries and doubles them up to
    ``max_queries``, with the next seed each time)."""
    _check_rate_kind(raw)
    seed = first = raw["workload"].get("seed", 0)
    # a probe's queries (at most max_queries, within any run's limit: OPTIONS) need no building to check
    if isinstance(seed, int) and not isinstance(seed, bool):
        seed += probe_doublings(n, max_queries)  # as Probe.__call__ goes on
    try:
        check_buildable(probe_config(raw, rate, n, seed), stack)
    except ConfigError as e:
        if e.field != "workload.seed" or seed == first:
            raise
        from dvasim.workload.config import MAX_SEED

        raise ConfigError("workload.seed", f"{first!r} is too large: a probe that doubles its queries takes the "
                                           f"next seed, up to {seed - first} more; give at most "
                                           f"{MAX_SEED - (seed - first)}") from None


def check_buildable(raw: dict[str, Any], stack: str | None = None) -> None:
    """Everything :func:`dvasim.run` checks before it simulates ``raw``, without simulating: the config resolved
    and its parts built (model, serving stack, policy, workload, pipeline); a bad value is the run's own one-line
    error."""
    from dvasim.api import build

    build(cfgmod.resolve(raw), stack)


def _rate_config(config, overrides, engine) -> dict[str, Any]:
    """The raw config the probes vary: ``config`` (a file or a dict, copied) with the engine file merged and then
    the overrides, as ``run(engine=)`` does; its workload must have an open-loop rate."""
    raw = cfgmod.load_toml(config) if not isinstance(config, dict) else copy.deepcopy(config)
    raw = cfgmod.apply_engine_file(raw, None if engine is None else str(engine))  # as run(engine=): before --set
    raw = cfgmod.apply_overrides(raw, overrides)
    _check_rate_kind(raw)
    return raw


def _check_rate_kind(raw: dict[str, Any]) -> None:
    wl = raw.get("workload", {})
    if not isinstance(wl, dict):
        raise ConfigError("workload", "must be a table of keys ([workload] with kind = \"poisson\", ...)")
    if wl.get("kind") not in RATE_KINDS:
        raise ConfigError("workload.kind", f"capacity needs an open-loop rate: kind = one of {', '.join(RATE_KINDS)}, "
                                           f"got {wl.get('kind')!r}")


class Probe:
    """The probes of one capacity search: calling it with an offered rate runs the config at that rate, with more
    queries until the SLO's verdict is confident (module docstring), tests an accepted rate with a backlog (the
    trigger), and returns whether the SLO holds. Every decided probe is kept in ``probes`` (and given to
    ``progress``) with its ``verdict`` (:data:`dvasim.reporting.verdict.VERDICTS`) and the rule that decided it
    (``decided_by``); ``ran_on`` holds the stack they ran on."""

    def __init__(self, raw: dict[str, Any], slo_ms: float, percentile: float, confidence: float, n0: int,
                 max_queries: int | None, *, stack: str | None = None, progress=None, tag: dict[str, Any] | None = None,
                 min_duration_s: float = MIN_DURATION_S, trigger: str = "backlog", trigger_slos: float = 1.0,
                 long_factor: int = 1):
        self.raw, self.slo_ms, self.percentile, self.confidence = raw, slo_ms, percentile, confidence
        self.tag = dict(tag or {})  # added to every probe's record (several searches: the search's seed)
        self.n0, self.max_queries, self.stack, self.progress = n0, max_queries, stack, progress
        self.min_duration_s, self.trigger, self.trigger_slos = float(min_duration_s), trigger, float(trigger_slos)
        self.long_factor = int(long_factor)  # > 1: a confirmation's long run (no doubling, a probe-long trigger)
        self.allowed = 1.0 - percentile / 100.0
        self.seed0 = int(raw.get("workload", {}).get("seed", 0))
        self.probes: list[dict[str, Any]] = []
        self.ran_on: list[str] = []  # the stack the probes ran on (summary["stack"])

    def first_queries(self, rate: float) -> int:
        """A probe's first query count at ``rate``: LoadGen's two minimums, the duration (``rate x
        min_duration_s``) and the count (``n0``: at least the fewest that can pass)."""
        return min(self.long_factor * self.short_queries(rate), MAX_QUERIES)

    def short_queries(self, rate: float) -> int:
        """A probe's first query count at ``rate`` were it not a long run: a long run's trigger test runs this
        many after the backlog (a recovery shows within a probe)."""
        return min(max(int(self.n0), math.ceil(float(rate) * self.min_duration_s)), MAX_QUERIES)

    def most_queries(self, first: int) -> int:
        """The most queries a probe doubles up to from ``first``: ``max_queries``, or ``8 x first``; a long run
        never doubles (undecided at its length, its estimate decides, as LoadGen's 600 s run does)."""
        if self.long_factor > 1:
            return first
        top = first * 2 ** PROBE_DOUBLINGS if self.max_queries is None else max(first, int(self.max_queries))
        return min(top, MAX_QUERIES)

    def __call__(self, rate: float) -> bool:
        full = self.first_queries(rate)
        top, attempt = self.most_queries(full), 0
        n = min(full, max(int(self.n0), QUICK_LOOK))  # a quick look first: an overloaded rate fails at once
        while True:
            res = self._run(rate, n, attempt)
            lat = res.queries["latency_ms"].to_numpy()
            late = ~(lat <= self.slo_ms)  # NaN (never finished, refused) counts as slow
            slow = int(np.count_nonzero(late))
            vif = inflation(late)
            lower, upper = clopper_pearson(slow / vif, n / vif, self.confidence)
            s = res.summary
            served = s["throughput_qps"] / s["offered_qps"] if s.get("offered_qps") else math.nan
            steady = s.get("steady_state", s.get("stable")) is not False
            unstable = not steady or (math.isfinite(served) and served < 0.9) or bool(res.stuck)
            if unstable or lower > self.allowed:
                ok = False
                how = "stability rule" if unstable else f"lower bound above the allowed share at {self.confidence:g}"
                if n < full:
                    how += f" (a quick look of {n:,} queries)"
            elif n < full:  # the quick look did not fail: the probe's own length (a random load's first queries are the same)
                n = full
                continue
            elif upper <= self.allowed:
                ok, how = True, f"early stopping at {self.confidence:g} (LoadGen)" + (
                    f", late queries clustered: n_eff = n / {vif:.3g}" if vif > 1 else "")
            elif n * 2 <= top:
                n, attempt = n * 2, attempt + 1
                continue
            else:
                ok, how = slow / n <= self.allowed, f"estimate at the most queries ({n:,})"
            refused = (s.get("n_rejected", 0) + s.get("n_timed_out", 0)) / n
            verdict = "stable" if ok else "unstable" if unstable else (
                "rejecting" if refused > self.allowed else "over-SLO")
            rec = {"rate_qps": float(rate), "n_queries": int(n), "duration_s": n / float(rate), "slow": slow,
                   "slow_fraction": slow / n, "slow_bounds": [lower, upper], "variance_inflation": vif,
                   f"p{self.percentile:g}_latency_ms": percentile_ms(lat, self.percentile),
                   "served_fraction": served, "within_slo": ok, "verdict": verdict, "decided_by": how, **self.tag}
            if ok and self.trigger != "none":
                trig = self._trigger(rate, n, attempt)
                rec["trigger"] = trig
                if not trig["recovered"]:
                    ok = False
                    rec.update(within_slo=False, verdict="metastable", decided_by="trigger: " + trig["reason"])
            self.probes.append(rec)
            if self.progress is not None:
                self.progress(rec)
            return ok

    def _trigger(self, rate: float, n: int, attempt: int) -> dict[str, Any]:
        """The accepted probe again with a backlog of ``trigger_slos`` SLOs of arrivals at ``rate``
        (:func:`dvasim.reporting.verdict.default_backlog`): did it recover (:func:`~dvasim.reporting.verdict.recovery`)?"""
        backlog = default_backlog(rate, self.slo_ms, self.trigger_slos)
        if self.long_factor > 1:
            n = self.short_queries(rate)
        res = self._run(rate, n, attempt, backlog=backlog)
        q = res.queries
        return recovery(q["arrival_ms"].to_numpy(), q["finish_ms"].to_numpy(), backlog, self.slo_ms,
                        self.percentile, status=q["status"].to_numpy())

    def _run(self, rate: float, n: int, attempt: int, backlog: int = 0):
        """One run of the config at ``rate`` with ``n`` queries (after ``backlog`` waiting ones) and the attempt's
        seed."""
        from dvasim.api import run_whole as run

        trial = probe_config(self.raw, rate, n, self.seed0 + attempt)
        if backlog:
            trial["workload"]["backlog"] = int(backlog)
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
    lo, hi = bisect(probe, lo, hi, resolution)
    if hi / lo - 1.0 > resolution:
        return lo, (lo, hi), True, f"stopped after {MAX_BISECTIONS} bisections at hi / lo - 1 = {hi / lo - 1:.3g}"
    return lo, (lo, hi), True, ""


def _result(cap, bracket, slo_ms, percentile, confidence, resolution, top_exceeded, probes, bound, ran_on=(),
            note=""):
    lo, hi = bracket
    return {"capacity_qps": cap, "stack": ran_on[0] if ran_on else None, "slo_ms": float(slo_ms),
            "percentile": float(percentile),
            "confidence": confidence, "bracket_qps": [lo, hi if math.isfinite(hi) else None],
            "resolution": (hi / lo - 1.0) if lo > 0 and math.isfinite(hi) else None,
            "resolution_asked": resolution, "top_exceeded": top_exceeded,
            "throughput_bound_qps": bound, "n_probes": len(probes),
            "n_metastable": sum(p.get("verdict") == "metastable" for p in probes), "probes": probes, "note": note}


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
    from dvasim.api import run_whole as run

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
