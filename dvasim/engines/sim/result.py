"""How a run of the SimPy engine is asked for and how it ends: its options (:class:`SimOptions`), its result
(:class:`SimResult`) and the errors that stop it, in a module of their own so that the compiled core (``make
compiled``: mypyc) leaves them ordinary Python classes: mypyc compiles no ``RuntimeError`` subclass, a compiled
class takes no interpreted subclass (the cluster's result extends :class:`SimResult`), and compiled options would
check their fields' types where the pure ones do not (a numpy integer for ``seed``), so both paths accept the
same options. Each is re-exported by :mod:`dvasim.engines.sim.engine`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dvasim.config.sections import OVERLAP_SHARE_H100
from dvasim.core.pipeline import Pipeline
from dvasim.core.query import Query
from dvasim.reporting.records import RecordStore


class DeadlockError(RuntimeError):
    """The simulation ran out of events while queries were still inside the pipeline."""


@dataclass
class SimResult:
    queries: list[Query] | None  # the Query objects, in id order (``keep_queries``), else None
    pipeline: Pipeline
    sim_end_ms: float
    wall_s: float
    device_busy_ms: float
    stuck: str | None = None  # description of the pipeline if some queries never finished
    records: RecordStore | None = None  # every query's record (columnar), finished or not
    interrupted: str | None = None  # what stopped the run early (a stop request, Ctrl-C), if anything did
    n_not_arrived: int = 0  # queries that had not arrived when it was interrupted: not recorded, not measured


class SimulationStuck(RuntimeError):
    """The simulated clock stopped advancing (see :func:`~dvasim.engines.sim.engine.simulate`'s watchdog)."""


class StopRequested(Exception):
    """The ``stop`` option asked the run to stop (its argument: why, e.g. ``"SIGTERM"``)."""


@dataclass(frozen=True)
class SimOptions:
    """How :func:`simulate` runs a pipeline: every option of the engine, with its default (see :func:`simulate`'s
    docstring for what each does). ``simulate(pipeline, arrivals, lens, **options)`` takes them by name."""

    sharing: str = "fluid"
    corun_slowdown: float = 1.0
    launch_overhead_ms: float = 0.0
    admission_delay_ms: Any = 0.0  # ms, or a list (or tuple) of the delay's quantiles
    service_cv: float = 0.0
    seed: int = 0
    progress: bool = False
    until_ms: float | None = None
    closed_clients: int | None = None
    think_ms: float = 0.0
    fail_soft: bool = False
    cores: int = 2
    host: Any = None  # a dvasim.server.host.HostModel
    watchdog_events: int = 1_000_000
    records: RecordStore | None = None
    keep_queries: bool = True
    transfer: Any = None  # a dvasim.server.transfer.Transfer
    batch_costs: Any = None  # a dvasim.server.costs.BatchCosts
    corun_per_worker: float = 0.0
    contention: str = "none"  # [engine] contention: "none" or "overlap" (dvasim.engines.sim.device)
    contention_share: float = OVERLAP_SHARE_H100  # [engine] contention_share (used by "overlap" only)
    stop: Callable[[], str | None] | None = None
    stream: int = 0  # a replica's index (:mod:`~dvasim.engines.sim.cluster`): its own random streams beyond 0
