"""Triton r24.10 with the Python backend (release ``"24.10"``, dvasim.policies.triton_release) against ``"current"``.

As tests/policies/test_triton_release.py: one instance, one stage of 10 ms at any batch size up to 8, the exclusive
device, so every timestamp is worked by hand below. Each difference is shown twice: ``"24.10"`` against
``"current"``, and ``"24.10"`` against itself with that one rule set back to ``"current"``'s (``_only``), so that
the rule alone accounts for the change. The rules and their lines at r24.10 (core bfec7c61dc09, python_backend
01d0ad82f9f5):

* the instance is free when its batch has left: python_backend ``src/python_be.cc:1338-1345, 1514-1517,
  2305-2376``, core ``src/backend_model_instance.cc:796-805`` (``"current"``: TensorRT's inputs-consumed);
* a payload the batcher saturated is still merged at dequeue: core ``src/instance_queue.cc:71-72, 81-82`` test the
  payload's own flag, set only at ``src/dynamic_batch_scheduler.cc:558, 568`` (``"current"`` skips it);
* an aged payload too large to merge is left EXECUTING and stops growing: ``src/instance_queue.cc:85-89``,
  ``src/dynamic_batch_scheduler.cc:342-347``;
* ``allow_timeout_override = true`` alone turns prefetch off: ``src/scheduler_utils.cc:364-367``;
* the batcher thread runs only when woken (``wake_gate``): by an arrival only if a payload slot is free and its payload
  is saturated, stale or ``queued_batch_size_ >= next_preferred_batch_size_`` (``src/dynamic_batch_scheduler.cc:
  263-286``; the latter set while it waits out a delay, ``:623-634``, reset only with a new payload, ``:341-347``), by
  an instance that takes a payload or finishes (``src/rate_limiter.cc:354-355``, ``src/payload.cc:214-216``), or by
  its own ``wait_for`` (``:422-427``); when it runs, ``GetDynamicBatch`` (``:487-670``) grows the queued payload,
  past a preferred size by one request (``:540-546, 594-603``) or by the whole walk once the delay has passed
  (``:611-617``). The tests of the other rules that a gated batcher would hide set it off (``only(wake_gate=False)``:
  the batcher looks at every arrival, as in ``"current"``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import dvasim.policies.triton_release as triton_release
from dvasim.core.pipeline import Pipeline
from dvasim.engines.sim.engine import simulate
from dvasim.policies import make_policy
from dvasim.policies.triton_release import RELEASES, release_rules
from tests.conftest import make_table

BURST = [0.0, 1.0, 2.0, 3.0, 4.0]  # one query on an idle instance, then four while it is busy


def run(name, release, arrivals=BURST, eager=False, instances=1, ms=10.0, **params):
    table = make_table(1, lambda s, b: ms, batch_sizes=range(1, 9))
    policy = make_policy(name, {"max_batch_size": 8, **params})
    pipe = Pipeline(table, policy, 1, instances=instances, triton_release=release, eager_batching=eager)
    res = simulate(pipe, np.array(arrivals), np.ones(len(arrivals), dtype=int), sharing="exclusive")
    assert res.stuck is None
    qs = sorted(res.queries, key=lambda q: q.qid)
    return [q.finish for q in qs], [q.exit_batch_size for q in qs]


@pytest.fixture
def only(monkeypatch):
    """``only(**fields)``: from now on ``"24.10"`` runs with ``fields`` replaced (one rule set back)."""
    original = triton_release.release_rules

    def set_fields(**fields):
        def rules(name, eager_batching=False, field_name="server.triton_release"):
            r = original(name, eager_batching, field_name)
            return dataclasses.replace(r, **fields) if name == "24.10" else r

        monkeypatch.setattr(triton_release, "release_rules", rules)

    return set_fields


def test_the_release_is_a_choice_and_names_its_rules():
    assert "24.10" in RELEASES
    r, cur = release_rules("24.10"), release_rules("current")
    assert r.name == "24.10" and not r.ideal
    assert r.release_at_exit and not r.skip_saturated_merge and r.freeze_unmerged and r.override_stops_prefetch
    assert not cur.release_at_exit and cur.skip_saturated_merge and not cur.freeze_unmerged
    assert not cur.override_stops_prefetch
    assert r.wake_gate and not cur.wake_gate and not release_rules("21.10").wake_gate
    assert r.lost_wakeup and not r.grow_at_finish  # the race at an instance's finish, as the real runs mostly went
    for other in ("ideal", "21.10", "current"):
        assert not release_rules(other).lost_wakeup and not release_rules(other).grow_at_finish
    assert not release_rules("ideal").wake_gate
    # the rules both releases share (the code is the same: r24.10 core = main 73aad7c3 for the batcher)
    for f in ("prefetch_slots_per_instance", "frozen", "prefetch_with_queue_policy"):
        assert getattr(r, f) == getattr(cur, f)
    assert release_rules("24.10", eager_batching=True) == r  # TensorRT's eager batching: no effect


def test_python_backend_frees_the_instance_when_its_batch_has_left():
    """q0 runs 0-10. q1 (t=1) is a payload formed ahead (a prefetch slot is free) that no instance takes: the
    instance's thread is in the stub's execute until 10. q2-q4 join the queued payload as they come (it grows, as
    in "current"), so at 10 the instance takes {q1..q4}, 10-20. Under "current" the TensorRT instance takes q1's
    payload at t=1 (q0's inputs are consumed), so q1 runs alone at 10 and {q2, q3, q4} at 20."""
    assert run("zerobatch", "24.10") == ([10.0, 20.0, 20.0, 20.0, 20.0], [1, 4, 4, 4, 4])
    assert run("zerobatch", "current") == ([10.0, 20.0, 30.0, 30.0, 30.0], [1, 1, 3, 3, 3])
    # eager batching is TensorRT's: "24.10" ignores it, "current" issues a batch per query
    assert run("zerobatch", "24.10", eager=True) == run("zerobatch", "24.10")
    assert run("zerobatch", "current", eager=True)[1] == [1, 1, 1, 1, 1]


def test_python_backend_alone_accounts_for_the_burst(only):
    # "24.10" with TensorRT's release (one token, inputs consumed) is "current" on this burst
    only(release_at_exit=False, tokens=1)
    assert run("zerobatch", "24.10") == run("zerobatch", "current")


PREF2 = [0.0, 1.0, 1.2, 2.0, 2.2, 3.0]  # DelayBatch, 0.5 ms window, preferred size 2


def test_saturated_payloads_are_merged_at_dequeue():
    """q0 waits its 0.5 ms and runs 0.5-10.5. q1 (1.0) wakes the batcher, which waits for its delay and sets the next
    preferred size to 2; q2 (1.2) brings the queue to 2 and wakes it: {q1, q2} leaves at the preferred size 2, not
    saturated (a delay is set, dynamic_batch_scheduler.cc:596-602). q3 (2.0) does not wake it (1 queued < 2); q4
    (2.2) does, and the queued payload, past its largest preferred size, takes one request (:540-546, 596-602):
    {q1, q2, q3}, saturated. q4 starts a new payload, formed when its delay passes (2.7). q5 (3.0) finds both
    prefetch slots taken. At 10.5 the instance takes {q1, q2, q3} and merges {q4}, which has waited 8.3 ms > 0.5 ms
    and fits (4 <= 8): {q1..q4} runs 10.5-20.5; q5's payload is formed at 10.5 (its delay has passed) and runs
    20.5-30.5. (With the batcher looking at every arrival, ``wake_gate`` off, the payloads are {q1, q2} and
    {q3, q4}, both at the preferred size, and the merge gives the same batches.)"""
    assert run("delaybatch", "24.10", PREF2, max_queue_delay_ms=0.5, preferred_batch_size=[2]) == (
        [10.5, 20.5, 20.5, 20.5, 20.5, 30.5], [1, 4, 4, 4, 4, 1])
    # Triton's whole batcher forms the same payloads here
    assert run("triton", "24.10", PREF2, max_queue_delay_ms=0.5, preferred_batch_size=[2]) == run(
        "delaybatch", "24.10", PREF2, max_queue_delay_ms=0.5, preferred_batch_size=[2])


def test_skipping_saturated_payloads_at_dequeue_alone_splits_them(only):
    """The same with "current"'s skip: at 10.5 {q1, q2} is saturated, so it merges nothing and runs alone
    10.5-20.5; q5's payload is formed at 10.5 behind {q3, q4}, which runs 20.5-30.5 (saturated again: no merge),
    and {q5} 30.5-40.5. "current" gives the same timeline (its TensorRT release takes {q1, q2} at 1.2, which changes
    nothing here: the merge is what differs)."""
    expected = ([10.5, 20.5, 20.5, 30.5, 30.5, 40.5], [1, 2, 2, 2, 2, 1])
    assert run("delaybatch", "current", PREF2, max_queue_delay_ms=0.5, preferred_batch_size=[2]) == expected
    # (dvasim's "current" skips the payloads its batcher saturated; the gated batcher's saturation stays the
    # batcher's, as in the code, so the skip is shown with the batcher looking at every arrival)
    only(skip_saturated_merge=True, wake_gate=False)
    assert run("delaybatch", "24.10", PREF2, max_queue_delay_ms=0.5, preferred_batch_size=[2]) == expected


FREEZE = [0.0, 1.0, 1.1, 1.2, 2.0, 3.0, 4.0, 11.0, 11.1, 11.2]  # DelayBatch, 0.5 ms, max_batch_size 4


def test_an_aged_payload_too_large_to_merge_stops_growing(only):
    """With the batcher looking at every arrival (``wake_gate`` off; the gated batcher's case is
    ``test_the_gate_and_the_freeze``). max_batch_size 4 (so the preferred size is 4), 0.5 ms window. q0 runs 0.5-10.5. {q1, q2, q3} leaves at 1.5
    (its delay passed) as a payload that grows to 4 with q4 (2.0): saturated. {q5} is formed at 3.5 and grows with
    q6 (4.0). At 10.5 the instance takes {q1..q4}; {q5, q6} has waited more than 0.5 ms but does not fit (6 > 4):
    the merge leaves it EXECUTING, so q7 (11.0) starts a new payload, {q7, q8, q9} at 11.5. {q5, q6} runs
    20.5-30.5 (3 more would not fit), {q7, q8, q9} 30.5-40.5."""
    only(wake_gate=False)
    assert run("delaybatch", "24.10", FREEZE, max_batch_size=4, max_queue_delay_ms=0.5) == (
        [10.5, 20.5, 20.5, 20.5, 20.5, 30.5, 30.5, 40.5, 40.5, 40.5], [1, 4, 4, 4, 4, 2, 2, 3, 3, 3])


def test_without_the_freeze_the_unmerged_payload_grows_on(only):
    """As "current" models it: {q5, q6} keeps growing, with q7 and q8, to 4 (saturated); q9 is a payload of its
    own (11.7). {q5..q8} runs 20.5-30.5 and {q9} 30.5-40.5."""
    only(freeze_unmerged=False, wake_gate=False)
    assert run("delaybatch", "24.10", FREEZE, max_batch_size=4, max_queue_delay_ms=0.5) == (
        [10.5, 20.5, 20.5, 20.5, 20.5, 30.5, 30.5, 30.5, 30.5, 40.5], [1, 4, 4, 4, 4, 4, 4, 4, 4, 1])


def test_allow_timeout_override_alone_turns_prefetch_off(only):
    """Triton's whole batcher, preferred sizes 2 and 4, no delay. With prefetch, q1 (1) is a payload formed ahead
    that grows with q2 (2) to the preferred size 2 (saturated, no delay); {q3, q4} likewise: {q1, q2} runs 10-20 and
    {q3, q4} 20-30. With ``allow_timeout_override = true`` r24.10 forms no payload ahead: q1..q4 wait in the
    batcher's queue (no consumer waits: their arrivals do not wake it, dynamic_batch_scheduler.cc:269-271). At 10
    q0's finish wakes the batcher (payload.cc:214-216) before the instance's thread counts itself a consumer
    (``lost_wakeup``): it waits for a slot from 10, and no arrival comes, so it sees the waiting thread only at its
    deadline, 510 (:367, 463-468): {q1..q4}, the preferred size 4, 510-520. Had the batcher lost no wake-up, the
    idle instance's thread would have taken them at 10 (10-20)."""
    assert run("triton", "24.10", preferred_batch_size=[2, 4]) == ([10.0, 20.0, 20.0, 30.0, 30.0], [1, 2, 2, 2, 2])
    assert run("triton", "24.10", preferred_batch_size=[2, 4], allow_timeout_override=True) == (
        [10.0, 520.0, 520.0, 520.0, 520.0], [1, 4, 4, 4, 4])
    only(lost_wakeup=False)
    assert run("triton", "24.10", preferred_batch_size=[2, 4], allow_timeout_override=True) == (
        [10.0, 20.0, 20.0, 20.0, 20.0], [1, 4, 4, 4, 4])
    # "current" counts no override as a queue policy: its runs are unchanged by it
    assert run("triton", "current", preferred_batch_size=[2, 4], allow_timeout_override=True) == run(
        "triton", "current", preferred_batch_size=[2, 4])


def test_counting_the_override_alone_makes_the_difference(only):
    only(override_stops_prefetch=False)
    assert run("triton", "24.10", preferred_batch_size=[2, 4], allow_timeout_override=True) == (
        [10.0, 20.0, 20.0, 30.0, 30.0], [1, 2, 2, 2, 2])


def test_a_queue_policy_turns_prefetch_off_as_in_current(only):
    """A queue size limit turns prefetch off under both releases (scheduler_utils.cc:364-367): with no lost wake-up
    "24.10" then batches at 10 what queued while q0 ran, as the ideal batcher does; with it (the default), at the
    batcher's deadline 510 (see the test above)."""
    assert run("triton", "24.10", preferred_batch_size=[2, 4], max_queue_size=16) == (
        [10.0, 520.0, 520.0, 520.0, 520.0], [1, 4, 4, 4, 4])
    only(lost_wakeup=False)
    assert run("triton", "24.10", preferred_batch_size=[2, 4], max_queue_size=16) == (
        [10.0, 20.0, 20.0, 20.0, 20.0], [1, 4, 4, 4, 4])


# ---------------------------------------------------------------- the race at an instance's finish
# Triton's whole batcher with a queue size limit (no prefetch), no delay, max_batch_size 8, 10 ms batches.
LOST = [0.0, 1.0, 2.0, 13.0, 14.0]


def test_the_lost_wake_up_waits_for_the_next_arrival(only):
    """q0 runs 0-10. q1 (1) and q2 (2) queue: no consumer waits, so their arrivals do not wake the batcher
    (dynamic_batch_scheduler.cc:269-271). At 10 q0's finish notifies the batcher (payload.cc:214-216), which runs
    before the instance's thread counts itself a waiting consumer (backend_model_instance.cc:801-804, 798;
    rate_limiter.cc:317-320): no slot (``WaitingConsumerCount`` 0, rate_limiter.cc:230-234), it waits from 10; the
    count's increment notifies only ``waiting_consumer_cv_`` (instance_queue.cc:106-114). q3 (13) finds a
    consumer waiting and, no delay, passes the gate (next preferred size 0, :275-281): the batcher forms {q1, q2, q3}
    at 13, 13-23. q4 (14) waits: its arrival finds no consumer; at 23 the batcher loses the race again, and with no
    arrival after it waits until its deadline, 23 + 500 = 523: {q4} 523-533. Without the lost wake-up: {q1, q2}
    10-20, {q3, q4} 20-30."""
    assert run("triton", "24.10", LOST, max_queue_size=16) == (
        [10.0, 23.0, 23.0, 23.0, 533.0], [1, 3, 3, 3, 1])
    only(lost_wakeup=False)
    assert run("triton", "24.10", LOST, max_queue_size=16) == ([10.0, 20.0, 20.0, 30.0, 30.0], [1, 2, 2, 2, 2])


def test_refused_arrivals_wake_nothing(only):
    """A full queue (max_queue_size 2): q0 runs 0-10; q1 (1) and q2 (2) queue; q3 (3) and q4 (12) are refused
    (:261 returns before the gate). At 10 the batcher loses the race, and the refused q4 does not wake it: {q1, q2}
    leaves at its deadline 510, 510-520."""
    finish, size = run("triton", "24.10", [0.0, 1.0, 2.0, 3.0, 12.0], max_queue_size=2)
    assert (finish[:3], size[:3]) == ([10.0, 520.0, 520.0], [1, 2, 2])
    assert not np.isfinite(finish[3]) and not np.isfinite(finish[4])
    only(lost_wakeup=False)
    finish, size = run("triton", "24.10", [0.0, 1.0, 2.0, 3.0, 12.0], max_queue_size=2)
    assert (finish[:3], size[:3]) == ([10.0, 20.0, 20.0], [1, 2, 2]) and finish[4] == 30.0


def test_with_prefetch_the_instance_takes_the_payload_before_the_batcher_grows_it(only):
    """DelayBatch, 0.5 ms window, max_batch_size 8 (GATE's first part): q0 runs 0.5-10.5; {q1} leaves at 1.5 with
    next preferred size 8, so q2 (2.0) does not wake the batcher. At 10.5 q0's finish notifies it: by default
    (``grow_at_finish`` off) the instance's thread takes {q1} first (it runs 10.5-20.5) and the batcher, woken again
    by the take (rate_limiter.cc:354-355), starts a new payload with q2 (20.5-30.5). With ``grow_at_finish`` the
    batcher runs first and grows the queued {q1} by the walk, q2 (its delay has passed, :619-621): {q1, q2}
    10.5-20.5."""
    assert run("delaybatch", "24.10", [0.0, 1.0, 2.0], max_queue_delay_ms=0.5) == ([10.5, 20.5, 30.5], [1, 1, 1])
    only(grow_at_finish=True)
    assert run("delaybatch", "24.10", [0.0, 1.0, 2.0], max_queue_delay_ms=0.5) == ([10.5, 20.5, 20.5], [1, 2, 2])


def _load(release, instances=2, **params):
    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(2.0, 1500))
    table = make_table(2, lambda s, b: 3.0 + 0.4 * b, batch_sizes=range(1, 17))
    pol = make_policy("delaybatch" if params else "zerobatch", {"max_batch_size": 16, **params})
    pipe = Pipeline(table, pol, 2, instances=instances, triton_release=release)
    res = simulate(pipe, arrivals, np.ones(len(arrivals), dtype=int), sharing="fluid")
    assert res.stuck is None
    return sorted(res.queries, key=lambda q: q.qid)


