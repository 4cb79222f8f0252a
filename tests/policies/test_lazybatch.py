"""LazyBatching (Choi et al., HPCA'21) as the policy ``lazybatch`` (dvasim.policies.lazybatch).

Checked against hand-worked timelines: the paper's Figure 10 (8 nodes A-H of 1 time-unit at any batch size, Req1
issued at t=2, Req2 arriving during Req1's node B, Req3 during Req2's node A), Equation 1's worked example
(SLA 30, T_wait 2, 8 nodes: slack 20), the conservative predictor (Equation 2) flipping its decision on either side
of ``T_wait + N * SingleInputExecTime``, the oracle merging where batching is cheap and the conservative one
refuses, and Algorithm 1's ``dec_timesteps``. Then the mechanism's invariants under random loads (hypothesis), the
oracle's prediction against the simulated exit, both engines and the host model, bad parameters, and the
experiment script's quick mode.

All tables here have dyadic latencies, so every time below is exact in binary.
"""

from __future__ import annotations

import math
import random

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dvasim
from dvasim.core.batch_table import Batch
from dvasim.core.pipeline import Pipeline
from dvasim.core.query import Query
from dvasim.engines.sim.engine import simulate
from dvasim.errors import ConfigError
from dvasim.policies import make_policy, policy_names
from dvasim.policies.lazybatch import LazyBatch, coverage_length
from tests.conftest import make_table, random_cost_table
from tests.core.test_pipeline_properties import Monitor, run_random_load

FLAT8 = make_table(8, lambda s, b: 1.0)  # Figure 10: nodes A..H, 1 time-unit each at any batch size
FIG10_ARRIVALS = [2.0, 3.5, 4.5]  # Req1 issued at 2; Req2 arrives during Req1's B [3, 4]; Req3 during Req2's A


def sim(table, params, arrivals, seq_lens=None, sharing="fluid", pairs=2, instances=1, qos=None, lengths=None):
    pipe = Pipeline(table, make_policy("lazybatch", params), pairs, instances=instances, qos_target_ms=qos,
                    input_lengths=lengths)
    res = simulate(pipe, arrivals, seq_lens or [1] * len(arrivals), sharing=sharing, cores=2)
    assert res.stuck is None, res.stuck
    return pipe, sorted(res.queries, key=lambda q: q.qid)


def test_registered():
    assert "lazybatch" in policy_names()


# ----------------------------------------------------------------------------- Figure 10
@pytest.mark.parametrize("sharing", ["fluid", "exclusive", "parallel", "cores"])
@pytest.mark.parametrize("pairs", [1, 2, 3])
def test_figure10_timeline(sharing, pairs):
    # Req1: A [2,3], B [3,4]; Req2 is pushed at t=4 (Req1 preempted at the end of B): A [4,5]; Req3 is pushed at
    # t=5 (Req2 preempted at the end of A): A [5,6]; Req2+3 merge at B [6,7]; Req1+2+3 merge at C..H [7,13].
    pipe, qs = sim(FLAT8, {"sla_ms": 30.0}, FIG10_ARRIVALS, sharing=sharing, pairs=pairs)
    r1, r2, r3 = qs
    assert r1.stage_start == [2, 3, 7, 8, 9, 10, 11, 12]
    assert r1.stage_finish == [3, 4, 8, 9, 10, 11, 12, 13]
    assert r2.stage_start == [4, 6, 7, 8, 9, 10, 11, 12]
    assert r2.stage_finish == [5, 7, 8, 9, 10, 11, 12, 13]
    assert r3.stage_start == [5, 6, 7, 8, 9, 10, 11, 12]
    assert r3.stage_finish == [6, 7, 8, 9, 10, 11, 12, 13]
    assert [q.finish for q in qs] == [13.0, 13.0, 13.0]
    assert [q.exit_batch_size for q in qs] == [3, 3, 3]
    # the BatchTable's stack operations (Figure 10(b)): push Req1 at 2, push Req2 at 4, push Req3 at 5
    assert [(op, t) for op, t, *_ in pipe.table.log] == [("new", 2.0), ("stretch", 4.0), ("stretch", 5.0)]


def test_figure10_one_node_at_a_time():
    # no two executions overlap: the NPU runs one node at a time (11 executions: 2 + 1 + 1 + 1 + 6)
    pipe = Pipeline(FLAT8, make_policy("lazybatch", {"sla_ms": 30.0}), 2)
    spans = []
    pipe.on_finish.append(lambda ex: spans.append((ex.start, ex.end, ex.stage, ex.batch_size)))
    simulate(pipe, FIG10_ARRIVALS, [1, 1, 1], sharing="fluid")
    assert sorted(spans) == [(2, 3, 0, 1), (3, 4, 1, 1), (4, 5, 0, 1), (5, 6, 0, 1), (6, 7, 1, 2)] + [
        (t, t + 1, t - 5, 3) for t in range(7, 13)]


