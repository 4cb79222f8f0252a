"""Query records as they leave, buffered field by field until they become columns
(:class:`dvasim.reporting.records.RecordStore`), and the record's status codes.

A record's fields go to a typed array each (``array.array``; the stage times ``n_stages`` values a record), so
that buffered records are no Python objects (nothing for the garbage collector to walk) and a chunk's columns
are copies of the arrays' memory. This runs once for every query of a run, so it is part of the optional compiled
core (:mod:`dvasim.compiled`); it imports nothing but the standard library and the query it records
(:mod:`dvasim.core.query`, read natively by a compiled core).
"""

from __future__ import annotations

import math
from array import array
from typing import Any, Final

from dvasim.core.query import Query

# the ``status`` column's values; a record keeps its status as the index (an int8 code)
STATUSES = ("ok", "rejected", "timed_out", "unfinished")
OK: Final = 0
REJECTED: Final = 1
TIMED_OUT: Final = 2
UNFINISHED: Final = 3
_STATUS_CODE: Final = {"ok": OK, "rejected": REJECTED, "timed_out": TIMED_OUT}

# a record's fields as they are buffered: (name, the array's type code)
FIELDS: tuple[tuple[str, str], ...] = (
    ("query_id", "q"), ("arrival_ms", "d"), ("seen_ms", "d"), ("admitted_ms", "d"), ("start_ms", "d"),
    ("finish_ms", "d"), ("seq_len", "q"), ("batch_id", "q"), ("exit_batch_id", "q"), ("exit_batch_size", "q"),
    ("stage_start", "d"), ("stage_finish", "d"), ("status", "b"), ("priority", "h"), ("replica", "h"))


def status_code(q: Query) -> int:
    """Query ``q``'s record status: its refusal, else ok when it finished, else unfinished."""
    code = _STATUS_CODE[q.status]
    return UNFINISHED if code == OK and q.finish != q.finish else code  # NaN finish: never left


class Rows:
    """Records buffered field by field (:data:`FIELDS`: ``arrays[k]`` holds field ``k``), in the order added."""

    def __init__(self, n_stages: int) -> None:
        self.n_stages = n_stages
        self.arrays: list[Any] = [array(code) for _, code in FIELDS]

    def __len__(self) -> int:
        return len(self.arrays[0])

    def add(self, queries: Any) -> None:  # (an iterable of Query: each read natively by a compiled core)
        """The records of ``queries`` (:class:`dvasim.core.query.Query`), in order."""
        (qid, arrival, seen, admitted, start, finish, seq_len, batch_id, exit_batch_id, exit_batch_size,
         stage_start, stage_finish, status, priority, replica) = self.arrays
        q: Query
        for q in queries:
            st = q.stage_start
            if not st:  # never reached the front door
                self.add_blank(q.qid, q.arrival, q.seq_len)
                continue
            qid.append(q.qid)
            arrival.append(q.arrival)
            seen.append(q.seen)
            admitted.append(q.admitted)
            start.append(st[0])
            finish.append(q.finish)
            seq_len.append(q.seq_len)
            batch_id.append(q.batch_id)
            exit_batch_id.append(q.exit_batch_id)
            exit_batch_size.append(q.exit_batch_size)
            stage_start.extend(st)
            stage_finish.extend(q.stage_finish)
            status.append(status_code(q))
            priority.append(q.priority)
            replica.append(q.replica)

    def add_blank(self, qid: int, arrival: float, seq_len: int) -> None:
        """The record of a query that never reached the front door."""
        nan = math.nan
        stages = [nan] * self.n_stages
        values = (qid, arrival, nan, nan, nan, nan, seq_len, -1, -1, 0, stages, stages, UNFINISHED, 0, 0)
        for k, v in enumerate(values):
            if k in (10, 11):
                self.arrays[k].extend(v)
            else:
                self.arrays[k].append(v)
