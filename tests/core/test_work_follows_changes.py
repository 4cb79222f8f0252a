"""The control plane's work follows what changed (issue 25), and what it skips changes nothing.

* :meth:`Pipeline.step` examines only the executors a change can affect (``Lane.lo``): checked against a second
  implementation, the full fixed-point pass over every executor of every lane from the first stage, under random
  meta operations (the chaos policy of ``test_pipeline_properties``), 1-4 stages, 1-4 buffer pairs, 1-2
  instances and every sharing mode: the same executions start in the same order, and every query's record is
  the same, bit for bit.
* A policy whose front door acts only on waiting queries (:class:`FrontDoorPolicy`) is not asked while none
  waits, nor at a stage boundary when it never decides there, and the runs are identical to those of the same
  policy asked every time.
* The device arms one timer per finish that moves, and the engine spends one SimPy event per stage execution and
  one per arrival (plus one start-up event per executor).
"""

from __future__ import annotations

import random

import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dvasim.core.pipeline import ACTIVE, CHECKING, INACTIVE, WORKING, Pipeline
from dvasim.engines.sim.device import Device
from dvasim.engines.sim.engine import simulate
from dvasim.policies import make_policy
from dvasim.policies.base import FrontDoorPolicy
from tests.conftest import make_table, random_cost_table
from tests.core.test_pipeline_properties import ChaosPolicy


def full_pass_step(self, now):
    """The reference step: every pass examines every executor of every lane, from the first stage, until a pass
    starts nothing and changes no state (the step of the engine before issue 25)."""
    self._now = now
    if self.policy.has_pending():
        for op in self.policy.admit(now):
            self._apply_front(op, now)
    started = []
    for lane in self.lanes:
        lane.lo = lane.n_stages
        progress = True
        while progress:
            progress = False
            for ex, queue in zip(lane.executors, lane.queues):
                if ex.state is WORKING:
                    continue
                head = queue[0] if queue else None
                if head is not None and head.slot is None:
                    head = self._resolve_slot(head)
                if ex.state is INACTIVE:
                    progress |= ex.wake(head)
                if ex.state is ACTIVE:
                    if ex.owed:
                        progress |= ex.release_owed()
                    if head is not None and ex.can_pull(head):
                        queue.popleft()
                        item = ex.pull(head)
                        self.table[item.bid].slot = item.slot
                        if ex.state is WORKING:
                            started.append(self._begin(lane, ex.stage, item, now))
                        progress = True
                elif ex.state is CHECKING and ex.retry():
                    started.append(self._begin(lane, ex.stage, ex.item, now))
                    progress = True
    return started


class FullPassPipeline:
    """A :class:`Pipeline` whose :meth:`step` is :func:`full_pass_step` (a wrapper, not a subclass: the compiled
    core's classes take no interpreted subclass); everything else is the wrapped pipeline's."""

    def __init__(self, *args, **kw):
        object.__setattr__(self, "_pipe", Pipeline(*args, **kw))

    def step(self, now):
        return full_pass_step(self._pipe, now)

    def __getattr__(self, name):
        return getattr(self._pipe, name)

    def __setattr__(self, name, value):
        setattr(self._pipe, name, value)


def _records(res):
    return [(q.qid, q.batch_id, q.exit_batch_id, q.exit_batch_size, q.admitted, q.finish, *q.stage_start,
             *q.stage_finish) for q in res.queries]


def _run(cls, seed, n_stages, n_pairs, instances, sharing, n_queries):
    rng = random.Random(seed)
    table = random_cost_table(rng, n_stages)
    pipe = cls(table, ChaosPolicy(seed, 6), n_pairs, instances=instances)
    order = []
    pipe.on_begin.append(lambda ex: order.append((ex.start, ex.lane, ex.stage, ex.item.bid, ex.item.start)))
    arrivals = sorted(rng.uniform(0, 20) if rng.random() < 0.7 else rng.choice([0.0, 5.0]) for _ in range(n_queries))
    res = simulate(pipe, arrivals, [1] * n_queries, sharing=sharing)
    assert res.stuck is None, res.stuck
    return _records(res), order


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n_stages=st.integers(1, 4), n_pairs=st.integers(1, 4), instances=st.integers(1, 2),
       sharing=st.sampled_from(["fluid", "exclusive", "parallel"]), n_queries=st.integers(1, 50),
       seed=st.integers(0, 2**31))
