"""Buffer pairs between stage executors (paper §6.1).

Stage ``i``'s executor reads its input from boundary ``i`` and writes its output to boundary ``i+1``; there are
``K`` buffers at each boundary ``0..N``. Buffer pair ``j`` of executor ``i`` is ``(buf[i][j], buf[i+1][j])``: the
output buffer of executor ``i`` is the input buffer of executor ``i+1``. Each buffer is in one of four states:

* ``AVAILABLE``  not used by any executor;
* ``INVALID``    cannot be used as an input buffer now (its reader has consumed it, but the executor after that
  reader has not yet given the pair back, so writing a new input here could overwrite unread data downstream);
* ``INREADING`` / ``INWRITING``  used as input / output of a running execution.

A pair is *legitimate* for an executor when its input buffer is available and its output buffer is available or
invalid (an invalid buffer may be written, not read). See :mod:`dvasim.core.executor` for who changes what when.

Two refinements the paper leaves implicit, both needed to keep data safe and the pipeline live:

* **split**: the sub-batches of a split batch share their parent's input buffer. The executor that reads them
  gives its predecessor the pair back only after the last of them has been read (``pending`` counts the queued
  items that still have to read a buffer).
* **serial split**: the pair of a batch split in the serial manner is *held* until its last sub-batch has left the
  pipeline; no fresh batch takes a held pair.
* **stretch**: the newcomers of a stretched batch occupy rows of the batch's own buffer pair that no one else
  reads or writes, so while they catch up the pair only needs to be free of running executions, not available.
  With a single buffer pair the whole pair must be free (no execution at any stage), so one pair means one stage
  at a time even under stretch (§6.2's serial manner).
"""

from __future__ import annotations

from enum import Enum


class BufferState(str, Enum):
    AVAILABLE = "available"
    INVALID = "invalid"
    INREADING = "inreading"
    INWRITING = "inwriting"


BUSY = (BufferState.INREADING, BufferState.INWRITING)


class BufferPairs:
    """States of the ``(n_stages + 1) x n_pairs`` buffers and the count of pending reads of each."""

    def __init__(self, n_stages: int, n_pairs: int):
        if n_pairs < 1:
            raise ValueError("n_pairs must be >= 1")
        self.n_stages = n_stages
        self.n_pairs = n_pairs
        self.state = [[BufferState.AVAILABLE] * n_pairs for _ in range(n_stages + 1)]
        self.pending = [[0] * n_pairs for _ in range(n_stages + 1)]
        # the state an output buffer returns to when the write into it ends
        self.restore = [[BufferState.AVAILABLE] * n_pairs for _ in range(n_stages + 1)]
        # pairs held by the sub-batches of a serial split: no fresh batch takes them at the first stage
        self.held = [0] * n_pairs

    def _pair_busy(self, slot: int) -> bool:
        return any(row[slot] in BUSY for row in self.state)

    def legitimate(self, stage: int, slot: int) -> bool:
        """Pair ``slot`` of executor ``stage``: input available, output available or invalid (and, with a single
        pair, no execution anywhere on it: a stretch's catch-up must not run beside its batch)."""
        if self.n_pairs == 1 and self._pair_busy(slot):
            return False
        return self.state[stage][slot] is BufferState.AVAILABLE and self.state[stage + 1][slot] in (
            BufferState.AVAILABLE,
            BufferState.INVALID,
        )

    def usable_for_catch_up(self, stage: int, slot: int) -> bool:
        """Catch-up rows of a stretched batch need only that no execution is using the pair's buffers -- with one
        buffer pair, no buffer of it at any boundary (the serial manner of §6.2: one stage at a time, so the
        newcomers catch up while the batch's first queries wait, never beside them)."""
        if self.n_pairs == 1:
            return not self._pair_busy(slot)
        return self.state[stage][slot] not in BUSY and self.state[stage + 1][slot] not in BUSY

    def any_legitimate(self, stage: int) -> bool:
        if self.n_pairs == 1:
            return self.legitimate(stage, 0)
        inp, out = self.state[stage], self.state[stage + 1]
        for j in range(self.n_pairs):
            if inp[j] is BufferState.AVAILABLE and (out[j] is BufferState.AVAILABLE or out[j] is BufferState.INVALID):
                return True
        return False

    def legitimate_slots(self, stage: int) -> list[int]:
        return [j for j in range(self.n_pairs) if self.legitimate(stage, j)]

    def fresh_slots(self, stage: int) -> list[int]:
        """Legitimate pairs a fresh batch may take: those no serial split holds."""
        return [j for j in range(self.n_pairs) if not self.held[j] and self.legitimate(stage, j)]

    def snapshot(self) -> list[list[str]]:
        return [[s.value for s in row] for row in self.state]
