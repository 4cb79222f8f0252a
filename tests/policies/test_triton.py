"""Triton dynamic-batcher semantics of ZeroBatch and DelayBatch, on explicit arrivals with hand-computed outcomes."""

import numpy as np
import pytest

from dvasim.core.pipeline import Pipeline
from dvasim.engines.sim.engine import simulate
from dvasim.errors import ConfigError
from dvasim.policies import make_policy, policy_names
from tests.conftest import make_table


def run(policy, arrivals, table=None, n_pairs=1, instances=1):
    table = table or make_table(1, lambda s, b: 10.0, batch_sizes=range(1, 9))
    pipe = Pipeline(table, policy, n_pairs, instances=instances)
    res = simulate(pipe, arrivals, np.ones(len(arrivals), dtype=int), sharing="exclusive")
    assert res.stuck is None
    return res.queries


def test_registry_lists_baselines():
    assert {"zerobatch", "delaybatch"} <= set(policy_names())


def test_zerobatch_batches_what_queued_while_busy():
    # one instance; queries at 0, 1, 2, 3: the first runs alone 0-10, the three others leave together at 10
    qs = run(make_policy("zerobatch", {"max_batch_size": 8}), [0.0, 1.0, 2.0, 3.0])
    assert [q.admitted for q in qs] == [0.0, 10.0, 10.0, 10.0]
    assert [q.exit_batch_size for q in qs] == [1, 3, 3, 3]
    assert [q.finish for q in qs] == [10.0, 20.0, 20.0, 20.0]


def test_zerobatch_respects_max_batch_size():
    qs = run(make_policy("zerobatch", {"max_batch_size": 2}), [0.0, 1.0, 2.0, 3.0, 4.0])
    assert [q.exit_batch_size for q in qs] == [1, 2, 2, 2, 2]
    assert [q.finish for q in qs] == [10.0, 20.0, 20.0, 30.0, 30.0]


def test_delaybatch_waits_for_window_then_sends_all():
    qs = run(make_policy("delaybatch", {"max_batch_size": 8, "max_queue_delay_ms": 5.0}), [0.0, 2.0, 4.0, 6.0])
    # window of the oldest closes at 5: queries 0-2 leave; query 3 (at 6) waits until the instance frees at 15
    assert [q.admitted for q in qs] == [5.0, 5.0, 5.0, 15.0]
    assert [q.finish for q in qs] == [15.0, 15.0, 15.0, 25.0]


def test_delaybatch_leaves_at_once_when_max_reached():
    qs = run(make_policy("delaybatch", {"max_batch_size": 3, "max_queue_delay_ms": 50.0}), [0.0, 1.0, 2.0])
    assert [q.admitted for q in qs] == [2.0, 2.0, 2.0]


def test_preferred_batch_size_leaves_at_once():
    p = make_policy("delaybatch", {"max_batch_size": 8, "preferred_batch_size": [2, 4], "max_queue_delay_ms": 50.0})
    qs = run(p, [0.0, 1.0, 2.0, 3.0, 4.0])
    # at 1 a batch of 2 (preferred) leaves; 2, 3, 4 queue while busy; at 11 the largest preferred size that fits
    # (2) leaves; the last waits for its window (4 + 50) but the instance frees at 21 -> still waits until 54
    assert [q.admitted for q in qs] == [1.0, 1.0, 11.0, 11.0, 54.0]


def test_instances_allow_concurrent_batches():
    table = make_table(2, lambda s, b: 5.0, batch_sizes=range(1, 9))
    qs = run(make_policy("zerobatch", {"max_batch_size": 8}), [0.0, 1.0], table=table, n_pairs=2, instances=2)
    assert [q.admitted for q in qs] == [0.0, 1.0]
    # exclusive device, FIFO by launch: A.s0 [0,5], B.s0 [5,10], A.s1 [10,15], B.s1 [15,20]
    assert [q.finish for q in qs] == [15.0, 20.0]
    qs = run(make_policy("zerobatch", {"max_batch_size": 8}), [0.0, 1.0], table=table, n_pairs=2)
    assert [q.admitted for q in qs] == [0.0, 10.0]


@pytest.mark.parametrize(
    "name,params,field",
    [
        ("nope", {}, "policy.name"),
        ("zerobatch", {"max_batch_size": 0}, "policy.max_batch_size"),
        ("zerobatch", {"max_queue_delay_ms": 5}, "policy.max_queue_delay_ms"),
        ("delaybatch", {"max_queue_delay_ms": -1}, "policy.max_queue_delay_ms"),
        ("delaybatch", {"window": 3}, "policy.window"),
        ("delaybatch", {"max_batch_size": 4, "preferred_batch_size": [8]}, "policy.preferred_batch_size"),
    ],
)
def test_bad_policy_params_name_the_field(name, params, field):
    with pytest.raises(ConfigError) as e:
        make_policy(name, params)
    assert e.value.field == field


def test_max_batch_size_beyond_table_is_refused():
    table = make_table(1, lambda s, b: 1.0, batch_sizes=range(1, 9))
    with pytest.raises(ConfigError, match="largest profiled batch size 8"):
        Pipeline(table, make_policy("zerobatch", {"max_batch_size": 16}), 1)
