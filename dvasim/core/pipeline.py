"""The control plane shared by both engines: batch table, batch queues, buffer pairs, executors and the policy.

An engine (the SimPy simulator, or the replay on real torch execution) owns time and the device; it calls

* :meth:`Pipeline.arrive` when a query arrives,
* :meth:`Pipeline.step` after anything happened: the policy forms batches at the front door, executors change
  state and pull batches; it returns the executions that start now,
* :meth:`Pipeline.finish` when an execution is done: the batch table is updated, the policy may *split* or
  *stretch* at the stage boundary (paper Figure 12, ``Schedule``), and batches move to the next batch queue,
* :meth:`Pipeline.wakeup_time` to know when the front door wants to be called even if nothing else happens.

A policy may refuse a query that is still waiting at the front door (Triton's queue policy: a full queue, a
timeout): it calls :meth:`Pipeline.leave_unserved`, and the query leaves at once with its ``status``
(``"rejected"`` or ``"timed_out"``) and no ``finish``. It leaves the way served queries do (``n_exited``, the
``exit_hook`` or ``exited``), so an engine that waits for every query to leave is never left waiting for it and
its record is written like every other. ``priorities`` (one priority level per query id, e.g. the workload's
``priority_mix`` draws) sets each arriving query's ``priority`` for a policy with priority levels.

A pipeline may hold several *instances* (Triton's model instances, ``[engine] instances``): each instance is a
full chain of stage executors with its own batch queues and buffer pairs, and all of them share the one device
and the one batch table. A new batch goes to an instance whose first stage is free (else the least loaded one);
its stretch and split sub-batches stay in that instance.

Split sub-batches run in the *serial* manner by default (paper Figure 2 and Figure 3 Case II): the first is handed
to the next stage at once, each following one when the one before it has left the last stage, and the parent's
buffer pair is held -- no fresh batch takes it at the first stage -- until the last of them has left. A policy
may ask for the *pipelined* manner instead (``Split(..., manner="pipelined")``): all sub-batches are handed on at
once and overlap stage by stage as far as the buffer pairs allow.

It never sleeps, never blocks, and imports neither simpy nor torch.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from dvasim.core.arith import int_sum
from dvasim.core.batch_table import Batch, BatchItem, BatchTable, MetaOpError
from dvasim.core.buffers import BufferPairs
from dvasim.core.errors import PolicyError
from dvasim.core.executor import Executor, ExecutorState
from dvasim.core.operations import SPLIT_MANNERS, New, Split, Stretch
from dvasim.core.query import UNSERVED, Query

MAX_INSTANCES = 64  # the mechanism's limit on a pipeline's instances (model instances, E2bird's workers)

# (Final: a compiled core reads them as constants, not from the module's dict)
ACTIVE: Final = ExecutorState.ACTIVE
CHECKING: Final = ExecutorState.CHECKING
WORKING: Final = ExecutorState.WORKING
INACTIVE: Final = ExecutorState.INACTIVE


class Lane:
    """One model instance: a chain of stage executors with its batch queues and buffer pairs."""

    def __init__(self, index: int, n_stages: int, n_buffer_pairs: int, record_states: bool):
        self.index = index
        self.buffers = BufferPairs(n_stages, n_buffer_pairs)
        self.executors = [Executor(i, n_stages, self.buffers, record_states) for i in range(n_stages)]
        self.queues: list[deque[BatchItem]] = [deque() for _ in range(n_stages)]
        self.pairs = list(zip(self.executors, self.queues))
        self.batches = 0  # batches of the batch table that live in this lane
        self.n_stages = n_stages
        # the first stage whose executor something changed for since the executors last reached a fixed point
        # (n_stages: none; only such an executor, or one after it, can move)
        self.lo = 0
        # what a change at stage s can affect: with one buffer pair every executor (a pair busy anywhere is busy
        # for all); else the executors s-2 .. s+1 (the buffers of boundaries s-1 .. s+1 that stage s touches)
        self.one_pair = n_buffer_pairs == 1
        self.reach = n_stages if self.one_pair else 2

    def touch(self, stage: int) -> None:
        """Something changed for executor ``stage`` (its state, queue or buffers): it is examined again."""
        lo = 0 if self.one_pair else stage
        if lo < self.lo:
            self.lo = lo

    def changed(self, stage: int) -> None:
        """Stage ``stage``'s buffers changed (an execution finished): every executor they can affect is examined."""
        lo = stage - self.reach
        if lo < self.lo:
            self.lo = lo if lo > 0 else 0

    def first_stage_free(self) -> bool:
        return not self.queues[0] and self.executors[0].state in (ExecutorState.ACTIVE, ExecutorState.INACTIVE)


