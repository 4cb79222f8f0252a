"""E2bird (Cui et al., TPDS'21) in dvasim: the memory pool and TF-Serving's on-launch copies ([engine.transfer]),
the multi-granularity engine (one instance per worker, New(lane=k)), N-Ebird (Algorithm 1), E-Ebird (offline search
+ Algorithm 2) and the diurnal load (workload kind "phases").

Hand-worked timelines use dyadic latencies (exact in binary): one stage of T(b) = 4 + b/4 ms, and copies of
1e6 bytes at 1 GB/s = exactly 1 ms per query.
"""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dvasim
from dvasim.core.pipeline import Pipeline
from dvasim.engines.sim.corun import SimCoRun, sim_corun
from dvasim.engines.sim.engine import simulate
from dvasim.errors import ConfigError
from dvasim.policies import make_policy, policy_names
from dvasim.policies.e2bird import combinations, default_max_inf, offline_search
from dvasim.server.transfer import Transfer
from dvasim.workload import workload_from_config
from tests.conftest import make_table, random_cost_table
from tests.core.test_pipeline_properties import Monitor

MS_COPY = {"input_bytes": 1e6, "bandwidth_gbps": 1.0}  # 1 ms per query


def lin(s, b):
    return 4 + b / 4


def write_table(path, fn=lin, top=32, n_stages=1):
    rows = [{"stage": s, "batch_size": b, "latency_ms": float(fn(s, b))} for s in range(n_stages)
            for b in range(1, top + 1)]
    pd.DataFrame(rows).to_csv(path, index=False)
    return str(path)


def run(tmp_path, policy, arrivals, transfer=None, sharing="parallel", engine=None, fn=lin, admission=0.0):
    eng = {"sharing": sharing, "admission_delay_ms": admission, **(engine or {})}
    if transfer is not None:
        eng["transfer"] = transfer
    r = dvasim.run({"model": {"table": write_table(tmp_path / "t.csv", fn)}, "policy": policy,
                    "workload": {"kind": "explicit", "arrivals_ms": [float(a) for a in arrivals]}, "engine": eng})
    assert r.stuck is None
    q = r.queries.sort_values("query_id")
    return q["admitted_ms"].tolist(), q["finish_ms"].tolist(), q["exit_batch_size"].astype(int).tolist(), r


def test_registered():
    assert {"n-ebird", "e-ebird"} <= set(policy_names())


# ----------------------------------------------------------------------------- the paper's Figure 10
def test_figure10_dispatch(tmp_path):
    # workers [1, 1, 2, 4, 8] (lanes 0..4), MaxInf 32, table T(b) = 4 + b/4, no interference (parallel sharing).
    # t=0: 8 inputs ready, Q = [8, 4, 2, 1, 1]: R = 8 -> the worker of 8 (lane 4) takes q0..q7, 0 -> T(8) = 6.
    # t=1: 4 more ready (12 in the pool, 8 of them taken), Q = [4, 2, 1, 1]: R = min(4, 32 - 8) = 4 -> the first
    #      worker of Q, of size 4 (lane 3), takes q8..q11: 1 -> 1 + T(4) = 6.
    # t=6: the worker of 8 is back at the front of Q; t=7: 8 inputs -> it takes them: 7 -> 13.
    table = make_table(1, lin, batch_sizes=range(1, 33))
    pipe = Pipeline(table, make_policy("n-ebird", {"workers": [1, 1, 2, 4, 8], "max_inf": 32}))
    assert pipe.instances == 5
    log = []
    pipe.on_begin.append(lambda ex: log.append((ex.start, ex.lane, [q.qid for q in ex.queries])))
    res = simulate(pipe, [0.0] * 8 + [1.0] * 4 + [7.0] * 8, [1] * 20, sharing="parallel")
    assert res.stuck is None
    assert log == [(0.0, 4, list(range(8))), (1.0, 3, list(range(8, 12))), (7.0, 4, list(range(12, 20)))]
    assert [q.finish for q in res.queries] == [6.0] * 8 + [6.0] * 4 + [13.0] * 8


