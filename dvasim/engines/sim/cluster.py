"""Replicas behind a router, in one SimPy environment (``[cluster]``, :mod:`dvasim.server.router`).

:func:`simulate_cluster` runs ``N`` replicas, each a :class:`~dvasim.engines.sim.engine.Simulation` of its own
pipeline on its own device (and its own host, jitter and admission streams: replica ``r > 0`` draws from streams
of its own, replica 0 from the single-GPU run's), in one environment. Queries reach the router at their arrival
plus the network delay (a constant, or each query's own draw from the delay's quantiles, seeded: then queries may
reach the router out of arrival order, as over a real network), those reaching it at the same instant in id order;
the router picks each one's replica from what it has sent and what has come back (:class:`Router`), and hands
the replica's share of the instant's queries to it together. Every query's record says its replica; each replica's
device keeps its own busy time.

One replica behind any router with no network delay is the single-GPU run, event for event (the same records).

A closed loop (``[workload] kind = "closed"``) runs on one replica only: its clients would need the router too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
import simpy

from dvasim.core.arith import int_sum, left_sum
from dvasim.core.query import Query
from dvasim.engines.sim.engine import _URGENT, SimOptions, SimResult, Simulation, drive, open_bar
from dvasim.reporting.records import RecordStore
from dvasim.server.router import Router

__all__ = ["ClusterResult", "simulate_cluster", "query_work_ms"]

BLOCK = 1 << 16  # arrivals read this many at a time (memory stays small with a constant network delay)


@dataclass
class ClusterResult(SimResult):
    """A :class:`SimResult` of several replicas: ``pipeline`` is replica 0's; ``pipelines`` and
    ``replica_busy_ms`` (each device's busy time) are per replica, ``device_busy_ms`` their sum."""

    pipelines: list | None = None
    replica_busy_ms: list[float] | None = None
    sent_to: list[int] | None = None  # queries the router sent to each replica
    replica_of: np.ndarray | None = None  # each query's replica (int16; -1: never routed)


def query_work_ms(profile, seq_lens) -> np.ndarray:
    """The router's estimate of each query's work (``least_work``): its batch-1 time through the whole model at
    its input length, from the table."""
    lens = np.asarray(seq_lens)
    if profile.seq_lens is None:
        return np.full(len(lens), float(profile.total(1)))
    distinct, index = np.unique(lens, return_inverse=True)  # one table lookup per distinct length
    return np.array([float(profile.total(1, int(L))) for L in distinct.tolist()])[index]


def simulate_cluster(pipelines: list, arrivals_ms, seq_lens, router: Router, *, work_ms=None,
                     network_delay_ms: float | list[float] = 0.0, **options) -> ClusterResult:
    """Run one pipeline per replica behind ``router`` on the given arrivals (``options``: those of
    :func:`~dvasim.engines.sim.engine.simulate`; ``work_ms``: each query's estimated work for the router, default
    :func:`query_work_ms` of the first pipeline's table). Every query is in the result, finished or not."""
    return Cluster(pipelines, arrivals_ms, seq_lens, router, SimOptions(**options), work_ms,
                   network_delay_ms).run()


class Cluster:
    """The replicas, the router and the queries' way to them (see the module docstring)."""

    def __init__(self, pipelines: list, arrivals_ms, seq_lens, router: Router, options: SimOptions,
                 work_ms=None, network_delay_ms: float | list[float] = 0.0) -> None:
        if options.closed_clients is not None and len(pipelines) > 1:
            raise ValueError("a closed loop runs on one replica")
        if router.n != len(pipelines):
            raise ValueError(f"the router has {router.n} replicas, the cluster {len(pipelines)}")
        self.t0 = time.perf_counter()
        self.options, self.router = options, router
        self.env = simpy.Environment()
        self.arrivals = np.asarray(arrivals_ms, dtype=np.float64)
        self.lens = np.asarray(seq_lens)
        self.n_total = n = len(self.arrivals)
        if n and np.any(self.arrivals[1:] < self.arrivals[:-1]):
            raise ValueError("arrivals_ms must be sorted (non-decreasing)")
        self.records = options.records if options.records is not None else RecordStore(
            n, pipelines[0].n_stages, arrivals=self.arrivals)
        self.work = query_work_ms(pipelines[0].profile, self.lens) if work_ms is None else np.asarray(work_ms)
        sub = replace(options, records=self.records, progress=False, stop=None)
        self.replicas = [Simulation(p, self.arrivals, self.lens, replace(sub, stream=r), env=self.env,
                                    external=True) for r, p in enumerate(pipelines)]
        for r, rep in enumerate(self.replicas):
            rep.on_left = partial(self._left, r)
        self.replica_of = np.full(n, -1, dtype=np.int16)  # each query's replica (-1: not routed yet)
        self.network = network_delay_ms
        self.groups = self._router_groups(options.seed)
        self.due = None
        self.bar = None

    # ---------------------------------------------------------------- the router
    def _router_times(self, seed: int):
        """``(ids, times)`` blocks: when each query reaches the router, in the order it does."""
        arrivals, d = self.arrivals, self.network
        if not isinstance(d, (list, tuple)):
            for b in range(0, self.n_total, BLOCK):
                yield np.arange(b, min(b + BLOCK, self.n_total)), arrivals[b:b + BLOCK] + float(d)
            return
        rng = np.random.default_rng([int(seed), 4])
        levels, q = np.linspace(0.0, 1.0, len(d)), np.asarray(d, dtype=float)
        t = arrivals + np.interp(rng.random(self.n_total), levels, q)
        order = np.argsort(t, kind="stable")
        for b in range(0, self.n_total, BLOCK):
            ids = order[b:b + BLOCK]
            yield ids, t[ids]

    def _router_groups(self, seed: int):
        """``(t, ids)`` for each run of queries reaching the router at the same instant ``t``, in order."""
        t_run, run = None, []
        for ids, times in self._router_times(seed):
            for k, t in zip(ids.tolist(), times.tolist()):
                if t != t_run:
                    if run:
                        yield t_run, run
                    t_run, run = t, []
                run.append(k)
        if run:
            yield t_run, run

    def next_arrivals(self, _ev=None) -> None:
        """The queries due now reach the router, then the next instant is awaited (as the single run's)."""
        env, groups = self.env, self.groups
        if self.due is not None:
            group, self.due = self.due, None
            self._route(group[1])
        while True:
            group = next(groups, None)
            if group is None:
                return
            if group[0] > env.now:
                self.due = group
                env.timeout(group[0] - env.now).callbacks.append(self.next_arrivals)
                return
            self._route(group[1])

    def _route(self, ids: list[int]) -> None:
        """Each query's replica, in id order; each replica's share handed over together."""
        router, arrivals, lens, work, replica_of = self.router, self.arrivals, self.lens, self.work, self.replica_of
        shares: dict[int, list[Query]] = {}
        for k in ids:
            w = float(work[k])
            r = router.pick(w)
            router.sent(r, w)
            q = Query(k, float(arrivals[k]), int(lens[k]))
            q.replica = r
            replica_of[k] = r
            shares.setdefault(r, []).append(q)
        for r, queries in shares.items():
            self.replicas[r].accept(queries)

    def _left(self, r: int, exited: list[Query]) -> None:
        router, work, bar = self.router, self.work, self.bar
        for q in exited:
            router.answered(r, float(work[q.qid]))
        if bar is not None:
            bar.update(len(exited))

    # ---------------------------------------------------------------- running
    def run(self) -> ClusterResult:
        o = self.options
        self.bar = open_bar(self.n_total, o.progress)
        try:
            self._fire(self.next_arrivals)
            for rep in self.replicas:
                rep.start_executors()
            failure, interrupted = drive(self.env, _Report(self.replicas), o.until_ms, o.watchdog_events, o.stop,
                                         o.fail_soft)
            return self._collect(failure, interrupted)
        except BaseException:
            self.records.discard()
            raise
        finally:
            if self.bar is not None:
                self.bar.close()

    def _fire(self, callback) -> None:
        ev = simpy.Event(self.env)
        ev._ok, ev._value = True, None
        ev.callbacks.append(callback)
        self.env.schedule(ev, _URGENT)

    def _collect(self, failure: str | None, interrupted: str | None) -> ClusterResult:
        """Every query's record (see :meth:`Simulation._collect`): inside a replica, never routed, or, of an
        interrupted run, left out when it had not arrived."""
        records, n_total, env = self.records, self.n_total, self.env
        for rep in self.replicas:
            records.add_many([rep.live[k] for k in sorted(rep.live)])
        n_arrived = n_total if interrupted is None else int(np.searchsorted(self.arrivals, env.now, side="right"))
        for k in np.flatnonzero(self.replica_of[:n_arrived] < 0).tolist():
            records.add_unseen(k, int(self.lens[k]))
        stuck = failure
        if n_arrived < n_total:
            stuck = (f"{failure}; {n_total - n_arrived:,} of {n_total:,} queries had not arrived (left out of the "
                     "records and the metrics)")
            records.leave_out(n_arrived, stuck)
        records.close()
        n_done = int_sum(rep.pipeline.n_exited for rep in self.replicas)
        if failure is None and n_done < n_total:
            stuck = f"{n_total - n_done} of {n_total} queries never finished; " + _Report(self.replicas).stuck_report()
        busy = [rep.device.busy_time for rep in self.replicas]
        return ClusterResult(None, self.replicas[0].pipeline, env.now, time.perf_counter() - self.t0,
                             left_sum(busy), stuck, records, interrupted, n_total - n_arrived,
                             pipelines=[rep.pipeline for rep in self.replicas], replica_busy_ms=busy,
                             sent_to=list(self.router.sent_to), replica_of=self.replica_of)


class _Report:
    """What the watchdog names when the clock stops: every replica's pipeline."""

    def __init__(self, replicas):
        self.replicas = replicas

    def stuck_report(self) -> str:
        return "; ".join(f"replica {r}: {rep.pipeline.stuck_report()}" for r, rep in enumerate(self.replicas))
