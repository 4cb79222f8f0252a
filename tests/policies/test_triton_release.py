"""Triton's instance pipeline by release (dvasim.policies.triton_release), on hand-worked timelines.

One instance, one stage of 10 ms at any batch size up to 8, the exclusive device, so a batch runs alone on the GPU
and every timestamp is worked by hand below. The rules and their source lines:

* prefetch: the batcher forms a payload while fewer than 2 x instances wait (server r21.10
  ``src/core/rate_limiter.cc:116-127``);
* r21.10 freezes a queued payload (``IsStaleState`` counts SCHEDULED, ``src/core/dynamic_batch_scheduler.cc:42-49``);
  current releases let it grow until an instance takes it (c9c7c0a94, core ``src/dynamic_batch_scheduler.cc:42-48``);
* merge at dequeue of payloads older than the delay, only with a delay > 0 (``src/core/instance_queue.cc:66-89``);
* TensorRT frees the instance when its batch's inputs are consumed (tensorrt_backend r21.10 ``src/tensorrt.cc:
  1596-1597, 2491-2492``): the next payload waits on the instance's stream; ``eager_batching`` allows more
  (``:2915-2932``; main ``src/instance_state.h:45-48``).
"""

from __future__ import annotations

import numpy as np
import pytest

import dvasim
from dvasim.core.pipeline import Pipeline
from dvasim.engines.sim.engine import simulate
from dvasim.errors import ConfigError
from dvasim.policies import make_policy
from dvasim.policies.triton_release import release_rules
from tests.conftest import make_table

BURST = [0.0, 1.0, 2.0, 3.0, 4.0]  # one query on an idle instance, then four while it is busy


def run(name, release, arrivals=BURST, eager=False, **params):
    table = make_table(1, lambda s, b: 10.0, batch_sizes=range(1, 9))
    policy = make_policy(name, {"max_batch_size": 8, **params})
    pipe = Pipeline(table, policy, 1, triton_release=release, eager_batching=eager)
    res = simulate(pipe, np.array(arrivals), np.ones(len(arrivals), dtype=int), sharing="exclusive")
    assert res.stuck is None
    qs = sorted(res.queries, key=lambda q: q.qid)
    return [q.finish for q in qs], [q.exit_batch_size for q in qs]


def mean_latency(finish, arrivals=BURST):
    return float(np.mean(np.array(finish) - np.array(arrivals)))


def test_ideal_batcher_batches_what_queued_while_busy():
    # no prefetch: at 10 the four waiting queries leave as one batch
    assert run("zerobatch", "ideal") == ([10.0, 20.0, 20.0, 20.0, 20.0], [1, 4, 4, 4, 4])


def test_r2110_payloads_are_formed_ahead_and_frozen():
    """q0 runs 0-10. q1 (t=1) is a payload the instance takes at once (q0's inputs are consumed), so it waits on the
    stream; q2 (2) and q3 (3) fill the two prefetch slots as payloads of one, frozen; q4 (4) finds no slot. At 10 q1
    starts and the instance takes q2's payload, q4's is formed; and so on: every batch is a single query."""
    finish, sizes = run("zerobatch", "21.10")
    assert finish == [10.0, 20.0, 30.0, 40.0, 50.0]
    assert sizes == [1, 1, 1, 1, 1]


def test_current_release_grows_the_queued_payload():
    """As r21.10 up to q2's payload (t=2); it is still queued, so q3 and q4 join it (#3789). At 10 q1 starts and
    the instance takes the payload of three, which runs 20-30."""
    finish, sizes = run("zerobatch", "current")
    assert finish == [10.0, 20.0, 30.0, 30.0, 30.0]
    assert sizes == [1, 1, 3, 3, 3]


def test_instance_freed_at_inputs_consumed_freezes_the_next_batch():
    """What sets the current release apart from the ideal batcher is the release at inputs-consumed: q1's payload
    is taken at t=1, when q0 has started, so q1 runs alone at 10 although q2-q4 arrived before it started; freed at
    q0's exit instead (ideal) q1 would have left with them."""
    _, current = run("zerobatch", "current")
    _, ideal = run("zerobatch", "ideal")
    assert current[1] == 1 and ideal[1] == 4


def test_eager_batching_issues_more_batches_per_instance():
    """With eager batching the current TensorRT backend lets three batches wait for their inputs to be consumed:
    q1, q2 and q3 are each taken alone at once (the queue never holds a growing payload), q4 when q1 starts."""
    finish, sizes = run("zerobatch", "current", eager=True)
    assert sizes == [1, 1, 1, 1, 1]
    assert finish == [10.0, 20.0, 30.0, 40.0, 50.0]


