"""Per-query records, columnar: kept in memory as a DataFrame, or streamed to ``queries.parquet``.

A :class:`RecordStore` receives each query as it leaves the pipeline (and, at the end of a run, the queries that
never did) and keeps

* the columns the summary needs, in per-query arrays indexed by query id (arrival, first-stage start, finish,
  exit batch size and status: 29 bytes a query, 37 with the offered rate; an open loop's arrivals are shared
  with its workload, not copied), from which :func:`summarize_arrays`
  computes the exact mean and percentiles;
* the full record (:data:`columns`) of every query, either in memory (``frame()`` gives the DataFrame, in query
  id order) or written to a Parquet file in chunks of ``chunk_rows`` rows, in the order the queries left
  (``path``; read it back sorted with :func:`read_records`). Memory then stays bounded by the chunk, whatever the
  run's length. Given a per-query ``offered_qps`` array, the records end with an ``offered_qps`` column (the rate
  the query was offered at; see :func:`dvasim.reporting.stability.offered_rates`).

The times of a record (ms): ``arrival_ms``; ``seen_ms``, when the front door saw it (the arrival plus any admission
delay); ``payload_ms``, when its payload formed: it left the batcher's queue into the batch Triton's dynamic batcher
forms, after which the queue policy's timeout no longer applies to it; ``instance_ms``, when that payload reached a
model instance (the instance's thread dequeued it); ``admitted_ms``, when it entered its batch of the batch table;
``start_ms`` and ``finish_ms``, its first stage's start and its last stage's finish (``s{s}_start_ms`` /
``s{s}_finish_ms`` per stage); ``latency_ms`` = ``finish_ms - arrival_ms`` and ``queue_ms`` = ``start_ms -
arrival_ms``. Under a Triton release that forms payloads ahead (any but ``"ideal"``: ``"21.10"``, ``"current"``,
:mod:`dvasim.policies.triton_release`; also ``dvabatch-built``'s front door) ``seen_ms <= payload_ms <=
instance_ms <= admitted_ms <= start_ms``: a payload may wait in the model's queue for an instance (``instance_ms -
payload_ms``), then on the instance's stream behind its running batch (``start_ms - instance_ms``). Every other
policy (and Triton's ``"ideal"`` release) forms no payload ahead: a batch goes to its instance as it forms, so
``payload_ms`` = ``instance_ms`` = ``admitted_ms`` (for a query stretched into a running batch, when it joined
it). Both are NaN for a query that never left the batcher's queue (refused, or still waiting when the run ended).
The summary's ``mean_payload_wait_ms`` and ``max_payload_wait_ms`` are over the served queries' ``payload_ms -
arrival_ms``.

Every record has a ``status`` (:data:`STATUSES`): ``"ok"`` (served), ``"rejected"`` or ``"timed_out"`` (it
left without being served: Triton's queue policy refused it, :meth:`dvasim.core.pipeline.Pipeline.leave_unserved`;
no ``finish_ms``, no latency) or ``"unfinished"`` (still inside when the run ended, or never reached the front
door), a ``priority`` (int16: the priority level it asked for, 1 the highest; 0: the server's default level) and a
``replica`` (int16: the model replica that served it, 0 on a single replica). The summary's latency
statistics are over the served queries only; ``n_rejected`` and ``n_timed_out`` count the refused ones, which,
like unfinished ones, count as QoS violations (a client that got an error did not get its answer in time).

A streamed file is written under a temporary name beside ``path`` (``.queries.parquet.partial``) and renamed when
:meth:`RecordStore.close` has written its footer: a file under the final name is always readable. An ``OSError``
while writing (a full disk) removes the temporary file and raises :class:`~dvasim.errors.OutputError`; a store
whose run failed is :meth:`~RecordStore.discard`-ed.

A run that was interrupted records only the queries that had arrived (ids ``0..m-1``: ids are in arrival order):
:meth:`RecordStore.leave_out` marks the rest, the summary and the verdict measure the first ``m`` only and say how
many were left out (``n_not_arrived``; a streamed file says it in its footer's key-value metadata too).

Nothing here imports simpy or torch.
"""

