"""Reporting: what a run's results become. Per-query records (:mod:`~dvasim.reporting.records`), their metrics
(:mod:`~dvasim.reporting.metrics`), the stability verdict (:mod:`~dvasim.reporting.stability`), a run's result and
its files (:mod:`~dvasim.reporting.result`), seaborn figures (:mod:`~dvasim.reporting.plots`) and timelines
(:mod:`~dvasim.reporting.timeline`).

May import: the foundation, model data and workloads, numpy, pandas, matplotlib and seaborn; never an engine.
"""