def test_merge_at_dequeue_needs_a_delay():
    """DelayBatch with a 0.5 ms window under r21.10: q0 leaves at 0.5 (10.5 done); q1's payload (formed 1.5) is
    taken at once onto the stream; q2 (2.5) and q3 (3.5) are frozen payloads; q4 finds no slot. At 10.5 q1 starts
    and the instance dequeues q2's payload and merges q3's, which has waited more than the delay
    (instance_queue.cc:66-89): {q2, q3} runs 20.5-30.5, q4 (formed at 10.5) 30.5-40.5."""
    finish, sizes = run("delaybatch", "21.10", max_queue_delay_ms=0.5)
    assert finish == [10.5, 20.5, 30.5, 30.5, 40.5]
    assert sizes == [1, 1, 2, 2, 1]


def test_a_window_beats_zerobatch_under_r2110_and_not_under_the_ideal_batcher():
    """The known answer: on this burst ZeroBatch's mean is 16.0 ms (ideal) and 28.0 ms (r21.10), DelayBatch's with a
    0.5 ms window 16.5 ms and 24.5 ms (the timelines above): the window loses on the ideal batcher and wins on the
    paper's release, whose ZeroBatch freezes payloads of one (§8.2: "DelayBatch shows lower average latency at high
    load compared with ZeroBatch")."""
    zb_ideal = mean_latency(run("zerobatch", "ideal")[0])
    db_ideal = mean_latency(run("delaybatch", "ideal", max_queue_delay_ms=0.5)[0])
    zb_2110 = mean_latency(run("zerobatch", "21.10")[0])
    db_2110 = mean_latency(run("delaybatch", "21.10", max_queue_delay_ms=0.5)[0])
    assert (zb_ideal, db_ideal, zb_2110, db_2110) == pytest.approx((16.0, 16.5, 28.0, 24.5))
    assert db_ideal > zb_ideal and db_2110 < zb_2110


def test_triton_whole_batcher_runs_the_release_too():
    # Triton's whole batcher (policy "triton") forms the same payloads under r21.10 on this burst
    assert run("triton", "21.10") == run("zerobatch", "21.10")


def test_every_query_is_served_under_every_release_at_load():
    rng = np.random.default_rng(4)
    arrivals = np.cumsum(rng.exponential(2.0, 2000))
    table = make_table(2, lambda s, b: 3.0 + 0.4 * b, batch_sizes=range(1, 17))
    for release in ("ideal", "21.10", "current"):
        for eager in (False, True):
            for params in ({}, {"max_queue_delay_ms": 2.0}):
                pol = make_policy("delaybatch" if params else "zerobatch", {"max_batch_size": 16, **params})
                pipe = Pipeline(table, pol, 2, instances=2, triton_release=release, eager_batching=eager)
                res = simulate(pipe, arrivals, np.ones(len(arrivals), dtype=int), sharing="fluid")
                assert res.stuck is None
                assert all(np.isfinite(q.finish) for q in res.queries) and len(res.queries) == 2000


def test_release_rules_name_their_code():
    assert release_rules("21.10").frozen and release_rules("21.10").tokens == 1
    assert release_rules("21.10", eager_batching=True).tokens == 2
    assert not release_rules("current").frozen and release_rules("current", eager_batching=True).tokens == 3
    assert release_rules("ideal").ideal
    with pytest.raises(ConfigError, match="triton_release"):
        release_rules("20.01")


def _cfg(**server):
    return {"model": {"name": "resnet152", "device": "titanrtx", "stages": 4}, "policy": {"name": "zerobatch"},
            "workload": {"kind": "poisson", "rate_qps": 200.0, "n_queries": 300, "seed": 2}, "server": server}


def test_titan_rtx_runs_the_papers_release_and_the_run_names_it():
    s = dvasim.run({**_cfg(), "server": {}}).summary
    assert s["stack"] == "triton-tensorrt-21.10" and s["triton_release"] == "21.10"
    s = dvasim.run(_cfg(stack="triton-tensorrt")).summary
    assert s["stack"] == "triton-tensorrt" and s["triton_release"] == "current"
    s = dvasim.run(_cfg(stack="gpu-only")).summary
    assert s["stack"] == "gpu-only" and s["triton_release"] == "ideal"
    s = dvasim.run(_cfg(stack="gpu-only", triton_release="21.10")).summary
    assert s["stack"] == "gpu-only (triton 21.10)" and s["triton_release"] == "21.10"


def test_a_bad_release_is_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"server.triton_release"):
        dvasim.run(_cfg(triton_release="20.01"))
