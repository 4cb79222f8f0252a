"""A cluster's summary (``[cluster] replicas > 1``): the router, and per replica what it served and how busy its
device was.

Each query's record has its ``replica``; :func:`replica_summary` adds to a run's summary ``replicas``, ``router``,
``network_delay_ms``, ``replica_busy_spread`` (the busiest device's busy fraction less the idlest's) and
``per_replica``: one dict per replica with ``replica``, ``n_queries`` (sent to it), ``n_completed``,
``throughput_qps``, ``mean_latency_ms``, ``p99_latency_ms``, ``qos_violation_rate`` and
``device_busy_fraction`` (its device's busy time over the run's length: its utilisation). The summary's own
``device_busy_fraction`` is then the mean over the replicas.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dvasim.reporting.records import summarize_arrays

KEYS = ("n_queries", "n_completed", "throughput_qps", "mean_latency_ms", "p99_latency_ms", "qos_violation_rate")


def replica_summary(store, cfg: dict[str, Any], res) -> dict[str, Any]:
    """The cluster's part of a run's summary (see the module docstring). ``res``: the cluster engine's result
    (``replica_of``, ``replica_busy_ms``, ``sim_end_ms``)."""
    arrival, start, finish, ebs = store.measured()
    status = store.measured_status()
    m = len(arrival)
    of = res.replica_of[:m]
    qos = cfg["qos"]["target_ms"]
    per = []
    for r, busy in enumerate(res.replica_busy_ms):
        mask = of == r
        s = summarize_arrays(arrival[mask], start[mask], finish[mask], ebs[mask], qos, status=status[mask])
        row = {"replica": r, **{k: s.get(k, float("nan")) for k in KEYS}}
        row["device_busy_fraction"] = busy / res.sim_end_ms if res.sim_end_ms > 0 else 0.0
        per.append(row)
    fractions = np.array([row["device_busy_fraction"] for row in per])
    cl = cfg["cluster"]
    return {"replicas": len(per), "router": cl["router"], "network_delay_ms": cl["network_delay_ms"],
            "replica_busy_spread": float(fractions.max() - fractions.min()), "per_replica": per}
