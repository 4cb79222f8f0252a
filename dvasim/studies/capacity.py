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

**Seeds** (``seeds = K``, ``dvasim capacity --seeds K``, 1..:data:`MAX_SEEDS`): ``K`` independent searches, the
``i``-th from workload seed ``seed + i * a`` (``a`` the seeds one probe may take while it doubles its queries:
:func:`search_seeds`; searches that shared a seed would replay the same arrivals and not be independent). The
result's ``capacity_qps`` is their mean, ``capacity_interval`` its Student-t interval at 95%
(:func:`dvasim.reporting.intervals.over_seeds`; a capacity found by search is one number per search, so seeds are
the sound way to its noise, not a bootstrap over queries), ``capacity_by_seed`` each search's, ``searches`` each
search's bracket and note, and every probe says its search's ``search_seed``. One search (the default) is exactly
the search as it always was, with ``seeds``, ``capacity_by_seed`` and a ``"single run"`` interval added.
:func:`compare_policies` finds the capacity under several policies and words each against the first: the
difference with its interval, or a tie when the difference is within the intervals or the searches' resolution
(:func:`dvasim.reporting.intervals.tie`).

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
from dvasim.reporting.intervals import Interval, compare_label, over_seeds, relative_difference, tie
from dvasim.schema import Key, Section
from dvasim.workload.arrivals import MAX_QUERIES

RATE_KINDS = ("poisson", "uniform", "gamma", "trace")  # a rate a probe can set (a trace: scaled to it)
MIN_RESOLUTION = 1e-4  # finer than this the probes' own noise decides, not the bisection
MAX_BISECTIONS = 64  # from MAX_RATE_QPS * 2**MAX_DOUBLINGS down to 1e-4 takes under 30
MAX_DOUBLINGS = 30
MAX_RATE_QPS = 1e9
MAX_SEEDS = 100  # independent searches of one capacity (--seeds)
INTERVAL_CONFIDENCE = 0.95  # of the interval over seeds (each probe's verdict has its own ``confidence``)

OPTIONS = Section("capacity", "the capacity search's settings (dvasim capacity's flags; a sweep's [capacity])", (
    Key("slo_ms", "number", "the latency objective (ms); required", minimum=0, strict=True),
    Key("percentile", "number", "the percentile that must meet it", default=99.0, minimum=0, maximum=100,
        strict=True, strict_max=True),
    Key("confidence", "number", "confidence of each probe's verdict", default=0.95, minimum=0.5, maximum=1,
        strict_max=True),
    Key("resolution", "number", "relative width of the final bracket (hi / lo - 1)", default=0.02,
        minimum=MIN_RESOLUTION, maximum=1, strict_max=True),
    Key("max_queries", "int", "most queries of one probe (at least the first probe's: 1000 for p99 at 95%)",
        default=64_000, minimum=1, maximum=MAX_QUERIES),
    Key("min_queries", "int", "queries of a rate's first probe (default: max(1000, the fewest that can pass))",
        minimum=1, maximum=MAX_QUERIES),
    Key("max_doublings", "int", "most doublings of the bracket's top", default=8, minimum=0, maximum=MAX_DOUBLINGS),
    Key("lo", "number", "bottom of the first bracket (qps)", minimum=0, strict=True, maximum=MAX_RATE_QPS),
    Key("hi", "number", "top of the first bracket (qps)", minimum=0, strict=True, maximum=MAX_RATE_QPS),
    Key("seeds", "int", "independent searches (workload seeds apart); the capacity their mean, with its t interval",
        default=1, minimum=1, maximum=MAX_SEEDS),
))


