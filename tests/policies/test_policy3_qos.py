"""Policy III's T_comp_wait derived from the QoS target (paper §7.2): a stretch is made only if the stretched batch
still finishes within the QoS target of its oldest query's arrival, from the latency table's standalone times.
Hand-computed margins, the overrides, and a property check on the exclusive (sequential) device."""

from __future__ import annotations

import random

import pytest

import dvasim
from dvasim.core.pipeline import Pipeline
from dvasim.engines.sim.engine import simulate
from dvasim.errors import ConfigError
from dvasim.policies import make_policy
from tests.conftest import make_table, random_cost_table

# Four stages, T_s(b) = 1 + 0.25 (b - 1) ms for b = 1..4: every stage prefers batch 4 (batch 3 reaches only 87.5%
# of batch 4's throughput), so a batch of 1 is insufficient and may be stretched up to 4.
RAMP = make_table(4, lambda s, b: 1.0 + 0.25 * (b - 1), batch_sizes=range(1, 5))
# Query 0 arrives at 0 and runs alone: stage 0 in [0, 1], stage 1 in [1, 2], ... Queries 1 and 2 arrive at 1.5,
# while query 0 is in stage 1 (merge boundary f = 1). A stretch then costs: the rest of query 0's stage 1
# (2 - 1.5 = 0.5), the newcomers' catch-up through stages 0 and 1 at batch 2 (1.25 + 1.25), stages 2 and 3 at the
# merged batch 3 (1.5 + 1.5): the merged batch finishes at 1.5 + 0.5 + 2.5 + 3.0 = 7.5, query 0's latency 7.5.
ARRIVALS = [0.0, 1.5, 1.5]
MARGIN = 7.5


@pytest.fixture
def ramp_csv(tmp_path):
    path = tmp_path / "ramp.csv"
    RAMP.save(path)
    return str(path)


def run_ramp(table_path, qos_ms, sharing="exclusive", **policy):
    cfg = {"model": {"table": table_path}, "policy": {"name": "dvabatch", "max_batch_size": 4,
                                                       **({"t_comp_wait_rule": "qos"} if not policy else {}), **policy},
           "workload": {"kind": "explicit", "arrivals_ms": ARRIVALS}, "qos": {"target_ms": qos_ms},
           "engine": {"sharing": sharing}}
    return dvasim.run(cfg, progress=False)


def spied_dvabatch(params, spy):
    """A dvabatch policy whose ``merged_finish`` answers ``spy(original, batch, newcomers, now)``: a subclass, not
    an instance attribute, which the compiled policy (``make compiled``) would not see, as it calls its own methods
    directly."""

    class Spied(type(make_policy("dvabatch", params))):
        def merged_finish(self, batch, newcomers, now):
            return spy(super().merged_finish, batch, newcomers, now)

    return Spied(**params)


def test_hand_computed_merge_finish_is_the_policys_estimate():
    """The policy's own estimate at the moment of the stretch (query 0 running stage 1 since 1.0) is 7.5."""
    seen = []

    def spy(original, batch, newcomers, now):
        got = original(batch, newcomers, now)
        seen.append((now, batch.bs, len(newcomers), got))
        return got

    pol = spied_dvabatch({"max_batch_size": 4, "t_comp_wait_rule": "qos"}, spy)
    pipe = Pipeline(RAMP, pol, 2, qos_target_ms=MARGIN)
    res = simulate(pipe, ARRIVALS, [1, 1, 1], sharing="exclusive")
    assert res.stuck is None
    assert seen[0] == pytest.approx((1.5, 1, 2, MARGIN))


@pytest.mark.parametrize("sharing", ["exclusive", "fluid"])
def test_stretch_accepted_just_above_the_margin(ramp_csv, sharing):
    """QoS = 7.5 + 0.1 ms (and exactly 7.5): the stretch keeps query 0 within it, so it is made. The newcomers'
    catch-up waits for query 0's stage 1 to release the pair (at 2): stage 0 in [2, 3.25], stage 1 in
    [3.25, 4.5]; the three run stage 2 in [4.5, 6] and stage 3 in [6, 7.5]. Latencies 7.5, 6, 6; one batch."""
    for qos in (MARGIN + 0.1, MARGIN):
        r = run_ramp(ramp_csv, qos, sharing)
        assert r.config["policy"]["t_comp_wait_rule"].startswith("qos")
        assert r.summary["n_stretch"] == 1 and r.summary["n_stretch_started"] == 1
        assert r.queries["batch_id"].tolist() == [0, 0, 0]
        assert r.queries["finish_ms"].tolist() == pytest.approx([7.5, 7.5, 7.5])
        assert r.queries["latency_ms"].tolist() == pytest.approx([7.5, 6.0, 6.0])
        assert r.queries["s1_start_ms"].tolist() == pytest.approx([1.0, 3.25, 3.25])
        assert r.queries["latency_ms"].max() <= qos


