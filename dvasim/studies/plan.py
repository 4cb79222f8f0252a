"""Capacity planning: how many GPUs (replicas behind a router, ``[cluster]``) serve ``qps`` within a latency SLO,
and what ``N`` replicas hold.

:func:`plan` answers, for each policy asked (each on the run's serving stack, named in the answer):

1. **One replica's capacity** (:func:`dvasim.studies.capacity.capacity`: the highest rate whose
   ``percentile``-th latency meets ``slo_ms`` with confidence, confirmed by its long runs), over ``seeds``
   independent searches.
2. **The fewest replicas.** From the estimate ``ceil(qps / capacity)`` the replica count is searched with
   *probes of the cluster itself* at ``qps`` behind the router (a load-aware router can need fewer replicas than
   the estimate: it pools the replicas' queues; round robin and random need about as many): down while the
   count below still meets the SLO, up (doubling, then bisecting) while it does not. A probe is the capacity
   search's (:class:`dvasim.studies.capacity.Probe`: Clopper-Pearson verdicts, more queries until confident; an
   unstable run fails), with ``per_replica_queries`` queries per replica at least, so that each replica reaches
   its steady state. The search assumes that more replicas never serve worse (true of these routers).
   With several seeds each seed searches on its own; the answer is the largest count (it met the SLO under every
   seed), with the counts' interval.
3. **The confirmation**: runs ``confirm_factor`` times a probe's length (default
   :data:`dvasim.studies.capacity.CONFIRM_FACTOR`, 10: 600 s for 60 s probes, LoadGen's Server rule) at the
   answer's count and ``qps``, one per seed (fresh seeds), each with its trigger test; a count holds when every one
   is ``stable``. The count steps up while it fails, then down while the count below holds
   (:func:`confirmed_count`); the answer is the confirmed count, with the count below's failing runs beside it.
4. **The headroom**: the capacity of that many replicas behind the router (a capacity search of the cluster),
   as ``capacity / qps - 1``.

:func:`replicas_hold` answers the inverse: the capacity of ``N`` replicas (a capacity search of the cluster).

Policies are compared on the replica count and the per-replica capacity; a difference within the intervals (or
the capacity search's resolution) is a tie (:func:`dvasim.reporting.intervals.tie`).

On a trace (``[workload] kind = "trace"``) every probe replays the trace from its start, time-scaled to its rate
and cut at its query count (a cluster probe: ``per_replica_queries`` times the replicas), so bursts later in the
trace never enter; and the seed changes nothing there (the arrivals and lengths are the file's), so intervals over
seeds are of identical runs and the confirmation replays the last probe: the answer's ``notes`` say so. Plan
disjoint windows of the trace instead (``notebooks/how_many_gpus.ipynb``) and check the whole trace with a run.

Limits: ``qps`` up to :data:`dvasim.studies.capacity.MAX_RATE_QPS`, at most :data:`MAX_PLAN_REPLICAS` replicas
(``[cluster]``'s limit), a probe's queries at most 20 million; everything is checked before the first probe.
"""

from __future__ import annotations

import copy
import math
import warnings
from typing import Any

from dvasim import config as cfgmod
from dvasim.errors import ConfigError, IncompleteRunWarning
from dvasim.reporting.intervals import Interval, against_best, over_seeds_counts
from dvasim.server.router import ALIASES, MAX_REPLICAS, ROUTERS, router_name
from dvasim.studies import capacity as capmod
from dvasim.workload.arrivals import MAX_QUERIES

MAX_PLAN_REPLICAS = MAX_REPLICAS
PER_REPLICA_QUERIES = 2000  # a cluster probe's queries per replica, at least (each replica's own steady state)


def _policy_raw(base: dict[str, Any], name: str | None) -> dict[str, Any]:
    raw = copy.deepcopy(base)
    if name is not None and (not isinstance(raw.get("policy"), dict) or raw["policy"].get("name") != name):
        raw["policy"] = {"name": name}
    return raw


def _with_cluster(raw: dict[str, Any], n: int, router: str | None) -> dict[str, Any]:
    out = copy.deepcopy(raw)
    cl = dict(out.get("cluster", {}))
    cl["replicas"] = int(n)
    if router is not None:
        cl["router"] = router
    out["cluster"] = cl
    return out