def test_nebird_waits_for_a_worker_that_fits(tmp_path):
    # workers [4, 1]: 3 inputs at 0 -> R = 3: the 4 does not fit, the 1 takes q0 (0 -> 4.25); q1, q2 stay.
    # q3 at 1: N = 3 -> the 4 does not fit and the 1 is busy: wait. q4 at 2: N = 4 -> the 4 takes q1..q4: 2 -> 7
    admitted, finish, sizes, _ = run(tmp_path, {"name": "n-ebird", "workers": [4, 1], "max_inf": 8},
                                     [0, 0, 0, 1, 2])
    assert admitted == [0.0, 2.0, 2.0, 2.0, 2.0]
    assert finish == [4.25, 7.0, 7.0, 7.0, 7.0]
    assert sizes == [1, 4, 4, 4, 4]


def test_nebird_max_inf_limits_alive_inferences(tmp_path):
    # workers [1, 1, 1], MaxInf 2: three inputs at 0 -> two run (0 -> 4.25), the third waits for one of them
    admitted, finish, _, _ = run(tmp_path, {"name": "n-ebird", "workers": [1, 1, 1], "max_inf": 2}, [0, 0, 0])
    assert admitted == [0.0, 0.0, 4.25] and finish == [4.25, 4.25, 8.5]


def test_default_max_inf_rule():
    # T(b) = 4 + b/4 profiled at 1..32; QoS 30: 2 T(b) <= 30 <=> b <= 44: the table's largest, 32; QoS 20: b <= 24
    table = make_table(1, lin, batch_sizes=range(1, 33))
    assert default_max_inf(table, 30.0, 99) == 32
    assert default_max_inf(table, 20.0, 99) == 24
    assert default_max_inf(table, None, 99) == 99
    # the paper's Table 1 for ResNet-152 (profiled at 4..32, plus 64 > 100 ms): MaxInf 32 at 200 ms, its s = 32
    paper = make_table(1, lambda s, b: float(np.interp(b, [4, 8, 16, 32, 64], [17.3, 29.2, 49.5, 93.7, 137.9])),
                       batch_sizes=[4, 8, 16, 32, 64])
    assert default_max_inf(paper, 200.0, 99) == 32


def test_resolved_config_and_instances(tmp_path):
    _, _, _, r = run(tmp_path, {"name": "n-ebird"}, [0.0])
    assert r.config["policy"]["workers"] == [1, 1, 2, 4, 8, 16]
    assert r.config["policy"]["max_inf"] == 32  # 2 T(32) = 24 <= 200: the table's largest
    assert r.summary["instances"] == 6
    with pytest.raises(ConfigError) as e:
        run(tmp_path, {"name": "n-ebird"}, [0.0], engine={"instances": 3})
    assert e.value.field == "engine.instances"
    _, _, _, r = run(tmp_path, {"name": "n-ebird"}, [0.0], engine={"instances": 6})
    assert r.summary["instances"] == 6


# ----------------------------------------------------------------------------- the memory pool
def test_pool_serial_copies_in_arrival_order(tmp_path):
    # 1 ms per copy. Arrivals 0, 0.5, 3: copies 0 -> 1, 1 -> 2 (q1 queued behind q0's copy), 3 -> 4. Three workers
    # of 1: every query is dispatched when visible and runs T(1) = 4.25.
    pol = {"name": "n-ebird", "workers": [1, 1, 1]}
    admitted, finish, _, _ = run(tmp_path, pol, [0, 0.5, 3], transfer={"mode": "pool", **MS_COPY})
    assert admitted == [1.0, 2.0, 4.0]
    assert finish == [5.25, 6.25, 8.25]
    # with an admission delay of 0.25 the copies start at the front door: 0.25 -> 1.25, 1.25 -> 2.25, 3.25 -> 4.25
    admitted, _, _, _ = run(tmp_path, pol, [0, 0.5, 3], transfer={"mode": "pool", **MS_COPY}, admission=0.25)
    assert admitted == [1.25, 2.25, 4.25]
    # the latency still counts from the arrival; no transfer: visible on arrival
    admitted, _, _, _ = run(tmp_path, pol, [0, 0.5, 3])
    assert admitted == [0.0, 0.5, 3.0]


def test_pool_copy_time_from_bytes_and_bandwidth():
    t = Transfer("pool", input_bytes=602112, bandwidth_gbps=12.0)
    assert t.query_ms() == pytest.approx(602112 / 12e9 * 1e3)
    assert Transfer("pool", 100.0, 2.0, 1.0).query_ms(50) == pytest.approx(200 / 1e6)