def test_stretch_refused_just_below_the_margin(ramp_csv):
    """QoS = 7.5 - 0.1 ms: the stretch would make query 0 miss it, so queries 1-2 form batch 1 at once (the
    first stage is free). On the exclusive device executions run one at a time in launch order: query 0's
    stage 1 [1, 2], the new batch's stage 0 (launched at 1.5) [2, 3.25], query 0's stage 2 [3.25, 4.25], the new
    batch's stage 1 (launched at 3.25) [4.25, 5.5], query 0's stage 3 [5.5, 6.5], then the new batch's stages 2
    and 3 [6.5, 7.75] and [7.75, 9]. Latencies 6.5, 7.5, 7.5: query 0 keeps its QoS."""
    r = run_ramp(ramp_csv, MARGIN - 0.1)
    assert r.summary["n_stretch"] == 0 and r.summary["n_batches"] == 2
    assert r.queries["batch_id"].tolist() == [0, 1, 1]
    assert r.queries["finish_ms"].tolist() == pytest.approx([6.5, 9.0, 9.0])
    assert r.queries["latency_ms"].tolist() == pytest.approx([6.5, 7.5, 7.5])


def test_refused_below_the_margin_on_the_fluid_device_too(ramp_csv):
    """The decision is the same whatever the sharing mode (it is made from the table's standalone times)."""
    r = run_ramp(ramp_csv, MARGIN - 0.1, sharing="fluid")
    assert r.summary["n_stretch"] == 0
    assert r.queries["batch_id"].tolist() == [0, 1, 1]


@pytest.mark.parametrize("t_comp_wait_ms, qos, stretched", [
    (1.6, MARGIN - 0.1, True),  # processed 1.5 <= 1.6: stretched although query 0 then misses the QoS
    (1.4, 100.0, False),  # processed 1.5 > 1.4: refused although the QoS would allow it
])
def test_fixed_t_comp_wait_overrides_the_qos_rule(ramp_csv, t_comp_wait_ms, qos, stretched):
    r = run_ramp(ramp_csv, qos, t_comp_wait_ms=t_comp_wait_ms)
    assert r.config["policy"]["t_comp_wait_rule"].startswith("fixed")
    assert r.config["policy"]["t_comp_wait_ms"] == t_comp_wait_ms
    assert r.summary["n_stretch"] == int(stretched)
    assert r.queries["batch_id"].tolist() == ([0, 0, 0] if stretched else [0, 1, 1])


@pytest.mark.parametrize("frac, stretched", [(0.4, True), (0.35, False)])
def test_t_comp_wait_frac_is_an_opt_in_fixed_threshold(ramp_csv, frac, stretched):
    """frac x the batch-1 latency (4 ms): 1.6 ms lets the batch processed for 1.5 ms be stretched, 1.4 does not,
    whatever the QoS target."""
    r = run_ramp(ramp_csv, 100.0, t_comp_wait_frac=frac)
    pol = r.config["policy"]
    assert pol["t_comp_wait_rule"].startswith("frac") and pol["t_comp_wait_frac"] == frac
    assert pol["t_comp_wait_ms"] == pytest.approx(4.0 * frac)
    assert r.summary["n_stretch"] == int(stretched)


def test_both_overrides_at_once_are_refused():
    with pytest.raises(ConfigError, match="policy.t_comp_wait_frac"):
        make_policy("dvabatch", {"t_comp_wait_ms": 1.0, "t_comp_wait_frac": 0.25})


