"""The batch table's meta operations, following the paper's Figure 8 (new, stretch at stage 2, split at stage 3)."""

import pytest

from dvasim.core.batch_table import BatchItem, BatchTable, MetaOpError
from dvasim.core.query import Query


def qs(*ids):
    return [Query(i, 0.0) for i in ids]


def test_new_creates_row_and_first_item():
    t = BatchTable(4)
    item = t.new(qs(0, 1), now=5.0)
    b = t[item.bid]
    assert (item.start, item.num, item.slot) == (0, 2, None)
    assert b.bs == 2 and b.created == 5.0 and b.status_map == [0, 0, 0, 0]
    assert t.latest() is b
    assert [q.batch_id for q in b.queries] == [b.bid, b.bid]


def test_complete_and_advance_move_whole_batch():
    t = BatchTable(3)
    item = t.new(qs(0, 1, 2), 0.0)
    done = t.complete(item, 0)
    assert done.ready and not done.exited
    nxt = t.advance(item.bid, 0)
    assert (nxt.start, nxt.num) == (0, 3)
    assert t[item.bid].status_map == [3, 0, 0]


def test_figure8_stretch_catch_up_then_merge():
    # (a) new batch0 with 2 queries; stage 1 done, stage 2 running
    t = BatchTable(4)
    it = t.new(qs(0, 1), 0.0)
    t.complete(it, 0)
    it2 = t.advance(it.bid, 0)
    # (b) stretch with 2 queries while executor 2 processes the batch
    catch = t.stretch(it.bid, qs(2, 3), 1.0)
    assert (catch.bid, catch.start, catch.num) == (it.bid, 2, 2) and catch.catch_up
    assert t[it.bid].bs == 4
    done = t.complete(it2, 1)  # executor 2 finishes the first 2 queries: no push, only status_map
    assert not done.ready and t[it.bid].status_map == [2, 2, 0, 0]
    done = t.complete(catch, 0)  # the newcomers catch up through stage 1 ...
    assert done.ready
    c2 = t.advance(it.bid, 0)
    assert (c2.start, c2.num) == (2, 2)  # ... then only they run stage 2
    done = t.complete(c2, 1)
    assert done.ready and t[it.bid].status_map == [4, 4, 0, 0]
    merged = t.advance(it.bid, 1)
    assert (merged.start, merged.num) == (0, 4)  # one merged batch enters stage 3


def test_figure8_split_at_stage3():
    t = BatchTable(4)
    cur = t.new(qs(0, 1, 2, 3), 0.0, splittable=True)
    it = cur
    for s in range(3):
        t.complete(cur, s)
        if s < 2:
            cur = t.advance(it.bid, s)
    items = t.split(it.bid, [2, 2], stage=2, now=3.0)
    assert it.bid not in t and len(items) == 2
    a, b = (t[i.bid] for i in items)
    assert [q.qid for q in a.queries] == [0, 1] and [q.qid for q in b.queries] == [2, 3]
    assert a.row_offset == 0 and b.row_offset == 2
    assert a.status_map == [2, 2, 2, 0] and a.splittable and b.splittable
    assert all(i.start == 0 and i.num == 2 for i in items)


def test_stretch_only_latest_and_not_splittable():
    t = BatchTable(3)
    a = t.new(qs(0), 0.0)
    b = t.new(qs(1), 0.0)
    with pytest.raises(MetaOpError, match="latest"):
        t.stretch(a.bid, qs(2), 1.0)
    t.stretch(b.bid, qs(3), 1.0)
    c = t.new(qs(4), 0.0, splittable=True)
    with pytest.raises(MetaOpError, match="split"):
        t.stretch(c.bid, qs(5), 1.0)


def test_split_children_cannot_be_stretched_and_sizes_checked():
    t = BatchTable(3)
    it = t.new(qs(0, 1, 2), 0.0, splittable=True)
    t.complete(it, 0)
    with pytest.raises(MetaOpError, match="add up"):
        t.split(it.bid, [1, 1], 0, 0.0)
    items = t.split(it.bid, [1, 2], 0, 0.0)
    assert t.latest_id is None
    with pytest.raises(MetaOpError):
        t.stretch(items[-1].bid, qs(9), 1.0)


def test_split_needs_whole_batch_and_splittable():
    t = BatchTable(3)
    it = t.new(qs(0, 1), 0.0)
    t.complete(it, 0)
    with pytest.raises(MetaOpError, match="splittable"):
        t.split(it.bid, [1, 1], 0, 0.0)
    t2 = BatchTable(3)
    it2 = t2.new(qs(0, 1), 0.0, splittable=True)
    with pytest.raises(MetaOpError, match="whole"):
        t2.split(it2.bid, [1, 1], 0, 0.0)  # stage 0 not completed yet


def test_last_stage_exits_and_removes_row():
    t = BatchTable(1)
    it = t.new(qs(0, 1), 0.0)
    done = t.complete(it, 0)
    assert [q.qid for q in done.exited] == [0, 1] and len(t) == 0 and t.latest_id is None


def test_stretch_refused_once_last_stage_reached():
    t = BatchTable(2)
    it = t.new(qs(0), 0.0)
    t.complete(it, 0)
    t.advance(it.bid, 0)
    with pytest.raises(MetaOpError, match="last stage"):
        t.stretch(it.bid, qs(1), 1.0)


def test_item_rows_follow_row_offset():
    t = BatchTable(2)
    it = t.new(qs(0, 1, 2, 3), 0.0, splittable=True)
    t.complete(it, 0)
    items = t.split(it.bid, [3, 1], 0, 0.0)
    assert list(t[items[1].bid].rows(items[1])) == [3]
    assert BatchItem(0, 2, 2).catch_up and not BatchItem(0, 0, 2).catch_up