def test_pool_in_a_closed_loop(tmp_path):
    # one client, think 0: send at 0, visible 1, runs 1 -> 5.25; next sent at 5.25, visible 6.25 -> 10.5
    r = dvasim.run({"model": {"table": write_table(tmp_path / "t.csv")}, "policy": {"name": "n-ebird"},
                    "workload": {"kind": "closed", "clients": 1, "n_queries": 2},
                    "engine": {"sharing": "parallel", "transfer": {"mode": "pool", **MS_COPY}}})
    assert r.queries.sort_values("query_id")["finish_ms"].tolist() == [5.25, 10.5]


# ----------------------------------------------------------------------------- TF-Serving's copies on launch
def test_on_launch_copies_the_batch_before_computing(tmp_path):
    # NO_Wait: q0 alone at 0: copy 1 ms, compute T(1) = 4.25 -> 5.25. q1-q3 (1, 2, 3) leave together at 5.25:
    # copy 3 ms (-> 8.25), compute T(3) = 4.75 -> 13.0
    admitted, finish, sizes, _ = run(tmp_path, {"name": "tfserving-nowait"}, [0, 1, 2, 3],
                                     transfer={"mode": "on_launch", **MS_COPY})
    assert admitted == [0.0, 5.25, 5.25, 5.25]
    assert finish == [5.25, 13.0, 13.0, 13.0]
    assert sizes == [1, 3, 3, 3]


def test_on_launch_copies_the_padded_rows(tmp_path):
    # Static, max 8, timeout 2: q0 leaves at 2 padded to 8: copy 8 ms (-> 10), compute T(8) = 6 -> 16
    _, finish, _, _ = run(tmp_path, {"name": "tfserving-static", "max_batch_size": 8, "max_queue_delay_ms": 2},
                          [0], transfer={"mode": "on_launch", **MS_COPY})
    assert finish == [16.0]


def test_on_launch_copies_share_one_link(tmp_path):
    # two instances, batches of 1, both at 0: copies 0 -> 1 and 1 -> 2 (one link); finishes 5.25 and 6.25
    _, finish, _, _ = run(tmp_path, {"name": "zerobatch", "max_batch_size": 1}, [0, 0],
                          transfer={"mode": "on_launch", **MS_COPY}, engine={"instances": 2})
    assert sorted(finish) == [5.25, 6.25]


def test_on_launch_with_the_host_model(tmp_path):
    # [engine.host] with no launch cost: the copy (1 ms) still comes before the GPU time: 1 + 4.25
    _, finish, _, _ = run(tmp_path, {"name": "tfserving-nowait"}, [0], transfer={"mode": "on_launch", **MS_COPY},
                          engine={"host": {"launch_ms": [0.0], "copy_ms": 0.0}})
    assert finish == [5.25]


def test_transfer_none_is_the_default(tmp_path):
    a = run(tmp_path, {"name": "tfserving-nowait"}, [0, 1, 2, 3])[1]
    b = run(tmp_path, {"name": "tfserving-nowait"}, [0, 1, 2, 3], transfer={"mode": "none"})[1]
    assert a == b == [4.25, 9.0, 9.0, 9.0]


# ----------------------------------------------------------------------------- E-Ebird's offline search
def _ps_average(works):
    """Average finish time of jobs of ``works`` sharing one processor equally (every demand 1), closed form."""
    ws = sorted(works)
    t, prev, n, ends = 0.0, 0.0, len(ws), []
    for k, w in enumerate(ws):
        t += (n - k) * (w - prev)
        prev = w
        ends.append(t)
    return sum(ends) / n


def _partitions(total, parts=(32, 16, 8, 4, 2, 1)):
    """Multisets of powers of two summing to ``total`` (a second enumeration: largest part first)."""
    if total == 0:
        yield ()
        return
    for i, p in enumerate(parts):
        if p <= total:
            for rest in _partitions(total - p, parts[i:]):
                yield (p, *rest)


