"""Replicas behind a front-end router: ``[cluster]`` and the routing rules.

A run may serve on ``replicas`` GPUs, each its own device with its own pipeline (policy, batch table, executors,
``[engine] instances`` model instances, the stack's host): a serving deployment scaled out, one model server per
GPU, behind one load balancer. Every query reaches the router (after an optional network or front-end delay,
``network_delay_ms``), the router picks a replica at that instant, and the replica's front door sees the query
then (plus the replica's own ``[engine] admission_delay_ms``). A query's latency still counts from its arrival.

The routers, and the systems that use them:

``round_robin``
    Replica ``k mod N`` for the ``k``-th query. NGINX's default upstream balancing, Kubernetes Services in IPVS
    mode (``rr``), Envoy's ``ROUND_ROBIN``, Triton's own client-side gRPC load balancing examples. Under round
    robin each replica of ``N`` sees every ``N``-th arrival: from a Poisson stream of rate ``N * lam`` an Erlang-N
    renewal stream of rate ``lam`` (less bursty than Poisson: Poisson splitting does not hold).
``random``
    A replica drawn uniformly (seeded: the run's ``[workload] seed``). Kubernetes Services in iptables mode (the
    default kube-proxy), Envoy's ``RANDOM``. Each replica then sees a Poisson stream of rate ``lam`` (Poisson
    splitting), so N replicas behave as N independent single-GPU servers.
``join_shortest_queue`` (``jsq``)
    The replica holding the fewest queries not yet answered (queued or in service; ties go to the next replica
    after the last one picked). NGINX ``least_conn``, HAProxy ``leastconn``, Envoy ``LEAST_REQUEST`` with all
    hosts compared, AWS ALB's "least outstanding requests"; the classic JSQ of queueing theory.
``power_of_two`` (``p2c``)
    Two distinct replicas drawn at random, the one with fewer queries not yet answered wins (Mitzenmacher's "power
    of two choices"): Envoy's default ``LEAST_REQUEST`` (choice_count 2), Finagle's, linkerd's P2C balancer.
``least_work``
    The replica with the least work not yet done, estimated by the router as each query's batch-1 time through
    the whole model at its input length (the table's), summed over the replica's queries not yet answered (the
    "least work left" rule; llm-d's and other LLM routers' load-aware scoring weigh queued work this way). With
    equal lengths it picks as JSQ does; with diverse lengths (BERT) it sees that long inputs weigh more.

Routers decide on what a load balancer can know: counts and estimates kept at the router from what it sent and
what came back, never the replica's internal queues. Nothing here imports simpy or torch.
"""

from __future__ import annotations

import numpy as np

from dvasim.schema import MAX_MS, Key, Section

MAX_REPLICAS = 1024  # every replica is a device, a pipeline and its executors the engine keeps

ROUTERS = {
    "round_robin": "replica k mod N for the k-th query (NGINX default, Kubernetes IPVS rr, Envoy ROUND_ROBIN)",
    "random": "a replica drawn uniformly, seeded (kube-proxy iptables mode, Envoy RANDOM)",
    "join_shortest_queue": "fewest queries not yet answered (NGINX least_conn, HAProxy leastconn, AWS ALB least "
                           "outstanding requests)",
    "power_of_two": "the less loaded of two random replicas (Envoy LEAST_REQUEST's default, Finagle, linkerd)",
    "least_work": "least estimated work not yet done: batch-1 model time of each query not yet answered",
}
ALIASES = {"rr": "round_robin", "jsq": "join_shortest_queue", "p2c": "power_of_two",
           "least_outstanding_work": "least_work"}

CLUSTER = Section("cluster", "replicas (one GPU each, its own pipeline) behind a front-end router", (
    Key("replicas", "int", "GPUs serving the model, each its own device and pipeline", default=1, minimum=1,
        maximum=MAX_REPLICAS),
    Key("router", "choice", "how the front end picks a replica: " + "; ".join(f"{k}: {v}" for k, v in ROUTERS.items())
        + " (aliases: " + ", ".join(f"{a} = {n}" for a, n in ALIASES.items()) + ")",
        default="round_robin", choices=(*ROUTERS, *ALIASES)),
    Key("network_delay_ms", "any", "time from a query's arrival until the router sees it (network, front end): a "
        f"number in [0, {MAX_MS:g}], or a list of >= 2 non-decreasing quantiles of its distribution (ms), each query drawing its "
        "own", default=0.0),
))


def router_name(name: str) -> str:
    """The router's canonical name (aliases resolved)."""
    return ALIASES.get(name, name)


class Router:
    """Picks a replica for each query from the router's own counts: ``outstanding[r]`` (queries sent to ``r`` and
    not yet answered) and ``work[r]`` (their estimated work, ms), which :meth:`sent` and :meth:`answered` keep."""

    name = "router"

    def __init__(self, n: int, seed: int = 0):
        self.n = int(n)
        self.outstanding = [0] * self.n
        self.work = [0.0] * self.n
        self.sent_to = [0] * self.n  # queries sent to each replica in all
        self.rng = np.random.default_rng([int(seed), 3])  # its own stream: never the workload's or the jitter's
        self.last = self.n - 1  # the replica picked last (ties go to the next one after it)

    def pick(self, work_ms: float) -> int:
        raise NotImplementedError

    def sent(self, r: int, work_ms: float) -> None:
        self.outstanding[r] += 1
        self.work[r] += work_ms
        self.sent_to[r] += 1
        self.last = r

    def answered(self, r: int, work_ms: float) -> None:
        self.outstanding[r] -= 1
        w = self.work[r] - work_ms
        self.work[r] = w if self.outstanding[r] else 0.0  # no drift from rounding once the replica is empty

    def _least(self, load) -> int:
        """The replica of least ``load``; ties to the first after the last one picked."""
        n, start = self.n, self.last + 1
        best, best_r = None, 0
        for i in range(n):
            r = (start + i) % n
            v = load[r]
            if best is None or v < best:
                best, best_r = v, r
        return best_r


class RoundRobin(Router):
    name = "round_robin"

    def pick(self, work_ms: float) -> int:
        return (self.last + 1) % self.n


class RandomRouter(Router):
    name = "random"

    def pick(self, work_ms: float) -> int:
        return int(self.rng.integers(self.n))


class JoinShortestQueue(Router):
    name = "join_shortest_queue"

    def pick(self, work_ms: float) -> int:
        return self._least(self.outstanding)


class PowerOfTwo(Router):
    name = "power_of_two"

    def pick(self, work_ms: float) -> int:
        if self.n == 1:
            return 0
        a, b = (int(x) for x in self.rng.choice(self.n, size=2, replace=False))
        oa, ob = self.outstanding[a], self.outstanding[b]
        return a if oa < ob or (oa == ob and a < b) else b


class LeastWork(Router):
    name = "least_work"

    def pick(self, work_ms: float) -> int:
        return self._least(self.work)


_CLASSES = {c.name: c for c in (RoundRobin, RandomRouter, JoinShortestQueue, PowerOfTwo, LeastWork)}


def make_router(name: str, n: int, seed: int = 0) -> Router:
    """The router ``name`` (or an alias) over ``n`` replicas."""
    return _CLASSES[router_name(name)](n, seed)
