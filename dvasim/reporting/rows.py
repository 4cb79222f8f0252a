"""Query records as they leave, buffered as packed rows until they become columns
(:class:`dvasim.reporting.records.RecordStore`), and the record's status codes.

A record is one row of fixed size packed with :mod:`struct` (:func:`row_format`: each field of :data:`FIELDS` in
an 8-byte slot, the stage times ``n_stages`` slots each, the three small codes sharing the last slot) and
appended to one ``bytearray``: buffered records are no Python objects (nothing for the garbage collector to walk),
and a chunk's columns are read from the rows' memory (:func:`dvasim.reporting.records._columns`). One ``pack`` a
record, not a call per field: appending to typed arrays field by field parsed each value in a generic call and
made recording a sixth of a compiled run. This runs once for every query of a run, so it is part of the optional
compiled core (:mod:`dvasim.compiled`); it imports nothing but the standard library and the query it records
(:mod:`dvasim.core.query`, read natively by a compiled core).
"""

from __future__ import annotations

import math
import struct
from typing import Any, Final

from dvasim.core.query import Query

# the ``status`` column's values; a record keeps its status as the index (an int8 code)
STATUSES = ("ok", "rejected", "timed_out", "unfinished")
OK: Final = 0
REJECTED: Final = 1
TIMED_OUT: Final = 2
UNFINISHED: Final = 3
_STATUS_CODE: Final = {"ok": OK, "rejected": REJECTED, "timed_out": TIMED_OUT}

# a record's fields in the order packed: (name, struct's type code). ``d`` and ``q`` take an 8-byte slot each
# (the stage times n_stages slots); the last three share one slot (an int8 and two int16, then padding)
FIELDS: tuple[tuple[str, str], ...] = (
    ("query_id", "q"), ("arrival_ms", "d"), ("seen_ms", "d"), ("admitted_ms", "d"), ("start_ms", "d"),
    ("finish_ms", "d"), ("seq_len", "q"), ("batch_id", "q"), ("exit_batch_id", "q"), ("exit_batch_size", "q"),
    ("payload_ms", "d"), ("instance_ms", "d"),
    ("stage_start", "d"), ("stage_finish", "d"), ("status", "b"), ("priority", "h"), ("replica", "h"))
STAGE_FIELDS = ("stage_start", "stage_finish")
# the fields of one slot each ahead of the stage times (the records' columns of the same names)
SCALAR_FIELDS: tuple[str, ...] = tuple(name for name, _ in FIELDS[:[n for n, _ in FIELDS].index("stage_start")])


def row_format(n_stages: int) -> str:
    """The struct format of a record of ``n_stages`` stages: native byte order, standard sizes, no alignment, a
    whole number of 8-byte slots (every field of 8 bytes at a multiple of 8)."""
    codes = "".join(f"{n_stages}{code}" if name in STAGE_FIELDS else code for name, code in FIELDS)
    return "=" + codes + "xxx"


def status_code(q: Query) -> int:
    """Query ``q``'s record status: its refusal, else ok when it finished, else unfinished."""
    code = _STATUS_CODE[q.status]
    return UNFINISHED if code == OK and q.finish != q.finish else code  # NaN finish: never left


class Rows:
    """Records buffered as packed rows (:func:`row_format`) in ``buffer``, in the order added."""

    def __init__(self, n_stages: int) -> None:
        self.n_stages = n_stages
        self.buffer = bytearray()
        self.n = 0
        self._pack = struct.Struct(row_format(n_stages)).pack

    def __len__(self) -> int:
        return self.n

    def add(self, queries: Any) -> None:  # (an iterable of Query: each read natively by a compiled core)
        """The records of ``queries`` (:class:`dvasim.core.query.Query`), in order."""
        buffer, pack = self.buffer, self._pack
        q: Query
        for q in queries:
            st = q.stage_start
            if not st:  # never reached the front door
                self.add_blank(q.qid, q.arrival, q.seq_len)
                continue
            buffer += pack(q.qid, q.arrival, q.seen, q.admitted, st[0], q.finish, q.seq_len, q.batch_id,
                           q.exit_batch_id, q.exit_batch_size, q.payload_formed, q.on_instance, *st, *q.stage_finish,
                           status_code(q), q.priority, q.replica)
            self.n += 1

    def add_blank(self, qid: int, arrival: float, seq_len: int) -> None:
        """The record of a query that never reached the front door."""
        nan = math.nan
        stages = [nan] * (2 * self.n_stages)
        self.buffer += self._pack(qid, arrival, nan, nan, nan, nan, seq_len, -1, -1, 0, nan, nan, *stages, UNFINISHED,
                                  0, 0)
        self.n += 1
