"""The batch table and batch-queue items: DVABatch's meta operations *new*, *stretch* and *split* (paper §5.2).

A row of the table is a :class:`Batch`: its id, its current batch size ``bs`` (the number of its queries), the time it
was created and its ``status_map``, the number of its queries that have completed each stage. A batch's queries
are its *rows*: query ``r`` of a batch lives in row ``row_offset + r`` of the buffers of the buffer pair (``slot``)
the batch runs in. A :class:`BatchItem` is an entry of a batch queue between two stages: ``(id, start, num)`` says
"run queries ``start .. start+num-1`` of batch ``id``".

Meta operations:

* **new** creates a row and an item covering all its queries for the first batch queue.
* **stretch** appends queries to the *latest* batch (the one most recently made by *new*). The newcomers get an
  item ``(id, start=old_bs, num=n)`` in the first batch queue; they *catch up* through the stages the batch has
  already done, guided by ``status_map``: the batch is handed to stage ``s+1`` only when all ``bs`` queries have
  completed stage ``s``, and then only the queries not yet handed on. So the original queries wait at the first
  boundary they reach after the stretch and continue merged with the newcomers (paper Figure 8b).
* **split** replaces a batch that has completed a stage (all its queries, none handed on) by sub-batches of given
  sizes, each a row of its own, pushed one by one into the next batch queue (Figure 8c). Whether the pushes
  happen at once or one after the other (the serial manner) is the pipeline's business.
* **new at a stage boundary** (:meth:`BatchTable.renew`, paper Figure 12 line 16, ``BatchTable.New(inBatch)``)
  re-creates a batch that has completed a stage as a new row: a new id, the same queries and buffer rows,
  continuing from the next stage, and the latest batch unless one entered the pipeline after it. It makes a
  batch the one later queries may stretch again (LazyBatching's preemption).

A batch that may be split (``splittable``) can never be stretched; sub-batches inherit that (paper §5.2.2). A
stretched batch may become splittable when its new size passes the policy's split test (:meth:`mark_splittable`),
which ends its stretching.

The table counts what a study wants to know of them: the operations in :attr:`log`, and the time-integral of the
number of its rows (:meth:`mean_in_flight`, the mean number of batches in flight).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

from dvasim.core.arith import int_sum
from dvasim.core.errors import MetaOpError
from dvasim.core.query import Query


@dataclass(eq=False, slots=True)
class Batch:
    bid: int
    queries: list[Query]
    created: float
    n_stages: int
    splittable: bool = False
    slot: int | None = None  # buffer pair holding the batch's rows, fixed when stage 0 first runs it
    row_offset: int = 0
    lane: int = 0  # the model instance (chain of executors) the batch runs in
    parent: int | None = None
    first_start: float = math.nan  # when stage 0 first started working on it
    status_map: list[int] = field(default_factory=list)  # queries completed per stage
    issued: list[int] = field(default_factory=list)  # queries handed to each stage's batch queue

    def __post_init__(self) -> None:
        if not self.status_map:
            self.status_map = [0] * self.n_stages
        if not self.issued:
            self.issued = [0] * self.n_stages

    @property
    def bs(self) -> int:
        return len(self.queries)

    def rows(self, item: BatchItem) -> range:
        """Buffer rows that ``item`` reads and writes."""
        return range(self.row_offset + item.start, self.row_offset + item.start + item.num)

    def item_queries(self, item: BatchItem) -> list[Query]:
        return self.queries[item.start : item.start + item.num]

    def stage_reached(self) -> int:
        """Number of stages all of whose queries are done (the boundary the batch has fully reached)."""
        k = 0
        while k < self.n_stages and self.status_map[k] == self.bs:
            k += 1
        return k


class BatchItem(NamedTuple):
    """An entry of a batch queue: run queries ``start .. start+num-1`` of batch ``bid`` in buffer pair ``slot``.
    (An immutable tuple: one is made for every stage execution.)"""

    bid: int
    start: int
    num: int
    slot: int | None = None

    @property
    def catch_up(self) -> bool:
        """True for the rows a *stretch* added that are still catching up (they never start at row 0)."""
        return self.start > 0


@dataclass(slots=True)
class Completion:
    """What :meth:`BatchTable.complete` reports about a finished stage execution."""

    batch: Batch
    exited: list[Query]  # queries that left the pipeline (last stage only)
    ready: bool  # every query of the batch has completed this stage and some are not yet handed on


class BatchTable:
    """All ongoing batches on one device, in creation order."""

    LOG_LIMIT: ClassVar[int] = 100_000

    def __init__(self, n_stages: int):
        if n_stages < 1:
            raise ValueError("n_stages must be >= 1")
        self.n_stages = n_stages
        self.rows: dict[int, Batch] = {}
        self.latest_id: int | None = None
        self._next_id = 0
        # (op, time, batch id, detail) of the first LOG_LIMIT operations, for inspection and tests; the counts of
        # every operation are in `counts` (a long run's memory does not grow with its operations)
        self.log: list[tuple] = []
        self.counts = {"n_batches": 0, "n_stretch": 0, "n_stretch_started": 0, "n_split": 0, "n_renew": 0}
        # time-integral of len(rows): the mean number of batches in flight over [first op, last op]
        self._area = 0.0
        self._t_last = math.nan
        self._t_first = math.nan
        self._active = 0  # queries in the table that have not left the last stage (kept as operations happen)

    def _tick(self, now: float) -> None:
        """Accumulate the rows' time-integral up to ``now`` (call before the row count changes)."""
        if math.isnan(self._t_first):
            self._t_first = now
        elif now > self._t_last:
            self._area += len(self.rows) * (now - self._t_last)
        if math.isnan(self._t_last) or now > self._t_last:
            self._t_last = now

    def _note(self, count: str, entry: tuple) -> None:
        self.counts[count] += 1
        if len(self.log) < self.LOG_LIMIT:
            self.log.append(entry)

    def mean_in_flight(self) -> float:
        """Time-average number of batches in the table between the first *new* and the last change."""
        span = self._t_last - self._t_first
        return self._area / span if span > 0 else math.nan

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self.rows)

    def __contains__(self, bid: int) -> bool:
        return bid in self.rows

    def __getitem__(self, bid: int) -> Batch:
        return self.rows[bid]

    def latest(self) -> Batch | None:
        return self.rows.get(self.latest_id) if self.latest_id is not None else None

    def n_queries(self) -> int:
        """Queries in ongoing batches that have not yet left the pipeline (``sum(bs - status_map[-1])`` over the
        rows, kept up to date by the operations)."""
        return self._active

    def _new_id(self) -> int:
        bid = self._next_id
        self._next_id += 1
        return bid

    # ------------------------------------------------------------------ meta operations
    def new(self, queries: list[Query], now: float, splittable: bool = False) -> BatchItem:
        """*new*: a row for ``queries`` and the item that sends all of them to the first stage."""
        if not queries:
            raise MetaOpError("new: a batch needs at least one query")
        b = Batch(self._new_id(), list(queries), now, self.n_stages, splittable=splittable)
        self._tick(now)
        self.rows[b.bid] = b
        self.latest_id = b.bid
        for q in queries:
            q.batch_id = b.bid
            q.admitted = now
        b.issued[0] = b.bs
        self._active += b.bs
        self._note("n_batches", ("new", now, b.bid, b.bs))
        return BatchItem(b.bid, 0, b.bs, None)

    def can_stretch(self, bid: int) -> str | None:
        """Why batch ``bid`` cannot be stretched now, or None if it can."""
        if bid != self.latest_id or bid not in self.rows:
            return "only the latest batch can be stretched"
        b = self.rows[bid]
        if b.splittable:
            return "a batch that may be split cannot be stretched"
        if b.issued[-1] > 0:
            return "the batch has already been handed to the last stage"
        return None

    def stretch(self, bid: int, queries: list[Query], now: float) -> BatchItem:
        """*stretch*: append ``queries`` to the latest batch; returns the catch-up item for the first stage."""
        if not queries:
            raise MetaOpError("stretch: no queries")
        why = self.can_stretch(bid)
        if why:
            raise MetaOpError(f"stretch of batch {bid}: {why}")
        b = self.rows[bid]
        start = b.bs
        b.queries.extend(queries)
        for q in queries:
            q.batch_id = bid
            q.admitted = now
        b.issued[0] = b.bs
        self._active += len(queries)
        # detail: (newcomers, whether the batch's first stage had already started on it: Policy III's case)
        started = not math.isnan(b.first_start)
        self.counts["n_stretch_started"] += started
        self._note("n_stretch", ("stretch", now, bid, (len(queries), started)))
        return BatchItem(bid, start, len(queries), b.slot)

    def mark_splittable(self, bid: int) -> None:
        """The batch may now be split (and so is no longer stretched)."""
        self.rows[bid].splittable = True

    def can_renew(self, bid: int, stage: int) -> str | None:
        """Why batch ``bid`` cannot be made new at the boundary after ``stage`` now, or None if it can."""
        return self._not_whole(bid, stage)

    def _not_whole(self, bid: int, stage: int) -> str | None:
        """Why batch ``bid`` is not whole (every query done, none handed on) at the boundary after ``stage``."""
        b = self.rows.get(bid)
        if b is None:
            return "no such batch"
        if stage >= self.n_stages - 1:
            return "nothing follows the last stage"
        if b.status_map[stage] != b.bs or b.issued[stage + 1] != 0:
            return f"the batch is not whole at the boundary after stage {stage}"
        return None

    def renew(self, bid: int, stage: int, now: float, splittable: bool = False) -> BatchItem:
        """*new* at the boundary after ``stage``: batch ``bid``, whole there with none handed on, becomes a new row
        (new id) with the same queries, creation time and buffer rows; returns its item for the next batch queue.
        The row is the latest batch (the one a stretch may join) unless a batch entered the pipeline after it. A
        batch that may be split (a split sub-batch among them) stays splittable."""
        why = self.can_renew(bid, stage)
        if why:
            raise MetaOpError(f"new of batch {bid} at a boundary: {why}")
        b = self.rows[bid]
        self._tick(now)
        del self.rows[bid]
        # a batch that may be split stays so (§5.2.2): a split sub-batch's rows are followed by its siblings' rows,
        # so it must never be stretched
        child = self._continuation(b, b.queries, b.row_offset, stage, splittable=splittable or b.splittable)
        # it becomes the latest batch only if no batch entered the pipeline after it: a stretch's catch-up rows
        # follow the batches queued ahead of them, so a batch with younger batches ahead would wait for them while
        # they wait for its buffer pair
        if not any(r.created > b.created for r in self.rows.values()):
            self.latest_id = child.bid
        elif self.latest_id == bid:
            self.latest_id = None
        self.rows[child.bid] = child
        self._note("n_renew", ("renew", now, child.bid, (bid, stage + 1)))
        return BatchItem(child.bid, 0, b.bs, b.slot)

    def _continuation(self, b: Batch, queries: list[Query], row_offset: int, stage: int, splittable: bool) -> Batch:
        """A new row for ``queries`` of batch ``b`` (their rows from ``row_offset``), done through ``stage`` and
        handed to ``stage + 1``: a split sub-batch or a batch made new at a boundary."""
        n = len(queries)
        child = Batch(self._new_id(), queries, b.created, self.n_stages, splittable=splittable, slot=b.slot,
                      row_offset=row_offset, lane=b.lane, parent=b.bid, first_start=b.first_start)
        child.status_map[: stage + 1] = [n] * (stage + 1)
        child.issued[: stage + 2] = [n] * (stage + 2)
        return child

    def complete(self, item: BatchItem, stage: int, now: float = math.nan) -> Completion:
        """Record that ``item`` finished ``stage`` at ``now`` (updates ``status_map``)."""
        b = self.rows[item.bid]
        bs = len(b.queries)
        status_map = b.status_map
        done = status_map[stage] = status_map[stage] + item.num
        if done > bs:
            raise MetaOpError(f"batch {b.bid}: stage {stage} completed more queries than the batch has")
        if stage == self.n_stages - 1:
            self._active -= item.num
            exited = b.item_queries(item)
            if done == bs:
                if not math.isnan(now):
                    self._tick(now)
                del self.rows[b.bid]
                if self.latest_id == b.bid:
                    self.latest_id = None
            return Completion(b, exited, False)
        return Completion(b, [], done == bs and b.issued[stage + 1] < bs)

    def advance(self, bid: int, stage: int) -> BatchItem:
        """Hand the queries of a ready batch that have completed ``stage`` on to stage ``stage+1``."""
        b = self.rows[bid]
        bs = len(b.queries)
        if b.status_map[stage] != bs:
            raise MetaOpError(f"batch {bid}: not every query has completed stage {stage}")
        start = b.issued[stage + 1]
        b.issued[stage + 1] = bs
        return BatchItem(bid, start, bs - start, b.slot)

    def can_split(self, bid: int, stage: int) -> str | None:
        """Why batch ``bid`` cannot be split at the boundary after ``stage`` now, or None if it can."""
        b = self.rows.get(bid)
        if b is not None and not b.splittable:
            return "the batch was not created as splittable"
        return self._not_whole(bid, stage)

    def split(self, bid: int, sizes: list[int], stage: int, now: float) -> list[BatchItem]:
        """*split*: replace batch ``bid``, whole after ``stage``, by sub-batches of ``sizes`` (in row order).

        Returns the sub-batches' items for the next batch queue, in order.
        """
        why = self.can_split(bid, stage)
        if why:
            raise MetaOpError(f"split of batch {bid}: {why}")
        b = self.rows[bid]
        if any(int(s) != s or s < 1 for s in sizes) or int_sum(int(s) for s in sizes) != b.bs:
            raise MetaOpError(f"split of batch {bid}: sizes {sizes} must be positive and add up to {b.bs}")
        self._tick(now)
        del self.rows[bid]
        if self.latest_id == bid:
            self.latest_id = None
        items = []
        offset = 0
        for n in sizes:
            child = self._continuation(b, b.queries[offset : offset + n], b.row_offset + offset, stage, True)
            self.rows[child.bid] = child
            items.append(BatchItem(child.bid, 0, n, b.slot))
            offset += n
        self._note("n_split", ("split", now, bid, tuple(sizes)))
        return items


def meta_op_counts(table: BatchTable) -> dict:
    """What a run did with the meta operations: batches made at the front door (``n_batches``), stretches
    (``n_stretch``) and those of batches whose first stage had already started (``n_stretch_started``, Policy
    III's case), splits, *new* at a stage boundary (``n_renew``), and the mean number of batches in flight."""
    return {**table.counts, "mean_batches_in_flight": table.mean_in_flight()}