def test_every_query_is_served_under_2410_at_load():
    for instances in (1, 2):
        for params in ({}, {"max_queue_delay_ms": 2.0}, {"max_queue_delay_ms": 2.0, "preferred_batch_size": [4, 8]}):
            qs = _load("24.10", instances, **params)
            assert len(qs) == 1500 and all(np.isfinite(q.finish) for q in qs)


def test_2410_is_current_with_the_python_backend_where_the_rules_agree(only):
    """With no queue delay nothing is merged at dequeue (instance_queue.cc:71-72), so the merge rules cannot differ:
    "24.10" is then "current" with the Python backend's release, at load and with two instances."""
    ours = [(q.finish, q.exit_batch_size) for q in _load("24.10")]
    only(skip_saturated_merge=True, freeze_unmerged=False, override_stops_prefetch=False)
    assert [(q.finish, q.exit_batch_size) for q in _load("24.10")] == ours


def test_2410_with_every_differing_rule_set_back_is_current(only):
    """The five rules are all that set "24.10" apart: with TensorRT's release, "current"'s merge and prefetch rules
    and a batcher that looks at every arrival it runs "current" exactly, at load, with merges at dequeue (a delay and
    preferred sizes)."""
    params = {"max_queue_delay_ms": 2.0, "preferred_batch_size": [4, 8]}
    current = [(q.finish, q.exit_batch_size) for q in _load("current", **params)]
    assert [(q.finish, q.exit_batch_size) for q in _load("24.10", **params)] != current
    only(release_at_exit=False, tokens=1, skip_saturated_merge=True, freeze_unmerged=False,
         override_stops_prefetch=False, wake_gate=False)
    assert [(q.finish, q.exit_batch_size) for q in _load("24.10", **params)] == current