def test_combinations_match_an_independent_enumeration():
    for total in (4, 8, 16, 32):
        mine = {tuple(sorted((s for s, c in zip((1, 2, 4, 8, 16, 32), counts) for _ in range(c)), reverse=True))
                for counts in combinations(total)}
        assert mine == set(_partitions(total))
    assert len(combinations(4)) == 4  # [4], [2,2], [2,1,1], [1,1,1,1]


def test_offline_search_linear_table_is_processor_sharing():
    # T(b) = b: every batch saturates (demand 1), so co-running workers share the device equally: the average
    # latency is that of processor sharing, closed form. For TotalBS = 4: [1,1,2] (3 + 3 + 4)/3 = 10/3 beats [4],
    # [2,2] (4) and [1,1,1,1] (4).
    table = make_table(1, lambda s, b: float(b), batch_sizes=range(1, 33))
    best = offline_search(table, (4, 8, 16, 32), SimCoRun(table))
    assert best[4] == (2, 1, 0, 0, 0, 0)
    for total in (4, 8, 16, 32):
        scored = sorted((_ps_average(p), len(p), tuple(-x for x in p), p) for p in _partitions(total))
        want = scored[0][3]
        got = tuple(s for s, c in zip((32, 16, 8, 4, 2, 1), reversed(best[total])) for _ in range(c))
        assert got == want, total


def test_offline_search_flat_table_ties_to_the_fewest_workers():
    # T(b) = 10 for every b: demand b/32, so any TotalBS <= 32 runs at full speed: every combination averages 10;
    # the tie goes to one worker of TotalBS
    table = make_table(1, lambda s, b: 10.0, batch_sizes=range(1, 33))
    best = offline_search(table, (4, 8, 16, 32), SimCoRun(table))
    assert best == {4: (0, 0, 1, 0, 0, 0), 8: (0, 0, 0, 1, 0, 0), 16: (0, 0, 0, 0, 1, 0), 32: (0, 0, 0, 0, 0, 1)}


def test_eebird_engine_and_online_configuration(tmp_path):
    # flat table: configurations [4], [8], [16], [32] + the default 1 and 2 -> workers [32, 16, 8, 4, 2, 1].
    # 5 inputs at 0: MemState 5 -> TotalBS 4's [4] takes q0..q3; MemState 1 -> the default {1, 2}: the 1 takes q4.
    # 11 inputs at 20: MemState 11 -> [8] takes 8; then 3 -> {1, 2}: the 2 takes 2, then the 1 takes the last.
    admitted, finish, sizes, r = run(tmp_path, {"name": "e-ebird"}, [0] * 5 + [20] * 11, fn=lambda s, b: 10.0)
    assert r.config["policy"]["engine_workers"] == [32, 16, 8, 4, 2, 1]
    assert r.summary["instances"] == 6
    assert sizes == [4] * 4 + [1] + [8] * 8 + [2] * 2 + [1]
    assert admitted == [0.0] * 5 + [20.0] * 11 and finish == [10.0] * 5 + [30.0] * 11


def test_eebird_configuration_limits_busy_workers_per_size():
    """CurConf bounds the workers *busy* per batch size: a worker busy from an earlier dispatch counts against its
    size's allowance (hand-worked on an engine [4, 1, 1, 1] with the configuration {1: 2} at MemState 2)."""
    from types import SimpleNamespace

    from dvasim.policies.e2bird import EEbird

    pol = EEbird(total_bs=[2])
    pol.sizes = [4, 1, 1, 1]
    pol.engine_confs, pol._levels = {2: (2, 0, 0, 0, 0, 0)}, [2]  # TotalBS 2: two workers of 1
    pol._lanes_of = {4: [0], 1: [1, 2, 3]}
    free = {0, 1, 2, 3}
    pol.view = SimpleNamespace(free_lane_indices=lambda: sorted(free))
    assert pol.current_conf(2) == {1: 2} and pol.current_conf(1) == {1: 1, 2: 1}  # below TotalBS 2: defaults
    assert pol.idle_queue(2, set()) == [1, 2]  # two of the three idle 1s, in index order
    free.discard(1)  # lane 1 busy: one 1 left to give
    assert pol.idle_queue(2, set()) == [2]
    assert pol.idle_queue(2, {2}) == []  # lane 2 taken in this round: both allowed 1s are busy
    assert pol.idle_queue(1, set()) == []  # the defaults allow one 1 (busy) and a 2 (none in this engine)
    free.discard(0)
    assert pol.idle_queue(2, set()) == [2]  # the busy 4 is no 1: it does not count