# ----------------------------------------------------------------------------- the slack predictor
def _query(qid, seen, admitted=math.nan):
    q = Query(qid, seen)
    q.seen, q.admitted = seen, admitted
    return q


def test_equation1_worked_example():
    # §IV-C: Req1 waits in InfQ from 0 to 2, SLA 30, 8 nodes of 1: slack without batching 30 - (2 + 8) = 20;
    # batched with two more requests (Equation 2, N = 3): 30 - (2 + 3 * 8) = 4
    pol = LazyBatch(sla_ms=30.0)
    Pipeline(FLAT8, pol, 2)
    assert pol.single_ms == 8.0
    req1 = Batch(0, [_query(1, 0.0, 2.0)], 0.0, 8)
    assert pol.slack(req1, [], now=2.0) == 20.0
    assert pol.slack(req1, [_query(2, 3.0), _query(3, 4.0)], now=4.0) == 4.0
    # a candidate that has waited longer than Req1 (ours: the largest wait counts): 30 - (3 + 16) = 11
    assert pol.slack(req1, [_query(4, 1.0)], now=4.0) == 11.0


@pytest.mark.parametrize("sla,finish", [
    (24.5, [13, 13, 13]),  # Req3's slack 24.5 - (0.5 + 3 * 8) = 0 >= 0: Figure 10
    (24.4, [12, 12, 20]),  # Req3 refused (-0.1): Req1+2 exit at 12, Req3 runs alone 12 -> 20
    (16.5, [12, 12, 20]),  # Req2's slack 16.5 - (0.5 + 2 * 8) = 0: pushed; Req3 refused
    (16.4, [10, 18, 18]),  # Req2 refused (-0.1): Req1 runs alone 2 -> 10; Req2+3 leave together 10 -> 18
])
def test_conservative_predictor_flips_at_the_slack_boundary(sla, finish):
    # T_wait: Req2 seen at 3.5, pushed at 4 (0.5); Req3 seen at 4.5, tried at 5 (0.5); Req1 never waited
    pipe, qs = sim(FLAT8, {"sla_ms": sla}, FIG10_ARRIVALS)
    assert [q.finish for q in qs] == finish
    refused = finish != [13, 13, 13]
    assert pipe.policy.n_refused == int(refused)


def test_refused_batch_completes_uninterrupted():
    # SLA 16.4: Req2 is refused at t=4 and the batch is closed: Req3 (arriving at 4.5) is never pushed onto it
    # even though its own slack would be as large; the two leave together when Req1 has left
    _, qs = sim(FLAT8, {"sla_ms": 16.4}, FIG10_ARRIVALS)
    assert qs[0].stage_start == [2, 3, 4, 5, 6, 7, 8, 9]
    assert qs[1].admitted == qs[2].admitted == 10.0 and qs[1].exit_batch_size == 2


@pytest.mark.parametrize("predictor,sla,finish", [
    ("conservative", 20.0, [12, 12, 20]),  # N = 3: 0.5 + 24 > 20: Req3 refused
    ("oracle", 20.0, [13, 13, 13]),  # exact: Req3 A [5,6], Req2+3 B [6,7], all C..H [7,13]: Req1 waits 13-2 = 11
    ("oracle", 11.0, [13, 13, 13]),  # 11 <= 11
    ("oracle", 10.9, [12, 12, 20]),  # Req3 refused (11 > 10.9); Req2 accepted (finish 12: 12 - 2 = 10)
    ("oracle", 9.9, [10, 18, 18]),  # Req2 refused (10 > 9.9)
])
def test_oracle_authorises_more_when_batching_is_cheap(predictor, sla, finish):
    _, qs = sim(FLAT8, {"sla_ms": sla, "predictor": predictor}, FIG10_ARRIVALS)
    assert [q.finish for q in qs] == finish