def test_2410_equals_current_when_no_rule_that_differs_fires():
    # queries 20 ms apart: each runs alone on an idle instance under both releases
    assert run("zerobatch", "24.10", [0.0, 20.0, 40.0]) == run("zerobatch", "current", [0.0, 20.0, 40.0]) == (
        [10.0, 30.0, 50.0], [1, 1, 1])


# ---------------------------------------------------------------- the batcher thread's wake-ups (wake_gate)
# DelayBatch, max_batch_size 8 (so the preferred sizes are [8]), 0.5 ms window, 10 ms batches, unless said.
GATE = [0.0, 1.0, 2.0, 11.0, 12.0, 13.0]


def test_an_arrival_wakes_the_batcher_only_through_its_gate(only):
    """q0 runs 0.5-10.5. q1 (1.0) wakes the batcher (its new payload: next preferred size 0), which waits for q1's
    delay and sets the next preferred size to 8 (dynamic_batch_scheduler.cc:623-634): {q1} leaves at 1.5 and
    waits for the instance, growable. q2 (2.0) does not wake it: 1 queued < 8 (:275-281). At 10.5 the instance
    takes {q1} and its callback wakes the batcher (rate_limiter.cc:354-355): a new payload (next preferred 0,
    :341-347) takes q2 at once (its delay has passed, :619-621). q3 (11.0) wakes it (1 >= 0); the queued payload
    of 1 absorbs q3 (:636-645), and the next preferred size becomes 8 - 1 = 7 (:633): q4 (12.0) and q5 (13.0) do
    not wake it (1, 2 < 7). At 20.5 the instance takes {q2, q3}; {q4, q5} runs 30.5-40.5. A batcher that looks at
    every arrival grows {q1, q2} and {q3, q4, q5}."""
    assert run("delaybatch", "24.10", GATE, max_queue_delay_ms=0.5) == (
        [10.5, 20.5, 30.5, 30.5, 40.5, 40.5], [1, 1, 2, 2, 2, 2])
    assert run("triton", "24.10", GATE, max_queue_delay_ms=0.5) == run(
        "delaybatch", "24.10", GATE, max_queue_delay_ms=0.5)
    only(wake_gate=False)
    assert run("delaybatch", "24.10", GATE, max_queue_delay_ms=0.5) == (
        [10.5, 20.5, 20.5, 30.5, 30.5, 30.5], [1, 2, 2, 3, 3, 3])


