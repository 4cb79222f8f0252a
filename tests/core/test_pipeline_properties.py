"""Property tests of the mechanism under random arrivals and random meta-operation sequences.

A *chaos* policy makes random new / stretch / split decisions (every one the batch table allows): splits in the
serial and the pipelined manner, stretches that mark the batch splittable, and *new* at a stage boundary. An independent
monitor watches every stage execution and checks, at the level of buffers and of buffer rows:

* no execution reads or writes a buffer that another running execution is writing (or writes one being read);
* no execution overwrites buffer rows whose data has not been read yet;
* every execution reads exactly the rows its predecessor wrote for the same queries;
* every query passes every stage exactly once, in order, and exits exactly once; no batch exceeds its maximum;
* the run never deadlocks, with 1 to 4 buffer pairs and 1 to 4 stages, under every device-sharing mode.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dvasim.core.pipeline import Pipeline
from dvasim.engines.sim.engine import simulate
from dvasim.policies.base import New, Policy, Split, Stretch
from tests.conftest import make_table, random_cost_table


class ChaosPolicy(Policy):
    name = "chaos"

    def __init__(self, seed: int, max_batch_size: int, p_wait=0.3, p_split=0.5, p_stretch=0.5, p_renew=0.2):
        super().__init__()
        self.rng = random.Random(seed)
        self.max_batch_size = max_batch_size
        self.p_wait, self.p_split, self.p_stretch, self.p_renew = p_wait, p_split, p_stretch, p_renew
        self._wake = math.inf

    def _room(self):
        t = self.view.table
        latest = t.latest()
        if latest is None or t.can_stretch(latest.bid):
            return None, 0
        return latest, self.max_batch_size - latest.bs

    def admit(self, now):
        ops = []
        self._wake = math.inf
        while self.pending:
            if self.rng.random() < self.p_wait:
                self._wake = now + self.rng.choice([0.1, 0.5, 1.0])
                break
            latest, room = self._room()
            if latest is not None and room > 0 and not ops and self.rng.random() < self.p_stretch:
                ops.append(Stretch(latest.bid, self.take(self.rng.randint(1, room)),
                                   splittable=self.rng.random() < 0.3))
                continue
            n = self.rng.randint(1, min(len(self.pending), self.max_batch_size))
            ops.append(New(self.take(n), splittable=self.rng.random() < 0.5))
            break  # later ops see the table only after these are applied
        if self.pending and self._wake == math.inf:
            self._wake = now + 0.05
        return ops

    def next_wakeup(self, now):
        return self._wake

    def at_boundary(self, batch, stage, now):
        if (self.view.table.can_split(batch.bid, stage) is None and batch.bs >= 2
                and self.rng.random() < self.p_split):
            cuts = sorted(self.rng.sample(range(1, batch.bs), self.rng.randint(1, min(3, batch.bs - 1))))
            sizes = [b - a for a, b in zip([0, *cuts], [*cuts, batch.bs])]
            return Split(batch.bid, sizes, self.rng.choice(["serial", "pipelined"]))
        if self.view.table.can_renew(batch.bid, stage) is None and self.rng.random() < self.p_renew:
            return New(batch.queries, splittable=self.rng.random() < 0.3)
        latest, room = self._room()
        if latest is batch and room > 0 and self.pending and self.rng.random() < self.p_stretch:
            return Stretch(batch.bid, self.take(self.rng.randint(1, min(room, len(self.pending)))))
        return None


class Monitor:
    def __init__(self, pipeline: Pipeline, max_batch_size: int):
        self.n = pipeline.n_stages
        self.max = max_batch_size
        self.running = []
        self.unread = {}  # (boundary, slot, row) -> qid written and not yet read
        self.passes = {}  # (qid, stage) -> count
        self.exits = {}
        self.errors = []
        pipeline.on_begin.append(self.begin)
        pipeline.on_finish.append(self.finish)

    def begin(self, ex):
        s, j = ex.stage, (ex.lane, ex.slot)  # buffers belong to one instance (lane)
        if ex.batch_size > self.max or ex.batch.bs > self.max:
            self.errors.append(f"batch {ex.batch.bid} of size {ex.batch.bs} exceeds {self.max}")
        for other in self.running:
            oj = (other.lane, other.slot)
            o_in, o_out = (other.stage, oj), (other.stage + 1, oj)
            mine_in, mine_out = (s, j), (s + 1, j)
            if mine_in == o_out or mine_out in (o_in, o_out):
                self.errors.append(f"stage {s} pair {j} overlaps a running execution of stage {other.stage}")
        for row, q in zip(ex.rows, ex.queries):
            if s > 0:
                if self.unread.get((s, j, row)) != q.qid:
                    self.errors.append(f"stage {s} reads row {row} of pair {j} expecting query {q.qid}, "
                                       f"found {self.unread.get((s, j, row))}")
                self.unread.pop((s, j, row), None)
            if s + 1 < self.n and (s + 1, j, row) in self.unread:
                self.errors.append(f"stage {s} overwrites unread row {row} of pair {j}")
            self.passes[(q.qid, s)] = self.passes.get((q.qid, s), 0) + 1
        self.running.append(ex)

    def finish(self, ex):
        self.running.remove(ex)
        for row, q in zip(ex.rows, ex.queries):
            if ex.stage + 1 < self.n:
                self.unread[(ex.stage + 1, (ex.lane, ex.slot), row)] = q.qid
            else:
                self.exits[q.qid] = self.exits.get(q.qid, 0) + 1


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_stages=st.integers(1, 4),
    n_pairs=st.integers(1, 4),
    max_bs=st.integers(1, 8),
    n_queries=st.integers(1, 60),
    seed=st.integers(0, 2**31),
    sharing=st.sampled_from(["fluid", "exclusive", "parallel"]),
    instances=st.integers(1, 2),
)
def test_random_meta_operations_are_safe_and_live(n_stages, n_pairs, max_bs, n_queries, seed, sharing, instances):
    rng = random.Random(seed)
    table = random_cost_table(rng, n_stages)
    pipe = Pipeline(table, ChaosPolicy(seed, max_bs), n_pairs, instances=instances)
    mon = Monitor(pipe, max_bs)
    run_random_load(pipe, mon, rng, n_queries, sharing)


def run_random_load(pipe, mon, rng, n_queries, sharing, cap=None, **simulate_kw):
    """``n_queries`` random arrivals (most spread over 20 ms, the rest in bursts at 0, 5 and 10 ms, drawn from
    ``rng``) through ``pipe``, watched by ``mon``; asserts what holds for every policy: nothing stuck, no
    mechanism error, every query exits once and passes every stage once, in stage order, within the batch limit
    ``cap``, and nothing is left behind. Returns the simulation's result."""
    n_stages = pipe.n_stages
    arrivals = sorted(rng.uniform(0, 20) if rng.random() < 0.8 else rng.choice([0.0, 5.0, 10.0])
                      for _ in range(n_queries))
    res = simulate(pipe, arrivals, [1] * n_queries, sharing=sharing, **simulate_kw)
    assert res.stuck is None, res.stuck
    assert mon.errors == [], mon.errors[:5]
    assert sorted(mon.exits) == list(range(n_queries)) and set(mon.exits.values()) == {1}
    assert all(mon.passes[(q, s)] == 1 for q in range(n_queries) for s in range(n_stages))
    for q in res.queries:
        assert q.done and q.finish >= q.arrival and (cap is None or q.exit_batch_size <= cap)
        times = [t for s in range(n_stages) for t in (q.stage_start[s], q.stage_finish[s])]
        assert times == sorted(times), f"query {q.qid} went through stages out of order"
    assert len(pipe.table) == 0 and not any(pipe.queues)
    return res