def test_the_derived_default_needs_no_qos_target_and_stretches_within_its_limits():
    """The default rule (the authors' fixed thresholds, derived): RAMP's stages all prefer batch 4, so the stage
    limit is ceil(4 / 2) = 2 and T_comp_wait the time of stages 0 and 1 at batch 4, 1.75 + 1.75 = 3.5 ms. At 1.5
    query 0 has been processed 1.5 ms and handed to stage 1 (< 2): the stretch is made, as with the QoS rule."""
    pol = make_policy("dvabatch", {"max_batch_size": 4})
    pipe = Pipeline(RAMP, pol, 2)
    res = simulate(pipe, ARRIVALS, [1, 1, 1], sharing="exclusive")
    d = pol.describe()
    assert d["t_comp_wait_rule"].startswith("derived") and d["t_comp_wait_ms"] == pytest.approx(3.5)
    assert d["max_stretch_stage"] == 2
    assert pipe.table.counts["n_stretch"] == 1
    assert [q.finish for q in res.queries] == pytest.approx([7.5, 7.5, 7.5])


@pytest.mark.parametrize("arrive, params, stretched", [
    (2.5, {}, False),  # query 0 handed to stage 2 at 2.0: not below the stage limit 2
    (1.9, {}, True),  # still in stage 1
    (2.5, {"max_stretch_stage": 3}, True),  # T_comp_wait 5.25 ms, stage 2 < 3
    (2.5, {"max_stretch_stage": 3, "t_comp_wait_ms": 2.4}, False),  # processed 2.5 ms > 2.4
    (2.5, {"max_stretch_stage": 3, "t_comp_wait_ms": 2.6}, True),
])
def test_the_derived_rule_at_its_boundaries(arrive, params, stretched):
    pol = make_policy("dvabatch", {"max_batch_size": 4, **params})
    pipe = Pipeline(RAMP, pol, 2)
    simulate(pipe, [0.0, arrive], [1, 1], sharing="exclusive")
    assert pipe.table.counts["n_stretch"] == int(stretched)


def test_the_rule_and_a_fixed_wait_are_exclusive():
    with pytest.raises(ConfigError, match="policy.t_comp_wait_rule"):
        make_policy("dvabatch", {"t_comp_wait_rule": "qos", "t_comp_wait_ms": 1.0})
    with pytest.raises(ConfigError, match="policy.t_comp_wait_rule"):
        make_policy("dvabatch", {"t_comp_wait_rule": "fast"})
    with pytest.raises(ConfigError, match="policy.t_comp_wait_rule"):
        Pipeline(RAMP, make_policy("dvabatch", {"max_batch_size": 4, "t_comp_wait_rule": "qos"}), 2)


def test_a_sufficient_batch_is_not_stretched(tmp_path):
    """§3.3: stretching merges *insufficient* batches into one that fully utilizes the hardware. With every stage
    linear in the batch size (each prefers batch 1), a batch of 1 is already sufficient: no stretch, even with
    the loosest QoS target."""
    path = tmp_path / "linear.csv"
    make_table(4, lambda s, b: 1.0 * b, batch_sizes=range(1, 5)).save(path)
    cfg = {"model": {"table": str(path)}, "policy": {"name": "dvabatch", "max_batch_size": 4, "policies": ["load"]},
           "workload": {"kind": "explicit", "arrivals_ms": ARRIVALS}, "qos": {"target_ms": 1e6}}
    r = dvasim.run(cfg, progress=False)
    assert r.summary["n_stretch"] == 0 and r.queries["batch_id"].tolist() == [0, 1, 1]


def _batches(res):
    by = {}
    for q in res.queries:
        by.setdefault(q.batch_id, []).append(q)
    return by


def _scenario(rng):
    """A random table, and one burst: the originals at 0 and the newcomers once the first stage is free again
    (so a refused stretch becomes a new batch at once and is never reconsidered)."""
    n_st = rng.randint(2, 5)
    table = random_cost_table(rng, n_st, top=8)
    n_orig, n_new = rng.randint(1, 3), rng.randint(1, 4)
    t_new = table.latency(0, n_orig) * (1.0 + 1e-6) + rng.uniform(0.0, 0.9) * table.remaining(1, n_orig)
    return table, [0.0] * n_orig + [t_new] * n_new


