"""Peer systems' policies (dvasim.policies.peers): TF-Serving's NO_Wait / OPT_Wait / Static (E2bird, TPDS'21
§3.2) and LazyBatching's Serial / GraphB baselines, on hand-worked timelines, under the mechanism's invariants,
by name through dvasim.run, and on the CPU replay.

The hand-worked timelines use a table written to tmp_path whose latencies are dyadic (exact in binary), so every
finish time is exact: one stage of T(b) = 4 + b/4 ms (T(1) = 4.25, T(2) = 4.5, T(3) = 4.75, T(4) = 5,
T(32) = 12), or two stages of 2 + b/8 ms each.
"""

from __future__ import annotations

import random

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dvasim
from dvasim.core.pipeline import Pipeline
from dvasim.engines.sim.engine import simulate
from dvasim.errors import ConfigError
from dvasim.policies import make_policy, policy_names
from tests.conftest import make_table, random_cost_table
from tests.core.test_pipeline_properties import Monitor, run_random_load

PEERS = ("tfserving-nowait", "tfserving-optwait", "tfserving-static", "serial", "graphbatch")


def write_table(path, n_stages=1, fn=lambda s, b: 4 + b / 4, top=32):
    rows = [{"stage": s, "batch_size": b, "latency_ms": float(fn(s, b))} for s in range(n_stages)
            for b in range(1, top + 1)]
    pd.DataFrame(rows).to_csv(path, index=False)
    return str(path)


def run(tmp_path, policy, arrivals, n_stages=1, fn=lambda s, b: 4 + b / 4, instances=1, sharing="exclusive",
        pairs=2):
    table = write_table(tmp_path / "table.csv", n_stages, fn)
    r = dvasim.run({
        "model": {"table": table},
        "policy": policy,
        "workload": {"kind": "explicit", "arrivals_ms": [float(a) for a in arrivals]},
        "engine": {"sharing": sharing, "instances": instances, "buffer_pairs": pairs},
    })
    assert r.stuck is None
    q = r.queries.sort_values("query_id")
    return q["admitted_ms"].tolist(), q["finish_ms"].tolist(), q["exit_batch_size"].astype(int).tolist()


def test_every_peer_is_registered():
    assert set(PEERS) <= set(policy_names())


# ----------------------------------------------------------------------------- TF-Serving NO_Wait
def test_nowait_batches_what_queued_while_busy(tmp_path):
    # q0 (at 0) finds the instance free: runs alone 0 -> T(1) = 4.25. q1-q3 (1, 2, 3) queue meanwhile; at 4.25
    # they leave as one batch of 3: 4.25 + T(3) = 4.25 + 4.75 = 9.0.
    admitted, finish, sizes = run(tmp_path, {"name": "tfserving-nowait"}, [0, 1, 2, 3])
    assert admitted == [0.0, 4.25, 4.25, 4.25]
    assert finish == [4.25, 9.0, 9.0, 9.0]
    assert sizes == [1, 3, 3, 3]


def test_nowait_caps_batches_at_max_batch_size(tmp_path):
    # max 2: q0 0 -> 4.25; {q1, q2} 4.25 -> 4.25 + T(2) = 8.75; {q3, q4} 8.75 -> 13.25
    _, finish, sizes = run(tmp_path, {"name": "tfserving-nowait", "max_batch_size": 2}, [0, 1, 2, 3, 4])
    assert finish == [4.25, 8.75, 8.75, 13.25, 13.25]
    assert sizes == [1, 2, 2, 2, 2]


# ----------------------------------------------------------------------------- TF-Serving OPT_Wait
def test_optwait_leaves_at_the_timeout(tmp_path):
    # default timeout 30 ms: q0 (0), q1 (10), q2 (20) wait until q0 has waited 30 ms: one batch of 3 at 30,
    # finishing 30 + T(3) = 34.75
    admitted, finish, sizes = run(tmp_path, {"name": "tfserving-optwait"}, [0, 10, 20])
    assert admitted == [30.0] * 3
    assert finish == [34.75] * 3
    assert sizes == [3, 3, 3]


def test_optwait_timeout_counts_from_the_oldest_waiting_request(tmp_path):
    # q0 leaves alone at 30 (its timeout), runs 30 -> 34.25. q1 (31), q2 (33) arrive while busy; when the instance
    # frees at 34.25 q1 has waited only 3.25 ms, so the batch waits for q1's timeout at 61 and takes q3 (40) too:
    # {q1, q2, q3} at 61 -> 61 + T(3) = 65.75
    admitted, finish, sizes = run(tmp_path, {"name": "tfserving-optwait"}, [0, 31, 33, 40])
    assert admitted == [30.0, 61.0, 61.0, 61.0]
    assert finish == [34.25, 65.75, 65.75, 65.75]
    assert sizes == [1, 3, 3, 3]