from __future__ import annotations

import contextlib
import math
import os
import struct
from pathlib import Path

import numpy as np
import pandas as pd

from dvasim.outputs import output_error, partial_path
from dvasim.reporting.rows import (  # noqa: F401  (the status codes are re-exported)
    FIELDS,
    OK,
    REJECTED,
    SCALAR_FIELDS,
    STAGE_FIELDS,
    STATUSES,
    TIMED_OUT,
    UNFINISHED,
    Rows,
    row_format,
    status_code,
)

PERCENTILES = (50, 90, 95, 99)
_CODES = dict(FIELDS)  # a stored field's type code (struct's, which numpy reads the same)
_STATUS_NAMES = np.array(STATUSES, dtype=object)


def columns(n_stages: int) -> list[str]:
    """The record's columns, in order (``latency_ms`` and ``queue_ms`` are derived from them)."""
    return ["query_id", "arrival_ms", "seen_ms", "payload_ms", "instance_ms", "admitted_ms", "start_ms", "finish_ms",
            "latency_ms", "seq_len", "batch_id", "exit_batch_id", "exit_batch_size",
            *[f"s{s}_{k}_ms" for s in range(n_stages) for k in ("start", "finish")], "queue_ms", "status", "priority",
            "replica"]


def _dtype(column: str) -> np.dtype:
    """A stored column's dtype: its field's type code (:data:`FIELDS`), else float64 (the stage times, the offered
    load). ``status`` is stored as its int8 code and written as its name."""
    return np.dtype(_CODES.get(column, "d"))


def _row_dtype(n_stages: int) -> np.dtype:
    """A packed record (:func:`row_format`) as numpy reads it: each field at its offset, the stage times as
    ``n_stages`` values."""
    names, formats, offsets, offset = [], [], [], 0
    for name, _code in FIELDS:
        dt, width = _dtype(name), n_stages if name in STAGE_FIELDS else 1
        names.append(name)
        formats.append((dt, (width,)) if name in STAGE_FIELDS else dt)
        offsets.append(offset)
        offset += dt.itemsize * width
    return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                     "itemsize": struct.calcsize(row_format(n_stages))})


def _columns(rows: Rows) -> dict[str, np.ndarray]:
    """The buffered records as columns (the stage times as ``s{s}_start_ms`` / ``s{s}_finish_ms``), copied out of
    the packed rows."""
    n_stages = rows.n_stages
    packed = np.frombuffer(rows.buffer, dtype=_row_dtype(n_stages))
    out = {name: packed[name].copy() for name in SCALAR_FIELDS}
    starts, finishes = packed["stage_start"], packed["stage_finish"]
    for s in range(n_stages):
        out[f"s{s}_start_ms"] = starts[:, s].copy()
        out[f"s{s}_finish_ms"] = finishes[:, s].copy()
    for name in ("status", "priority", "replica"):
        out[name] = packed[name].copy()
    return out


