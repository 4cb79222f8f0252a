"""E-Ebird's offline co-run profiler in the simulator (:class:`dvasim.policies.e2bird.CoRunProfiler`).

E-Ebird's offline search (:func:`dvasim.policies.e2bird.offline_search`) asks an engine-supplied profiler for the
average latency of workers of given batch sizes that start together, each running one batch of its size through
the whole model. In the simulator that co-run is a small SimPy run of exactly those workers on the simulator's own
device-sharing model (the ``fluid`` model of :class:`dvasim.engines.sim.device.Device`, whatever ``[engine]
sharing`` the run uses, and no ``corun_slowdown``): **our offline profiler**, in place of the paper's GPU
measurements. Every co-running worker is charged what the run's serving stack charges its batch beside its GPU
time (:class:`WorkerCosts`: the very host model and per-batch costs the engine charges, so that the search and the
engine cannot drift apart).

Which stack: the run's own resolved stack (``dvasim.run`` hands it over: ``[server]`` overrides, an
``[engine.host]``'s custom host and the run's ``[engine.transfer]`` included), or the stack E-Ebird's ``stack``
parameter names (resolved here, under E2bird's memory pool; an unknown name is a ConfigError on ``policy.stack``).
Without a stack, or on one that adds nothing (``gpu-only``, ``as-profiled``), the profile is the GPU alone.

:func:`sim_corun` builds the profiler a run's policy asks for (None for a policy that asks none).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from dvasim.core.arith import left_sum
from dvasim.errors import ConfigError

__all__ = ["SimCoRun", "WorkerCosts", "corun_average_ms", "sim_corun", "worker_costs"]


@dataclass(frozen=True)
class WorkerCosts:
    """What the run's serving stack charges each worker's batch beside its GPU time, for the offline profile: the
    very host model and per-batch costs the engine charges (:func:`dvasim.engines.sim.engine.simulate`), so that
    the search and the engine cannot drift apart:

    * every stage: the Python-level work ``host.locked(s, b)`` under the interpreter lock, the copies' per-row
      part ``host.copy_rows(s, b)`` on a core without it, then its launch
      ``host.launch(s, b)`` on the host's cores while the GPU runs it (under the lock where ``host.locks_launch``:
      eager launching), the stage ending when both are done;
    * at the first stage, with per-batch costs: the batch's entry (``batch.entry_host_ms``) and its copy
      (``batch.h2d_ms``) on the one host-to-device link, before the GPU starts where the stack's batch thread idles
      the GPU between its batches, else beside the GPU's work;
    * after the last stage: ``batch.exit_ms(b)`` (synchronisation, results' copy back);
    * the stack's co-run penalty ``corun_per_worker`` on the device.
    """

    stack: str
    host: Any  # a dvasim.server.host.HostModel
    batch: Any = None  # a dvasim.server.costs.BatchCosts, or None (a custom host: launches only)
    corun_per_worker: float = 0.0
    operators: tuple[int, ...] = ()
    operators_source: str = ""

    @classmethod
    def of_run(cls, run) -> WorkerCosts | None:
        """The costs of a :class:`dvasim.server.resolve.StackRun` (None where it adds nothing: the GPU alone)."""
        if run is None or run.host is None:
            return None
        return cls(run.label, run.host, run.batch, run.corun_per_worker, tuple(run.operators or ()),
                   run.operators_source)

    def key(self) -> tuple:
        return (self.stack, json.dumps(self.host.describe(), sort_keys=True, default=str), self.batch,
                self.corun_per_worker)

    def describe(self) -> dict[str, Any]:
        """The costs as E-Ebird's resolved config shows them (``search_costs``)."""
        d = {"stack": self.stack, "launch_ms": list(self.host.launch_ms), "cores": self.host.cores,
             "operators": list(self.operators), "operators_source": self.operators_source}
        if self.batch is not None:
            d.update(request_ms=self.batch.request_ms, sync_ms=self.batch.sync_ms,
                     idle_between_batches=self.batch.idle_between_batches)
        return d


def worker_costs(stack_name: str, profile, field: str = "policy.stack") -> WorkerCosts | None:
    """The :class:`WorkerCosts` of the stack named ``stack_name`` on ``profile`` under E2bird's memory pool (the
    inputs are on the GPU before a batch forms), as a run on that table resolves it; None for a stack that adds
    nothing (``gpu-only``, ``as-profiled``). An unknown name is a ConfigError on ``field``."""
    from dvasim.server.resolve import stack_run
    from dvasim.server.stacks import STACKS
    from dvasim.server.transfer import Transfer

    if not isinstance(stack_name, str) or stack_name not in STACKS:
        raise ConfigError(field, f"unknown stack {stack_name!r}; allowed: {', '.join(STACKS)}")
    return WorkerCosts.of_run(stack_run(stack_name, profile, Transfer(mode="pool"), field))


class _CoRun:
    """One co-run on the fluid device: the SimPy processes of its workers and the resources they share."""

    def __init__(self, profile, seq_len: int | None, costs: WorkerCosts | None):
        import simpy

        from dvasim.engines.sim.device import Device

        self.env = env = simpy.Environment()
        self.profile, self.seq_len, self.costs = profile, seq_len, costs
        self.dev = Device(env, "fluid", corun_per_worker=0.0 if costs is None else costs.corun_per_worker)
        self.ends: list[float] = []
        if costs is not None:
            self.host, self.batch = costs.host, costs.batch
            self.cores = Device(env, "cores", 1.0, self.host.cores)
            self.lock = Device(env, "cores", 1.0, 1)  # one interpreter lock
            self.link = -math.inf  # the one host-to-device link, one copy at a time

    def entry(self, b: int):
        """The batch's entry on the host (under the lock where Python-level) and its copy on the link."""
        env, batch, seq_len = self.env, self.batch, self.seq_len
        pre = batch.entry_host_ms(b, seq_len)
        if pre > 0:
            yield self.lock.run(pre) if batch.python_level else env.timeout(pre)
        h2d = batch.h2d_ms(b, seq_len)
        if h2d > 0:
            self.link = max(env.now, self.link) + h2d
            yield env.timeout(self.link - env.now)

    def launch(self, s: int, b: int, spare: bool):
        """Stage ``s``'s launch on the host while the GPU runs it."""
        host = self.host
        launch = host.launch(s, b, self.seq_len)
        if launch > 0:
            if host.locks_launch:
                yield self.lock.run(launch)
            elif spare:
                yield self.env.timeout(launch)
            else:
                yield self.cores.run(launch)

    def worker(self, b: int, spare: bool):
        """One worker's batch of ``b`` through the whole model; its end time goes to ``ends``."""
        costs, profile, seq_len = self.costs, self.profile, self.seq_len
        batch = None if costs is None else self.batch
        for s in range(profile.n_stages):
            first = batch is not None and s == 0
            locked = self.host.locked(s, b) if costs is not None else 0.0
            if locked > 0:
                yield self.lock.run(locked)
            rows = self.host.copy_rows(s, b) if costs is not None else 0.0
            if rows > 0:  # the copies' per-row part, without the lock (HostModel.copy_rows)
                yield self.env.timeout(rows) if spare else self.cores.run(rows)
            if first and batch.idle_between_batches:  # before the GPU starts
                yield from self.entry(b)
            gpu = self.dev.run(profile.latency(s, b, seq_len), profile.demand(s, b, seq_len))
            if first and not batch.idle_between_batches:  # asynchronous copies: beside the GPU's work
                yield from self.entry(b)
            if costs is not None:
                yield from self.launch(s, b, spare)
            yield gpu
        if batch is not None:
            post = batch.exit_ms(b)
            if post > 0:
                yield self.env.timeout(post)
        self.ends.append(self.env.now)


def corun_average_ms(profile, batch_sizes, seq_len: int | None = None, costs: WorkerCosts | None = None) -> float:
    """The offline profiler: the average latency of workers of ``batch_sizes`` that start together, each running
    one batch of its size through the whole model, on the simulator's fluid device-sharing model (a small SimPy
    run of :class:`dvasim.engines.sim.device.Device`), with ``costs`` (a stack's :class:`WorkerCosts`) charged to
    every worker as the engine charges them."""
    run = _CoRun(profile, seq_len, costs)
    spare = costs is not None and costs.host.cores >= profile.n_stages * len(batch_sizes)  # no launch waits a core
    for b in batch_sizes:
        run.env.process(run.worker(b, spare))
    run.env.run()
    return left_sum(run.ends) / len(run.ends)


class SimCoRun:
    """The simulator's :class:`dvasim.policies.e2bird.CoRunProfiler`: :func:`corun_average_ms` on ``profile``
    with ``costs`` (a stack's :class:`WorkerCosts`, or None: the GPU alone)."""

    def __init__(self, profile, costs: WorkerCosts | None = None):
        self.profile = profile
        self.costs = costs

    def average_ms(self, batch_sizes: tuple[int, ...], seq_len: int | None = None) -> float:
        return corun_average_ms(self.profile, batch_sizes, seq_len, self.costs)

    def cache_key(self) -> tuple:
        """Beside the table's times the search reads, what decides the answers: the fluid model and the costs."""
        return ("sim-fluid", None if self.costs is None else self.costs.key())

    def describe(self) -> dict[str, Any]:
        """``search_costs``: the stack's costs the search charged (nothing for the GPU alone)."""
        return {} if self.costs is None else {"search_costs": self.costs.describe()}


def sim_corun(policy, profile, served=None) -> SimCoRun | None:
    """The co-run profiler a run of ``policy`` on ``profile`` asks for (None for a policy that asks none):
    charged the stack the policy's ``stack`` parameter names, else ``served`` (the run's resolved
    :class:`dvasim.server.resolve.StackRun`, or None: the GPU alone)."""
    if not getattr(policy, "needs_corun", False):
        return None
    stack = getattr(policy, "stack", None)
    costs = worker_costs(stack, profile) if stack is not None else WorkerCosts.of_run(served)
    return SimCoRun(profile, costs)
