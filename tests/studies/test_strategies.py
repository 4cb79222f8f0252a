"""The characterization study's reorchestrating strategies (its Table 5): DVABatch's ``stretch``, ``split`` and
``pipeline`` flags turn each operation on or off independently, and leave today's behaviour alone when not given."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import dvasim
from dvasim.api import load_profile
from dvasim.core.pipeline import Pipeline
from dvasim.engines.sim.engine import simulate
from dvasim.errors import ConfigError
from dvasim.policies import make_policy

VGG = {"name": "vgg19", "device": "titanrtx", "stages": 4}
LINKNET = {"name": "linknet", "device": "titanrtx", "stages": 4}


def cfg(model, rate, n=300, seed=3, **policy):
    return {"model": model, "policy": {"name": "dvabatch", "max_batch_size": 32, **policy},
            "workload": {"kind": "poisson", "rate_qps": rate, "n_queries": n, "seed": seed},
            "qos": {"target_ms": 200.0}, "engine": {"progress": False}}


def summary(model, rate, **policy):
    return dvasim.run(cfg(model, rate, **policy)).summary


@pytest.fixture(scope="module")
def vgg_default():
    """linknet, 4 stages, 1400 qps: the default both stretches and splits (operator and load diversity, §8.1;
    VGG19, the case before issue 33, is load diversity only now)."""
    r = dvasim.run(cfg(LINKNET, 1400.0))
    assert r.config["policy"]["policies"] == ["operator", "load"]
    assert r.summary["n_stretch"] > 0 and r.summary["n_split"] > 0
    return r


def test_default_flags_change_nothing(vgg_default):
    """None (not given) is today's behaviour, query for query; and True where §7.1 already picks the operation."""
    base = vgg_default.queries
    for flags in ({"stretch": None, "split": None, "pipeline": None}, {"stretch": True, "split": True, "pipeline": True}):
        r = dvasim.run(cfg(LINKNET, 1400.0, **flags))
        assert np.array_equal(r.queries["finish_ms"].to_numpy(), base["finish_ms"].to_numpy())
        assert r.summary["n_stretch"] == vgg_default.summary["n_stretch"]
    # resolved configs of the defaults are unchanged: the flags appear only when given
    assert not {"stretch", "split", "pipeline"} & set(vgg_default.config["policy"])
    assert dvasim.run(cfg(LINKNET, 1400.0, split=False)).config["policy"]["split"] is False
    # a second config: resnet152 with two instances (the golden case resnet152-dvabatch-pairs2-inst2)
    res = {"name": "resnet152", "device": "titanrtx", "stages": 3}
    a = dvasim.run({**cfg(res, 300.0, seed=5), "engine": {"progress": False, "instances": 2}})
    b = dvasim.run({**cfg(res, 300.0, seed=5, pipeline=True), "engine": {"progress": False, "instances": 2}})
    assert np.array_equal(a.queries["finish_ms"].to_numpy(), b.queries["finish_ms"].to_numpy())


def test_stretch_false_never_stretches(vgg_default):
    s = summary(LINKNET, 2000.0, stretch=False)  # (at 1400 qps only stretched batches grow large enough to split)
    assert s["n_stretch"] == 0 and s["n_stretch_started"] == 0
    assert s["n_split"] > 0  # splitting is still on
    assert s["n_completed"] == 300


def test_split_false_never_splits(vgg_default):
    s = summary(LINKNET, 1400.0, split=False)
    assert s["n_split"] == 0 and s["n_stretch"] > 0 and s["n_completed"] == 300


def test_true_forces_an_operation_the_identification_leaves_off():
    """With ``policies = []`` nothing is stretched or split; the flags turn each on alone (linknet at a load that
    batches; Policy II still splits only where its T_remain test passes)."""
    off = summary(LINKNET, 1400.0, policies=[])
    assert off["n_stretch"] == off["n_split"] == 0
    st = summary(LINKNET, 1400.0, policies=[], stretch=True)
    assert st["n_stretch"] > 0 and st["n_split"] == 0
    sp = summary(LINKNET, 1400.0, policies=[], split=True, pipeline=False)
    assert sp["n_split"] > 0 and sp["n_stretch"] == 0


def _poisson(rate, n, seed=7):
    return list(np.cumsum(np.random.default_rng(seed).exponential(1000.0 / rate, n)))


@pytest.mark.parametrize("stretch", [False, True])
def test_pipeline_false_holds_one_batch_at_a_time(stretch):
    """Without splitting, the batch table never holds two batches when a stage starts; with the default
    (pipelined) the same load overlaps batches across stages."""
    seen = {}
    for pipelined in (False, None):
        pol = make_policy("dvabatch", {"max_batch_size": 32, "split": False, "stretch": stretch,
                                       "pipeline": pipelined})
        pipe = Pipeline(load_profile(VGG), pol, 2)
        in_table = []
        pipe.on_begin.append(lambda ex, pipe=pipe, in_table=in_table: in_table.append(len(pipe.table)))
        res = simulate(pipe, _poisson(400.0, 200), [1] * 200, sharing="fluid")
        assert res.stuck is None and all(not np.isnan(q.finish) for q in res.queries)
        seen[pipelined] = max(in_table)
    assert seen[False] == 1 and seen[None] > 1


def test_pipeline_false_batches_never_overlap_with_stretch_and_split():
    """Every strategy without pipelining: a batch (with its stretched queries and split sub-batches) has left the
    pipeline (its last stage) before the next one's first stage starts. (Its answers may leave later: a serving
    stack's completion thread copies them back while the pipeline goes on.)"""
    for stretch, split in itertools.product((False, True), repeat=2):
        r = dvasim.run(cfg(VGG, 400.0, stretch=stretch, split=split, pipeline=False))
        q = r.queries
        assert r.summary["n_completed"] == 300
        last = f"s{r.summary['n_stages'] - 1}_finish_ms"
        spans = q.groupby("batch_id").agg(start=("s0_start_ms", "min"), end=(last, "max")).sort_values("start")
        assert (spans["start"].to_numpy()[1:] >= spans["end"].to_numpy()[:-1] - 1e-9).all(), (stretch, split)
        if not split:
            assert r.summary["mean_batches_in_flight"] <= 1.0 + 1e-9
        if split:
            assert r.summary["n_split"] > 0
    assert summary(VGG, 400.0)["mean_batches_in_flight"] > 1.0  # the default overlaps batches


@pytest.mark.parametrize("field", ["stretch", "split", "pipeline"])
@pytest.mark.parametrize("value", [1, "yes", 0.0, [True]])
def test_flags_must_be_booleans(field, value):
    with pytest.raises(ConfigError, match=f"policy.{field}"):
        make_policy("dvabatch", {field: value})


def test_flags_are_documented_and_described():
    from dvasim.policies.dvabatch import DVABatch

    for field in ("stretch", "split", "pipeline"):
        assert field in DVABatch.params and DVABatch.params[field]
    pol = make_policy("dvabatch", {"stretch": False, "pipeline": False})
    d = pol.describe()
    assert d["stretch"] is False and d["pipeline"] is False and "split" not in d