def clopper_pearson(k: int, n: int, confidence: float) -> tuple[float, float]:
    """One-sided bounds ``(lower, upper)`` on a binomial fraction after ``k`` successes in ``n`` trials: each
    holds with probability ``confidence``."""
    # imported here: scipy.stats takes half a second, and the command line's parser imports this module (its help)
    from scipy.stats import beta

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
             progress=None, stack: str | None = None, engine=None, seeds: int = 1) -> dict[str, Any]:
    """The capacity of ``config`` under the SLO (see the module docstring). ``progress``: a callable given each
    probe as it is decided. ``stack``: the serving stack by name; ``engine``: an engine file (``dvasim fit``).
    ``seeds``: independent searches (:func:`search_seeds`), their mean the capacity, with its t interval."""
    plan = prepare(config, slo_ms, percentile=percentile, overrides=overrides, confidence=confidence,
                   resolution=resolution, lo=lo, hi=hi, min_queries=min_queries, max_queries=max_queries,
                   max_doublings=max_doublings, stack=stack, engine=engine, seeds=seeds)
    return search(plan, progress)


def prepare(config, slo_ms: float, *, percentile: float = 99.0, overrides: list[str] | None = None,
            confidence: float = 0.95, resolution: float = 0.02, lo: float | None = None, hi: float | None = None,
            min_queries: int | None = None, max_queries: int = 64_000, max_doublings: int = 8,
            stack: str | None = None, engine=None, seeds: int = 1) -> dict[str, Any]:
    """Everything :func:`capacity` checks before its first probe, done: the settings, the config as a probe would
    run it and the seeds of its searches; returns the plan :func:`search` runs."""
    from dvasim.api import load_profile

    n0 = check_options({"slo_ms": slo_ms, "percentile": percentile, "confidence": confidence,
                        "resolution": resolution, "min_queries": min_queries, "max_queries": max_queries,
                        "max_doublings": max_doublings, "lo": lo, "hi": hi, "seeds": seeds}, stack=stack)
    raw = _rate_config(config, overrides, engine)
    cfg = cfgmod.resolve(raw)
    profile = load_profile(cfg["model"])
    bound = throughput_bound_qps(profile, cfg["engine"]["instances"]) * cfg["cluster"]["replicas"]
    default_hi = hi is None
    lo = 1.0 if lo is None else float(lo)
    hi = 2.0 * float(bound) if hi is None else float(hi)
    if not 0 < lo < hi:
        raise ConfigError("--lo", f"need 0 < lo < hi, got lo={lo!r}, hi={hi!r}"
                                  + (" (the default: twice the table's throughput bound)" if default_hi else ""))
    check_probe_config(raw, stack, lo, n0, max_queries)
    return {"raw": raw, "slo_ms": slo_ms, "percentile": percentile, "confidence": confidence,
            "resolution": resolution, "n0": n0, "max_queries": max_queries, "max_doublings": max_doublings,
            "lo": lo, "hi": hi, "bound": bound, "stack": stack,
            "seeds": search_seeds(raw.get("workload", {}).get("seed", 0), int(seeds), n0, max_queries)}


def search(plan: dict[str, Any], progress=None) -> dict[str, Any]:
    """The searches of a plan (:func:`prepare`): one search is :func:`capacity`'s result as it always was, with
    ``seeds``, ``capacity_by_seed`` and ``capacity_interval`` added; several are combined (:func:`_combined`)."""
    results = []
    many = len(plan["seeds"]) > 1
    for s in plan["seeds"]:
        raw = plan["raw"]
        if many:
            raw = copy.deepcopy(raw)
            raw["workload"]["seed"] = s
        probe = Probe(raw, plan["slo_ms"], plan["percentile"], plan["confidence"], plan["n0"], plan["max_queries"],
                      stack=plan["stack"], progress=progress, tag={"search_seed": s} if many else None)
        cap, bracket, top_exceeded, note = bracket_and_bisect(probe, plan["lo"], plan["hi"], plan["max_doublings"],
                                                              plan["resolution"])
        results.append(_result(cap, bracket, plan["slo_ms"], plan["percentile"], plan["confidence"],
                               plan["resolution"], top_exceeded, probe.probes, plan["bound"], probe.ran_on,
                               note=note))
    if not many:
        res = results[0]
        res.update(seeds=list(plan["seeds"]), capacity_by_seed=[res["capacity_qps"]],
                   capacity_interval=over_seeds([res["capacity_qps"]]).as_dict())
        return res
    return _combined(results, plan["seeds"])