def test_eebird_levels_above_max_inf_are_not_profiled(tmp_path):
    _, _, _, r = run(tmp_path, {"name": "e-ebird", "max_inf": 8}, [0], fn=lambda s, b: 10.0)
    assert set(r.config["policy"]["engine_confs"]) == {"4", "8"}
    assert r.config["policy"]["engine_workers"] == [8, 4, 2, 1]


# ----------------------------------------------------------------------------- invariants
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(["n-ebird", "e-ebird"]),
    n_stages=st.integers(1, 3),
    workers=st.lists(st.sampled_from([1, 2, 4, 8]), min_size=0, max_size=4).map(lambda w: [1, *w]),
    max_inf=st.sampled_from([None, 1, 4, 8, 16]),
    n_queries=st.integers(1, 60),
    seed=st.integers(0, 2**31),
    sharing=st.sampled_from(["fluid", "exclusive", "parallel"]),
    transfer=st.sampled_from([None, "pool"]),
)
def test_ebird_is_safe_and_live(name, n_stages, workers, max_inf, n_queries, seed, sharing, transfer):
    rng = random.Random(seed)
    table = random_cost_table(rng, n_stages, top=32)
    if name == "n-ebird":
        if max_inf is not None and max_inf < min(workers):
            max_inf = min(workers)
        params = {"workers": workers, "max_inf": max_inf}
    else:
        params = {"max_inf": max_inf, "total_bs": [4, 8]}
    pol = make_policy(name, params)
    pipe = Pipeline(table, pol, 2, qos_target_ms=rng.choice([None, 5.0, 50.0]), corun=sim_corun(pol, table))
    pol = pipe.policy
    mon = Monitor(pipe, max(pol.sizes))
    lane_batch = {}
    errors = []

    def begin(ex):
        if ex.stage == 0:
            if ex.lane in lane_batch:
                errors.append(f"worker {ex.lane} got batch {ex.batch.bid} while running {lane_batch[ex.lane]}")
            lane_batch[ex.lane] = ex.batch.bid
            if ex.batch.bs != pol.sizes[ex.lane]:
                errors.append(f"worker {ex.lane} of size {pol.sizes[ex.lane]} got a batch of {ex.batch.bs}")
        if pipe.active_queries() > pol.max_inf_used:
            errors.append(f"{pipe.active_queries()} alive > MaxInf {pol.max_inf_used}")

    def finish(ex):
        if ex.stage == n_stages - 1:
            lane_batch.pop(ex.lane, None)

    pipe.on_begin.append(begin)
    pipe.on_finish.append(finish)
    arrivals = sorted(rng.uniform(0, 20) if rng.random() < 0.8 else rng.choice([0.0, 5.0]) for _ in range(n_queries))
    tr = None if transfer is None else Transfer("pool", 1e5, 0.0, 1.0)
    res = simulate(pipe, arrivals, [1] * n_queries, sharing=sharing, transfer=tr)
    assert res.stuck is None, res.stuck
    assert errors == [] and mon.errors == [], (errors + mon.errors)[:5]
    assert sorted(mon.exits) == list(range(n_queries)) and set(mon.exits.values()) == {1}
    for q in res.queries:
        assert q.done and q.finish >= q.arrival
        if transfer:
            assert q.seen >= q.arrival + 0.1 - 1e-9  # visible only after its own copy (0.1 ms)
    assert {op[0] for op in pipe.table.log} == {"new"}
    assert len(pipe.table) == 0 and not any(pipe.queues)


def test_same_seed_same_results(tmp_path):
    cfg = {"model": {"name": "resnet152", "device": "titanrtx", "stages": 1}, "policy": {"name": "e-ebird"},
           "workload": {"kind": "phases", "phases": [{"n": 40, "rate_qps": 40}, {"n": 60, "rate_qps": 300}],
                        "seed": 4},
           "engine": {"transfer": {"mode": "pool"}}}
    ra = dvasim.run(cfg)
    a, b = ra.queries, dvasim.run(cfg).queries
    pd.testing.assert_frame_equal(a, b)
    # the records carry each query's phase rate, and the resolved config the copy model as run (its defaults too)
    assert a["offered_qps"].tolist() == [40.0] * 40 + [300.0] * 60
    assert ra.config["engine"]["transfer"] == {"mode": "pool", "input_bytes": 602112.0, "input_bytes_per_token": 0.0,
                                               "bandwidth_gbps": 12.0}
    assert ra.summary["instances"] == len(ra.config["policy"]["engine_workers"])


