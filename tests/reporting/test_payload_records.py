"""The records' payload times (``payload_ms``, ``instance_ms``: :class:`dvasim.core.query.Query`'s
``payload_formed`` and ``on_instance``), on hand-worked timelines.

``payload_ms`` is when a query left the batcher's queue into a payload (from then on the queue policy's timeout no
longer applies to it), ``instance_ms`` when that payload reached a model instance. Under a Triton release that forms
payloads ahead (any but ``"ideal"``) the two may differ from each other and from ``admitted_ms``; a policy
without payloads (ZeroBatch and DelayBatch on the ideal batcher, DVABatch, ...) hands a batch to an instance as it
forms it, so both equal ``admitted_ms``.

The timelines are those of ``tests/policies/test_triton_release.py``: one instance, one stage of 10 ms at any batch
size up to 8, the exclusive device.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import dvasim
from dvasim.core.pipeline import Pipeline
from dvasim.core.query import Query
from dvasim.engines.sim.engine import simulate
from dvasim.policies import make_policy
from dvasim.reporting.records import RecordStore, read_records, records_frame
from tests.conftest import make_table

BURST = [0.0, 1.0, 2.0, 3.0, 4.0]  # one query on an idle instance, then four while it is busy
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def run(name, release, arrivals=BURST, n_stages=1, **params):
    table = make_table(n_stages, lambda s, b: 10.0, batch_sizes=range(1, 9))
    policy = make_policy(name, {"max_batch_size": 8, **params})
    pipe = Pipeline(table, policy, 1, triton_release=release)
    res = simulate(pipe, np.array(arrivals, dtype=float), np.ones(len(arrivals), dtype=int), sharing="exclusive")
    assert res.stuck is None
    return records_frame(res.queries, n_stages)


def times(df, col):
    return df[col].tolist()


@pytest.mark.parametrize("name", ["delaybatch", "triton"])
def test_r2110_payload_formed_and_taken_by_the_instance(name):
    """A 0.5 ms queue delay under r21.10 (the timeline of test_merge_at_dequeue_needs_a_delay): q0's payload forms
    at 0.5 and runs at once; q1's forms at 1.5 and the instance takes it at once (it waits on the stream until
    10.5); q2's (2.5) and q3's (3.5) fill the two prefetch slots; q4's forms at 10.5, when the instance takes q2's
    payload and merges q3's; the instance takes q4's at 20.5, when {q2, q3} start."""
    df = run(name, "21.10", max_queue_delay_ms=0.5)
    assert times(df, "payload_ms") == [0.5, 1.5, 2.5, 3.5, 10.5]
    assert times(df, "instance_ms") == [0.5, 1.5, 10.5, 10.5, 20.5]
    assert times(df, "start_ms") == [0.5, 10.5, 20.5, 20.5, 30.5]
    assert (df.seen_ms <= df.payload_ms).all() and (df.payload_ms <= df.instance_ms).all()
    assert (df.instance_ms <= df.admitted_ms).all() and (df.admitted_ms <= df.start_ms).all()


def test_current_release_notes_when_each_query_joined_its_growing_payload():
    """ZeroBatch under the current release (test_current_release_grows_the_queued_payload): q2's payload forms at
    2 and is still queued when q3 (3) and q4 (4) join it, each at its own arrival; the instance takes it at 10."""
    df = run("zerobatch", "current")
    assert times(df, "payload_ms") == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert times(df, "instance_ms") == [0.0, 1.0, 10.0, 10.0, 10.0]
    assert times(df, "start_ms") == [0.0, 10.0, 20.0, 20.0, 20.0]
    assert times(df, "exit_batch_size") == [1, 1, 3, 3, 3]


def test_bert_base_waits_past_the_reject_timeout_are_explained():
    """configs/triton/bert_base.toml: a REJECT timeout of 100 ms (its pbtxt), yet hundreds of served queries wait
    more than 100 ms from arrival to start. The timeout applies only until a query's payload forms: every one of
    them left the batcher's queue within 100 ms of its arrival (the front door adds no delay here) and spent the
    rest in its payload, on an instance's stream behind the running batch (the current release takes a payload
    for a waiting backend thread only: no prefetch with a queue policy). A timed-out query never joined a
    payload."""
    res = dvasim.run(CONFIGS / "triton" / "bert_base.toml")
    assert res.config["policy"]["default_timeout_ms"] == 100.0 and res.config["policy"]["timeout_action"] == "REJECT"
    df = res.queries
    ok = df[df.status == "ok"]
    assert (ok.seen_ms == ok.arrival_ms).all()
    late = ok[ok.start_ms - ok.arrival_ms > 100.0]
    assert len(late) > 100  # the waits to explain (923 at the time of writing)
    assert (late.payload_ms - late.arrival_ms <= 100.0).all()
    assert (late.start_ms - late.payload_ms > 0).all()
    assert (ok.payload_ms - ok.seen_ms <= 100.0).all()
    assert (ok.payload_ms <= ok.instance_ms).all() and (ok.instance_ms <= ok.start_ms).all()
    refused = df[df.status != "ok"]
    assert len(refused) and refused.payload_ms.isna().all() and refused.instance_ms.isna().all()
    # the summary says it: the longest wait for a payload is within the timeout, the longest wait to start is not
    wait = ok.payload_ms - ok.arrival_ms
    assert res.summary["max_payload_wait_ms"] == wait.max() <= 100.0 < (ok.start_ms - ok.arrival_ms).max()
    assert res.summary["mean_payload_wait_ms"] == pytest.approx(wait.mean(), rel=1e-12)
    assert res.summary["mean_payload_wait_ms"] < res.summary["mean_queue_ms"]


def test_without_payloads_both_are_the_admission():
    """ZeroBatch on the ideal batcher (test_ideal_batcher_batches_what_queued_while_busy): a batch is formed only
    for a free instance and goes to it at once, so payload_ms = instance_ms = admitted_ms: q0 at 0, q1-q4 at 10."""
    df = run("zerobatch", "ideal")
    for col in ("payload_ms", "instance_ms", "admitted_ms", "start_ms"):
        assert times(df, col) == [0.0, 10.0, 10.0, 10.0, 10.0], col


def test_dvabatch_stretched_queries_reach_their_instance_when_they_join_the_batch():
    """DVABatch, two stages of 10 ms: payload_ms = instance_ms = admitted_ms for every query, new or stretched. A
    query stretched into a batch that already started joins it (and its instance) at once and catches up from the
    first stage later: its start is after its admission."""
    rng = np.random.default_rng(3)
    arrivals = np.cumsum(rng.exponential(1.5, 200))
    df = run("dvabatch", "ideal", arrivals=arrivals, n_stages=2)
    assert df.start_ms.notna().all()
    assert (df.payload_ms == df.admitted_ms).all() and (df.instance_ms == df.admitted_ms).all()
    assert (df.start_ms > df.instance_ms).any()  # stretched (or queued on the instance) before its first stage


def test_records_write_the_payload_columns():
    """The packed rows carry both fields exactly (NaN for a query that never formed a payload), in memory and in a
    streamed queries.parquet, between seen_ms and admitted_ms."""
    q = Query(0, 1.0)
    q.seen, q.payload_formed, q.on_instance, q.admitted, q.finish = 1.0, 1.25, 2.5, 3.0, 9.0
    q.stage_start, q.stage_finish = [3.0], [9.0]
    waiting = Query(1, 2.0)  # still in the batcher's queue when the run ended
    waiting.seen, waiting.stage_start, waiting.stage_finish = 2.0, [math.nan], [math.nan]
    df = records_frame([q, waiting], 1)
    cols = list(df.columns)
    assert cols.index("seen_ms") + 1 == cols.index("payload_ms") == cols.index("instance_ms") - 1
    assert cols.index("instance_ms") + 1 == cols.index("admitted_ms")
    assert df.payload_ms[0] == 1.25 and df.instance_ms[0] == 2.5
    assert math.isnan(df.payload_ms[1]) and math.isnan(df.instance_ms[1])


def test_streamed_records_hold_the_payload_columns(tmp_path):
    path = tmp_path / "queries.parquet"
    store = RecordStore(2, 1, path=path)
    q = Query(0, 0.5)
    q.seen, q.payload_formed, q.on_instance, q.admitted = 0.5, 0.75, 1.0, 1.0
    q.stage_start, q.stage_finish, q.finish = [1.0], [2.0], 2.0
    store.add(q)
    store.add_unseen(1, 1)
    store.close()
    df = read_records(path)
    assert df.payload_ms.tolist()[0] == 0.75 and df.instance_ms.tolist()[0] == 1.0
    assert df[["payload_ms", "instance_ms"]].iloc[1].isna().all()
    assert df.payload_ms.dtype == np.float64
