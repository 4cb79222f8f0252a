"""What every engine builds the same way from a resolved config: the policy object, the workload checked against
the model's table, and (for the engines that serve one real replica: the replay, the real Triton server) the
refusal of a ``[cluster]`` they cannot serve. :func:`dvasim.api.build`, the replay and the triton engine call these,
so a config means one thing on every engine.

May import: the foundation, the policies and the workloads (no simpy, no torch).
"""

from __future__ import annotations

from typing import Any

from dvasim.errors import ConfigError


def policy_from_section(section: dict[str, Any]):
    """The policy object of a resolved ``[policy]`` section (its ``name`` and parameters), checked."""
    from dvasim.policies import make_policy

    return make_policy(section["name"], {k: v for k, v in section.items() if k != "name"})


def workload_for_table(cfg: dict[str, Any], table):
    """The resolved config's workload, with lengths where ``table`` has them, each length within the table."""
    from dvasim.workload import workload_from_config
    from dvasim.workload.lengths import check_lengths

    workload = workload_from_config(cfg["workload"], needs_seq_len=table.seq_lens is not None,
                                    base_dir=cfg["base_dir"])
    if table.seq_lens is not None and len(workload.seq_lens):
        check_lengths(table, workload.seq_lens)
    return workload


def check_one_replica(cluster: dict, engine: str = "the replay") -> None:
    """An engine that serves on one device, each query straight into its one pipeline (``engine``: its name in
    the message): a resolved ``[cluster]`` that would change the simulation of the same config (``replicas`` > 1,
    a ``network_delay_ms``) is refused rather than ignored, or ``dvasim validate`` would compare a cluster's
    simulation with one replica's run. (The ``router`` of one replica picks nothing, in either engine.)"""
    if cluster["replicas"] != 1:
        raise ConfigError("cluster.replicas", f"is {cluster['replicas']}, but {engine} runs one replica (one "
                                              "device, one pipeline): remove [cluster] replicas (or set it to 1) to "
                                              "replay or validate, and simulate the cluster with dvasim run")
    delay = cluster["network_delay_ms"]
    if any(float(d) != 0.0 for d in (delay if isinstance(delay, list) else [delay])):
        raise ConfigError("cluster.network_delay_ms", f"is {delay}, but {engine} has no network before its "
                                                      "pipeline: remove [cluster] network_delay_ms (or set it to 0) "
                                                      "to replay or validate, and simulate the delay with dvasim run")