# ----------------------------------------------------------------------------- the diurnal load
def test_phases_workload():
    wl = workload_from_config({"kind": "phases", "phases": [{"n": 3, "rate_qps": 10}, {"n": 2, "rate_qps": 1000}],
                               "poisson": False}, needs_seq_len=False)
    assert wl.arrivals_ms.tolist() == [100.0, 200.0, 300.0, 301.0, 302.0]
    wl = workload_from_config({"kind": "phases", "phases": [{"n": 150, "rate_qps": 20},
                                                            {"n": 250, "rate_qps": 400}], "seed": 2},
                              needs_seq_len=False)
    gaps = np.diff(np.concatenate([[0.0], wl.arrivals_ms]))
    assert len(gaps) == 400
    # mean gaps near 50 ms and 2.5 ms (exponential: 4-sigma bounds)
    assert abs(gaps[:150].mean() - 50) < 4 * 50 / np.sqrt(150)
    assert abs(gaps[150:].mean() - 2.5) < 4 * 2.5 / np.sqrt(250)


@pytest.mark.parametrize("section,field", [
    ({"kind": "phases"}, "workload.phases"),
    ({"kind": "phases", "phases": []}, "workload.phases"),
    ({"kind": "phases", "phases": [{"n": 3}]}, "workload.phases[0]"),
    ({"kind": "phases", "phases": [{"n": 0, "rate_qps": 3}]}, "workload.phases[0].n"),
    ({"kind": "phases", "phases": [{"n": 3, "rate_qps": -1}]}, "workload.phases[0].rate_qps"),
    ({"kind": "phases", "phases": [{"n": 3, "rate_qps": 1}], "poisson": "yes"}, "workload.poisson"),
    ({"kind": "phases", "phases": [{"n": 3, "rate_qps": 1}], "rate_qps": 3}, "workload.rate_qps"),
])
def test_phases_bad_input(section, field):
    with pytest.raises(ConfigError) as e:
        workload_from_config(section, needs_seq_len=False)
    assert e.value.field == field


# ----------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("name,params,field", [
    ("n-ebird", {"workers": []}, "policy.workers"),
    ("n-ebird", {"workers": [1, 0]}, "policy.workers"),
    ("n-ebird", {"workers": [2, 4]}, "policy.workers"),
    ("n-ebird", {"workers": "1,2"}, "policy.workers"),
    ("n-ebird", {"workers": [1] * 65}, "policy.workers"),
    ("n-ebird", {"max_inf": 0}, "policy.max_inf"),
    ("n-ebird", {"max_inf": 2.5}, "policy.max_inf"),
    ("e-ebird", {"total_bs": [4, 4]}, "policy.total_bs"),
    ("e-ebird", {"total_bs": [0]}, "policy.total_bs"),
    ("e-ebird", {"total_bs": [512]}, "policy.total_bs"),
    ("e-ebird", {"total_bs": [4, 128]}, "policy.total_bs"),  # beyond MAX_TOTAL_BS: minutes of offline search
    ("e-ebird", {"workers": [1]}, "policy.workers"),
])
def test_bad_parameters_name_the_field(name, params, field):
    with pytest.raises(ConfigError) as e:
        make_policy(name, params)
    assert e.value.field == field


def test_bad_parameters_against_the_table(tmp_path):
    with pytest.raises(ConfigError) as e:  # a worker beyond the table's 32
        run(tmp_path, {"name": "n-ebird", "workers": [1, 64]}, [0.0])
    assert e.value.field == "policy.workers"
    with pytest.raises(ConfigError) as e:  # MaxInf 0 is refused in a run too (every engine has a worker of 1)
        run(tmp_path, {"name": "n-ebird", "workers": [4, 8, 1], "max_inf": 0}, [0.0])
    assert e.value.field == "policy.max_inf"