def search_seeds(seed0, k: int, n0: int, max_queries: int) -> list:
    """The workload seeds of ``k`` independent searches from ``seed0``: ``seed0 + i * a`` (``i = 0 .. k-1``), ``a``
    the seeds one probe may take (it doubles its queries from ``n0`` up to ``max_queries``, with the next seed
    each time). Searches never share a seed: a probe with the seed of another's doubled probe would replay the
    first half of its arrivals, and the searches would not be independent. One search keeps ``seed0`` as given."""
    if k == 1:
        return [seed0]
    a = 1 + doublings(n0, max_queries)
    from dvasim.workload.config import MAX_SEED

    seed0 = int(seed0)
    top = seed0 + k * a - 1
    if top > MAX_SEED:
        raise ConfigError("--seeds", f"{k} searches from workload.seed = {seed0} take seeds up to {top} ({a} a "
                                     f"search), beyond 2**63 - 1; give fewer seeds or a workload.seed of at most "
                                     f"{MAX_SEED - k * a + 1}")
    return [seed0 + i * a for i in range(k)]


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
            "n_probes": sum(r["n_probes"] for r in results), "probes": [p for r in results for p in r["probes"]],
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
    return {"policies": list(policies), "by_policy": by_policy,
            "comparisons": policy_comparisons(by_policy, kw.get("resolution", 0.02))}


def policy_comparisons(by_policy: dict[str, dict[str, Any]], resolution: float) -> list[dict[str, Any]]:
    """Each policy's capacity against the first's: the difference (percent of the first's, its interval), whether
    it is a tie at ``resolution`` (or at the resolution a search reached, when coarser) and the phrase."""
    names = list(by_policy)
    ref = names[0]
    out = []
    for name in names[1:]:
        a, b = (Interval(**by_policy[k]["capacity_interval"]) for k in (name, ref))
        reached = [by_policy[k]["resolution"] for k in (name, ref) if by_policy[k]["resolution"] is not None]
        res = max([float(resolution), *reached])
        d = relative_difference(a, b)
        out.append({"policy": name, "against": ref, "difference_%": d.point, "difference_interval_%": [d.lo, d.hi],
                    "resolution": res, "tie": tie(a, b, res),
                    "label": compare_label(a, b, (name, ref), higher_is_better=True, resolution=res)})
    return out


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
    most = given.get("max_queries", OPTIONS.default("max_queries"))
    first = given.get("min_queries", max(1000, min_queries_to_pass(pct, conf)))
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
    trial["workload"].update(rate_qps=float(rate), n_queries=int(n), seed=seed)
    trial.setdefault("engine", {})["progress"] = False
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
    if isinstance(seed, int) and not isinstance(seed, bool) and max_queries is not None:
        seed += doublings(n, max_queries)  # as Probe.__call__ goes on
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
    queries until the SLO's verdict is confident (module docstring), and returns whether the SLO holds. Every
    decided probe is kept in ``probes`` (and given to ``progress``); ``ran_on`` holds the stack they ran on."""

    def __init__(self, raw: dict[str, Any], slo_ms: float, percentile: float, confidence: float, n0: int,
                 max_queries: int, *, stack: str | None = None, progress=None, tag: dict[str, Any] | None = None):
        self.raw, self.slo_ms, self.percentile, self.confidence = raw, slo_ms, percentile, confidence
        self.tag = dict(tag or {})  # added to every probe's record (several searches: the search's seed)
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
                   "served_fraction": served, "within_slo": ok, "decided_by": how, **self.tag}
            self.probes.append(rec)
            if self.progress is not None:
                self.progress(rec)
            return ok

    def _run(self, rate: float, n: int, attempt: int):
        """One run of the config at ``rate`` with ``n`` queries and the attempt's seed."""
        from dvasim.api import run_whole as run

        trial = probe_config(self.raw, rate, n, self.seed0 + attempt)
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
    for _ in range(MAX_BISECTIONS):
        if hi / lo - 1.0 <= resolution:
            break
        mid = math.sqrt(lo * hi)
        if probe(mid):
            lo = mid
        else:
            hi = mid
    else:
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