def test_step_examining_only_affected_executors_equals_the_full_pass(n_stages, n_pairs, instances, sharing,
                                                                     n_queries, seed):
    want = _run(FullPassPipeline, seed, n_stages, n_pairs, instances, sharing, n_queries)
    got = _run(Pipeline, seed, n_stages, n_pairs, instances, sharing, n_queries)
    assert got[1] == want[1], "executions started in another order"
    assert got[0] == want[0]


def _asked_always(name, params):
    """Policy ``name`` made with ``params`` as a subclass of its class, asked at every step and every boundary."""
    cls = type(make_policy(name, params))
    assert issubclass(cls, FrontDoorPolicy)
    wrapped = type("Always" + cls.__name__, (cls,), {
        "has_pending": lambda self: True,
        "decides_at_boundary": True,
    })
    return wrapped(**params)


def test_front_door_policies_are_not_asked_without_waiting_queries_and_nothing_changes():
    table = make_table(4, lambda s, b: 0.4 + 0.15 * b + 0.1 * s, batch_sizes=range(1, 17))
    rng = random.Random(4)
    arrivals = sorted(rng.uniform(0, 200) for _ in range(400))
    for name, params in [("zerobatch", {}), ("delaybatch", {"max_queue_delay_ms": 2.0}), ("dvabatch", {}),
                         ("lazybatch", {})]:
        runs, asked_empty = [], []
        for always in (False, True):
            kw = {"max_batch_size": 16, **params}
            policy = _asked_always(name, kw) if always else make_policy(name, kw)
            empty = [0]
            admit = policy.admit

            def counted_admit(now, admit=admit, policy=policy, empty=empty):
                empty[0] += not policy.pending
                return admit(now)

            policy.admit = counted_admit
            pipe = Pipeline(table, policy, 2)
            res = simulate(pipe, arrivals, [1] * len(arrivals), sharing="fluid")
            assert res.stuck is None
            runs.append(_records(res))
            asked_empty.append(empty[0])
        assert runs[0] == runs[1], name
        assert asked_empty[0] == 0 < asked_empty[1], (name, asked_empty)


def test_the_device_arms_a_timer_only_when_the_next_finish_moves():
    env = simpy.Environment()
    dev = Device(env, "parallel")
    done = []
    dev.start(10.0, 1.0, lambda: done.append(("a", env.now)))
    dev.settle()

    def later(_ev):  # a longer execution starting at 2: the next finish (a's, at 10) does not move
        dev.start(20.0, 1.0, lambda: done.append(("b", env.now)))
        dev.settle()

    env.timeout(2.0).callbacks.append(later)
    events = 0
    while True:
        try:
            env.step()
        except simpy.core.EmptySchedule:
            break
        events += 1
    assert done == [("a", 10.0), ("b", 22.0)]
    assert events == 3  # b's start, a's timer, b's timer: no superseded timer, no event between finish and handler


def test_one_event_per_stage_execution_and_per_arrival():
    """Queries far apart, one at a time through 4 stages on the GPU alone: the run's SimPy events are one per
    arrival, one per stage execution (the device's timer, which calls the executor's handler) and one start-up
    per executor."""
    table = make_table(4, lambda s, b: 1.0 + 0.1 * b, batch_sizes=range(1, 9))
    n = 50
    pipe = Pipeline(table, make_policy("zerobatch", {"max_batch_size": 8}), 2)
    counted = [0]
    step = simpy.Environment.step

    def counting_step(env):
        counted[0] += 1
        return step(env)

    simpy.Environment.step = counting_step
    try:
        res = simulate(pipe, [100.0 * k for k in range(n)], [1] * n)
    finally:
        simpy.Environment.step = step
    assert res.stuck is None and all(q.done for q in res.queries)
    # the last call finds the schedule empty (it raises EmptySchedule after being counted)
    assert counted[0] - 1 == n + 4 * n + 4