def test_optwait_full_batch_leaves_at_once(tmp_path):
    # max 4: the 4th request (at 3) fills the batch: it leaves at 3, not at 30: 3 + T(4) = 8
    admitted, finish, _ = run(tmp_path, {"name": "tfserving-optwait", "max_batch_size": 4}, [0, 1, 2, 3])
    assert admitted == [3.0] * 4 and finish == [8.0] * 4


# ----------------------------------------------------------------------------- TF-Serving Static
def test_static_takes_max_batch_time_even_for_one_request(tmp_path):
    # one request: leaves at its timeout (30) as OPT_Wait, but runs padded to 32: 30 + T(32) = 30 + 12 = 42
    # (OPT_Wait: 30 + T(1) = 34.25). Records keep the real batch size (1).
    _, finish, sizes = run(tmp_path, {"name": "tfserving-static"}, [0])
    assert finish == [42.0] and sizes == [1]
    _, finish, _ = run(tmp_path, {"name": "tfserving-optwait"}, [0])
    assert finish == [34.25]


def test_static_pads_to_its_own_max_batch_size(tmp_path):
    # max 8, timeout 2: q0, q1 (0, 1) leave at 2, padded to 8: 2 + T(8) = 2 + 6 = 8. A full batch of 8 (all at 10)
    # leaves at once and takes T(8) = 6 as OPT_Wait would: 16.
    _, finish, sizes = run(tmp_path, {"name": "tfserving-static", "max_batch_size": 8, "max_queue_delay_ms": 2},
                           [0, 1] + [10] * 8)
    assert finish == [8.0, 8.0] + [16.0] * 8
    assert sizes == [2, 2] + [8] * 8


def test_static_pads_every_stage_and_the_device_demand():
    # two stages of 2 + b/8 ms (padded to 8: 3 ms each): one request at 0, timeout 0 -> exits at 6, and the device
    # is busy 6 ms (the padded demand); without padding 2 x 2.125 = 4.25
    table = make_table(2, lambda s, b: 2 + b / 8, batch_sizes=range(1, 9))
    for name, want in (("tfserving-static", 6.0), ("tfserving-optwait", 4.25)):
        pipe = Pipeline(table, make_policy(name, {"max_batch_size": 8, "max_queue_delay_ms": 0}), 2)
        res = simulate(pipe, [0.0], [1], sharing="fluid")
        assert res.queries[0].finish == want
        assert res.device_busy_ms == pytest.approx(want)


# ----------------------------------------------------------------------------- LazyBatching Serial and GraphB
def test_serial_runs_one_by_one(tmp_path):
    # q0, q1 at 0, q2 at 1, each alone T(1) = 4.25, in arrival order: 4.25, 8.5, 12.75
    admitted, finish, sizes = run(tmp_path, {"name": "serial"}, [0, 0, 1])
    assert admitted == [0.0, 4.25, 8.5]
    assert finish == [4.25, 8.5, 12.75]
    assert sizes == [1, 1, 1]


def test_serial_with_two_instances_runs_two_at_a_time(tmp_path):
    # parallel sharing (each execution at its table time): q0 and q1 (0) on the two instances 0 -> 4.25; q2 (1)
    # waits for the first free instance: 4.25 -> 8.5
    _, finish, _ = run(tmp_path, {"name": "serial"}, [0, 0, 1], instances=2, sharing="parallel")
    assert finish == [4.25, 4.25, 8.5]


def test_serial_runs_the_whole_model_before_the_next_request(tmp_path):
    # two stages of 2 + 1/8 = 2.125 ms, two buffer pairs: q1 (at 1) does not enter stage 0 while q0 is in stage 1;
    # it starts when q0 exits at 4.25 and exits at 8.5
    admitted, finish, _ = run(tmp_path, {"name": "serial"}, [0, 1], n_stages=2, fn=lambda s, b: 2 + b / 8)
    assert admitted == [0.0, 4.25] and finish == [4.25, 8.5]


def test_graphbatch_window(tmp_path):
    # window 5, max 8: q0-q2 (0, 2, 4) leave when q0 has waited 5: 5 + T(3) = 9.75. q3 (6) waits for its own
    # window (6 + 5 = 11; the instance is free from 9.75): 11 + T(1) = 15.25
    admitted, finish, sizes = run(tmp_path, {"name": "graphbatch", "max_batch_size": 8}, [0, 2, 4, 6])
    assert admitted == [5.0, 5.0, 5.0, 11.0]
    assert finish == [9.75, 9.75, 9.75, 15.25]
    assert sizes == [3, 3, 3, 1]