@dataclass(eq=False, slots=True, init=False)
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
    lane: int = 0
    info: dict | None = None  # an engine's own notes on it (the replay's measured copy time, rows run)
    padded_size: int = 0  # the rows it runs when a policy pads batches with dummy rows (0: no padding)

    # (written out, not generated by dataclass: a generated __init__ is interpreted code even in a compiled core)
    def __init__(self, stage: int, item: BatchItem, batch: Batch, queries: list[Query], seq_len: int,
                 standalone_ms: float, demand: float, start: float = math.nan, end: float = math.nan,
                 lane: int = 0, info: dict | None = None, padded_size: int = 0) -> None:
        self.stage, self.item, self.batch, self.queries, self.seq_len = stage, item, batch, queries, seq_len
        self.standalone_ms, self.demand, self.start, self.end = standalone_ms, demand, start, end
        self.lane, self.info, self.padded_size = lane, info, padded_size

    @property
    def batch_size(self) -> int:
        return self.item.num

    @property
    def charged_batch_size(self) -> int:
        """The batch size it costs: its own, or the padded size of a padding policy (``tfserving-static``)."""
        return self.padded_size or self.item.num

    @property
    def slot(self) -> int:
        return self.item.slot

    @property
    def rows(self) -> range:
        return self.batch.rows(self.item)