class RecordStore:
    """Columnar records of ``n`` queries (ids ``0..n-1``) through ``n_stages`` stages."""

    CHUNK_ROWS = 1 << 16  # rows buffered before they are converted to columns (and written, when streaming)

    def __init__(self, n: int, n_stages: int, path: str | Path | None = None, chunk_rows: int | None = None,
                 arrivals: np.ndarray | None = None, offered_qps: np.ndarray | None = None):
        self.n = n
        self.n_stages = n_stages
        self.chunk_rows = chunk_rows or self.CHUNK_ROWS
        self.path = None if path is None else Path(path)
        # the summary's columns, by query id; the arrivals of an open loop are known (and shared, not copied)
        self._arrivals_known = arrivals is not None
        self.arrival = np.asarray(arrivals, dtype=np.float64) if arrivals is not None else np.full(n, math.nan)
        self.start = np.full(n, math.nan)
        self.finish = np.full(n, math.nan)
        self.exit_batch_size = np.zeros(n, dtype=np.int32)
        self.status = np.full(n, UNFINISHED, dtype=np.int8)  # each query's status code (STATUSES)
        self.offered_qps = None if offered_qps is None else np.asarray(offered_qps, dtype=np.float64)
        self._rows = Rows(n_stages)
        self._chunks: list[dict[str, np.ndarray]] = []
        self._writer = None
        self._file_done = False  # a streamed file has been closed (renamed to ``path``) or discarded
        self.n_rows = 0
        self.n_measured = n  # the queries the summary measures: ids 0..n_measured-1 (see leave_out)
        self.left_out_reason: str | None = None
        # the served queries' waits for their payload (payload_ms - arrival_ms), kept as each chunk's exact sum
        # (math.fsum: the mean does not depend on the chunking) and the largest, for the summary
        self._payload_wait_sums: list[float] = []
        self._payload_wait_n = 0
        self._payload_wait_max = -math.inf

    # ------------------------------------------------------------------ filling
    def add(self, q) -> None:
        """Record query ``q`` (a :class:`dvasim.core.query.Query`): when it leaves, or at the end of the run."""
        self.add_many((q,))

    def add_many(self, queries) -> None:
        self._rows.add(queries)
        if len(self._rows) >= self.chunk_rows:
            self._flush()

    def add_unseen(self, qid: int, seq_len: int) -> None:
        """A query that never reached the front door (its arrival, if known, is in the summary arrays)."""
        self._rows.add_blank(qid, float(self.arrival[qid]), seq_len)
        if len(self._rows) >= self.chunk_rows:
            self._flush()

    def _flush(self) -> None:
        if not len(self._rows):
            return
        chunk = _columns(self._rows)
        self._rows = Rows(self.n_stages)
        qid = chunk["query_id"]
        if not self._arrivals_known:
            self.arrival[qid] = chunk["arrival_ms"]
        self.start[qid] = chunk["start_ms"]
        self.finish[qid] = chunk["finish_ms"]
        self.exit_batch_size[qid] = chunk["exit_batch_size"]
        self.status[qid] = chunk["status"]
        if self.offered_qps is not None:
            chunk["offered_qps"] = self.offered_qps[qid]
        self.n_rows += len(qid)
        served = chunk["status"] == OK
        if served.any():
            wait = chunk["payload_ms"][served] - chunk["arrival_ms"][served]
            self._payload_wait_sums.append(math.fsum(wait.tolist()))
            self._payload_wait_n += len(wait)
            self._payload_wait_max = max(self._payload_wait_max, float(wait.max()))
        if self.path is None:
            self._chunks.append(chunk)
            return
        self._write(chunk)

    def _write(self, chunk: dict[str, np.ndarray]) -> None:
        """Append ``chunk`` to the streamed file (opened, under its temporary name, on the first chunk)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._file_done:
            raise RuntimeError(f"{self.path}: the records were already closed")
        table = pa.table(_with_derived(chunk, self.n_stages))
        try:
            if self._writer is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._writer = pq.ParquetWriter(partial_path(self.path), table.schema, compression="zstd")
            self._writer.write_table(table)
        except OSError as e:  # a full disk: nothing half-written is left, and the error says so
            self.discard()
            raise output_error(self.path, e) from None

    def leave_out(self, n_arrived: int, reason: str) -> None:
        """Measure only queries ``0..n_arrived-1`` (the others had not arrived when the run was ``reason``-ed:
        interrupted); their records are not added."""
        self.n_measured = int(n_arrived)
        self.left_out_reason = reason

    @property
    def n_left_out(self) -> int:
        """How many queries (the last ids) had not arrived when the run stopped: not recorded, not measured."""
        return self.n - self.n_measured

    def close(self) -> None:
        """Write what is buffered; a streamed file gets its footer and its final name (an empty run's file has
        the columns and no rows). Closing again does nothing."""
        self._flush()
        if self.path is None or self._file_done:
            return
        if self._writer is None:
            self._write(self._empty_chunk())
        try:
            if self.n_left_out:
                self._writer.add_key_value_metadata({"dvasim.n_not_arrived": str(self.n_left_out),
                                                     "dvasim.interrupted": self.left_out_reason or ""})
            self._writer.close()
            self._writer = None
            os.replace(partial_path(self.path), self.path)
        except OSError as e:
            self.discard()
            raise output_error(self.path, e) from None
        self._file_done = True

    def discard(self) -> None:
        """Give up a streamed file: close its writer and remove its temporary file (a failed run's)."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
            self._writer = None
        if self.path is not None and not self._file_done:
            with contextlib.suppress(OSError):
                partial_path(self.path).unlink()
            self._file_done = True

    def _empty_chunk(self) -> dict[str, np.ndarray]:
        names = [c for c in columns(self.n_stages) if c not in ("latency_ms", "queue_ms")]
        if self.offered_qps is not None:
            names.append("offered_qps")
        return {c: np.array([], dtype=_dtype(c)) for c in names}

    # ------------------------------------------------------------------ reading
    def frame(self) -> pd.DataFrame:
        """All records in query id order (in-memory stores; a streamed store reads its file back)."""
        self.close()
        if self.path is not None:
            return read_records(self.path)
        if not self._chunks:
            return pd.DataFrame(_with_derived(self._empty_chunk(), self.n_stages))
        merged = {k: np.concatenate([c[k] for c in self._chunks]) for k in self._chunks[0]}
        order = np.argsort(merged["query_id"], kind="stable")
        return pd.DataFrame(_with_derived({k: v[order] for k, v in merged.items()}, self.n_stages))

    def measured(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``arrival``, ``start``, ``finish`` and ``exit_batch_size`` of the measured queries (views: no copies)."""
        m = self.n_measured
        if m == self.n:
            return self.arrival, self.start, self.finish, self.exit_batch_size
        return self.arrival[:m], self.start[:m], self.finish[:m], self.exit_batch_size[:m]

    def measured_status(self) -> np.ndarray:
        """The status codes (:data:`STATUSES`) of the measured queries (a view)."""
        return self.status if self.n_measured == self.n else self.status[:self.n_measured]

    def summary(self, qos_target_ms: float) -> dict:
        """:func:`summarize_arrays` of the measured queries, with the mean and largest wait of a served query for its
        payload (``mean_payload_wait_ms``, ``max_payload_wait_ms``: ``payload_ms - arrival_ms``; NaN when none was
        served); with ``n_not_arrived`` when some were left out."""
        self.close()
        out = summarize_arrays(*self.measured(), qos_target_ms, status=self.measured_status())
        n = self._payload_wait_n
        out["mean_payload_wait_ms"] = math.fsum(self._payload_wait_sums) / n if n else math.nan
        out["max_payload_wait_ms"] = self._payload_wait_max if n else math.nan
        if self.n_left_out:
            out["n_not_arrived"] = self.n_left_out
        return out

    def latency_sample(self, max_points: int) -> pd.DataFrame:
        """``arrival_ms``, ``finish_ms`` and ``latency_ms`` of every k-th measured query (by id), at most
        ``max_points``: what a latency figure draws."""
        self.close()
        arrival, _, finish, _ = self.measured()
        k = max(1, -(-len(arrival) // max_points))
        a, f = arrival[::k], finish[::k]
        return pd.DataFrame({"arrival_ms": a, "finish_ms": f, "latency_ms": f - a})


def _with_derived(chunk: dict[str, np.ndarray], n_stages: int) -> dict[str, np.ndarray]:
    out = dict(chunk)
    out["latency_ms"] = chunk["finish_ms"] - chunk["arrival_ms"]
    out["queue_ms"] = chunk["start_ms"] - chunk["arrival_ms"]
    codes = chunk["status"]
    out["status"] = _STATUS_NAMES[codes] if len(codes) else np.array([], dtype=str)  # names (typed when empty)
    extra = ["offered_qps"] if "offered_qps" in chunk else []
    return {c: out[c] for c in [*columns(n_stages), *extra]}


def read_records(path: str | Path) -> pd.DataFrame:
    """A ``queries.parquet`` written by a run, as a DataFrame in query id order."""
    df = pd.read_parquet(path)
    return df.sort_values("query_id", kind="stable").reset_index(drop=True)


def records_frame(queries, n_stages: int) -> pd.DataFrame:
    """One row per query (finished or not), in query id order, from :class:`Query` objects."""
    queries = list(queries)
    store = RecordStore(max((q.qid for q in queries), default=-1) + 1, n_stages, chunk_rows=max(1, len(queries)))
    store.add_many(queries)
    return store.frame()


def status_codes(status) -> np.ndarray:
    """Status codes (:data:`STATUSES`) from codes or from the records' ``status`` names."""
    arr = np.asarray(status)
    if arr.dtype.kind in "iu":
        return arr
    codes = np.full(arr.shape, -1, dtype=np.int8)
    for i, name in enumerate(STATUSES):  # vectorized: a record set's status column may hold millions of names
        codes[arr == name] = i
    if np.any(codes < 0):
        raise ValueError(f"unknown status {str(arr[codes < 0][0])!r}; one of {', '.join(STATUSES)}")
    return codes


def summarize_arrays(arrival: np.ndarray, start: np.ndarray, finish: np.ndarray, exit_batch_size: np.ndarray,
                     qos_target_ms: float, status: np.ndarray | None = None) -> dict:
    """Latency statistics over finished queries (NaN ``finish``); unfinished ones count as QoS violations.
    Arrays are per query, in query id order. Means are numpy's (pairwise sums), percentiles numpy's linear.
    Temporaries: a few arrays of the finished queries' size at a time (10 million queries: 80 MB each).

    ``status`` (codes or names, :data:`STATUSES`): then ``n_rejected`` and ``n_timed_out`` count the queries that
    left without being served (their ``finish`` is NaN: they are not in the latency statistics, and count as QoS
    violations), and ``latency_note`` says so when there are any."""
    n = len(arrival)
    done = ~np.isnan(finish)
    n_done = int(done.sum())
    every = n_done == n
    pick = (lambda x: x) if every else (lambda x: x[done])  # noqa: E731  (no copies when every query finished)
    lat = pick(finish) - pick(arrival)
    out: dict = {"n_queries": int(n), "n_completed": n_done}
    n_refused = 0
    if status is not None:
        codes = status_codes(status)
        out["n_rejected"] = int(np.count_nonzero(codes == REJECTED))
        out["n_timed_out"] = int(np.count_nonzero(codes == TIMED_OUT))
        n_refused = out["n_rejected"] + out["n_timed_out"]
    if len(lat):
        out["mean_latency_ms"] = float(lat.mean())
        for p, v in zip(PERCENTILES, np.percentile(lat, PERCENTILES)):
            out[f"p{p}_latency_ms"] = float(v)
        out["max_latency_ms"] = float(lat.max())
        span_ms = float(np.max(pick(finish)) - np.nanmin(arrival))
        out["throughput_qps"] = float(len(lat) / (span_ms / 1000.0)) if span_ms > 0 else math.nan
        out["mean_queue_ms"] = float((pick(start) - pick(arrival)).mean())
        out["mean_exit_batch_size"] = float(pick(exit_batch_size).mean())
    else:
        for k in ["mean_latency_ms", *[f"p{p}_latency_ms" for p in PERCENTILES], "max_latency_ms",
                  "throughput_qps", "mean_queue_ms", "mean_exit_batch_size"]:
            out[k] = math.nan
    span_in = float(np.nanmax(arrival) - np.nanmin(arrival)) if n > 1 else math.nan
    out["offered_qps"] = float((n - 1) / (span_in / 1000.0)) if n > 1 and span_in > 0 else math.nan
    out["qos_target_ms"] = float(qos_target_ms)
    violations = (n - n_done) + int(np.count_nonzero(lat > qos_target_ms))
    out["qos_violation_rate"] = float(violations / n) if n else math.nan
    if n_refused:
        out["latency_note"] = (f"latency statistics are over the {n_done:,} served queries; the {n_refused:,} "
                               f"refused by the queue policy ({out['n_rejected']:,} rejected, "
                               f"{out['n_timed_out']:,} timed out) are not in them and count as QoS violations")
    return out