PAST = [0.0, 1.0, 1.2, 2.0, 2.2]  # max_batch_size 3, preferred size 2


def test_a_queued_payload_at_its_largest_preferred_size_takes_one_more(only):
    """q0 runs 0.5-10.5. q1 (1.0): the batcher waits, next preferred size 2; q2 (1.2) wakes it (2 >= 2) and
    {q1, q2} leaves at the preferred size 2, not saturated (a delay is set, :596-602). q3 (2.0) does not wake it
    (1 < 2); q4 (2.2) does: the walk passes the largest preferred size at once, marking the best size at 0 and
    saturating (:540-546), then at 1 request (best was 0), and within the delay that 1 leaves (:596-602):
    {q1, q2, q3}, saturated. q4 starts a new payload, {q4} at 2.7. At 10.5 the instance takes {q1, q2, q3};
    {q4} has aged but 3 + 1 > 3: it is left EXECUTING (instance_queue.cc:85-89) and runs 20.5-30.5. A batcher
    that looks at every arrival sends {q1, q2} and {q3, q4} at the preferred size, saturated."""
    params = {"max_queue_delay_ms": 0.5, "max_batch_size": 3, "preferred_batch_size": [2]}
    assert run("delaybatch", "24.10", PAST, **params) == ([10.5, 20.5, 20.5, 20.5, 30.5], [1, 3, 3, 3, 1])
    assert run("triton", "24.10", PAST, **params) == run("delaybatch", "24.10", PAST, **params)
    only(wake_gate=False)
    assert run("delaybatch", "24.10", PAST, **params) == ([10.5, 20.5, 20.5, 30.5, 30.5], [1, 2, 2, 2, 2])