def check_plan(config, qps: float, slo_ms: float, *, policies: list[str] | None, router: str | None,
               overrides: list[str] | None, engine, stack: str | None, per_replica_queries: int,
               max_queries: int, replicas: int | None = None) -> tuple[dict[str, Any], list]:
    """Every setting checked before any probe: ``(base raw config, policy names)``."""
    if not (isinstance(qps, int | float) and math.isfinite(qps) and capmod.MIN_QPS <= qps <= capmod.MAX_RATE_QPS):
        raise ConfigError("--qps", f"must be a rate > 0, at least {capmod.MIN_QPS:g} and at most "
                                   f"{capmod.MAX_RATE_QPS:g} qps, got {qps!r}")
    if replicas is not None and not 1 <= int(replicas) <= MAX_PLAN_REPLICAS:
        raise ConfigError("--replicas", f"must be an integer in 1..{MAX_PLAN_REPLICAS}, got {replicas!r}")
    if not 1 <= int(per_replica_queries) <= MAX_QUERIES:
        raise ConfigError("--per-replica-queries", f"must be an integer in 1..{MAX_QUERIES:,}")
    base = capmod._rate_config(config, overrides, engine)
    resolved = cfgmod.resolve(copy.deepcopy(base))  # the config as given (its [cluster] too, which the plan varies)
    _check_reachable(resolved, slo_ms)
    if router is not None and router_name(router) not in ROUTERS:
        raise ConfigError("--router", f"unknown router {router!r}; one of {', '.join(ROUTERS)} (aliases: "
                                      f"{', '.join(ALIASES)})")
    names = list(policies) if policies else [None]
    if policies and len(set(policies)) < len(policies):
        raise ConfigError("--policies", "a policy is given twice")
    for name in names:
        try:
            capmod.check_probe_config(_with_cluster(_policy_raw(base, name), 1, router), stack, float(qps), 1000,
                                      max_queries)
        except ConfigError as e:
            if name is None or not e.field.startswith("policy"):
                raise
            raise ConfigError("--policies", f"{name}: {e.field}: {e.message}") from None
    return base, names


def _check_reachable(cfg: dict[str, Any], slo_ms: float) -> None:
    """An SLO no replica count can meet is answered at once (issue 34: ``--slo-ms 0.001`` searched for minutes and
    answered 1,024 replicas; a 60 ms network delay under a 50 ms SLO answered one replica): every query takes at
    least the least network delay plus its stages' time alone at batch 1 and the shortest profiled input."""
    from dvasim.api import load_profile

    table = load_profile(cfg["model"])
    short = min(table.seq_lens) if table.seq_lens is not None else None
    alone = float(table.total(1, short))
    delay = cfg.get("cluster", {}).get("network_delay_ms", 0.0)
    least_delay = float(min(delay)) if isinstance(delay, (list, tuple)) else float(delay or 0.0)
    if float(slo_ms) < alone + least_delay:
        why = f"a query alone takes at least {alone:.4g} ms on this model (its stages at batch 1, shortest input)"
        if least_delay > 0:
            why += f", after {least_delay:g} ms of [cluster] network_delay_ms"
        raise ConfigError("--slo-ms", f"no replica count can meet {slo_ms:g} ms: {why}; give a larger SLO")


class ClusterProbe(capmod.Probe):
    """A capacity probe of ``n`` replicas at the planned rate (:meth:`at`): the cluster's config, with at least
    ``per_replica`` queries per replica."""

    def __init__(self, raw: dict[str, Any], router: str | None = None, per_replica: int = PER_REPLICA_QUERIES, **kw):
        super().__init__(raw, **kw)
        self.base, self.router, self.per_replica = raw, router, int(per_replica)
        self.n0_single, self.max_single = self.n0, self.max_queries

    def at(self, n: int, qps: float) -> bool:
        self.raw = _with_cluster(self.base, n, self.router)
        self.n0 = min(max(self.n0_single, self.per_replica * n), MAX_QUERIES)
        self.max_queries = None if self.max_single is None else min(max(self.max_single, 4 * self.n0), MAX_QUERIES)
        self.tag["replicas"] = int(n)
        return self(qps)