def test_graphbatch_runs_batches_whole(tmp_path):
    # window 0, two stages of 2 + b/8 ms: q0 alone 0 -> 4.25 (both stages); q1, q2 (1, 2) wait for the whole
    # graph, then leave together: 4.25 + 2 x (2 + 2/8) = 8.75
    admitted, finish, sizes = run(tmp_path, {"name": "graphbatch", "max_batch_size": 8, "window_ms": 0}, [0, 1, 2],
                                  n_stages=2, fn=lambda s, b: 2 + b / 8)
    assert admitted == [0.0, 4.25, 4.25]
    assert finish == [4.25, 8.75, 8.75]
    assert sizes == [1, 2, 2]


def test_resolved_config_lists_the_parameters(tmp_path):
    table = write_table(tmp_path / "table.csv", top=64)
    cfgs = {name: dvasim.run({"model": {"table": table}, "policy": {"name": name},
                              "workload": {"kind": "explicit", "arrivals_ms": [0.0]}}).config["policy"]
            for name in PEERS}
    assert cfgs["tfserving-nowait"] == {"name": "tfserving-nowait", "max_batch_size": 32, "max_queue_delay_ms": 0.0}
    assert cfgs["tfserving-optwait"]["max_queue_delay_ms"] == 30.0
    assert cfgs["tfserving-static"] == {"name": "tfserving-static", "max_batch_size": 32, "max_queue_delay_ms": 30.0}
    assert cfgs["serial"] == {"name": "serial", "max_batch_size": 1}
    assert cfgs["graphbatch"] == {"name": "graphbatch", "max_batch_size": 64, "window_ms": 5.0}


# ----------------------------------------------------------------------------- invariants
def _peer_params(name, max_bs, delay):
    if name == "serial":
        return {}, 1
    if name == "tfserving-nowait":
        return {"max_batch_size": max_bs}, max_bs
    if name == "graphbatch":
        return {"max_batch_size": max_bs, "window_ms": delay}, max_bs
    return {"max_batch_size": max_bs, "max_queue_delay_ms": delay}, max_bs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(PEERS),
    n_stages=st.integers(1, 3),
    n_pairs=st.integers(1, 3),
    max_bs=st.sampled_from([1, 2, 4, 8]),
    delay=st.sampled_from([0.0, 0.3, 2.0, 10.0]),
    n_queries=st.integers(1, 60),
    seed=st.integers(0, 2**31),
    sharing=st.sampled_from(["fluid", "exclusive", "parallel", "cores"]),
    instances=st.integers(1, 2),
)
def test_peer_policies_are_safe_and_live(name, n_stages, n_pairs, max_bs, delay, n_queries, seed, sharing,
                                         instances):
    rng = random.Random(seed)
    table = random_cost_table(rng, n_stages)
    params, cap = _peer_params(name, max_bs, delay)
    pipe = Pipeline(table, make_policy(name, params), n_pairs, instances=instances)
    mon = Monitor(pipe, cap)
    in_lane = {}  # lane -> batches in flight: a batch runs whole, one at a time per instance
    execs = []

    def begin(ex):
        bids = in_lane.setdefault(ex.lane, set())
        bids.add(ex.batch.bid)
        assert len(bids) == 1, f"instance {ex.lane} holds batches {bids}"
        execs.append(ex)

    def finish(ex):
        if ex.stage == n_stages - 1:
            in_lane[ex.lane].discard(ex.batch.bid)

    pipe.on_begin.append(begin)
    pipe.on_finish.append(finish)
    run_random_load(pipe, mon, rng, n_queries, sharing, cap, cores=2)
    # the ops are new only: no stretch, no split
    assert {op[0] for op in pipe.table.log} == {"new"}
    assert pipe.table.counts["n_stretch"] == pipe.table.counts["n_split"] == pipe.table.counts["n_renew"] == 0
    # Static is charged max_bs's time at every execution; the others their own size's
    for ex in execs:
        charged = cap if name == "tfserving-static" else ex.batch_size
        assert ex.standalone_ms == table.latency(ex.stage, charged)
    assert len(pipe.table) == 0 and not any(pipe.queues)