def _run(table, arrivals, qos):
    rule = "qos" if qos is not None else "none"  # none: every stretch allowed (forced)
    pol = make_policy("dvabatch", {"max_batch_size": 8, "policies": ["load"], "t_comp_wait_rule": rule})
    pipe = Pipeline(table, pol, 2, qos_target_ms=qos)
    res = simulate(pipe, arrivals, [1] * len(arrivals), sharing="exclusive")
    assert res.stuck is None
    return res, pipe


def test_property_a_stretch_never_makes_its_batch_miss_the_qos_on_the_exclusive_device():
    """On one instance of the exclusive (sequential) device, where the table's times are exact, with the stretched
    batch alone in the pipeline: under the default rule (1) every query of a stretched batch meets the QoS
    target, and (2) the rule refuses exactly the stretches that would make the batch miss it: a refused stretch,
    made anyway (t_comp_wait_rule "none": every stretch allowed), would leave the batch's oldest query over the target.
    The targets are drawn around the forced stretch's own margin, so both answers occur."""
    rng = random.Random(20)
    made = refused = 0
    for _ in range(300):
        table, arrivals = _scenario(rng)
        forced, fpipe = _run(table, arrivals, None)
        if fpipe.table.counts["n_stretch"] == 0 or fpipe.table.counts["n_batches"] > 1:
            continue  # nothing to stretch (the batch is sufficient, or past the last stage's hand-off), or not
            # all the newcomers fit (the rest form a batch beside it: not the batch alone)
        n_orig = arrivals.count(0.0)
        worst_forced = max(q.finish - q.arrival for q in forced.queries[:n_orig])
        qos = worst_forced * rng.choice([0.98, 0.999, 1.001, 1.02]) if rng.random() < 0.8 else rng.uniform(
            0.5, 2.0) * worst_forced
        res, pipe = _run(table, arrivals, qos)
        stretched = pipe.table.counts["n_stretch"] > 0
        if stretched:
            made += 1
            for qs in _batches(res).values():
                if len({q.admitted for q in qs}) > 1:
                    assert max(q.finish - q.arrival for q in qs) <= qos * (1 + 1e-9)
        else:
            refused += 1
            assert worst_forced > qos
        # the exactness behind it: the forced merge finishes when the policy estimated it would
        assert stretched == (worst_forced <= qos * (1 + 1e-9))
    assert made > 40 and refused > 40


def test_property_several_stretches_of_one_batch_exact_on_the_exclusive_device():
    """Waves of newcomers stretch the same batch again and again, with one to three buffer pairs (so catch-up
    rows run beside the batch's own stages, or not): for every batch stretched while alone
    in the pipeline (no other batch in flight from its first query's admission to its exit), the policy's last
    estimate of the merged finish, when it made a stretch, is its exit time exactly, and every query of it meets
    the target."""
    rng = random.Random(5)
    checked = 0
    for _ in range(400):
        table = random_cost_table(rng, rng.randint(2, 5), top=8)
        t, arrivals = 0.0, []
        for _ in range(rng.randint(2, 5)):
            arrivals += [t] * rng.randint(1, 3)
            t += rng.uniform(0.05, 1.5) * table.latency(0, 1)
        qos = rng.uniform(0.8, 3.0) * table.total(1) + arrivals[-1]
        estimate = {}

        def spy(merged_finish, batch, newcomers, now, estimate=estimate, qos=qos):
            got = merged_finish(batch, newcomers, now)
            if got - min(q.arrival for q in batch.queries) <= qos + 1e-9:  # the stretch is made
                estimate[batch.bid] = got
            return got

        pol = spied_dvabatch({"max_batch_size": 8, "policies": ["load"], "t_comp_wait_rule": "qos"}, spy)
        pipe = Pipeline(table, pol, rng.randint(1, 3), qos_target_ms=qos)
        res = simulate(pipe, arrivals, [1] * len(arrivals), sharing="exclusive")
        assert res.stuck is None
        for bid, qs in _batches(res).items():
            if len({q.admitted for q in qs}) == 1:
                continue  # never stretched
            first, end = min(q.admitted for q in qs), max(q.finish for q in qs)
            if all(q.finish <= first or q.admitted >= end for q in res.queries if q.batch_id != bid):
                checked += 1
                assert estimate[bid] == pytest.approx(end, rel=1e-9, abs=1e-9)
                assert max(q.finish - q.arrival for q in qs) <= qos * (1 + 1e-9)
    assert checked > 60