def fewest_replicas(probe: ClusterProbe, qps: float, estimate: int) -> tuple[int, str | None]:
    """The fewest replicas whose cluster meets the SLO at ``qps`` (module docstring, step 2), from ``estimate``:
    ``(count, note)``; the note says when even :data:`MAX_PLAN_REPLICAS` do not."""
    n = min(max(1, estimate), MAX_PLAN_REPLICAS)
    if probe.at(n, qps):
        while n > 1 and probe.at(n - 1, qps):
            n -= 1
        return n, None
    lo, hi = n, n  # lo fails; find a count that holds, doubling
    while True:
        if hi == MAX_PLAN_REPLICAS:
            return hi, f"even {MAX_PLAN_REPLICAS} replicas do not meet the SLO at {qps:g} qps"
        lo, hi = hi, min(2 * hi, MAX_PLAN_REPLICAS)
        if probe.at(hi, qps):
            break
    while hi - lo > 1:  # lo fails, hi holds
        mid = (lo + hi) // 2
        if probe.at(mid, qps):
            hi = mid
        else:
            lo = mid
    return hi, None


def confirm(raw: dict[str, Any], n: int, qps: float, router: str | None, queries: int, seed: int, slo_ms: float,
            percentile: float, stack: str | None, trigger: str = "backlog", trigger_slos: float = 1.0,
            trigger_queries: int | None = None) -> dict[str, Any]:
    """One long run of ``n`` replicas at ``qps`` (with its trigger test, of ``trigger_queries`` after the backlog:
    a probe's length, since a recovery shows within a few hundred SLOs): its verdict
    (:mod:`dvasim.reporting.verdict`, against ``slo_ms`` at ``percentile``), its percentile latency and throughput,
    and how busy each replica was."""
    import numpy as np

    from dvasim.api import run_whole as run
    from dvasim.reporting.verdict import percentile_ms

    trial = capmod.probe_config(_with_cluster(raw, n, router), qps, queries, seed)
    trial["qos"] = {**(trial.get("qos") or {}), "target_ms": float(slo_ms), "percentile": float(percentile),
                    "trigger": trigger, "trigger_slos": float(trigger_slos)}
    if trigger_queries:
        trial["qos"]["trigger_queries"] = int(trigger_queries)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IncompleteRunWarning)
        res = run(trial, progress=False, stack=stack)
    s = res.summary
    p = percentile_ms(res.queries["latency_ms"].to_numpy(), percentile)
    busy = [r["device_busy_fraction"] for r in s.get("per_replica", [])] or [s["device_busy_fraction"]]
    return {"replicas": int(n), "n_queries": int(queries), "seed": seed, f"p{percentile:g}_latency_ms": p,
            "throughput_qps": s["throughput_qps"], "verdict": s["verdict"], "verdict_reason": s["verdict_reason"],
            "stable": bool(s["stable"]), "meets_slo": bool(p <= slo_ms), "confirmed": s["verdict"] == "stable",
            "utilisation_mean": float(np.mean(busy)), "utilisation_min": float(np.min(busy)),
            "utilisation_max": float(np.max(busy)), "stack": s.get("stack"), "router": s.get("router", "single")}


def _confirm_job(job, progress=None) -> dict[str, Any]:
    return confirm(*job)


