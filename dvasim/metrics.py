"""Per-query records as a DataFrame, and the summary of a run."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from dvasim.core.query import Query

PERCENTILES = (50, 90, 95, 99)


def records_frame(queries: list[Query], n_stages: int) -> pd.DataFrame:
    """One row per query (finished or not), in arrival order."""
    cols: dict[str, list] = {
        "query_id": [q.qid for q in queries],
        "arrival_ms": [q.arrival for q in queries],
        "seen_ms": [q.seen for q in queries],
        "admitted_ms": [q.admitted for q in queries],
        "start_ms": [q.start for q in queries],
        "finish_ms": [q.finish for q in queries],
        "latency_ms": [q.finish - q.arrival for q in queries],
        "seq_len": [q.seq_len for q in queries],
        "batch_id": [q.batch_id for q in queries],
        "exit_batch_id": [q.exit_batch_id for q in queries],
        "exit_batch_size": [q.exit_batch_size for q in queries],
    }
    for s in range(n_stages):
        cols[f"s{s}_start_ms"] = [q.stage_start[s] if q.stage_start else math.nan for q in queries]
        cols[f"s{s}_finish_ms"] = [q.stage_finish[s] if q.stage_finish else math.nan for q in queries]
    df = pd.DataFrame(cols)
    df["queue_ms"] = df["start_ms"] - df["arrival_ms"]
    return df


def summarize(df: pd.DataFrame, qos_target_ms: float) -> dict:
    """Latency statistics over finished queries; unfinished ones count as QoS violations."""
    n = len(df)
    done = df["finish_ms"].notna()
    lat = df.loc[done, "latency_ms"].to_numpy()
    out: dict = {"n_queries": int(n), "n_completed": int(done.sum())}
    if len(lat):
        out["mean_latency_ms"] = float(lat.mean())
        for p in PERCENTILES:
            out[f"p{p}_latency_ms"] = float(np.percentile(lat, p))
        out["max_latency_ms"] = float(lat.max())
        span_ms = float(df.loc[done, "finish_ms"].max() - df["arrival_ms"].min())
        out["throughput_qps"] = float(len(lat) / (span_ms / 1000.0)) if span_ms > 0 else math.nan
        out["mean_queue_ms"] = float(df.loc[done, "queue_ms"].mean())
        out["mean_exit_batch_size"] = float(df.loc[done, "exit_batch_size"].mean())
    else:
        for k in ["mean_latency_ms", *[f"p{p}_latency_ms" for p in PERCENTILES], "max_latency_ms",
                  "throughput_qps", "mean_queue_ms", "mean_exit_batch_size"]:
            out[k] = math.nan
    span_in = float(df["arrival_ms"].max() - df["arrival_ms"].min()) if n > 1 else math.nan
    out["offered_qps"] = float((n - 1) / (span_in / 1000.0)) if n > 1 and span_in > 0 else math.nan
    out["qos_target_ms"] = float(qos_target_ms)
    violations = (~done).sum() + (df.loc[done, "latency_ms"] > qos_target_ms).sum()
    out["qos_violation_rate"] = float(violations / n) if n else math.nan
    return out
