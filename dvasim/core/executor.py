"""Stage executors and their four-state transition diagram (paper §6.2, Figure 11).

States: ``ACTIVE`` (holds a legitimate buffer pair, may pull a batch), ``CHECKING`` (pulled a batch whose buffer
pair is not legitimate yet and waits for it), ``WORKING`` (executing), ``INACTIVE`` (no legitimate pair).

Transitions of executor ``i``:

* ``ACTIVE --pull batch with pair j, j legitimate--> WORKING``; ``ACTIVE --pull, j not legitimate--> CHECKING``.
  The first stage assigns a fresh batch the first legitimate pair it holds.
* ``CHECKING --pair j becomes legitimate--> WORKING``. On entering WORKING the input buffer of pair ``j`` becomes
  *inreading* and its output buffer *inwriting* (its previous state is remembered).
* ``WORKING --done-->``: the input buffer becomes *invalid*, the output buffer returns to its previous state; then
  ``ACTIVE`` if the executor holds another legitimate pair (the last stage always re-enters ACTIVE), else
  ``INACTIVE``.
* ``INACTIVE --a pair becomes legitimate--> ACTIVE``.
* Only **after (re-)entering ACTIVE** does executor ``i`` make the ``j``-th input buffer of executor ``i-1`` (the
  buffer it has consumed from) available again, for every pair ``j`` it has finished reading. With one buffer pair
  this keeps every executor inactive until the batch has left the last stage: the serial manner. With more pairs
  executors overlap: the parallel manner.

Refinements (see :mod:`dvasim.core.buffers`): the last stage's input buffer has no downstream reader, so it is
available again as soon as the last stage is done; a pair shared by split sub-batches is given back only after the
last of them has been read; catch-up rows of a stretched batch may use their own pair when no execution is using
it, and an executor with such an item at the head of its queue counts as active.
"""

from __future__ import annotations

from enum import Enum
from typing import cast

from dvasim.core.batch_table import BatchItem
from dvasim.core.buffers import BufferPairs, BufferState
from dvasim.core.errors import TransitionError


class ExecutorState(str, Enum):
    ACTIVE = "active"
    CHECKING = "checking"
    WORKING = "working"
    INACTIVE = "inactive"


class Executor:
    """The control state of one stage executor. Engines drive it; it never blocks or sleeps."""

    def __init__(self, stage: int, n_stages: int, buffers: BufferPairs, record: bool = False):
        self.stage = stage
        self.n_stages = n_stages
        self.buffers = buffers
        self.state = ExecutorState.ACTIVE
        self.item: BatchItem | None = None
        self.owed: set[int] = set()  # pairs whose predecessor buffer we must give back
        self.record = record
        self.history: list[ExecutorState] = [self.state]
        self.is_last = stage == n_stages - 1

    def _to(self, state: ExecutorState) -> None:
        self.state = state
        if self.record:
            self.history.append(state)

    # ----------------------------------------------------------------- predicates
    def usable(self, item: BatchItem) -> bool:
        if item.catch_up:
            return self.buffers.usable_for_catch_up(self.stage, item.slot)
        return self.buffers.legitimate(self.stage, item.slot)

    def _may_be_active(self, head: BatchItem | None) -> bool:
        if self.is_last or self.buffers.any_legitimate(self.stage):
            return True
        return head is not None and head.catch_up and self.usable(head)

    def can_pull(self, head: BatchItem) -> bool:
        if self.state is not ExecutorState.ACTIVE:
            return False
        if head.slot is None:  # a fresh batch at the first stage takes a legitimate pair no serial split holds
            return bool(self.buffers.fresh_slots(self.stage))
        return True

    # ----------------------------------------------------------------- transitions
    def pull(self, item: BatchItem) -> BatchItem:
        """ACTIVE -> WORKING or CHECKING with ``item``; returns the item (with its pair assigned)."""
        if self.state is not ExecutorState.ACTIVE:
            raise TransitionError(f"executor {self.stage}: pull in state {self.state.value}")
        if item.slot is None:
            slots = self.buffers.fresh_slots(self.stage)
            if self.stage != 0 or not slots:
                raise TransitionError(f"executor {self.stage}: no buffer pair for a fresh batch")
            item = BatchItem(item.bid, item.start, item.num, slots[0])
        self.item = item
        if self.usable(item):
            self._begin()
        else:
            self._to(ExecutorState.CHECKING)
        return item

    def retry(self) -> bool:
        """CHECKING -> WORKING once the pulled batch's pair is legitimate. Returns True if it started."""
        if self.state is ExecutorState.CHECKING and self.usable(self.item):
            self._begin()
            return True
        return False

    def _begin(self) -> None:
        st, j = self.buffers.state, cast(BatchItem, self.item).slot  # (pulled: an item, read natively compiled)
        i = self.stage
        if st[i][j] is BufferState.INWRITING or st[i + 1][j] in (BufferState.INREADING, BufferState.INWRITING):
            raise TransitionError(f"executor {i}: pair {j} is in use ({st[i][j].value}, {st[i + 1][j].value})")
        self.buffers.restore[i + 1][j] = st[i + 1][j]
        st[i][j] = BufferState.INREADING
        st[i + 1][j] = BufferState.INWRITING
        self._to(ExecutorState.WORKING)

    def finish(self, head: BatchItem | None) -> BatchItem:
        """WORKING -> ACTIVE or INACTIVE. ``head`` is the next item of this executor's queue (or None)."""
        if self.state is not ExecutorState.WORKING:
            raise TransitionError(f"executor {self.stage}: finish in state {self.state.value}")
        item = cast(BatchItem, self.item)  # (working: it holds an item)
        self.item = None
        i, j = self.stage, item.slot
        st = self.buffers.state
        st[i][j] = BufferState.AVAILABLE if self.is_last else BufferState.INVALID
        st[i + 1][j] = self.buffers.restore[i + 1][j] if i + 1 < self.n_stages else BufferState.AVAILABLE
        if i > 0:
            self.buffers.pending[i][j] -= 1
            self.owed.add(j)
        if self._may_be_active(head):
            self._activate()
        else:
            self._to(ExecutorState.INACTIVE)
        return item

    def wake(self, head: BatchItem | None) -> bool:
        """INACTIVE -> ACTIVE when a pair became legitimate. Returns True if the state changed."""
        if self.state is ExecutorState.INACTIVE and self._may_be_active(head):
            self._activate()
            return True
        return False

    def _activate(self) -> None:
        self._to(ExecutorState.ACTIVE)
        self.release_owed()

    def release_owed(self) -> bool:
        """Give executor ``i-1`` back the pairs we have finished reading. Returns True if a buffer changed."""
        if self.state is not ExecutorState.ACTIVE or not self.owed:
            return False
        changed = False
        pending = self.buffers.pending[self.stage]
        for j in sorted(self.owed):
            if pending[j] == 0:
                self.owed.discard(j)
                changed |= self._release(j)
        return changed

    def _release(self, j: int) -> bool:
        st = self.buffers.state[self.stage - 1]
        if st[j] is BufferState.INVALID:
            st[j] = BufferState.AVAILABLE
            return True
        if st[j] is BufferState.INWRITING:
            # executor i-2 is writing it: it must return to available, not to invalid, when that write ends
            self.buffers.restore[self.stage - 1][j] = BufferState.AVAILABLE
            return True
        return False  # already available, or being re-read (a catch-up); the next read will owe it again