EVERY2 = [2.0 * k for k in range(20)]  # a request every 2 ms, 9.8 ms batches


def test_the_gate_makes_big_and_small_batches_alternate(only):
    """q0 runs 0.5-10.3. {q1} leaves at 2.5 with next preferred size 8; q2..q5 (4-10) do not wake the batcher.
    10.3: the instance takes {q1} (10.3-20.1); a new payload takes q2..q5 at once (q2's delay has passed; next
    preferred 0). q6 (12) wakes it and joins (next preferred 8 - 4 = 4). q7..q9 (14-18) do not wake it (3 < 4);
    q10 (20.0) does (4 >= 4), and as q7..q9 have waited past the delay the walk goes on to max_batch_size
    (:611-617): {q2..q9}, 8, saturated; q10 starts a new payload and waits for its delay (next preferred 8).
    20.1: the instance takes {q2..q9} (20.1-29.9); {q10} leaves at 20.5 and q11..q14 (22-28) do not wake the
    batcher (at most 4 < 8). 29.9: the instance takes {q10} alone (29.9-39.7); q11..q14 leave at once, q15 (30)
    joins (next preferred 8 - 4 = 4); q16..q18 (32-36) do not wake it, q19 (38) does: {q11..q18}, 8, saturated,
    and {q19} leaves at 38.5. 39.7: the instance takes {q11..q18} (39.7-49.5); {q19} has aged but 8 + 1 > 8: left
    EXECUTING, it runs alone, 49.5-59.3. Batches of 1, 8, 1, 8, 1. A batcher that looks at every arrival grows each
    queued payload with every request until the instance takes it: 1, 5, 5, 4, 5."""
    finish, size = run("delaybatch", "24.10", EVERY2, max_queue_delay_ms=0.5, ms=9.8)
    assert size == [1, 1] + [8] * 8 + [1] + [8] * 8 + [1]
    assert finish == pytest.approx([10.3, 20.1] + [29.9] * 8 + [39.7] + [49.5] * 8 + [59.3])
    only(wake_gate=False)
    finish, size = run("delaybatch", "24.10", EVERY2, max_queue_delay_ms=0.5, ms=9.8)
    assert size == [1] + [5] * 10 + [4] * 4 + [5] * 5
    assert finish == pytest.approx([10.3] + [20.1] * 5 + [29.9] * 5 + [39.7] * 4 + [49.5] * 5)


