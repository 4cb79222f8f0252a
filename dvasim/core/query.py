"""A query: one inference request, and the record of its way through the pipeline."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

UNSERVED = ("rejected", "timed_out")  # the statuses of a query that left without being served


@dataclass(eq=False, slots=True)
class Query:
    """One request. ``seq_len`` is its input length (1 for fixed-size inputs such as images).

    The engine fills the record fields as the query moves: ``stage_start[s]`` / ``stage_finish[s]`` are the
    times (ms) at which the execution that carried it through stage ``s`` started and finished.

    ``status`` says how it left: ``"ok"`` (served, or not yet left), or, for a query that left without being
    served (:meth:`dvasim.core.pipeline.Pipeline.leave_unserved`: Triton's queue policy refused it),
    ``"rejected"`` (it found its queue full) or ``"timed_out"`` (it waited in the queue past its timeout); such
    a query has no ``finish`` (NaN) and no latency. ``priority`` is the priority level it asked for (0: the
    server's default level; 1 is the highest, as in Triton). ``replica`` is the replica of the model that served
    it (0 unless a multi-replica engine sets it).
    """

    qid: int
    arrival: float
    seq_len: int = 1
    # record
    seen: float = math.nan  # when the front door saw it (its arrival plus any admission delay)
    admitted: float = math.nan  # when the front door put it into a batch (new or stretch)
    batch_id: int = -1  # the batch it entered
    exit_batch_id: int = -1  # the batch it left in (differs after a split)
    exit_batch_size: int = 0
    finish: float = math.nan
    status: str = "ok"  # "ok" | "rejected" | "timed_out" (see the class docstring)
    priority: int = 0
    replica: int = 0
    stage_start: list[float] = field(default_factory=list)
    stage_finish: list[float] = field(default_factory=list)

    @property
    def start(self) -> float:
        """Time its first stage started (NaN if it never started)."""
        return self.stage_start[0] if self.stage_start else math.nan

    @property
    def done(self) -> bool:
        return not math.isnan(self.finish)

    @property
    def latency(self) -> float:
        return self.finish - self.arrival
