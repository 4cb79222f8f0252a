"""Per-query records as a DataFrame, and the summary of a run (see :mod:`dvasim.reporting.records` for the columnar store)."""

from __future__ import annotations

import pandas as pd

from dvasim.reporting.records import PERCENTILES, records_frame, summarize_arrays

__all__ = ["PERCENTILES", "records_frame", "summarize", "summarize_arrays"]


def summarize(df: pd.DataFrame, qos_target_ms: float) -> dict:
    """Latency statistics over finished queries; unfinished ones count as QoS violations (refused ones too, counted
    in ``n_rejected`` / ``n_timed_out`` when the records have a ``status`` column)."""
    return summarize_arrays(df["arrival_ms"].to_numpy(dtype=float), df["start_ms"].to_numpy(dtype=float),
                            df["finish_ms"].to_numpy(dtype=float), df["exit_batch_size"].to_numpy(), qos_target_ms,
                            status=df["status"].to_numpy() if "status" in df else None)