def test_the_gate_and_the_freeze(only):
    """FREEZE and q10 at 21.0, max_batch_size 4. q0 runs 0.5-10.5; {q1, q2, q3} leaves at 1.5 (next preferred 4):
    q4..q6 (2-4) do not wake the batcher. 10.5: the instance takes {q1, q2, q3}; {q4, q5, q6} leaves at once
    (next preferred 0) and q7 (11.0) wakes the batcher: it joins at the preferred size 4, not saturated; q8 (11.1)
    wakes it too (next preferred still 0): the full payload saturates and takes nothing (:540-551, 605-609), q8
    starts a new payload, {q8, q9} at 11.6 (next preferred 4). 20.5: the instance takes {q4..q7}; {q8, q9} has
    aged and does not fit (4 + 2 > 4): left EXECUTING, stale, so the batcher starts a new payload, and q10 (21.0)
    wakes it: {q10} at 21.5, merged at 30.5 behind {q8, q9} (3 <= 4), 30.5-40.5. Without the freeze {q8, q9}
    stays the batcher's payload (next preferred 4): q10 does not wake it (1 < 4) and runs alone, 40.5-50.5."""
    arrivals = FREEZE + [21.0]
    assert run("delaybatch", "24.10", arrivals, max_batch_size=4, max_queue_delay_ms=0.5) == (
        [10.5, 20.5, 20.5, 20.5, 30.5, 30.5, 30.5, 30.5, 40.5, 40.5, 40.5], [1, 3, 3, 3, 4, 4, 4, 4, 3, 3, 3])
    only(freeze_unmerged=False)
    assert run("delaybatch", "24.10", arrivals, max_batch_size=4, max_queue_delay_ms=0.5) == (
        [10.5, 20.5, 20.5, 20.5, 30.5, 30.5, 30.5, 30.5, 40.5, 40.5, 50.5], [1, 3, 3, 3, 4, 4, 4, 4, 2, 2, 1])


def test_with_no_delay_the_gate_is_always_open(only):
    """With no queue delay ``next_preferred_batch_size_`` is never set (GetDynamicBatch returns at :596-603 or
    :611-621 before :623), so every arrival with a free slot wakes the batcher: ZeroBatch runs as a batcher that
    looks at every arrival, at load, with one and two instances."""
    ours = {n: [(q.finish, q.exit_batch_size) for q in _load("24.10", n)] for n in (1, 2)}
    only(wake_gate=False)
    assert {n: [(q.finish, q.exit_batch_size) for q in _load("24.10", n)] for n in (1, 2)} == ours