def confirm_count(raw: dict[str, Any], n: int, qps: float, router: str | None, queries: int, seeds: list,
                  slo_ms: float, settings: dict[str, Any]) -> dict[str, Any]:
    """The long runs of ``n`` replicas, one per seed (in parallel): ``holds`` when every one is ``stable``."""
    from dvasim.studies.parallel import map_jobs

    jobs = [(raw, n, qps, router, queries, s, slo_ms, settings["percentile"], settings["stack"],
             settings["trigger"], settings["trigger_slos"], max(2, queries // settings["confirm_factor"]))
            for s in seeds]
    runs = map_jobs(_confirm_job, jobs, workers=settings.get("workers"), dask=settings.get("dask"))
    return {"replicas": int(n), "holds": all(r["confirmed"] for r in runs), "runs": runs}


def confirmed_count(raw: dict[str, Any], answer: int, qps: float, router: str | None, queries, seeds: list,
                    slo_ms: float, settings: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """The smallest count whose long runs hold (module docstring, step 3), from the probes' ``answer``: up while
    the count's runs fail, then down while the count below holds. ``queries(n)``: a long run's queries at ``n``
    replicas. Returns the count and every count's confirmation (the count and the one below it among them)."""
    tried: dict[int, dict[str, Any]] = {}

    def holds(n: int) -> bool:
        if n not in tried:
            tried[n] = confirm_count(raw, n, qps, router, queries(n), seeds, slo_ms, settings)
        return tried[n]["holds"]

    n = answer
    while not holds(n) and n < MAX_PLAN_REPLICAS:
        n += 1
    while n > 1 and holds(n - 1):
        n -= 1
    if n > 1:
        holds(n - 1)  # printed beside the answer: the count below fails
    return n, [tried[k] for k in sorted(tried)]


def _search_settings(percentile: float, confidence: float, resolution: float, max_queries: int | None, stack,
                     seeds: int, min_duration_s: float = capmod.MIN_DURATION_S, trigger: str = "backlog",
                     trigger_slos: float = 1.0, workers: int | None = None, dask=None,
                     confirm_factor: int = capmod.CONFIRM_FACTOR) -> dict[str, Any]:
    return dict(percentile=percentile, confidence=confidence, resolution=resolution, max_queries=max_queries,
                stack=stack, seeds=seeds, min_duration_s=min_duration_s, trigger=trigger, trigger_slos=trigger_slos,
                confirm_factor=confirm_factor, workers=workers, dask=dask)


def cluster_capacity(raw: dict[str, Any], n: int, router: str | None, slo_ms: float, per_replica: int,
                     settings: dict[str, Any], progress=None) -> dict[str, Any]:
    """What ``n`` replicas behind ``router`` hold: the capacity search of the cluster, each probe with at least
    ``per_replica`` queries per replica."""
    s = dict(settings)
    n0 = min(max(capmod.min_queries_to_pass(s["percentile"], s["confidence"]), capmod.LOADGEN_MIN_QUERY_COUNT,
                 per_replica * n), MAX_QUERIES)
    if s["max_queries"] is not None:
        s["max_queries"] = min(max(s["max_queries"], 4 * n0), MAX_QUERIES)
    prepared = capmod.prepare(_with_cluster(raw, n, router), slo_ms, min_queries=n0, **s)
    return capmod.search(prepared, progress)


def _fewest_job(job, progress=None) -> dict[str, Any]:
    """One seed's fewest replicas (a job of :func:`plan_policy`)."""
    raw, one, s, router, per_replica, qps, estimate = job
    r = copy.deepcopy(raw)
    r.setdefault("workload", {})["seed"] = s
    probe = capmod.make_probe(r, one, progress=progress, tag={"search_seed": s}, cls=ClusterProbe, router=router,
                              per_replica=per_replica)
    n, note = fewest_replicas(probe, qps, estimate)
    return {"count": n, "note": note, "probes": probe.probes}


def plan_policy(raw: dict[str, Any], qps: float, slo_ms: float, *, router: str | None, per_replica: int,
                settings: dict[str, Any], progress=None, headroom: bool = True) -> dict[str, Any]:
    """The plan for one policy (module docstring, steps 1 to 4)."""
    from dvasim.studies.parallel import map_jobs

    one = capmod.prepare(_with_cluster(raw, 1, router), slo_ms, **settings)
    single = capmod.search(one, progress)
    cap1 = single["capacity_qps"]
    estimate = MAX_PLAN_REPLICAS if cap1 <= 0 else math.ceil(qps / cap1)
    portable = {k: v for k, v in one.items() if k != "dask"}
    found = map_jobs(_fewest_job, [(raw, portable, s, router, per_replica, qps, estimate) for s in one["seeds"]],
                     workers=settings.get("workers"), dask=settings.get("dask"), progress=progress,
                     records=lambda r: r["probes"])
    counts = [f["count"] for f in found]
    probes = [p for f in found for p in f["probes"]]
    notes = [n for n in [single.get("note")] if n] + [f["note"] for f in found if f["note"]]
    answer = max(counts)
    if (raw.get("workload") or {}).get("kind") == "trace":
        notes.append("a trace: every probe replays it from its start (later bursts never enter), and the seed "
                     "changes nothing (intervals over seeds are of identical runs; the confirmation replays the "
                     "last probe); plan disjoint windows of the trace and check the whole trace with a run")
    seed0 = raw.get("workload", {}).get("seed", 0)
    fresh = capmod.search_seeds(seed0, 2 * len(one["seeds"]), one["n0"], one["max_queries"])[len(one["seeds"]):]
    sizing = capmod.make_probe(raw, one, cls=ClusterProbe, router=router, per_replica=per_replica)

    def queries(n: int) -> int:  # confirm_factor x the first length of a probe of n replicas at qps
        sizing.n0 = min(max(one["n0"], per_replica * n), MAX_QUERIES)
        return min(settings["confirm_factor"] * sizing.first_queries(qps), MAX_QUERIES)

    confirmed, confirmations = confirmed_count(raw, answer, qps, router, queries, fresh, slo_ms, settings)
    check = next(c for c in confirmations if c["replicas"] == confirmed)
    below = next((c for c in confirmations if c["replicas"] == confirmed - 1), None)
    first = check["runs"][-1]
    out = {"policy": (raw.get("policy") or {}).get("name", "zerobatch"), "stack": first["stack"],
           "router": router_name(router or (raw.get("cluster") or {}).get("router", "round_robin")),
           "qps": float(qps), "slo_ms": float(slo_ms), "percentile": settings["percentile"],
           "replicas": confirmed, "replicas_probed": answer, "replicas_by_seed": counts,
           "replicas_interval": over_seeds_counts([float(c) for c in counts], settings["confidence"]).as_dict(),
           "estimate_from_one_replica": estimate, "capacity_per_replica_qps": cap1,
           "capacity_per_replica_interval": single["capacity_interval"], "confirmation": first,
           "confirmed_at": check, "confirmed_below": below, "confirmations": confirmations,
           "confirm_queries": queries(confirmed), "rules": one["rules"],
           "single_replica_search": single, "probes": probes, "notes": notes}
    if confirmed != answer:
        out["notes"].append(f"the probes answered {answer} replica{'s' if answer != 1 else ''}; the long runs "
                            f"({settings['confirm_factor']}x a probe) hold from {confirmed}")
    if headroom:
        held = cluster_capacity(raw, confirmed, router, slo_ms, per_replica, settings)
        iv = Interval(**held["capacity_interval"])
        out.update(capacity_at_replicas_qps=held["capacity_qps"], capacity_at_replicas_interval=iv.as_dict(),
                   headroom=held["capacity_qps"] / qps - 1.0,
                   headroom_interval=[iv.lo / qps - 1.0, iv.hi / qps - 1.0], cluster_search=held)
    return out


def plan(config, qps: float, slo_ms: float, *, percentile: float = 99.0, policies: list[str] | None = None,
         seeds: int = 1, router: str | None = None, overrides: list[str] | None = None, engine=None,
         stack: str | None = None, confidence: float = 0.99, resolution: float = 0.02,
         max_queries: int | None = None, per_replica_queries: int = PER_REPLICA_QUERIES, headroom: bool = True,
         min_duration_s: float = capmod.MIN_DURATION_S, trigger: str = "backlog", trigger_slos: float = 1.0,
         confirm_factor: int = capmod.CONFIRM_FACTOR, workers: int | None = None, dask=None,
         progress=None) -> dict[str, Any]:
    """The fewest replicas serving ``qps`` within ``slo_ms`` at ``percentile``, per policy (module docstring).
    ``router``: over the config's ``[cluster] router``; ``policies``: names (each with its defaults, the config's
    own with its ``[policy]``), default the config's policy."""
    base, names = check_plan(config, qps, slo_ms, policies=policies, router=router, overrides=overrides,
                             engine=engine, stack=stack, per_replica_queries=per_replica_queries,
                             max_queries=max_queries)
    settings = _search_settings(percentile, confidence, resolution, max_queries, stack, seeds, min_duration_s,
                                trigger, trigger_slos, workers, dask, confirm_factor)
    capmod.check_options({"slo_ms": slo_ms, **{k: v for k, v in settings.items() if k not in ("stack", "dask")}}, stack=stack)
    if not confirm_factor:
        raise ConfigError("--confirm-factor", "plan confirms its replica count with long runs: give 1..100 (10: "
                                              "600 s runs for 60 s probes)")
    by_policy = {}
    for name in names:
        raw = _policy_raw(base, name)
        tagged = None if progress is None else (lambda p, n=name: progress({**p, "policy": n or "config"}))
        res = plan_policy(raw, qps, slo_ms, router=router, per_replica=per_replica_queries, settings=settings,
                          progress=tagged, headroom=headroom)
        by_policy[res["policy"]] = res
    return {"qps": float(qps), "slo_ms": float(slo_ms), "percentile": percentile, "seeds": int(seeds),
            "by_policy": by_policy, "comparisons": plan_comparisons(by_policy, resolution)}


def plan_comparisons(by_policy: dict[str, dict[str, Any]], resolution: float) -> list[dict[str, Any]]:
    """Each policy against the best (:func:`dvasim.reporting.intervals.against_best`): on the replica count, the
    fewest best (a tie when the counts' intervals allow it: with one seed, when they are equal), and on the
    per-replica capacity (:func:`dvasim.studies.capacity.policy_comparisons`)."""
    names = list(by_policy)
    if len(names) < 2:
        return []
    counts = {k: Interval(**v["replicas_interval"]) if v["replicas"] == v.get("replicas_probed", v["replicas"])
              else Interval(float(v["replicas"]), float(v["replicas"]), float(v["replicas"]), 1, 0.95, "confirmed")
              for k, v in by_policy.items()}
    fewest = against_best(counts, higher_is_better=False)
    caps = {c["policy"]: c for c in capmod.policy_comparisons(
        {k: v["single_replica_search"] for k, v in by_policy.items()}, resolution)}
    best = fewest["best"]
    out = []
    for r in fewest["rows"]:
        name = r["name"]
        more = by_policy[name]["replicas"] - by_policy[best]["replicas"]
        words = (f"tie with {best}" if r["tie"] else f"{more} more replica{'s' if more != 1 else ''} than {best}")
        cap = caps.get(name)
        out.append({"policy": name, "against": best, "replicas_difference": more, "replicas_tie": r["tie"],
                    "replicas_label": words, "ranking": fewest["ranking"],
                    "capacity_label": cap["label"] if cap else f"{name}: the highest capacity per replica",
                    "capacity_tie": cap["tie"] if cap else False})
    return out


def replicas_hold(config, replicas: int, slo_ms: float, *, percentile: float = 99.0, seeds: int = 1,
                  router: str | None = None, overrides: list[str] | None = None, engine=None,
                  stack: str | None = None, confidence: float = 0.99, resolution: float = 0.02,
                  max_queries: int | None = None, per_replica_queries: int = PER_REPLICA_QUERIES,
                  policies: list[str] | None = None, min_duration_s: float = capmod.MIN_DURATION_S,
                  trigger: str = "backlog", trigger_slos: float = 1.0,
                  confirm_factor: int = capmod.CONFIRM_FACTOR, workers: int | None = None, dask=None,
                  progress=None) -> dict[str, Any]:
    """The inverse: the highest rate ``replicas`` replicas behind the router serve within the SLO, per policy."""
    base, names = check_plan(config, 1.0, slo_ms, policies=policies, router=router, overrides=overrides,
                             engine=engine, stack=stack, per_replica_queries=per_replica_queries,
                             max_queries=max_queries, replicas=replicas)
    settings = _search_settings(percentile, confidence, resolution, max_queries, stack, seeds, min_duration_s,
                                trigger, trigger_slos, workers, dask, confirm_factor)
    # the searches' settings checked before any run, as plan() checks them (issue 34: --percentile 100 divided by 0)
    capmod.check_options({"slo_ms": slo_ms, **{k: v for k, v in settings.items() if k not in ("stack", "dask")}}, stack=stack)
    by_policy = {}
    for name in names:
        raw = _policy_raw(base, name)
        tagged = None if progress is None else (lambda p, n=name: progress({**p, "policy": n or "config"}))
        res = cluster_capacity(raw, int(replicas), router, slo_ms, per_replica_queries, settings, tagged)
        pol = (raw.get("policy") or {}).get("name", "zerobatch")
        by_policy[pol] = {"policy": pol, "replicas": int(replicas), **{k: res[k] for k in (
            "capacity_qps", "capacity_interval", "capacity_by_seed", "stack", "note", "resolution")},
            "search": res}
    comps = capmod.policy_comparisons({k: v["search"] for k, v in by_policy.items()}, resolution) \
        if len(by_policy) > 1 else []
    return {"replicas": int(replicas), "slo_ms": float(slo_ms), "percentile": percentile, "seeds": int(seeds),
            "by_policy": by_policy, "comparisons": comps}