def test_oracle_prediction_is_the_stack_timeline():
    # the stack at t=5: Req1 waits at boundary B (stage 1), Req2 just finished A (stage 0). A newcomer runs A at
    # batch 1, merges with Req2 for B at batch 2, then with Req1 for C..H at batch 3: with T(s, b) = b ms for
    # node s, finish = 5 + 1 + 2 + 6 * 3 = 26
    table = make_table(8, lambda s, b: float(b))
    pol = LazyBatch(sla_ms=1e9, predictor="oracle")
    Pipeline(table, pol, 2)
    qs = [_query(i, 0.0, 0.0) for i in range(2)]
    batch = Batch(0, qs, 0.0, 8)
    batch.issued = [2, 1, 0, 0, 0, 0, 0, 0]  # row 0 (Req1) was handed to B, row 1 (Req2) only to A
    batch.status_map = [2, 1, 0, 0, 0, 0, 0, 0]
    assert pol.oracle_finish(batch, 0, [_query(9, 4.5)], now=5.0) == 26.0
    # and at a whole batch's boundary (both at B): newcomer A+B at 1 each, C..H at 3: 5 + 2 + 18 = 25
    batch.issued = [2, 2, 0, 0, 0, 0, 0, 0]
    batch.status_map = [2, 2, 0, 0, 0, 0, 0, 0]
    assert pol.oracle_finish(batch, 1, [_query(9, 4.5)], now=5.0) == 25.0


# ----------------------------------------------------------------------------- Algorithm 1: dec_timesteps
SEQ2 = make_table(2, lambda s, b, L: L / 16, batch_sizes=range(1, 9), seq_lens=[16, 32, 64])


@pytest.mark.parametrize("dec,finish", [(16, [3.0, 3.0]), (32, [3.0, 3.0]), (64, [2.0, 4.0])])
def test_dec_timesteps_sets_the_single_input_estimate(dec, finish):
    # two nodes of L/16 ms, both inputs of length 16 (1 ms per node). SingleInputExecTime is estimated at
    # L = dec_timesteps: 2 ms (16), 4 ms (32), 8 ms (64). Req2 (seen 0.5) is tried at t=1 with N = 2:
    # slack = 10 - (0.5 + 2 * single) = 5.5 / 1.5 / -6.5. Pushed: Req2's A [1,2], both B [2,3], both exit at 3. Refused: Req1 exits at 2
    # and Req2 runs 2 -> 4. Execution always runs at the real length (16).
    pipe, qs = sim(SEQ2, {"sla_ms": 10.0, "dec_timesteps": dec, "max_batch_size": 8}, [0.0, 0.5], seq_lens=[16, 16])
    assert pipe.policy.single_ms == 2 * dec / 16
    assert [q.finish for q in qs] == finish


def test_dec_timesteps_default_covers_dec_coverage_of_the_lengths():
    assert coverage_length([10] * 9 + [60], 0.9) == 10
    assert coverage_length([10] * 9 + [60], 0.95) == 60
    assert coverage_length(range(1, 101), 0.9) == 90
    assert coverage_length([7], 0.5) == 7
    lengths = [16] * 8 + [40, 64]
    for cov, want in ((0.8, 16), (0.9, 40), (1.0, 64)):
        pipe = Pipeline(SEQ2, make_policy("lazybatch", {"dec_coverage": cov, "max_batch_size": 8}), 2,
                        input_lengths=lengths)
        assert pipe.policy.dec_timesteps == want
        assert pipe.policy.single_ms == 2 * want / 16  # bilinear in L between 32 and 64 for 40: 2 x 2.5
    # no sample: the table's longest length; no seq_len column: unused
    assert Pipeline(SEQ2, make_policy("lazybatch", {"max_batch_size": 8}), 2).policy.dec_timesteps == 64
    assert Pipeline(FLAT8, make_policy("lazybatch", {}), 2).policy.dec_timesteps is None


def test_sla_defaults_to_the_qos_target_then_100():
    assert Pipeline(FLAT8, make_policy("lazybatch", {}), 2, qos_target_ms=42.0).policy.sla_ms == 42.0
    assert Pipeline(FLAT8, make_policy("lazybatch", {}), 2).policy.sla_ms == 100.0
    assert Pipeline(FLAT8, make_policy("lazybatch", {"sla_ms": 7}), 2, qos_target_ms=42.0).policy.sla_ms == 7.0


def test_new_takes_every_pending_input_up_to_max_batch_size():
    # 5 requests at t=0 on an idle server: one batch of max 4, the fifth waits (the batch is full, no push)
    _, qs = sim(FLAT8, {"max_batch_size": 4}, [0.0] * 5)
    assert [q.exit_batch_size for q in qs] == [4, 4, 4, 4, 1]
    assert [q.finish for q in qs] == [8, 8, 8, 8, 16]


