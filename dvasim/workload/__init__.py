"""Workloads: query arrival times and input lengths (see :mod:`dvasim.workload.config` for the TOML keys;
:mod:`dvasim.workload.traces` for trace files)."""

from __future__ import annotations

from dvasim.workload.arrivals import (
    gamma_arrivals,
    poisson_arrivals,
    stepping_arrivals,
    stepping_rates,
    uniform_arrivals,
)
from dvasim.workload.config import ALLOWED_KEYS, KINDS, Workload, length_rng, workload_from_config
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
    "ALLOWED_KEYS",
]
