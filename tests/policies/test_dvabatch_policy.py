"""DVABatch's policy layer (paper §7): identifying the diversities, Policy I's window, Policy II at every batch
size, the serial split manner holding its buffer pair, and *new* at a stage boundary."""

from __future__ import annotations

import numpy as np
import pytest

import dvasim
from dvasim.core.pipeline import Pipeline, PolicyError
from dvasim.core.query import Query
from dvasim.engines.sim.engine import simulate
from dvasim.errors import ConfigError
from dvasim.policies import make_policy
from dvasim.policies.base import New, Policy, Stretch
from dvasim.policies.dvabatch import padding_waste
from tests.conftest import make_table

LENS = (16, 32, 64, 128)


def token_table(n_stages=2):
    # time grows with the padded length and (beyond batch 4) with the batch size: every stage prefers batch 4
    return make_table(n_stages, lambda s, b, L: (1.0 + L / 32) * max(1.0, b / 4), batch_sizes=range(1, 17),
                      seq_lens=LENS)


def bind(policy, table, lengths=None, qos=None):
    return Pipeline(table, policy, 2, qos_target_ms=qos, input_lengths=lengths)


def test_padding_waste_matches_monte_carlo():
    """The order-statistics formula against drawing batches and padding them (an independent computation)."""
    table = token_table()
    rng = np.random.default_rng(3)
    lengths = rng.choice([16, 16, 16, 32, 32, 64, 128], size=400)
    b = 8
    draws = rng.choice(lengths, size=(40_000, b))
    own = np.mean([table.total(b, int(x)) for x in lengths])
    padded = np.mean([table.total(b, int(m)) for m in draws.max(axis=1)])
    assert padding_waste(table, lengths, b) == pytest.approx(1 - own / padded, abs=0.005)
    assert padding_waste(table, [64] * 50, b) == pytest.approx(0.0)


@pytest.mark.parametrize("lengths, expected", [
    ([64] * 100, ["load"]),  # one length: nothing is padded, no input diversity
    ([60, 62, 64] * 30, ["load"]),  # similar lengths: padding wastes under 10% (interpolated table)
    ([16] * 80 + [128] * 20, ["input"]),  # short and long: padding wastes most of a batch
    (None, ["input"]),  # lengths unknown: a table with lengths means input diversity
])
def test_input_diversity_is_judged_from_the_length_distribution(lengths, expected):
    pol = make_policy("dvabatch", {"max_batch_size": 16})
    bind(pol, token_table(), lengths)
    assert list(pol.policies) == expected
    if lengths is not None:
        assert (pol.padding_waste >= 0.1) == ("input" in expected)


def test_operator_diversity_means_preferred_batch_sizes_differ():
    """Stage 0 saturates at batch 8, stage 1 at batch 1 (then at batch 2 with the threshold's tolerance):
    preferred sizes differ at least 2x -> operator. Two stages both saturating at 8 -> no operator."""
    diverse = make_table(2, lambda s, b: max(1.0, b / 8) if s == 0 else 0.25 * b, batch_sizes=range(1, 17))
    pol = make_policy("dvabatch", {"max_batch_size": 16})
    bind(pol, diverse)
    assert pol.preferred == [8, 1] and list(pol.policies) == ["operator", "load"]
    same = make_table(2, lambda s, b: max(1.0, b / 8), batch_sizes=range(1, 17))
    pol = make_policy("dvabatch", {"max_batch_size": 16})
    bind(pol, same)
    assert pol.preferred == [8, 8] and list(pol.policies) == ["load"]


def test_split_test_runs_at_every_batch_size():
    """A batch of 2 (not bs_max = 4) on Case II's table passes the split test (3 x T/2 >= 2 x 3 x T/4): it is
    created splittable and split after stage 0 into two batches of 1, run serially: exits 1.75T and 2.5T."""
    cfg = {"model": {"table": "experiments/worked_examples/case2_operator.csv"},
           "policy": {"name": "dvabatch", "max_batch_size": 4},
           "workload": {"kind": "explicit", "arrivals_ms": [0.0, 0.0]}}
    r = dvasim.run(cfg)
    assert r.summary["n_split"] == 1
    assert sorted(r.queries["finish_ms"]) == pytest.approx([1.75, 2.5])