# ----------------------------------------------------------------------------- invariants under random loads
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_stages=st.integers(1, 6),
    n_pairs=st.integers(1, 3),
    max_bs=st.sampled_from([1, 2, 4, 8]),
    sla=st.sampled_from([1.0, 5.0, 20.0, 1e6]),
    predictor=st.sampled_from(["conservative", "oracle"]),
    n_queries=st.integers(1, 60),
    seed=st.integers(0, 2**31),
    sharing=st.sampled_from(["fluid", "exclusive", "parallel", "cores"]),
    instances=st.integers(1, 2),
)
def test_lazybatch_is_safe_and_live(n_stages, n_pairs, max_bs, sla, predictor, n_queries, seed, sharing,
                                    instances):
    rng = random.Random(seed)
    table = random_cost_table(rng, n_stages)
    pol = make_policy("lazybatch", {"max_batch_size": max_bs, "sla_ms": sla, "predictor": predictor})
    pipe = Pipeline(table, pol, n_pairs, instances=instances)
    mon = Monitor(pipe, max_bs)
    spans = []
    pipe.on_finish.append(lambda ex: spans.append((ex.start, ex.end)))
    # the oracle's prediction at each batch's last accepted push must be its exit time (single instance: nothing
    # else runs, and a refusal closes the batch)
    predicted = {}
    real = pol.authorise

    def spy(batch, stage, newcomers, now):
        ok = real(batch, stage, newcomers, now)
        if ok:
            predicted[batch.bid] = pol.oracle_finish(batch, stage, newcomers, now)
        return ok

    pol.authorise = spy
    res = run_random_load(pipe, mon, rng, n_queries, sharing, max_bs, cores=2)
    assert {op[0] for op in pipe.table.log} <= {"new", "stretch"}
    assert len(pipe.table) == 0 and not any(pipe.queues) and not pol.pending
    if instances == 1:
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "two nodes ran at once"
        if predictor == "oracle" and sharing in ("fluid", "exclusive"):
            exits = {}
            for q in res.queries:
                exits.setdefault(q.exit_batch_id, []).append(q.finish)
            stretched = {op[2] for op in pipe.table.log if op[0] == "stretch"}
            for bid in stretched:
                assert exits[bid] == pytest.approx([predicted[bid]] * len(exits[bid]), rel=1e-12, abs=1e-9)


def test_lazybatch_never_waits_when_idle():
    # every request that finds the server idle starts at once (no batch window)
    _, qs = sim(make_table(3, lambda s, b: 0.5 + b / 8), {"max_batch_size": 8}, [0.0, 10.0, 20.0])
    assert [q.stage_start[0] for q in qs] == [0.0, 10.0, 20.0]


# ----------------------------------------------------------------------------- through the config, both engines
def _write_table(path, n_stages=8, top=64):
    rows = [{"stage": s, "batch_size": b, "latency_ms": 1.0} for s in range(n_stages) for b in range(1, top + 1)]
    pd.DataFrame(rows).to_csv(path, index=False)
    return str(path)


def test_run_by_name_and_resolved_config(tmp_path):
    r = dvasim.run({"model": {"table": _write_table(tmp_path / "t.csv")},
                    "policy": {"name": "lazybatch", "sla_ms": 30.0},
                    "workload": {"kind": "explicit", "arrivals_ms": FIG10_ARRIVALS}})
    assert r.stuck is None
    assert r.queries.sort_values("query_id")["finish_ms"].tolist() == [13.0, 13.0, 13.0]
    assert r.summary["n_stretch"] == 2 and r.summary["n_batches"] == 1
    assert r.config["policy"] == {"name": "lazybatch", "max_batch_size": 64, "sla_ms": 30.0,
                                  "predictor": "conservative", "dec_coverage": 0.9, "single_input_exec_ms": 8.0}
    # the run's QoS target is the default SLA
    r = dvasim.run({"model": {"table": _write_table(tmp_path / "t.csv")}, "policy": {"name": "lazybatch"},
                    "workload": {"kind": "explicit", "arrivals_ms": [0.0]}, "qos": {"target_ms": 55.0}})
    assert r.config["policy"]["sla_ms"] == 55.0


