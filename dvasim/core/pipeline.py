"""The control plane shared by both engines: batch table, batch queues, buffer pairs, executors and the policy.

An engine (the SimPy simulator, or the replay on real torch execution) owns time and the device; it calls

* :meth:`Pipeline.arrive` when a query arrives,
* :meth:`Pipeline.step` after anything happened: the policy forms batches at the front door, executors change
  state and pull batches; it returns the executions that start now,
* :meth:`Pipeline.finish` when an execution is done: the batch table is updated, the policy may *split* or
  *stretch* at the stage boundary (paper Figure 12, ``Schedule``), and batches move to the next batch queue,
* :meth:`Pipeline.wakeup_time` to know when the front door wants to be called even if nothing else happens.

It never sleeps, never blocks, and imports neither simpy nor torch.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from dvasim.core.batch_table import Batch, BatchItem, BatchTable, MetaOpError
from dvasim.core.buffers import BufferPairs
from dvasim.core.executor import Executor, ExecutorState
from dvasim.core.query import Query
from dvasim.policies.base import New, Policy, Split, Stretch


class PolicyError(RuntimeError):
    """A policy returned an operation the mechanism cannot carry out."""


@dataclass(eq=False)
class Execution:
    """One stage execution: ``batch_size`` queries of one batch through one stage, padded to ``seq_len``."""

    stage: int
    item: BatchItem
    batch: Batch
    queries: list[Query]
    seq_len: int
    standalone_ms: float
    demand: float
    start: float = math.nan
    end: float = math.nan
    info: dict = field(default_factory=dict)

    @property
    def batch_size(self) -> int:
        return self.item.num

    @property
    def slot(self) -> int:
        return self.item.slot

    @property
    def rows(self) -> range:
        return self.batch.rows(self.item)


class Pipeline:
    def __init__(self, profile, policy: Policy, n_buffer_pairs: int = 2, record_states: bool = False):
        self.profile = profile
        self.n_stages = profile.n_stages
        self.n_buffer_pairs = n_buffer_pairs
        self.table = BatchTable(self.n_stages)
        self.buffers = BufferPairs(self.n_stages, n_buffer_pairs)
        self.executors = [Executor(i, self.n_stages, self.buffers, record_states) for i in range(self.n_stages)]
        self.queues: list[deque[BatchItem]] = [deque() for _ in range(self.n_stages)]
        self.policy = policy
        self.exited: list[Query] = []
        self.running: dict[int, Execution] = {}
        self.on_begin: list[Callable[[Execution], None]] = []
        self.on_finish: list[Callable[[Execution], None]] = []
        self._now = 0.0
        policy.bind(self)

    # ------------------------------------------------------------------ PipelineView
    def now(self) -> float:
        return self._now

    def queue_length(self, stage: int) -> int:
        return len(self.queues[stage])

    def stage_idle(self, stage: int) -> bool:
        return self.executors[stage].state in (ExecutorState.ACTIVE, ExecutorState.INACTIVE) and not self.queues[stage]

    def active_queries(self) -> int:
        return self.table.n_queries()

    def executor_states(self) -> list[str]:
        return [e.state.value for e in self.executors]

    # ------------------------------------------------------------------ engine API
    def arrive(self, query: Query, now: float) -> None:
        self._now = now
        query.stage_start = [math.nan] * self.n_stages
        query.stage_finish = [math.nan] * self.n_stages
        self.policy.on_arrival(query)

    def wakeup_time(self) -> float:
        return self.policy.next_wakeup(self._now)

    def step(self, now: float) -> list[Execution]:
        self._now = now
        for op in self.policy.admit(now):
            self._apply_front(op, now)
        started: list[Execution] = []
        progress = True
        while progress:
            progress = False
            for ex, queue in zip(self.executors, self.queues):
                head = self._resolve_slot(queue[0]) if queue else None
                if ex.state is ExecutorState.INACTIVE:
                    progress |= ex.wake(head)
                if ex.state is ExecutorState.ACTIVE:
                    progress |= ex.release_owed()
                    if head is not None and ex.can_pull(head):
                        queue.popleft()
                        item = ex.pull(head)
                        self.table[item.bid].slot = item.slot
                        if ex.state is ExecutorState.WORKING:
                            started.append(self._begin(ex.stage, item, now))
                        progress = True
                elif ex.state is ExecutorState.CHECKING and ex.retry():
                    started.append(self._begin(ex.stage, ex.item, now))
                    progress = True
        return started

    def finish(self, execution: Execution, now: float) -> None:
        self._now = now
        stage = execution.stage
        queue = self.queues[stage]
        item = self.executors[stage].finish(self._resolve_slot(queue[0]) if queue else None)
        del self.running[id(execution)]
        execution.end = now
        for q in execution.queries:
            q.stage_finish[stage] = now
        for cb in self.on_finish:
            cb(execution)
        done = self.table.complete(item, stage)
        batch = done.batch
        if done.exited:
            for q in done.exited:
                q.finish = now
                q.exit_batch_id = batch.bid
                q.exit_batch_size = execution.batch_size
            self.exited.extend(done.exited)
            return
        if not done.ready:
            return
        op = self.policy.at_boundary(batch, stage, now)
        if isinstance(op, Split):
            try:
                items = self.table.split(op.bid, list(op.sizes), stage, now)
            except MetaOpError as e:
                raise PolicyError(f"{self.policy.name}: {e}") from None
            for it in items:
                self._push(stage + 1, it)
            return
        if isinstance(op, Stretch):
            self._stretch(op, now)
            if not (batch.status_map[stage] == batch.bs):
                return
        elif op is not None:
            raise PolicyError(f"{self.policy.name}: at_boundary returned {op!r}")
        self._push(stage + 1, self.table.advance(batch.bid, stage))

    # ------------------------------------------------------------------ internals
    def _resolve_slot(self, item: BatchItem) -> BatchItem:
        if item.slot is None and item.catch_up:
            return replace(item, slot=self.table[item.bid].slot)
        return item

    def _push(self, stage: int, item: BatchItem) -> None:
        if stage > 0:
            self.buffers.pending[stage][item.slot] += 1
        self.queues[stage].append(item)

    def _apply_front(self, op, now: float) -> None:
        if isinstance(op, New):
            self._push(0, self.table.new(list(op.queries), now, splittable=op.splittable))
        elif isinstance(op, Stretch):
            self._stretch(op, now)
        else:
            raise PolicyError(f"{self.policy.name}: admit returned {op!r}; allowed: New, Stretch")

    def _stretch(self, op: Stretch, now: float) -> None:
        try:
            item = self.table.stretch(op.bid, list(op.queries), now)
        except MetaOpError as e:
            raise PolicyError(f"{self.policy.name}: {e}") from None
        # rows added before the batch's first stage started simply join its queued item
        q0 = self.queues[0]
        for k, queued in enumerate(q0):
            if queued.bid == op.bid and queued.start + queued.num == item.start:
                q0[k] = replace(queued, num=queued.num + item.num)
                return
        self._push(0, item)

    def _begin(self, stage: int, item: BatchItem, now: float) -> Execution:
        batch = self.table[item.bid]
        queries = batch.item_queries(item)
        seq_len = max(q.seq_len for q in queries)
        if stage == 0 and math.isnan(batch.first_start):
            batch.first_start = now
        ex = Execution(
            stage, item, batch, queries, seq_len,
            self.profile.latency(stage, item.num, seq_len),
            self.profile.demand(stage, item.num, seq_len),
            start=now,
        )
        for q in queries:
            q.stage_start[stage] = now
        self.running[id(ex)] = ex
        for cb in self.on_begin:
            cb(ex)
        return ex

    # ------------------------------------------------------------------ diagnostics
    def stuck_report(self) -> str:
        """A one-paragraph description of where work is waiting (for deadlock errors)."""
        parts = [f"executors={self.executor_states()}", f"queues={[len(q) for q in self.queues]}",
                 f"batches={len(self.table)}", f"pending={len(self.policy.pending)}",
                 f"buffers={self.buffers.snapshot()}"]
        return " ".join(parts)
