"""Calibration data: per-stage latency tables (see :mod:`dvasim.calibration.table`)."""

from __future__ import annotations

from dvasim.calibration.table import DEFAULT_TABLE_PATH, LatencyTable, default_table_path

__all__ = ["LatencyTable", "DEFAULT_TABLE_PATH", "default_table_path"]