class Pipeline:
    def __init__(self, profile, policy, n_buffer_pairs: int = 2, record_states: bool = False,
                 instances: int = 1, qos_target_ms: float | None = None, input_lengths=None,
                 served=None, corun=None, priorities=None, triton_release: str | None = None,
                 eager_batching: bool | None = None):
        if instances < 1:
            raise ValueError("instances must be >= 1")
        # a policy that brings its own workers (E2bird's multi-granularity engine) says how many instances it
        # needs: ``instances_needed(profile, qos_target_ms, input_lengths, served=..., corun=...)`` (``served``:
        # the run's resolved serving stack, plain data, for a policy whose worker choice weighs the host's costs;
        # ``corun``: the engine's co-run profiler, for a policy that profiles workers running together, E-Ebird's
        # offline search); with [engine] instances left at 1 the pipeline takes that many
        needed = getattr(policy, "instances_needed", None)
        if callable(needed):
            want = int(needed(profile, qos_target_ms, input_lengths, served=served, corun=corun))
            if instances not in (1, want):
                from dvasim.errors import ConfigError

                raise ConfigError("engine.instances", f"policy {policy.name!r} runs {want} workers (one instance "
                                                      f"each); leave engine.instances at 1 or set it to {want}, "
                                                      f"got {instances}")
            instances = want
        self.profile = profile
        self.qos_target_ms = qos_target_ms
        self.input_lengths = input_lengths
        self.n_stages = profile.n_stages
        self.n_buffer_pairs = n_buffer_pairs
        self.table = BatchTable(self.n_stages)
        self.lanes = [Lane(k, self.n_stages, n_buffer_pairs, record_states) for k in range(instances)]
        self._free_lanes = instances  # lanes that hold no batch
        # flat views (lane 0 first) for diagnostics and single-instance users
        self.buffers = self.lanes[0].buffers
        self.executors = [e for lane in self.lanes for e in lane.executors]
        self.queues = [q for lane in self.lanes for q in lane.queues]
        self.policy = policy
        self.exited: list[Query] = []  # queries that left, in order (unless an exit_hook takes them instead)
        self.n_exited = 0
        self.exit_hook: Callable[[list[Query]], None] | None = None
        self.n_unserved = 0  # of n_exited: queries that left without being served (leave_unserved)
        # each query's priority level by id (None: every query at the policy's default level)
        self.priorities = priorities
        self.running: dict[int, Execution] = {}
        # serial split: sub-batch id -> (stage, item) of the sibling handed on when it leaves the last stage, or
        # None for the last of its chain (which gives the held pair back)
        self._serial_next: dict[int, tuple[int, BatchItem] | None] = {}
        self._cost: dict[tuple, tuple[float, float]] = {}
        # a policy that pads every batch with dummy rows to a fixed size (tfserving-static) is charged that size
        self._pad_to = int(getattr(policy, "pad_to_batch_size", 0) or 0)
        self.on_begin: list[Callable[[Execution], None]] = []
        self.on_finish: list[Callable[[Execution], None]] = []
        self._now = 0.0
        # the run's resolved serving stack (plain data; None: none known), for a policy that weighs its host costs
        self.served = served
        # the Triton release the stack runs, what Triton's batchers read (dvasim.policies.triton_release);
        # ``triton_release`` / ``eager_batching`` given override the stack's
        stack = getattr(served, "stack", None)
        self.triton_release: str = str(triton_release if triton_release is not None
                                       else getattr(stack, "triton_release", "ideal"))
        self.eager_batching: bool = bool(eager_batching if eager_batching is not None
                                         else getattr(stack, "eager_batching", False))
        # a policy that never decides at a stage boundary is not asked there (its answer is always None)
        self._boundary_policy = getattr(policy, "decides_at_boundary", True)
        policy.bind(self)
        # the policy's front-door questions, asked at every step (bound once: a compiled core calls them directly,
        # not through a method lookup each time)
        self._has_pending: Callable[[], bool] = policy.has_pending
        self._admit: Callable[[float], list] = policy.admit
        self._next_wakeup: Callable[[float], float] = policy.next_wakeup

    # ------------------------------------------------------------------ PipelineView
    def now(self) -> float:
        return self._now

    def queue_length(self, stage: int) -> int:
        return int_sum([len(lane.queues[stage]) for lane in self.lanes])

    def stage_idle(self, stage: int) -> bool:
        """True if some instance's executor of ``stage`` is not busy and has nothing queued."""
        return any(
            not lane.queues[stage]
            and lane.executors[stage].state in (ExecutorState.ACTIVE, ExecutorState.INACTIVE)
            for lane in self.lanes
        )

    def free_instances(self) -> int:
        """Instances that hold no batch at all (what Triton's batcher waits for)."""
        return self._free_lanes

    def free_lane_indices(self) -> list[int]:
        """The indices of the instances that hold no batch (a worker that is idle), in index order."""
        return [lane.index for lane in self.lanes if lane.batches == 0]

    def _add_batches(self, lane: Lane, n: int) -> None:
        """``n`` more (or fewer) batches live in ``lane``; keeps the count of free instances."""
        was_free = lane.batches == 0
        lane.batches += n
        self._free_lanes += (lane.batches == 0) - was_free

    @property
    def instances(self) -> int:
        return len(self.lanes)

    def active_queries(self) -> int:
        return self.table.n_queries()

    def executor_states(self) -> list[str]:
        return [e.state.value for e in self.executors]

    # ------------------------------------------------------------------ engine API
    def arrive(self, query: Query, now: float) -> None:
        self.arrive_many([query], now)

    def arrive_many(self, queries: list[Query], now: float) -> None:
        """:meth:`arrive` for each of ``queries``, in order (queries seen together)."""
        self._now = now
        n = self.n_stages
        on_arrival = self.policy.on_arrival
        priorities = self.priorities
        for q in queries:
            q.seen = now
            q.stage_start = [math.nan] * n
            q.stage_finish = [math.nan] * n
            if priorities is not None:
                q.priority = int(priorities[q.qid])
            on_arrival(q)

    def leave_unserved(self, queries: list[Query], status: str) -> None:
        """``queries``, still waiting at the front door (never put in a batch), leave now without being served:
        ``status`` ``"rejected"`` (a full queue) or ``"timed_out"`` (past its timeout). They count as exited (an
        engine waiting for every query is not kept waiting) and go to the exit hook like served ones; their
        ``finish`` stays NaN (they have no latency)."""
        if status not in UNSERVED:
            raise PolicyError(f"{self.policy.name}: a query may leave unserved as {' or '.join(UNSERVED)}, "
                              f"not {status!r}")
        if not queries:
            return
        for q in queries:
            if q.batch_id != -1:
                raise PolicyError(f"{self.policy.name}: query {q.qid} is in batch {q.batch_id}; only a query "
                                  "still waiting at the front door may leave unserved")
            q.status = status
        self.n_exited += len(queries)
        self.n_unserved += len(queries)
        if self.exit_hook is None:
            self.exited.extend(queries)
        else:
            self.exit_hook(queries)

    def wakeup_time(self) -> float:
        return self._next_wakeup(self._now) if self._has_pending() else math.inf

    def step(self, now: float) -> list[Execution]:
        """Form batches at the front door (the policy is asked only while it has queries waiting) and let the
        executors move until none can: returns the executions that start now, in the order they started."""
        self._now = now
        if self._has_pending():
            for op in self._admit(now):
                self._apply_front(op, now)
        started: list[Execution] = []
        for lane in self.lanes:
            n = lane.n_stages
            if lane.lo >= n:
                continue
            # passes over the executors until one makes no progress; a pass starts at the first executor that a
            # change since it was last examined can affect (the others would find what they found before)
            start, lane.lo = lane.lo, n
            pairs, reach = lane.pairs, lane.reach
            while start < n:
                nxt = n
                for s in range(start, n):
                    ex, queue = pairs[s]
                    state = ex.state
                    if state is WORKING:
                        continue
                    moved = False
                    head = queue[0] if queue else None
                    if head is not None and head.slot is None:
                        head = self._resolve_slot(head)
                    if state is INACTIVE:
                        moved = ex.wake(head)
                    state = ex.state
                    if state is ACTIVE:
                        if ex.owed and ex.release_owed():
                            moved = True
                        if head is not None and ex.can_pull(head):
                            queue.popleft()
                            item = ex.pull(head)
                            self.table.rows[item.bid].slot = item.slot
                            if ex.state is WORKING:
                                started.append(self._begin(lane, s, item, now))
                            moved = True
                    elif state is CHECKING and ex.retry():
                        started.append(self._begin(lane, s, ex.item, now))
                        moved = True
                    if moved and s - reach < nxt:
                        nxt = s - reach if s > reach else 0
                start = nxt
        return started

    def finish(self, execution: Execution, now: float) -> None:
        self._now = now
        stage = execution.stage
        lane = self.lanes[execution.lane]
        lane.changed(stage)
        queue = lane.queues[stage]
        head = queue[0] if queue else None
        if head is not None and head.slot is None:
            head = self._resolve_slot(head)
        item = lane.executors[stage].finish(head)
        del self.running[id(execution)]
        execution.end = now
        for q in execution.queries:
            q.stage_finish[stage] = now
        for cb in self.on_finish:
            cb(execution)
        done = self.table.complete(item, stage, now)
        batch = done.batch
        rows = self.table.rows
        if batch.bid not in rows:
            self._add_batches(lane, -1)
        if done.exited:
            for q in done.exited:
                q.finish = now
                q.exit_batch_id = batch.bid
                q.exit_batch_size = execution.batch_size
            self.n_exited += len(done.exited)
            if self.exit_hook is None:
                self.exited.extend(done.exited)
            else:
                self.exit_hook(done.exited)
            if batch.bid not in rows and self._serial_next:
                self._serial_successor(lane, batch)
            return
        if not done.ready:
            if batch.merge_stage > stage:  # a stretched batch's rows before its merge stage go on alone
                alone = self.table.advance_alone(item, stage)
                if alone is not None:
                    self._push(stage + 1, alone)
            return
        op = self.policy.at_boundary(batch, stage, now) if self._boundary_policy else None
        if isinstance(op, Split):
            if op.manner == "one-stage":
                try:
                    parts = self.table.advance_parts(batch.bid, stage, list(op.sizes), now)
                except MetaOpError as e:
                    raise PolicyError(f"{self.policy.name}: {e}") from None
                for it in parts:
                    self._push(stage + 1, it)
                return
            self._split(lane, op, stage, now)
            return
        if isinstance(op, New):
            if op.queries is not batch.queries and list(op.queries) != batch.queries:
                raise PolicyError(f"{self.policy.name}: a new at a stage boundary must take exactly the finished "
                                  f"batch's queries (batch {batch.bid})")
            try:
                item = self.table.renew(batch.bid, stage, now, splittable=op.splittable)
            except MetaOpError as e:
                raise PolicyError(f"{self.policy.name}: {e}") from None
            self._pass_serial(batch.bid, item.bid)
            self._push(stage + 1, item)
            return
        if isinstance(op, Stretch):
            self._stretch(op, now)
            if not (batch.status_map[stage] == batch.bs):
                return
        elif op is not None:
            raise PolicyError(f"{self.policy.name}: at_boundary returned {op!r}")
        self._push(stage + 1, self.table.advance(batch.bid, stage))

    # ------------------------------------------------------------------ internals
    def _split(self, lane: Lane, op: Split, stage: int, now: float) -> None:
        if op.manner not in SPLIT_MANNERS:
            raise PolicyError(f"{self.policy.name}: split manner {op.manner!r}; allowed: {', '.join(SPLIT_MANNERS)}")
        parent = self.table.rows.get(op.bid)
        try:
            items = self.table.split(op.bid, list(op.sizes), stage, now)
        except MetaOpError as e:
            raise PolicyError(f"{self.policy.name}: {e}") from None
        self._add_batches(lane, len(items) - 1)
        lane.touch(0)  # (a serial split holds its pair: no fresh batch takes it at the first stage)
        for it in items:
            self.table[it.bid].lane = lane.index
        # a sub-batch of a serial split that is split again keeps its place in its siblings' chain
        chained = parent.bid in self._serial_next
        successor = self._serial_next.pop(parent.bid, None)
        if op.manner == "pipelined":
            for it in items:
                self._push(stage + 1, it)
            if chained:
                self._serial_next[items[-1].bid] = successor
            return
        # serial: every sub-batch will read the split boundary's buffer, so count them all as pending reads now
        # (the buffer is not given back before the last has read it); hand on the first, chain the others
        if not chained:
            lane.buffers.held[items[0].slot] += 1  # the parent's pair is held until the last sub-batch leaves
        lane.buffers.pending[stage + 1][items[0].slot] += len(items) - 1
        self._push(stage + 1, items[0])
        for a, b in zip(items, items[1:]):
            self._serial_next[a.bid] = (stage + 1, b)
        self._serial_next[items[-1].bid] = successor  # None: the last of the chain gives the pair back

    def _pass_serial(self, old_bid: int, new_bid: int) -> None:
        if old_bid in self._serial_next:
            self._serial_next[new_bid] = self._serial_next.pop(old_bid)

    def _serial_successor(self, lane: Lane, batch: Batch) -> None:
        """A sub-batch of a serial split left the last stage: hand its next sibling on, or give the pair back."""
        if batch.bid not in self._serial_next:
            return
        nxt = self._serial_next.pop(batch.bid)
        lane.touch(0)
        if nxt is None:
            lane.buffers.held[batch.slot] -= 1
            return
        stage, item = nxt
        lane.queues[stage].append(item)  # its pending read was counted at the split

    def _resolve_slot(self, item: BatchItem) -> BatchItem:
        if item.slot is None and item.catch_up:
            return BatchItem(item.bid, item.start, item.num, self.table[item.bid].slot)
        return item

    def _push(self, stage: int, item: BatchItem) -> None:
        lane = self.lanes[self.table.rows[item.bid].lane]
        lane.touch(stage)
        if stage > 0:
            lane.buffers.pending[stage][item.slot] += 1
        lane.queues[stage].append(item)

    def _pick_lane(self) -> Lane:
        free = [lane for lane in self.lanes if lane.batches == 0]
        if free:
            return free[0]
        ready = [lane for lane in self.lanes if lane.first_stage_free()]
        if ready:
            return ready[0]
        return min(self.lanes, key=lambda ln: (len(ln.queues[0]), ln.batches, ln.index))

    def _apply_front(self, op, now: float) -> None:
        if isinstance(op, New):
            if op.lane is None:
                lane = self._pick_lane()
            else:
                if not (isinstance(op.lane, int) and 0 <= op.lane < len(self.lanes)):
                    raise PolicyError(f"{self.policy.name}: new batch for instance {op.lane!r}; the pipeline has "
                                      f"{len(self.lanes)}")
                lane = self.lanes[op.lane]
                if lane.batches:
                    raise PolicyError(f"{self.policy.name}: new batch for instance {op.lane}, which is busy")
            item = self.table.new(list(op.queries), now, splittable=op.splittable)
            row = self.table[item.bid]
            row.lane = lane.index
            if op.pad_len:
                row.pad_len = int(op.pad_len)
            self._add_batches(lane, 1)
            self._push(0, item)
        elif isinstance(op, Stretch):
            self._stretch(op, now)
        else:
            raise PolicyError(f"{self.policy.name}: admit returned {op!r}; allowed: New, Stretch")

    def _stretch(self, op: Stretch, now: float) -> None:
        try:
            item = self.table.stretch(op.bid, list(op.queries), now)
        except MetaOpError as e:
            raise PolicyError(f"{self.policy.name}: {e}") from None
        if op.splittable:
            self.table.mark_splittable(op.bid)
        if op.merge_stage is not None:
            self.table[op.bid].merge_stage = int(op.merge_stage)
        # rows added before the batch's first stage started simply join its queued item (unless the batch's rows go
        # on alone up to a merge stage: the newcomers then catch up as an item of their own)
        lane = self.lanes[self.table[op.bid].lane]
        lane.touch(0)
        q0 = lane.queues[0]
        for k, queued in enumerate(q0 if op.merge_stage is None else ()):
            if queued.bid == op.bid and queued.start + queued.num == item.start:
                q0[k] = BatchItem(queued.bid, queued.start, queued.num + item.num, queued.slot)
                return
        self._push(0, item)

    def _begin(self, lane: Lane, stage: int, item: BatchItem, now: float) -> Execution:
        batch = self.table.rows[item.bid]
        queries = batch.item_queries(item)
        seq_len = batch.pad_len  # the longest input, or the batch's padding (a loop: the builtin max is a generic
        for q in queries:         # call in a compiled core)
            if q.seq_len > seq_len:
                seq_len = q.seq_len
        if stage == 0 and math.isnan(batch.first_start):
            batch.first_start = now
        key = (stage, item.num, seq_len)
        cost = self._cost.get(key)
        if cost is None:  # the table's time and the device demand of this stage, batch size and length
            # a policy that pads every batch with dummy rows (pad_to_batch_size) is charged the padded size
            b = max(item.num, self._pad_to)
            cost = self._cost[key] = (self.profile.latency(stage, b, seq_len),
                                      self.profile.demand(stage, b, seq_len))
        ex = Execution(stage, item, batch, queries, seq_len, cost[0], cost[1], start=now, lane=lane.index)
        if self._pad_to > item.num:
            ex.padded_size = self._pad_to
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
