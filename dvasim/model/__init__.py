"""Calibration data: per-stage latency tables (see :mod:`dvasim.model.table`)."""

from __future__ import annotations

from dvasim.model.table import DEFAULT_TABLE_PATH, LatencyTable, default_table_path

__all__ = ["LatencyTable", "DEFAULT_TABLE_PATH", "default_table_path"]