def test_policy_one_window_from_pending_lengths_capped_by_qos():
    table = token_table()
    pol = make_policy("dvabatch", {"max_batch_size": 16})
    bind(pol, table, [16] * 10 + [128] * 10, qos=100.0)
    assert pol.use_input
    for qid, L in enumerate([16, 32]):
        pol.on_arrival(Query(qid, 0.0, L))
    assert pol.window() == pytest.approx(table.latency(0, 16, 32))  # the longest pending input, not the table's
    pol.on_arrival(Query(2, 0.0, 128))
    assert pol.window() == pytest.approx(table.latency(0, 16, 128))
    capped = make_policy("dvabatch", {"max_batch_size": 16})
    bind(capped, table, [16] * 10 + [128] * 10, qos=table.latency(0, 16, 64))
    capped.on_arrival(Query(0, 0.0, 128))
    assert capped.window() == pytest.approx(table.latency(0, 16, 64))  # never above the QoS target
    explicit = make_policy("dvabatch", {"max_batch_size": 16, "max_queue_delay_ms": 0.5})
    bind(explicit, table, [16] * 10 + [128] * 10, qos=100.0)
    explicit.on_arrival(Query(0, 0.0, 128))
    assert explicit.window() == 0.5


def test_serial_split_holds_the_parents_pair():
    """Case II's table with a fifth query arriving at 1.1T, while the four sub-batches hold pair 0: the new batch
    takes pair 1 at the first stage, and no execution on pair 0 belongs to it until the last sub-batch has left."""
    table = make_table(4, lambda s, b: 1.0 if s == 0 else 0.25 * b, batch_sizes=range(1, 5))
    pol = make_policy("dvabatch", {"max_batch_size": 4})
    pipe = Pipeline(table, pol, 2)
    seen = []
    pipe.on_begin.append(lambda ex: seen.append((ex.start, ex.stage, ex.slot, [q.qid for q in ex.queries])))
    res = simulate(pipe, [0.0] * 4 + [1.1], [1] * 5, sharing="fluid")
    assert res.stuck is None
    parent_slot = next(slot for t, s, slot, qs in seen if s == 0 and 0 in qs)
    last_exit = max(q.finish for q in res.queries[:4])
    q5 = [(t, s, slot) for t, s, slot, qs in seen if qs == [4]]
    assert q5[0][1:] == (0, 1 - parent_slot)
    assert all(slot != parent_slot or t >= last_exit for t, s, slot in q5)


def test_split_manner_is_checked():
    with pytest.raises(ConfigError, match="policy.split_manner"):
        make_policy("dvabatch", {"split_manner": "parallel"})


class RenewAfterFirstStage(Policy):
    """ZeroBatch-like front door that stretches the latest batch whenever it can, and makes every batch *new*
    again after stage 0 (so a batch that had stopped being the latest can be stretched again)."""

    name = "renew-test"

    def admit(self, now):
        table = self.view.table
        latest = table.latest()
        if self.pending and latest is not None and table.can_stretch(latest.bid) is None and latest.bs < 4:
            return [Stretch(latest.bid, self.take(4 - latest.bs))]
        if self.pending and self.view.stage_idle(0):
            return [New(self.take(1))]
        return []

    def at_boundary(self, batch, stage, now):
        return New(batch.queries) if stage == 0 and self.view.table.can_renew(batch.bid, 0) is None else None