@pytest.mark.parametrize("transfer,field", [
    ({"mode": "fast"}, "engine.transfer.mode"),
    ({"mode": "pool", "bandwidth_gbps": 0}, "engine.transfer.bandwidth_gbps"),
    ({"mode": "pool", "input_bytes": -1}, "engine.transfer.input_bytes"),
    ({"mode": "pool", "bytes": 3}, "engine.transfer.bytes"),
    ("pool", "engine.transfer"),
])
def test_bad_transfer_names_the_key(tmp_path, transfer, field):
    with pytest.raises(ConfigError) as e:
        run(tmp_path, {"name": "n-ebird"}, [0.0], transfer=transfer)
    assert e.value.field == field


def test_transfer_override_sets_a_subkey(tmp_path):
    r = dvasim.run({"model": {"table": write_table(tmp_path / "t.csv")}, "policy": {"name": "n-ebird"},
                    "workload": {"kind": "explicit", "arrivals_ms": [0.0]}, "engine": {"sharing": "parallel"}},
                   overrides=["engine.transfer.mode=pool", "engine.transfer.input_bytes=1e6",
                              "engine.transfer.bandwidth_gbps=1.0"])
    assert r.queries["finish_ms"].tolist() == [5.25]


# ----------------------------------------------------------------------------- the CPU replay
@pytest.mark.torch
@pytest.mark.parametrize("name", ["n-ebird", "e-ebird"])
def test_replay_runs_each_ebird_policy(name):
    pytest.importorskip("torch")
    from dvasim.engines.replay import replay
    from tests.engines.test_replay import assert_outputs_match

    params = {"workers": [1, 2, 4]} if name == "n-ebird" else {"total_bs": [4]}
    c = {
        "model": {"name": "vgg19", "device": "cpu", "stages": 1},
        "policy": {"name": name, **params},
        "workload": {"kind": "poisson", "rate_qps": 400.0, "n_queries": 24, "seed": 3},
    }
    r = replay(c, record_outputs=True, warmup=0)
    assert r.stuck is None
    assert r.summary["n_completed"] == 24
    sizes = set(r.extra["setup"].policy.sizes)
    assert set(r.queries["exit_batch_size"]) <= sizes
    assert r.summary["instances"] == len(r.extra["setup"].policy.sizes) > 1  # one instance per worker
    assert_outputs_match(r)
    if name == "e-ebird":  # the offline search measured its co-runs on the replay's own stages
        prof = r.config["policy"]["corun_profile"]
        assert prof["source"] == "measured" and prof["on"] == "real torchscript stages on cpu"
        assert prof["combinations"] == len(combinations(4)) and "search_costs" not in r.config["policy"]


def test_eebird_without_a_profiler_is_refused():
    # the offline search runs where the policy runs: a pipeline whose engine supplies no profiler is refused
    table = make_table(1, lambda s, b: 10.0, batch_sizes=range(1, 33))
    with pytest.raises(ConfigError, match="engine running it must supply") as e:
        Pipeline(table, make_policy("e-ebird", {}), 2)
    assert e.value.field == "policy"
    assert sim_corun(make_policy("n-ebird", {}), table) is None  # N-Ebird profiles nothing


class CountingProfiler:
    """A profiler that answers from a formula and counts the questions (the protocol is all the search needs)."""

    def __init__(self, key="counting"):
        self.asked: list[tuple] = []
        self.key = key

    def average_ms(self, batch_sizes, seq_len):
        self.asked.append((tuple(batch_sizes), seq_len))
        return float(max(batch_sizes)) + 0.5 * len(batch_sizes)  # made up: fewer, smaller workers win

    def cache_key(self):
        return self.key

    def describe(self):
        return {"corun_profile": {"source": "counting"}}


