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
* ``allow_timeout_override = true`` alone turns prefetch off: ``src/scheduler_utils.cc:364-367``.
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


def run(name, release, arrivals=BURST, eager=False, instances=1, **params):
    table = make_table(1, lambda s, b: 10.0, batch_sizes=range(1, 9))
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
    """q0 waits its 0.5 ms and runs 0.5-10.5. q1 (1.0) and q2 (1.2) make a payload of the preferred size 2, which
    is saturated; so are {q3, q4} (2.0, 2.2). q5 (3.0) finds both prefetch slots taken. At 10.5 the instance takes
    {q1, q2} and merges {q3, q4}, which has waited 8.5 ms > 0.5 ms and fits (4 <= 8): {q1..q4} runs 10.5-20.5;
    q5's payload is formed at 10.5 (its delay has passed) and runs 20.5-30.5."""
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
    only(skip_saturated_merge=True)
    assert run("delaybatch", "24.10", PREF2, max_queue_delay_ms=0.5, preferred_batch_size=[2]) == expected


FREEZE = [0.0, 1.0, 1.1, 1.2, 2.0, 3.0, 4.0, 11.0, 11.1, 11.2]  # DelayBatch, 0.5 ms, max_batch_size 4


def test_an_aged_payload_too_large_to_merge_stops_growing():
    """max_batch_size 4 (so the preferred size is 4), 0.5 ms window. q0 runs 0.5-10.5. {q1, q2, q3} leaves at 1.5
    (its delay passed) as a payload that grows to 4 with q4 (2.0): saturated. {q5} is formed at 3.5 and grows with
    q6 (4.0). At 10.5 the instance takes {q1..q4}; {q5, q6} has waited more than 0.5 ms but does not fit (6 > 4):
    the merge leaves it EXECUTING, so q7 (11.0) starts a new payload, {q7, q8, q9} at 11.5. {q5, q6} runs
    20.5-30.5 (3 more would not fit), {q7, q8, q9} 30.5-40.5."""
    assert run("delaybatch", "24.10", FREEZE, max_batch_size=4, max_queue_delay_ms=0.5) == (
        [10.5, 20.5, 20.5, 20.5, 20.5, 30.5, 30.5, 40.5, 40.5, 40.5], [1, 4, 4, 4, 4, 2, 2, 3, 3, 3])


def test_without_the_freeze_the_unmerged_payload_grows_on(only):
    """As "current" models it: {q5, q6} keeps growing, with q7 and q8, to 4 (saturated); q9 is a payload of its
    own (11.7). {q5..q8} runs 20.5-30.5 and {q9} 30.5-40.5."""
    only(freeze_unmerged=False)
    assert run("delaybatch", "24.10", FREEZE, max_batch_size=4, max_queue_delay_ms=0.5) == (
        [10.5, 20.5, 20.5, 20.5, 20.5, 30.5, 30.5, 30.5, 30.5, 40.5], [1, 4, 4, 4, 4, 4, 4, 4, 4, 1])


def test_allow_timeout_override_alone_turns_prefetch_off():
    """Triton's whole batcher, preferred sizes 2 and 4, no delay. With prefetch, q1 (1) is a payload formed ahead
    that grows with q2 (2) to the preferred size 2 (saturated, no delay); {q3, q4} likewise: {q1, q2} runs 10-20 and
    {q3, q4} 20-30. With ``allow_timeout_override = true`` r24.10 forms no payload ahead: at 10 the idle instance's
    thread waits for one, and the four queued requests leave as the preferred size 4, 10-20."""
    assert run("triton", "24.10", preferred_batch_size=[2, 4]) == ([10.0, 20.0, 20.0, 30.0, 30.0], [1, 2, 2, 2, 2])
    assert run("triton", "24.10", preferred_batch_size=[2, 4], allow_timeout_override=True) == (
        [10.0, 20.0, 20.0, 20.0, 20.0], [1, 4, 4, 4, 4])
    # "current" counts no override as a queue policy: its runs are unchanged by it
    assert run("triton", "current", preferred_batch_size=[2, 4], allow_timeout_override=True) == run(
        "triton", "current", preferred_batch_size=[2, 4])


def test_counting_the_override_alone_makes_the_difference(only):
    only(override_stops_prefetch=False)
    assert run("triton", "24.10", preferred_batch_size=[2, 4], allow_timeout_override=True) == (
        [10.0, 20.0, 20.0, 30.0, 30.0], [1, 2, 2, 2, 2])


def test_a_queue_policy_turns_prefetch_off_as_in_current():
    """A queue size limit turns prefetch off under both releases (scheduler_utils.cc:364-367): "24.10" then batches
    at 10 what queued while q0 ran, as the ideal batcher does."""
    assert run("triton", "24.10", preferred_batch_size=[2, 4], max_queue_size=16) == (
        [10.0, 20.0, 20.0, 20.0, 20.0], [1, 4, 4, 4, 4])


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
    """The four rules are all that set "24.10" apart: with TensorRT's release and "current"'s merge and prefetch
    rules it runs "current" exactly, at load, with merges at dequeue (a delay and preferred sizes)."""
    params = {"max_queue_delay_ms": 2.0, "preferred_batch_size": [4, 8]}
    current = [(q.finish, q.exit_batch_size) for q in _load("current", **params)]
    assert [(q.finish, q.exit_batch_size) for q in _load("24.10", **params)] != current
    only(release_at_exit=False, tokens=1, skip_saturated_merge=True, freeze_unmerged=False,
         override_stops_prefetch=False)
    assert [(q.finish, q.exit_batch_size) for q in _load("24.10", **params)] == current


def test_2410_equals_current_when_no_rule_that_differs_fires():
    # queries 20 ms apart: each runs alone on an idle instance under both releases
    assert run("zerobatch", "24.10", [0.0, 20.0, 40.0]) == run("zerobatch", "current", [0.0, 20.0, 40.0]) == (
        [10.0, 30.0, 50.0], [1, 1, 1])
