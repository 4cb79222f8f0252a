"""The garbage collector during a run (issue 25): the youngest generation's collections are spaced out while the
events run (:mod:`dvasim.engines.sim.collector`), and put back as they were after; that is safe because a run
drops no reference cycles while its events run (each would be garbage left for a collector that runs rarely).
"""

from __future__ import annotations

import gc
import threading

import pytest

import dvasim
from dvasim.engines.sim.collector import YOUNG_THRESHOLD, spaced_collections
from dvasim.errors import IncompleteRunWarning

BERT = {"name": "bert_base", "device": "titanrtx", "stages": 4}


def _cfg(policy: dict, n: int, rate: float = 300.0, model: dict | None = None) -> dict:
    return {"model": model or BERT, "policy": policy,
            "workload": {"kind": "poisson", "rate_qps": rate, "n_queries": n, "seed": 3, "seq_len_dist": "glue:RTE"},
            "qos": {"target_ms": 200.0}, "engine": {"progress": False}}


class Looks:
    """A stop request that never fires and notes the collector's thresholds each time it is asked."""

    def __init__(self):
        self.seen: list[tuple[int, ...]] = []

    def __call__(self):
        self.seen.append(gc.get_threshold())
        return None


@pytest.fixture
def default_thresholds():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def test_a_run_spaces_the_young_collections_and_puts_the_thresholds_back(default_thresholds):
    looks = Looks()
    res = dvasim.run(_cfg({"name": "zerobatch"}, 3000), stop=looks)
    assert res.summary["n_completed"] == 3000
    assert len(looks.seen) >= 2  # asked before the first event and then every STOP_EVERY events
    assert set(looks.seen) == {(YOUNG_THRESHOLD, 10, 10)}
    assert gc.get_threshold() == (700, 10, 10)


def test_a_run_that_fails_puts_the_thresholds_back_too(default_thresholds):
    def fail():
        assert gc.get_threshold()[0] == YOUNG_THRESHOLD
        raise RuntimeError("a failing stop request")

    with pytest.warns(IncompleteRunWarning, match="failing stop request"):
        res = dvasim.run(_cfg({"name": "zerobatch"}, 200), stop=fail)
    assert res.stuck and gc.get_threshold() == (700, 10, 10)


def test_a_collector_switched_off_or_set_higher_is_left_alone(default_thresholds):
    looks = Looks()
    gc.disable()
    try:
        dvasim.run(_cfg({"name": "zerobatch"}, 500), stop=looks)
    finally:
        gc.enable()
    assert set(looks.seen) == {(700, 10, 10)}
    gc.set_threshold(2 * YOUNG_THRESHOLD, 5, 5)
    looks = Looks()
    dvasim.run(_cfg({"name": "zerobatch"}, 500), stop=looks)
    assert set(looks.seen) == {(2 * YOUNG_THRESHOLD, 5, 5)}
    assert gc.get_threshold() == (2 * YOUNG_THRESHOLD, 5, 5)


def test_overlapping_runs_in_threads_put_back_what_the_first_found(default_thresholds):
    inside, release = threading.Barrier(2), threading.Event()

    def hold():
        with spaced_collections():
            inside.wait()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    with spaced_collections():
        inside.wait()
        with spaced_collections():  # nested in the same thread as well
            assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)  # the thread's run is still inside
    release.set()
    t.join()
    assert gc.get_threshold() == (700, 10, 10)


class Collect:
    """A stop request that never fires and, each time it is asked (before the first event, then every STOP_EVERY
    events), collects the cyclic garbage made since it was last asked: objects in reference cycles no longer
    reachable from the run. What the run's set-up left (before the first event) is collected but not counted."""

    def __init__(self):
        self.found, self.looks = 0, 0

    def __call__(self):
        found = gc.collect()
        self.found += found if self.looks else 0
        self.looks += 1
        return None


def _cyclic_garbage(cfg: dict) -> Collect:
    """The objects in reference cycles that a run made and dropped while its events ran (``found``)."""
    collect = Collect()
    gc.collect()
    gc.disable()
    try:
        dvasim.run(cfg, stop=collect)
    finally:
        gc.enable()
    return collect


SLOW = pytest.mark.slow  # (each 5-7 s in the full suite, where every collection walks a large heap: make test-slow)


@pytest.mark.parametrize("policy,model", [
    ({"name": "zerobatch"}, None),
    pytest.param({"name": "delaybatch", "max_queue_delay_ms": 10.0}, None, marks=SLOW),
    ({"name": "dvabatch"}, None),  # Policy I: the input clusters
    ({"name": "dvabatch"}, {"table": "traces/default/vgg16_titanx_4stages.csv"}),  # Policies II and III
    pytest.param({"name": "lazybatch"}, None, marks=SLOW),
    pytest.param({"name": "n-ebird"}, None, marks=SLOW),
    ({"name": "triton", "max_queue_size": 4}, None),  # queries refused by the queue policy
])
def test_a_run_drops_no_reference_cycles(policy, model):
    """What a run drops is freed by reference counting alone: no cyclic garbage while 2,000 queries run (a cycle
    per query or per batch would leave hundreds of objects; the run's own structure is still in use)."""
    collect = _cyclic_garbage(_cfg(policy, 2000, model=model))
    assert collect.looks > 3 and collect.found == 0