def test_offline_search_asks_the_injected_profiler_and_caches_only_computed_answers():
    table = make_table(1, lambda s, b: 3.0 + b / 7, batch_sizes=range(1, 9))  # sizes up to 8
    prof = CountingProfiler(key=("counting", 1))
    best = offline_search(table, (4, 8), prof)
    assert len(prof.asked) == len(combinations(4, (1, 2, 4, 8))) + len(combinations(8, (1, 2, 4, 8)))
    assert max(max(b) for b, _ in prof.asked) == 8 and {L for _, L in prof.asked} == {None}
    # TotalBS 4: [2, 2] and [1, 1, 1, 1] both 3.0, the tie to fewer workers; TotalBS 8: [2, 2, 2, 2] at 4.0
    assert best[4] == (0, 2, 0, 0, 0, 0) and best[8] == (0, 4, 0, 0, 0, 0)
    n = len(prof.asked)
    offline_search(table, (4, 8), prof)
    assert len(prof.asked) == n  # cached per (table, loads, length, key)
    measured = CountingProfiler(key=None)
    offline_search(table, (4,), measured)
    offline_search(table, (4,), measured)
    assert len(measured.asked) == 2 * len(combinations(4, (1, 2, 4, 8)))  # measurements: never reused
    pol = make_policy("e-ebird", {"total_bs": [4]})
    Pipeline(table, pol, 2, corun=measured)
    assert pol.describe()["corun_profile"] == {"source": "counting"}


# ----------------------------------------------------------------------------- the replay's co-run profiler
def _replay_setup(modules="torchscript"):
    from dvasim.engines.replay import prepare

    return prepare({"model": {"name": "vgg19", "device": "cpu", "stages": 2}, "policy": {"name": "n-ebird"},
                    "workload": {"kind": "poisson", "rate_qps": 400.0, "n_queries": 4, "seed": 3},
                    "replay": {"modules": modules}})


@pytest.mark.torch
def test_replay_profiler_measures_co_runs_on_the_cpu():
    pytest.importorskip("torch")
    from dvasim.engines.replay.corun import ReplayCoRun

    setup = _replay_setup()
    prof = ReplayCoRun(setup.model, setup.stages, warmup=1, repeats=2)
    one, four = prof.average_ms((4,), None), prof.average_ms((1, 1, 1, 1), None)
    assert 0 < one < float("inf") and 0 < four < float("inf")  # wall-clock: no values asserted
    assert prof.measured == 2 and prof.average_ms((1, 1, 1, 1), None) == four  # cached per combination
    assert prof.average_ms((1, 2, 1), None) == prof.average_ms((2, 1, 1), None) and prof.measured == 3
    assert prof.cache_key() is None and prof.describe()["corun_profile"]["combinations"] == 3


@pytest.mark.torch
def test_replay_profiler_cuda_path_one_stream_per_worker():
    """On a GPU every worker's pass runs on its own stream (through the CudaOps object) and its thread waits for
    its own event only; the device is synchronised once, before the timed runs. Checked with the recording
    stand-in; with CUDA graphs (captured per worker slot) every replay runs inside its own worker's stream."""
    pytest.importorskip("torch")
    from dvasim.engines.replay.corun import ReplayCoRun
    from tests.engines.test_replay_cuda_discipline import RecordingCudaOps

    for modules in ("eager", "cudagraph"):
        setup = _replay_setup("eager")
        ops = RecordingCudaOps()
        prof = ReplayCoRun(setup.model, setup.stages, device="cuda", modules=modules, ops=ops, warmup=1, repeats=1)
        assert prof.average_ms((2, 1, 1), None) > 0
        log = ops.log
        assert [e[1] for e in log if e[0] == "new_stream"] == [("corun", k) for k in range(3)]
        launches = [e for e in log if e[0] == "launch"]
        assert sorted(e[1] for e in launches) == [("corun", k) for k in range(3) for _ in range(2)]  # 2 rounds
        for e in launches:  # from the worker's own thread
            assert e[-1] == f"dvasim-corun-{e[1][1]}"
        syncs = [e for e in log if e[0] == "sync"]
        assert len(syncs) == 6 and all(e[-1] == f"dvasim-corun-{e[1][1]}" for e in syncs)  # own event only
        kinds = [e[0] for e in log]
        assert kinds.count("device_sync") == 1 and kinds.index("device_sync") < kinds.index("launch")
        if modules == "cudagraph":
            replays = [e for e in log if e[0] == "replay"]
            assert len(replays) == 2 * 3 * 2  # rounds x workers x stages
            for e in replays:  # a worker's graphs (its slot's pool) replay inside its own stream
                assert e[1][0] == "corun" and e[2][0] == "pool" and e[2][1][:2] == e[1]