def test_host_model_and_sweep_accept_it(tmp_path):
    from dvasim.studies.sweep import sweep

    table = _write_table(tmp_path / "t.csv")
    base = {"model": {"table": table}, "policy": {"name": "lazybatch", "sla_ms": 30.0},
            "workload": {"kind": "explicit", "arrivals_ms": FIG10_ARRIVALS}}
    # with a host model (launch costs per node), the same pushes happen and the run only gets longer
    r = dvasim.run({**base, "engine": {"host": {"launch_ms": 0.25, "cores": 1}}})
    assert r.stuck is None and r.summary["n_completed"] == 3
    assert r.summary["n_stretch"] == 2
    assert r.queries["finish_ms"].max() >= 13.0
    (tmp_path / "base.toml").write_text(f"""
[model]
table = "{table}"
[policy]
name = "lazybatch"
[workload]
kind = "poisson"
rate_qps = 200
n_queries = 100
seed = 1
""")
    (tmp_path / "sweep.toml").write_text('base = "base.toml"\n[grid]\n"policy.predictor" = ["conservative", '
                                         '"oracle"]\n')
    out = sweep(tmp_path / "sweep.toml", tmp_path / "out", workers=1, progress=False, figure=False)
    assert len(out) == 2 and (out["n_completed"] == 100).all()
    assert (out["policy"] == "lazybatch").all()


# ----------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("params,field", [
    ({"max_batch_size": 0}, "policy.max_batch_size"),
    ({"max_batch_size": "8"}, "policy.max_batch_size"),
    ({"sla_ms": -1}, "policy.sla_ms"),
    ({"sla_ms": 0}, "policy.sla_ms"),
    ({"sla_ms": float("nan")}, "policy.sla_ms"),
    ({"predictor": "exact"}, "policy.predictor"),
    ({"dec_timesteps": 0}, "policy.dec_timesteps"),
    ({"dec_timesteps": 2.5}, "policy.dec_timesteps"),
    ({"dec_coverage": 0}, "policy.dec_coverage"),
    ({"dec_coverage": 1.5}, "policy.dec_coverage"),
    ({"window_ms": 5}, "policy.window_ms"),
])
def test_bad_parameters_name_the_field(params, field):
    with pytest.raises(ConfigError) as e:
        make_policy("lazybatch", params)
    assert e.value.field == field


def test_parameters_beyond_the_table_are_refused():
    with pytest.raises(ConfigError) as e:
        Pipeline(SEQ2, make_policy("lazybatch", {"max_batch_size": 8, "dec_timesteps": 65}), 2)
    assert e.value.field == "policy.dec_timesteps"
    with pytest.raises(ConfigError) as e:
        Pipeline(SEQ2, make_policy("lazybatch", {}), 2)  # default max 64 > the table's 8
    assert e.value.field == "policy.max_batch_size"


# ----------------------------------------------------------------------------- the CPU replay
@pytest.mark.torch
@pytest.mark.parametrize("predictor", ["conservative", "oracle"])
def test_replay_runs_lazybatch(predictor):
    pytest.importorskip("torch")
    from dvasim.engines.replay import replay
    from tests.engines.test_replay import assert_outputs_match

    c = {
        "model": {"name": "vgg19", "device": "cpu", "stages": 4},
        "policy": {"name": "lazybatch", "max_batch_size": 4, "sla_ms": 1000.0, "predictor": predictor},
        "workload": {"kind": "poisson", "rate_qps": 400.0, "n_queries": 24, "seed": 3},
        "engine": {"buffer_pairs": 2},
    }
    r = replay(c, record_outputs=True, warmup=0)
    assert r.stuck is None
    assert r.summary["n_completed"] == 24
    assert r.queries["exit_batch_size"].max() <= 4
    assert r.summary["n_stretch"] >= 1  # the load makes it push at node boundaries
    assert_outputs_match(r)


# ----------------------------------------------------------------------------- the experiment's quick mode
def test_experiment_quick(tmp_path):
    from tests.experiments import load_experiment as load

    load("lazyb_figs12_15").main(["--quick", "--workers", "1", "--out", str(tmp_path)])
    for fig in ("fig12", "fig13", "fig14", "fig15"):
        assert (tmp_path / f"lazyb_{fig}.csv").is_file() and (tmp_path / f"lazyb_{fig}.png").is_file()
    runs = pd.read_csv(tmp_path / "lazyb_fig12.csv")
    assert set(runs["policy"]) >= {"Serial", "LazyB", "Oracle"}
    assert (runs["n_completed"] == runs["n_queries"]).all()
    # at the lowest load nothing queues: LazyB's mean latency is within 1.5x of Serial's (no batch window), while
    # every GraphB(N) waits for its window
    low = runs[runs["rate_paper_qps"] == runs["rate_paper_qps"].min()].groupby(["model", "policy"])["mean_latency_ms"].mean()
    for model in runs["model"].unique():
        assert low[(model, "LazyB")] <= 1.5 * low[(model, "Serial")]
    sla = pd.read_csv(tmp_path / "lazyb_fig15.csv")
    assert sla["violation_rate"].between(0, 1).all()