def test_new_at_a_stage_boundary():
    """Three stages of T each at any batch size. Query 0 arrives at 0 and is made a batch (id 0); query 1 at 0.5
    stretches it (catch-up after stage 0 has read the pair: stage 0 in [1, 2]); query 0 waits after stage 0. At
    the boundary after stage 0 (at 2, all rows done) the policy makes the batch *new*: id 1, the latest batch,
    continuing from stage 1 in [2, 3]. Query 2 at 2.5 stretches batch 1 (it is the latest); its catch-up rows
    wait until stage 1 has read the pair: stage 0 [3, 4], stage 1 [4, 5]; the others wait after stage 1; the
    three run stage 2 in [5, 6]."""
    table = make_table(3, lambda s, b: 1.0, batch_sizes=range(1, 5))
    pipe = Pipeline(table, RenewAfterFirstStage(), 2)
    res = simulate(pipe, [0.0, 0.5, 2.5], [1, 1, 1], sharing="fluid")
    assert res.stuck is None
    ops = [(op[0], op[2]) for op in pipe.table.log]
    assert ops == [("new", 0), ("stretch", 0), ("renew", 1), ("stretch", 1)]
    assert [q.finish for q in res.queries] == pytest.approx([6.0, 6.0, 6.0])
    assert [q.stage_start[1] for q in res.queries] == pytest.approx([2.0, 2.0, 4.0])
    assert {q.exit_batch_id for q in res.queries} == {1}


def test_new_at_a_boundary_must_take_the_whole_batch():
    class Bad(RenewAfterFirstStage):
        def at_boundary(self, batch, stage, now):
            return New(batch.queries[:1]) if stage == 0 and batch.bs > 1 else None

    pipe = Pipeline(make_table(3, lambda s, b: 1.0, batch_sizes=range(1, 5)), Bad(), 2)
    with pytest.raises(PolicyError, match="exactly the finished batch's queries"):
        simulate(pipe, [0.0, 0.5], [1, 1], sharing="fluid")


def test_policy_one_clusters_are_the_cheapest_cuts_against_trying_every_one():
    """Policy I's clusters against a second computation: every way to cut the sorted queries into at most
    ``max_clusters`` groups where the length changes, each costed with the fluid model. The clusters found cost
    the least; of equal costs the first in the search's order, which is the cut positions' lexicographic order
    (no cut, then the first cut, then it and the next ...)."""
    from itertools import combinations

    from dvasim.core.arith import left_sum
    from dvasim.policies.dvabatch import _mean_demand, fluid_finish_times

    table = token_table(3)
    rng = np.random.default_rng(11)
    for trial in range(40):
        pol = make_policy("dvabatch", {"policies": ["input"], "max_batch_size": 16, "max_clusters": int(rng.integers(1, 5))})
        bind(pol, table)
        qs = [Query(i, 0.0, int(rng.choice(LENS))) for i in range(int(rng.integers(1, 13)))]
        got = pol.clusters(list(reversed(qs)))
        order = sorted(qs, key=lambda q: (q.seq_len, q.qid))
        lens = [q.seq_len for q in order]
        cuts = [k for k in range(1, len(order)) if lens[k] != lens[k - 1]]

        def cost(bounds, lens=lens):
            groups = list(zip((0, *bounds), (*bounds, len(lens))))
            jobs = [(table.total(e - s, lens[e - 1]), _mean_demand(table, e - s, lens[e - 1])) for s, e in groups]
            return left_sum((e - s) * t for (s, e), t in zip(groups, fluid_finish_times(jobs)))

        ways = [c for k in range(min(pol.max_clusters, len(cuts) + 1)) for c in combinations(cuts, k)]
        best = min(cost(w) for w in ways)
        sizes = [len(g) for g in got]
        bounds = tuple(np.cumsum(sizes)[:-1].tolist())
        assert [q for g in got for q in g] == order, trial  # contiguous groups of the sorted queries
        assert len(got) <= pol.max_clusters and set(bounds) <= set(cuts), trial
        assert cost(bounds) <= best + 1e-9, (trial, bounds, cost(bounds), best)
        cheapest = [w for w in ways if cost(w) <= best + 1e-9]
        assert bounds == min(cheapest), trial