@settings(max_examples=60, deadline=None)
@given(n_stages=st.integers(2, 4), seed=st.integers(0, 2**31), n_queries=st.integers(2, 40))
def test_one_buffer_pair_is_serial(n_stages, seed, n_queries):
    """With one buffer pair no two stage executions ever overlap, whatever the policy does (stretch and its
    catch-up included: §6.2's serial manner)."""
    rng = random.Random(seed)
    table = make_table(n_stages, lambda s, b: 0.5 + 0.1 * b + s * 0.2, batch_sizes=range(1, 9))
    pipe = Pipeline(table, ChaosPolicy(seed, 8), 1)
    spans = []
    pipe.on_finish.append(lambda ex: spans.append((ex.start, ex.end)))
    arrivals = sorted(rng.uniform(0, 10) for _ in range(n_queries))
    res = simulate(pipe, arrivals, [1] * n_queries, sharing="parallel")
    assert res.stuck is None
    spans.sort()
    for (_, a1), (b0, _) in zip(spans, spans[1:]):
        assert b0 >= a1 - 1e-9, "two stages ran at once with a single buffer pair"


def test_two_buffer_pairs_overlap_stages():
    """With two buffer pairs, stage executions of different batches do overlap (the parallel manner), and a
    loaded pipeline finishes sooner than with one pair."""
    table = make_table(4, lambda s, b: 1.0, batch_sizes=range(1, 9))
    ends = {}
    for pairs in (1, 2):
        pipe = Pipeline(table, ChaosPolicy(5, 1, p_wait=0.0, p_split=0.0, p_stretch=0.0), pairs)
        spans = []
        pipe.on_finish.append(lambda ex, spans=spans: spans.append((ex.start, ex.end)))
        res = simulate(pipe, [0.0] * 20, [1] * 20, sharing="parallel")
        assert res.stuck is None
        spans.sort()
        overlaps = sum(b0 < a1 - 1e-9 for (_, a1), (b0, _) in zip(spans, spans[1:]))
        ends[pairs] = res.sim_end_ms
        assert (overlaps > 0) == (pairs > 1)
    assert ends[1] == pytest.approx(80.0) and ends[2] < ends[1]
