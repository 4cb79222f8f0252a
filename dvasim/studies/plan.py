"""Capacity planning: how many GPUs (replicas behind a router, ``[cluster]``) serve ``qps`` within a latency SLO,
and what ``N`` replicas hold.

:func:`plan` answers, for each policy asked (each on the run's serving stack, named in the answer):

1. **One replica's capacity** (:func:`dvasim.studies.capacity.capacity`: the highest rate whose
   ``percentile``-th latency meets ``slo_ms`` with confidence), over ``seeds`` independent searches.
2. **The fewest replicas.** From the estimate ``ceil(qps / capacity)`` the replica count is searched with
   *probes of the cluster itself* at ``qps`` behind the router (a load-aware router can need fewer replicas than
   the estimate: it pools the replicas' queues; round robin and random need about as many): down while the
   count below still meets the SLO, up (doubling, then bisecting) while it does not. A probe is the capacity
   search's (:class:`dvasim.studies.capacity.Probe`: Clopper-Pearson verdicts, more queries until confident; an
   unstable run fails), with ``per_replica_queries`` queries per replica at least, so that each replica reaches
   its steady state. The search assumes that more replicas never serve worse (true of these routers).
   With several seeds each seed searches on its own; the answer is the largest count (it met the SLO under every
   seed), with the counts' interval.
3. **The confirmation**: a run at the answer's count, ``qps`` and the last seed, whose summary must be stable and
   meet the SLO (``confirmed``; its percentile latency, throughput and the replicas' utilisation are reported).
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
from dvasim.reporting.intervals import Interval, over_seeds_counts, tie
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
    if not (isinstance(qps, int | float) and math.isfinite(qps) and 0 < qps <= capmod.MAX_RATE_QPS):
        raise ConfigError("--qps", f"must be a rate > 0 and at most {capmod.MAX_RATE_QPS:g} qps, got {qps!r}")
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

    def __init__(self, raw: dict[str, Any], router: str | None, per_replica: int, **kw):
        super().__init__(raw, **kw)
        self.base, self.router, self.per_replica = raw, router, int(per_replica)
        self.n0_single, self.max_single = self.n0, self.max_queries

    def at(self, n: int, qps: float) -> bool:
        self.raw = _with_cluster(self.base, n, self.router)
        self.n0 = min(max(self.n0_single, self.per_replica * n), MAX_QUERIES)
        self.max_queries = min(max(self.max_single, 4 * self.n0), MAX_QUERIES)
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
            percentile: float, stack: str | None) -> dict[str, Any]:
    """One run of ``n`` replicas at ``qps``: is it stable, does its ``percentile``-th latency meet the SLO, and
    how busy is each replica."""
    import numpy as np

    from dvasim.api import run_whole as run

    trial = capmod.probe_config(_with_cluster(raw, n, router), qps, queries, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", IncompleteRunWarning)
        res = run(trial, progress=False, stack=stack)
    s = res.summary
    lat = res.queries["latency_ms"].to_numpy()
    p = float(np.percentile(np.where(np.isnan(lat), np.inf, lat), percentile))
    busy = [r["device_busy_fraction"] for r in s.get("per_replica", [])] or [s["device_busy_fraction"]]
    return {"replicas": int(n), "n_queries": int(queries), "seed": seed, f"p{percentile:g}_latency_ms": p,
            "throughput_qps": s["throughput_qps"], "stable": bool(s.get("stable")),
            "meets_slo": bool(p <= slo_ms), "confirmed": bool(s.get("stable")) and p <= slo_ms,
            "utilisation_mean": float(np.mean(busy)), "utilisation_min": float(np.min(busy)),
            "utilisation_max": float(np.max(busy)), "stack": s.get("stack"), "router": s.get("router", "single")}


def _search_settings(percentile: float, confidence: float, resolution: float, max_queries: int, stack,
                     seeds: int) -> dict[str, Any]:
    return dict(percentile=percentile, confidence=confidence, resolution=resolution, max_queries=max_queries,
                stack=stack, seeds=seeds)


def cluster_capacity(raw: dict[str, Any], n: int, router: str | None, slo_ms: float, per_replica: int,
                     settings: dict[str, Any], progress=None) -> dict[str, Any]:
    """What ``n`` replicas behind ``router`` hold: the capacity search of the cluster, each probe with at least
    ``per_replica`` queries per replica."""
    s = dict(settings)
    n0 = min(max(capmod.min_queries_to_pass(s["percentile"], s["confidence"]), 1000, per_replica * n), MAX_QUERIES)
    s["max_queries"] = min(max(s["max_queries"], 4 * n0), MAX_QUERIES)
    prepared = capmod.prepare(_with_cluster(raw, n, router), slo_ms, min_queries=n0, **s)
    return capmod.search(prepared, progress)


def plan_policy(raw: dict[str, Any], qps: float, slo_ms: float, *, router: str | None, per_replica: int,
                settings: dict[str, Any], progress=None, headroom: bool = True) -> dict[str, Any]:
    """The plan for one policy (module docstring, steps 1 to 4)."""
    one = capmod.prepare(_with_cluster(raw, 1, router), slo_ms, **settings)
    single = capmod.search(one, progress)
    cap1 = single["capacity_qps"]
    estimate = MAX_PLAN_REPLICAS if cap1 <= 0 else math.ceil(qps / cap1)
    counts, probes, notes = [], [], [n for n in [single.get("note")] if n]
    for s in one["seeds"]:
        r = copy.deepcopy(raw)
        r.setdefault("workload", {})["seed"] = s
        probe = ClusterProbe(r, router, per_replica, slo_ms=slo_ms, percentile=settings["percentile"],
                             confidence=settings["confidence"], n0=one["n0"], max_queries=one["max_queries"],
                             stack=settings["stack"], progress=progress, tag={"search_seed": s})
        n, note = fewest_replicas(probe, qps, estimate)
        counts.append(n)
        probes.extend(probe.probes)
        notes += [note] if note else []
    answer = max(counts)
    if (raw.get("workload") or {}).get("kind") == "trace":
        notes.append("a trace: every probe replays it from its start (later bursts never enter), and the seed "
                     "changes nothing (intervals over seeds are of identical runs; the confirmation replays the "
                     "last probe); plan disjoint windows of the trace and check the whole trace with a run")
    seed0 = raw.get("workload", {}).get("seed", 0)
    fresh = capmod.search_seeds(seed0, len(one["seeds"]) + 1, one["n0"], one["max_queries"])[-1]
    check = confirm(raw, answer, qps, router, min(max(one["n0"], per_replica * answer), MAX_QUERIES), fresh, slo_ms,
                    settings["percentile"], settings["stack"])
    out = {"policy": (raw.get("policy") or {}).get("name", "zerobatch"), "stack": check["stack"],
           "router": router_name(router or (raw.get("cluster") or {}).get("router", "round_robin")),
           "qps": float(qps), "slo_ms": float(slo_ms), "percentile": settings["percentile"],
           "replicas": answer, "replicas_by_seed": counts,
           "replicas_interval": over_seeds_counts([float(c) for c in counts], settings["confidence"]).as_dict(),
           "estimate_from_one_replica": estimate, "capacity_per_replica_qps": cap1,
           "capacity_per_replica_interval": single["capacity_interval"], "confirmation": check,
           "single_replica_search": single, "probes": probes, "notes": notes}
    if headroom:
        held = cluster_capacity(raw, answer, router, slo_ms, per_replica, settings)
        iv = Interval(**held["capacity_interval"])
        out.update(capacity_at_replicas_qps=held["capacity_qps"], capacity_at_replicas_interval=iv.as_dict(),
                   headroom=held["capacity_qps"] / qps - 1.0,
                   headroom_interval=[iv.lo / qps - 1.0, iv.hi / qps - 1.0], cluster_search=held)
    return out


def plan(config, qps: float, slo_ms: float, *, percentile: float = 99.0, policies: list[str] | None = None,
         seeds: int = 1, router: str | None = None, overrides: list[str] | None = None, engine=None,
         stack: str | None = None, confidence: float = 0.95, resolution: float = 0.02, max_queries: int = 64_000,
         per_replica_queries: int = PER_REPLICA_QUERIES, headroom: bool = True, progress=None) -> dict[str, Any]:
    """The fewest replicas serving ``qps`` within ``slo_ms`` at ``percentile``, per policy (module docstring).
    ``router``: over the config's ``[cluster] router``; ``policies``: names (each with its defaults, the config's
    own with its ``[policy]``), default the config's policy."""
    base, names = check_plan(config, qps, slo_ms, policies=policies, router=router, overrides=overrides,
                             engine=engine, stack=stack, per_replica_queries=per_replica_queries,
                             max_queries=max_queries)
    settings = _search_settings(percentile, confidence, resolution, max_queries, stack, seeds)
    capmod.check_options({"slo_ms": slo_ms, **{k: v for k, v in settings.items() if k != "stack"}}, stack=stack)
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
    """Each policy against the first: the replica counts (a tie when their intervals allow it: with one seed,
    when they are equal) and the per-replica capacity (:func:`dvasim.studies.capacity.policy_comparisons`)."""
    names = list(by_policy)
    if len(names) < 2:
        return []
    caps = capmod.policy_comparisons({k: v["single_replica_search"] for k, v in by_policy.items()}, resolution)
    ref = by_policy[names[0]]
    out = []
    for name, cap in zip(names[1:], caps):
        a, b = Interval(**by_policy[name]["replicas_interval"]), Interval(**ref["replicas_interval"])
        same = tie(a, b, 0.0)
        fewer = by_policy[name]["replicas"] - ref["replicas"]
        words = ("tie" if same else f"{abs(fewer)} {'fewer' if fewer < 0 else 'more'} replica"
                 + ("s" if abs(fewer) != 1 else ""))
        out.append({"policy": name, "against": names[0], "replicas_difference": fewer, "replicas_tie": same,
                    "replicas_label": words, "capacity_label": cap["label"], "capacity_tie": cap["tie"]})
    return out


def replicas_hold(config, replicas: int, slo_ms: float, *, percentile: float = 99.0, seeds: int = 1,
                  router: str | None = None, overrides: list[str] | None = None, engine=None,
                  stack: str | None = None, confidence: float = 0.95, resolution: float = 0.02,
                  max_queries: int = 64_000, per_replica_queries: int = PER_REPLICA_QUERIES,
                  policies: list[str] | None = None, progress=None) -> dict[str, Any]:
    """The inverse: the highest rate ``replicas`` replicas behind the router serve within the SLO, per policy."""
    base, names = check_plan(config, 1.0, slo_ms, policies=policies, router=router, overrides=overrides,
                             engine=engine, stack=stack, per_replica_queries=per_replica_queries,
                             max_queries=max_queries, replicas=replicas)
    settings = _search_settings(percentile, confidence, resolution, max_queries, stack, seeds)
    # the searches' settings checked before any run, as plan() checks them (issue 34: --percentile 100 divided by 0)
    capmod.check_options({"slo_ms": slo_ms, **{k: v for k, v in settings.items() if k != "stack"}}, stack=stack)
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
