"""Every transition of the executors' state diagram (paper Figure 11) and the buffer states it drives."""

import pytest

from dvasim.core.batch_table import BatchItem
from dvasim.core.buffers import BufferPairs, BufferState
from dvasim.core.executor import Executor, ExecutorState, TransitionError

A, V, R, W = BufferState.AVAILABLE, BufferState.INVALID, BufferState.INREADING, BufferState.INWRITING
ACTIVE, CHECKING, WORKING, INACTIVE = (ExecutorState.ACTIVE, ExecutorState.CHECKING, ExecutorState.WORKING,
                                       ExecutorState.INACTIVE)


def chain(n_stages=3, n_pairs=1):
    bufs = BufferPairs(n_stages, n_pairs)
    return bufs, [Executor(i, n_stages, bufs, record=True) for i in range(n_stages)]


def test_initially_active_and_all_available():
    bufs, ex = chain(3, 2)
    assert all(e.state is ACTIVE for e in ex)
    assert all(s is A for row in bufs.state for s in row)


def test_legitimacy_rule():
    bufs = BufferPairs(2, 1)
    for inp, out, ok in [(A, A, True), (A, V, True), (V, A, False), (A, R, False), (A, W, False), (R, A, False),
                         (W, A, False), (V, V, False)]:
        bufs.state[0][0], bufs.state[1][0] = inp, out
        assert bufs.legitimate(0, 0) is ok, (inp, out)


def test_active_to_working_marks_buffers():
    bufs, ex = chain(3, 1)
    item = ex[0].pull(BatchItem(0, 0, 2, None))
    assert item.slot == 0 and ex[0].state is WORKING
    assert bufs.state[0][0] is R and bufs.state[1][0] is W


def test_active_to_checking_to_working():
    bufs, ex = chain(3, 2)
    bufs.state[1][1] = V  # executor 1's input of pair 1 is not legitimate
    ex[1].pull(BatchItem(0, 0, 1, 1))
    assert ex[1].state is CHECKING
    assert not ex[1].retry()
    bufs.state[1][1] = A
    assert ex[1].retry() and ex[1].state is WORKING


def test_working_to_inactive_with_one_pair_then_release_cascade():
    bufs, ex = chain(3, 1)
    ex[0].pull(BatchItem(0, 0, 1, None))
    ex[0].finish(None)
    # input invalid, output restored; no other legitimate pair -> inactive
    assert bufs.state[0][0] is V and bufs.state[1][0] is A and ex[0].state is INACTIVE
    bufs.pending[1][0] += 1
    ex[1].pull(BatchItem(0, 0, 1, 0))
    ex[1].finish(None)
    assert ex[1].state is INACTIVE and bufs.state[1][0] is V
    # executor 1 finished but is inactive: it has NOT given pair 0 back to executor 0 yet (serial manner)
    assert bufs.state[0][0] is V
    bufs.pending[2][0] += 1
    ex[2].pull(BatchItem(0, 0, 1, 0))
    ex[2].finish(None)
    # the last stage always re-enters active and gives executor 1 its pair back
    assert ex[2].state is ACTIVE and bufs.state[2][0] is A and bufs.state[1][0] is A
    assert ex[1].wake(None) and ex[1].state is ACTIVE
    # only after re-entering active does executor 1 make executor 0's buffer available
    assert bufs.state[0][0] is A
    assert ex[0].wake(None) and ex[0].state is ACTIVE
    assert ex[1].history == [ACTIVE, WORKING, INACTIVE, ACTIVE]


def test_working_to_active_with_another_pair():
    bufs, ex = chain(3, 2)
    ex[0].pull(BatchItem(0, 0, 1, None))
    ex[0].finish(None)
    assert ex[0].state is ACTIVE and bufs.state[0][0] is V
    item = ex[0].pull(BatchItem(1, 0, 1, None))
    assert item.slot == 1  # the next fresh batch takes the other legitimate pair


def test_release_waits_for_split_siblings():
    bufs, ex = chain(3, 2)
    bufs.state[1][0] = A
    bufs.state[0][0] = V  # executor 0 wrote pair 0 and wait for executor 1 to give it back
    bufs.pending[1][0] = 2  # two sub-batches of a split batch share buffer (1, 0)
    ex[1].pull(BatchItem(5, 0, 1, 0))
    ex[1].finish(None)
    assert ex[1].state is ACTIVE  # pair 1 is legitimate
    assert bufs.state[0][0] is V, "must not give the pair back while a sibling still has to read it"
    # the sibling waits until executor 2 has consumed the first sub-batch and gives buffer (1,0) back
    ex[1].pull(BatchItem(6, 0, 1, 0))
    assert ex[1].state is CHECKING
    bufs.state[1][0] = A
    assert ex[1].retry()
    ex[1].finish(None)
    assert bufs.state[0][0] is A


def test_release_during_write_returns_to_available():
    bufs, ex = chain(3, 1)
    # executor 0 writes buffer (1,0) which is invalid (consumed by executor 1, not yet given back)
    bufs.state[1][0] = V
    ex[0].pull(BatchItem(0, 0, 1, None))
    assert bufs.state[1][0] is W
    # meanwhile executor 2 re-enters active and gives buffer (1,0) back
    ex[2].owed.add(0)
    ex[2].release_owed()
    ex[0].finish(None)
    assert bufs.state[1][0] is A, "the release must not be lost when the write ends"


def test_catch_up_rows_need_only_a_free_pair():
    bufs, ex = chain(3, 1)
    bufs.state[0][0] = V
    item = BatchItem(0, 2, 2, 0)  # rows 2-3 of batch 0, added by stretch
    assert not bufs.legitimate(0, 0) and bufs.usable_for_catch_up(0, 0)
    ex[0].state = INACTIVE
    assert ex[0].wake(item) and ex[0].state is ACTIVE
    ex[0].pull(item)
    assert ex[0].state is WORKING


def test_illegal_transitions_raise():
    bufs, ex = chain(2, 1)
    with pytest.raises(TransitionError):
        ex[0].finish(None)
    ex[0].pull(BatchItem(0, 0, 1, None))
    with pytest.raises(TransitionError):
        ex[0].pull(BatchItem(1, 0, 1, None))
    assert ex[1].retry() is False