def test_static_padding_is_charged_by_a_host_models_gpu_table_too(tmp_path):
    """The padded size reaches every cost the engine charges: a host model's own GPU table included."""
    from dvasim.model.table import LatencyTable
    from dvasim.server.host import HostModel

    table = LatencyTable.load(write_table(tmp_path / "table.csv", top=8))
    gpu = LatencyTable.load(write_table(tmp_path / "gpu.csv", fn=lambda s, b: 1 + b / 8, top=8))
    host = HostModel(n_stages=1, gpu_table=gpu)
    for name, cap in (("tfserving-static", 8), ("tfserving-optwait", None)):
        pipe = Pipeline(table, make_policy(name, {"max_batch_size": 8, "max_queue_delay_ms": 1.0}))
        execs = []
        pipe.on_begin.append(execs.append)
        simulate(pipe, [0.0, 0.1, 5.0], [1, 1, 1])
        assert execs and all(ex.batch_size < 8 for ex in execs)
        for ex in execs:
            b = cap or ex.batch_size
            assert ex.charged_batch_size == b
            assert host.gpu(ex) == (gpu.latency(ex.stage, b), gpu.demand(ex.stage, b))


# ----------------------------------------------------------------------------- parameters
@pytest.mark.parametrize(
    "name,params,field",
    [
        ("tfserving-nowait", {"max_batch_size": 0}, "policy.max_batch_size"),
        ("tfserving-nowait", {"max_queue_delay_ms": 30}, "policy.max_queue_delay_ms"),
        ("tfserving-nowait", {"preferred_batch_size": 4}, "policy.preferred_batch_size"),
        ("tfserving-optwait", {"max_batch_size": "32"}, "policy.max_batch_size"),
        ("tfserving-optwait", {"max_queue_delay_ms": -1}, "policy.max_queue_delay_ms"),
        ("tfserving-static", {"max_batch_size": True}, "policy.max_batch_size"),
        ("tfserving-static", {"max_queue_delay_ms": float("nan")}, "policy.max_queue_delay_ms"),
        ("serial", {"max_batch_size": 2}, "policy.max_batch_size"),
        ("serial", {"max_queue_delay_ms": 1}, "policy.max_queue_delay_ms"),
        ("graphbatch", {"max_batch_size": -3}, "policy.max_batch_size"),
        ("graphbatch", {"window_ms": -0.5}, "policy.window_ms"),
        ("graphbatch", {"window_ms": "5"}, "policy.window_ms"),
        ("graphbatch", {"max_queue_delay_ms": 5}, "policy.max_queue_delay_ms"),
    ],
)
def test_bad_parameters_name_the_field(name, params, field):
    with pytest.raises(ConfigError) as e:
        make_policy(name, params)
    assert e.value.field == field


def test_default_max_batch_size_beyond_the_table_is_refused(tmp_path):
    table = write_table(tmp_path / "table.csv", top=16)
    with pytest.raises(ConfigError) as e:
        dvasim.run({"model": {"table": table}, "policy": {"name": "tfserving-static"},
                    "workload": {"kind": "explicit", "arrivals_ms": [0.0]}})
    assert e.value.field == "policy.max_batch_size"


# ----------------------------------------------------------------------------- the CPU replay
@pytest.mark.torch
@pytest.mark.parametrize("name", PEERS)
def test_replay_runs_each_peer_policy(name):
    pytest.importorskip("torch")
    from dvasim.engines.replay import replay
    from tests.engines.test_replay import assert_outputs_match

    params = {} if name == "serial" else {"max_batch_size": 4}
    if name in ("tfserving-optwait", "tfserving-static"):
        params["max_queue_delay_ms"] = 2.0
    elif name == "graphbatch":
        params["window_ms"] = 2.0
    c = {
        "model": {"name": "vgg19", "device": "cpu", "stages": 2},
        "policy": {"name": name, **params},
        "workload": {"kind": "poisson", "rate_qps": 400.0, "n_queries": 24, "seed": 3},
        "engine": {"buffer_pairs": 2},
    }
    r = replay(c, record_outputs=True, warmup=0)
    assert r.stuck is None
    assert r.summary["n_completed"] == 24
    assert r.queries["exit_batch_size"].max() <= (1 if name == "serial" else 4)
    assert_outputs_match(r)
    # Static really runs the dummy rows: every stage execution computes 4 rows, whatever its real size; the
    # others run exactly their batch
    ex = pd.DataFrame(r.extra["replay"].executions)
    want = 4 if name == "tfserving-static" else ex["batch_size"]
    assert (ex["rows_run"] == want).all()
    if name == "tfserving-static":
        assert (ex["batch_size"] < 4).any()  # the check above saw real padding
