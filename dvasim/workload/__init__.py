"""Workloads: query arrival times and input lengths. :mod:`~dvasim.workload.config` declares the ``[workload]``
section and builds a :class:`Workload`; :mod:`~dvasim.workload.arrivals` the arrival processes;
:mod:`~dvasim.workload.traces` trace files; :mod:`~dvasim.workload.lengths` input-length distributions.

May import: model data (the tables' profiled lengths, the shipped traces' folder), the foundation, numpy and
pandas.
"""

from __future__ import annotations

from dvasim.workload.arrivals import (
    gamma_arrivals,
    poisson_arrivals,
    stepping_arrivals,
    stepping_rates,
    uniform_arrivals,
)
from dvasim.workload.config import KINDS, WORKLOAD, Workload, length_rng, workload_from_config
from dvasim.workload.lengths import glue_path, glue_tasks, load_lengths
from dvasim.workload.traces import Trace, load_trace, shipped_traces, trace_arrivals, trace_path

__all__ = [
    "Workload",
    "workload_from_config",
    "poisson_arrivals",
    "gamma_arrivals",
    "uniform_arrivals",
    "stepping_arrivals",
    "stepping_rates",
    "glue_tasks",
    "glue_path",
    "load_lengths",
    "Trace",
    "load_trace",
    "trace_arrivals",
    "trace_path",
    "shipped_traces",
    "length_rng",
    "KINDS",
    "WORKLOAD",
]
