"""Triton r24.10's batcher rules on the real server (tritonserver 2.51.0), each against dvasim's release "24.10"
(dvasim/policies/triton_release.py; experiments/validation/triton/release_24.10.md) on a timeline built so that
the answer does not depend on this machine's speed: 100 ms executions, requests 10 ms apart. For each rule the
batches the real server formed (which requests went together, in which order) are the simulator's, and the
hand-derived ones the docstring gives.

* growing payloads with the prefetch (no queue policy: core scheduler_utils.cc:361-376): while the instance runs
  the first request, the payload formed for the second keeps absorbing arrivals until the instance takes it
  (dynamic_batch_scheduler.cc:42-48): one batch of the next five (r21.10 froze it at one);
* the instance is free only after its answers (python_backend python_be.cc:1338-1345, 1514-1517): no batch starts
  on an instance before the model's execute() returned the previous one;
* preferred sizes: a batch leaves as soon as a preferred size can be formed, before the queue delay
  (dynamic_batch_scheduler.cc:596-603);
* the delay: with no preferred size reached, the requests wait for the oldest one's delay (:619-621) and leave
  together;
* the merge at dequeue under a delay with a preferred size (instance_queue.cc:57-104: a payload at a preferred size
  is merged, its IsSaturated() flag being the payload's own, payload.cc:158-162), with the arrival wake-up gate
  (dynamic_batch_scheduler.cc:263-286): the batches are those of "24.10" and none of the other releases'
  ("current" and "21.10" model the TensorRT backend, whose instance is free when the inputs are consumed: they
  give [0], [1], [2, 3], [4, 5] for the first case; "ideal" [0], [1, 2, 3, 4, 5]).
"""

import pytest

from dvasim.engines.triton.engine import serve
from tests.engines.triton.conftest import table_csv


def batches_of(frame):
    """The batches in start order, each as the sorted query ids it carried."""
    ok = frame[frame["status"] == "ok"]
    groups = ok.groupby("batch_id")
    order = groups["start_ms"].first().sort_values(kind="stable").index
    return [sorted(int(q) for q in groups.get_group(b)["qid"]) for b in order]


def sim_batches(cfg):
    import dvasim

    r = dvasim.run(cfg, stack="triton-python-cpu")
    d = r.queries.rename(columns={"query_id": "qid"})
    return batches_of(d)


def case(tmp_path, pbtxt, arrivals):
    p = tmp_path / "config.pbtxt"
    p.write_text(pbtxt)
    return {"model": {"table": table_csv(tmp_path / "t.csv", lambda b: 100.0)}, "policy": {"triton_config": str(p)},
            "workload": {"kind": "explicit", "arrivals_ms": arrivals}, "qos": {"target_ms": 2000.0}}


RULES = {
    "growing payload": ("max_batch_size: 8\ndynamic_batching { }\n", [0, 10, 20, 30, 40, 50],
                        [[0], [1, 2, 3, 4, 5]]),
    "preferred size before the delay": (
        "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 300000 }\n",
        [0, 10, 20, 400, 410], [[0, 1, 2], [3, 4]]),
    "the delay": ("max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 150000 }\n",
                  [0, 5, 10, 15, 20, 400], [[0, 1, 2, 3, 4], [5]]),
    "merge at dequeue": (
        "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 1000 }\n",
        [0, 10, 20, 30, 40, 50], [[0], [1, 2, 3, 4], [5]]),
    "merge at dequeue within max_batch_size": (
        "max_batch_size: 3\ndynamic_batching { preferred_batch_size: [ 2 ] max_queue_delay_microseconds: 1000 }\n",
        [0, 10, 20, 30, 40, 50, 60], [[0], [1, 2, 3], [4, 5, 6]]),
}


# three of the five run under make test-slow (each case is a server start and stop, ~6 s): the default suite keeps
# the delay and the merge at dequeue
SLOW_RULES = ("growing payload", "preferred size before the delay", "merge at dequeue within max_batch_size")


@pytest.mark.parametrize("rule", [pytest.param(r, marks=pytest.mark.slow) if r in SLOW_RULES else r for r in RULES])
def test_rule_on_the_real_server_is_the_simulators(tmp_path, triton_env, rule):
    pbtxt, arrivals, want = RULES[rule]
    cfg = case(tmp_path, pbtxt, arrivals)
    real = serve(cfg, work_dir=tmp_path / "run", env=triton_env)
    assert batches_of(real.queries) == want
    assert sim_batches(cfg) == want
    # the instance takes a batch only after the model answered the one before
    q = real.queries.sort_values("start_ms")
    starts = q.groupby("batch_id")["start_ms"].first().sort_values()
    ends = q.groupby("batch_id")["exec_end_ms"].first().reindex(starts.index)
    assert (starts.to_numpy()[1:] >= ends.to_numpy()[:-1]).all()
