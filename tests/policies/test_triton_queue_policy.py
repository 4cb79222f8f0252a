"""Triton's dynamic batcher with its queue policy and priority levels (policy "triton", issue 24 item 4), against
independent truth: the M/D/1/K queue's blocking probability (an embedded Markov chain, computed here), the cases
of Triton's own queue tests (triton-inference-server/server qa/L0_model_queue: model_queue_test.py and
test.sh), hand-worked arrival sequences, and a second implementation (delaybatch / zerobatch where Triton's
rules coincide with theirs)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from dvasim.core.pipeline import Pipeline, PolicyError
from dvasim.core.query import Query
from dvasim.engines.sim.engine import simulate
from dvasim.errors import ConfigError
from dvasim.policies import make_policy
from dvasim.reporting.metrics import records_frame, summarize
from dvasim.reporting.records import STATUSES, status_codes
from dvasim.reporting.stability import stability
from dvasim.workload import poisson_arrivals
from tests.conftest import make_table


def run(params, arrivals, service=10.0, priorities=None, instances=1, top=64, name="triton"):
    """Queries through a one-stage model taking ``service`` ms at any batch size (exclusive device)."""
    table = make_table(1, lambda s, b: service, batch_sizes=range(1, top + 1))
    pipe = Pipeline(table, make_policy(name, params), 1, instances=instances, priorities=priorities)
    res = simulate(pipe, np.asarray(arrivals, dtype=float), np.ones(len(arrivals), dtype=int), sharing="exclusive")
    assert res.stuck is None  # refused queries left: the engine is not kept waiting for them
    return res.queries, pipe


def statuses(qs):
    return [q.status for q in qs]


# ----------------------------------------------------------------------------- max_queue_size
def md1k_blocking(rho: float, capacity: int) -> float:
    """Blocking probability of the M/D/1/N queue (N = ``capacity``, the one in service included): the embedded
    chain at departures on 0..N-1 (a departure leaves i - 1 + A behind, at most N - 1; A ~ Poisson(rho)
    arrivals during a service), then P_block = 1 - 1 / (pi_0 + rho) (Gross & Harris, M/G/1/K)."""
    a = [math.exp(-rho) * rho ** k / math.factorial(k) for k in range(capacity + 1)]
    P = np.zeros((capacity, capacity))
    for i in range(capacity):
        base = max(i - 1, 0)
        for j in range(base, capacity):
            k = j - base
            P[i, j] = a[k] if j < capacity - 1 else 1.0 - sum(a[:k])
    w, v = np.linalg.eig(P.T)
    pi = np.real(v[:, np.argmin(abs(w - 1.0))])
    pi /= pi.sum()
    return 1.0 - 1.0 / (pi[0] + rho)


def test_blocking_formula_matches_erlang_loss_for_one_place():
    # N = 1 (no waiting room) is Erlang's loss formula for one server: rho / (1 + rho), whatever the service law
    assert md1k_blocking(0.7, 1) == pytest.approx(0.7 / 1.7, abs=1e-12)


@pytest.mark.parametrize("rho,K", [(0.9, 3), (1.5, 2)])
def test_max_queue_size_rejections_match_md1k_blocking(rho, K):
    # a single instance serving one request at a time (max_batch_size 1) with a queue of K: an M/D/1/(K+1) queue
    T, n = 1.0, 20_000
    arrivals = poisson_arrivals(rho / T * 1000.0, n, seed=7)
    qs, _ = run({"max_batch_size": 1, "max_queue_size": K}, arrivals, service=T, top=1)
    rejected = statuses(qs).count("rejected") / n
    # over 3 seeds of 40,000 the estimate was within 0.002 of the formula; 0.012 is > 4 standard errors here
    assert rejected == pytest.approx(md1k_blocking(rho, K + 1), abs=0.012)
    served = [q for q in qs if q.status == "ok"]
    assert len(served) + statuses(qs).count("rejected") == n
    assert all(q.finish - q.seen <= (K + 1) * T + 1e-9 for q in served)  # never more than K ahead of it


def test_triton_qa_max_queue_size_two_of_ten_rejected():
    # qa/L0_model_queue test_max_queue_size: max_queue_size 8, preferred [4, 8], a model taking 5 s; a batch of
    # 8 is sent first (it executes at once), then 10 requests 0.5 s later: "exactly two" are rejected at once
    arrivals = [0.0] * 8 + [500.0] * 10
    params = {"max_batch_size": 32, "preferred_batch_size": [4, 8], "max_queue_size": 8}
    qs, _ = run(params, arrivals, service=5000.0)
    assert statuses(qs) == ["ok"] * 16 + ["rejected"] * 2
    assert [q.exit_batch_size for q in qs[:16]] == [8] * 16
    assert all(1000 < q.latency < 5999 for q in qs[:8])  # the test's bounds on the first request
    assert all(q.finish == 10_000.0 for q in qs[8:16])
    assert all(math.isnan(q.finish) and q.seen == 500.0 for q in qs[16:])


def test_each_level_has_its_own_queue_size():
    # level 1 holds at most 1, level 2 (the default policy) at most 3; the instance is busy with query 0
    prio = [2, 1, 1, 2, 2, 2, 2]
    params = {"max_batch_size": 1, "priority_levels": 2, "default_priority_level": 2, "max_queue_size": 3,
              "priority_queue_policy": {1: {"max_queue_size": 1}}}
    qs, _ = run(params, [0.0, 1, 2, 3, 4, 5, 6], priorities=prio)
    assert statuses(qs) == ["ok", "ok", "rejected", "ok", "ok", "ok", "rejected"]


# ----------------------------------------------------------------------------- timeouts
def test_timeouts_reject_what_is_still_queued():
    # service 10 ms; requests at 0, 1, 2, 3 with a 5 ms timeout: 0 runs 0-10, the others time out at 6, 7, 8
    qs, pipe = run({"max_batch_size": 1, "default_timeout_ms": 5.0}, [0.0, 1.0, 2.0, 3.0])
    assert statuses(qs) == ["ok", "timed_out", "timed_out", "timed_out"]
    assert qs[0].finish == 10.0 and all(math.isnan(q.finish) for q in qs[1:])
    assert pipe.n_exited == 4 and pipe.n_unserved == 3


def test_at_its_deadline_a_request_is_batched_if_an_instance_is_free_else_it_times_out():
    # Triton rejects only past the deadline (now > timeout, scheduler_utils.cc ApplyPolicy): at the instant of
    # the deadline the batcher may still take it; if it does not, it times out then
    table = make_table(1, lambda s, b: 10.0, batch_sizes=[1])
    for free_first, want in ((True, "ok"), (False, "timed_out")):
        pipe = Pipeline(table, make_policy("triton", {"max_batch_size": 1, "default_timeout_ms": 5.0}), 1)
        first, late = Query(0, 0.0), Query(1, 5.0)
        pipe.arrive(first, 0.0)
        [ex] = pipe.step(0.0)
        pipe.arrive(late, 5.0)
        assert pipe.step(5.0) == [] and pipe.wakeup_time() == 10.0  # busy; wake at the deadline
        if free_first:
            pipe.finish(ex, 10.0)
        pipe.step(10.0)
        assert late.status == want and (late.batch_id != -1) == (want == "ok")


def test_delay_moves_timed_out_requests_behind_the_others():
    # DELAY: 1, 2, 3 time out while 0 runs; 4 arrives at 9 and has not: it goes first at 10, then 1, 2, 3
    qs, _ = run({"max_batch_size": 1, "default_timeout_ms": 5.0, "timeout_action": "DELAY"},
                [0.0, 1.0, 2.0, 3.0, 9.0])
    assert statuses(qs) == ["ok"] * 5
    assert [q.finish for q in qs] == [10.0, 30.0, 40.0, 50.0, 20.0]


def test_triton_qa_policy_delay_and_reject():
    # qa/L0_model_queue test_policy_delay / test_policy_reject: preferred [4, 8], a 10 s batch delay, a 100 ms
    # timeout; one request, then 0.2 s later 4 rows (two requests of 2 there, four one-row queries here)
    arrivals = [0.0] + [200.0] * 4
    base = {"max_batch_size": 8, "preferred_batch_size": [4, 8], "max_queue_delay_ms": 10_000.0,
            "default_timeout_ms": 100.0}
    qs, _ = run({**base, "timeout_action": "DELAY"}, arrivals, service=1.0)
    # the four make a preferred batch at once (< 100 ms); the first, delayed, waits out the 10 s window
    assert all(q.latency < 100 for q in qs[1:]) and 10_000 < qs[0].latency < 15_000
    qs, _ = run({**base, "timeout_action": "REJECT"}, arrivals, service=1.0)
    assert statuses(qs) == ["timed_out", "ok", "ok", "ok", "ok"]  # "only one error for rejection"
    assert all(q.latency < 100 for q in qs[1:])


# ----------------------------------------------------------------------------- priorities
def test_the_highest_level_is_served_first_then_arrival_order():
    # 0 (level 2) runs 0-10; then 1 (2), 2 (1), 3 (2), 4 (1) wait: level 1 first (2, 4), then 1, 3
    qs, _ = run({"max_batch_size": 1, "priority_levels": 2, "default_priority_level": 2},
                [0.0, 1.0, 2.0, 3.0, 4.0], priorities=[2, 2, 1, 2, 1])
    assert [q.finish for q in qs] == [10.0, 40.0, 20.0, 50.0, 30.0]


def test_priority_zero_or_unknown_goes_to_the_default_level():
    # InferenceRequest::SetPriority: 0 or a level above priority_levels -> default_priority_level (1 here)
    qs, _ = run({"max_batch_size": 1, "priority_levels": 2, "default_priority_level": 1},
                [0.0, 1.0, 2.0, 3.0], priorities=[2, 2, 0, 7])
    assert [q.finish for q in qs] == [10.0, 40.0, 20.0, 30.0]


def test_a_delayed_request_stays_ahead_of_lower_levels():
    # level 1 DELAYs after 5 ms; 1 (level 1) is delayed at 6, 2 (level 2) arrives at 2: 1 still goes first
    params = {"max_batch_size": 1, "priority_levels": 2, "default_priority_level": 2,
              "priority_queue_policy": {"1": {"timeout_action": "DELAY", "default_timeout_ms": 5.0}}}
    qs, _ = run(params, [0.0, 1.0, 2.0], priorities=[2, 1, 2])
    assert [q.finish for q in qs] == [10.0, 20.0, 30.0]


def test_a_batch_takes_the_highest_levels_first():
    qs, _ = run({"max_batch_size": 2, "priority_levels": 3, "default_priority_level": 3},
                [0.0, 1.0, 2.0, 3.0, 4.0], priorities=[3, 3, 2, 3, 1])
    assert [q.admitted for q in qs] == [0.0, 20.0, 10.0, 20.0, 10.0]


# ----------------------------------------------------------------------------- Triton's batch rule
def test_a_preferred_size_goes_before_max_batch_size_until_the_delay_is_exceeded():
    # GetDynamicBatch: query 0 leaves alone (preferred 1); 40 queue while it runs; at 10, with preferred [1, 8]
    # and max 32, batches of 8 leave while the delay is not exceeded (batcher.md: "the largest possible preferred
    # size"); delaybatch would send 32
    arrivals = [0.0] + [1.0] * 40
    params = {"max_batch_size": 32, "preferred_batch_size": [1, 8]}
    qs, _ = run({**params, "max_queue_delay_ms": 100.0}, arrivals)
    assert [q.exit_batch_size for q in qs] == [1] + [8] * 40
    assert [q.admitted for q in qs[1::8]] == [10.0, 20.0, 30.0, 40.0, 50.0]
    # 9 ms waited > 5 ms: the whole walk (32) leaves, then the last 8 (a preferred size, and the delay exceeded)
    qs, _ = run({**params, "max_queue_delay_ms": 5.0}, arrivals)
    assert [q.exit_batch_size for q in qs] == [1] + [32] * 32 + [8] * 8
    qs, _ = run({"max_batch_size": 32, "preferred_batch_size": [1, 8], "max_queue_delay_ms": 100.0}, arrivals,
                name="delaybatch")
    assert [q.exit_batch_size for q in qs] == [1] + [32] * 32 + [8] * 8


def test_without_preferred_sizes_or_queue_policy_it_is_delaybatch():
    # the one rule where Triton's batcher and delaybatch agree: no preferred sizes means [max_batch_size]
    table = make_table(2, lambda s, b: 1.0 + 0.4 * b, batch_sizes=range(1, 17))
    arrivals = poisson_arrivals(900.0, 3000, seed=3)
    frames = []
    for name in ("triton", "delaybatch"):
        pipe = Pipeline(table, make_policy(name, {"max_batch_size": 16, "max_queue_delay_ms": 2.0}), 2,
                        instances=2)
        res = simulate(pipe, arrivals, np.ones(3000, dtype=int))
        frames.append(records_frame(res.queries, 2))
    assert frames[0]["exit_batch_size"].mean() > 2  # it did batch
    pd.testing.assert_frame_equal(frames[0], frames[1])


def test_without_dynamic_batching_every_request_runs_alone_in_order():
    # Triton's default scheduler: each request to the next free instance as it came (zerobatch at 1 agrees)
    arrivals = poisson_arrivals(150.0, 400, seed=5)
    qs, _ = run({"max_batch_size": 8, "dynamic_batching": False}, arrivals, instances=2)
    ref, _ = run({"max_batch_size": 1}, arrivals, instances=2, name="zerobatch")
    assert {q.exit_batch_size for q in qs} == {1}
    assert [q.finish for q in qs] == [q.finish for q in ref]
    with pytest.raises(ConfigError, match="policy.dynamic_batching"):
        make_policy("triton", {"dynamic_batching": False, "max_queue_size": 4})


# ----------------------------------------------------------------------------- records and summary
def test_records_and_summary_count_refused_queries_never_drop_them():
    arrivals = poisson_arrivals(1500.0, 4000, seed=2)
    qs, _ = run({"max_batch_size": 1, "max_queue_size": 2, "default_timeout_ms": 1.5}, arrivals, service=1.0,
                top=1)
    df = records_frame(qs, 1)
    s = summarize(df, qos_target_ms=2.0)
    counts = df["status"].value_counts().to_dict()
    assert set(counts) == {"ok", "rejected", "timed_out"} and sum(counts.values()) == 4000
    assert (s["n_completed"], s["n_rejected"], s["n_timed_out"]) == (counts["ok"], counts["rejected"],
                                                                     counts["timed_out"])
    ok = df[df["status"] == "ok"]
    assert s["mean_latency_ms"] == pytest.approx(ok["latency_ms"].mean(), rel=1e-12)  # served queries only
    assert df.loc[df["status"] != "ok", "finish_ms"].isna().all()
    slow = int((ok["latency_ms"] > 2.0).sum())
    assert s["qos_violation_rate"] == pytest.approx((4000 - len(ok) + slow) / 4000)  # refused count as misses
    assert "served queries" in s["latency_note"]
    assert df["replica"].dtype == np.int16 and (df["replica"] == 0).all()
    v = stability(df["arrival_ms"], df["finish_ms"], status=df["status"])
    assert "never finished" not in v["stability_reason"] and "refused" in v["stability_reason"]
    assert v["refused_fraction"] == pytest.approx((4000 - len(ok)) / 4000)
    codes = status_codes(df["status"])  # names -> codes, checked against the records' own names
    assert [STATUSES[c] for c in codes] == df["status"].tolist()
    assert stability(df["arrival_ms"], df["finish_ms"], status=codes) == v
    with pytest.raises(ValueError, match="unknown status 'dropped'"):
        status_codes(["ok", "dropped"])
    assert "never finished" in stability(df["arrival_ms"], df["finish_ms"])["stability_reason"]  # without status


def test_only_queued_queries_may_leave_unserved():
    table = make_table(1, lambda s, b: 1.0, batch_sizes=[1])
    pipe = Pipeline(table, make_policy("triton", {"max_batch_size": 1}), 1)
    q = Query(0, 0.0)
    pipe.arrive(q, 0.0)
    pipe.step(0.0)  # admitted into a batch
    with pytest.raises(PolicyError, match="only a query still waiting"):
        pipe.leave_unserved([q], "rejected")
    with pytest.raises(PolicyError, match="rejected or timed_out"):
        pipe.leave_unserved([Query(1, 0.0)], "dropped")


@pytest.mark.parametrize("params,field", [
    ({"timeout_action": "DROP"}, "policy.timeout_action"),
    ({"priority_levels": 2}, "policy.default_priority_level"),
    ({"priority_levels": 2, "default_priority_level": 1, "priority_queue_policy": {3: {}}},
     "policy.priority_queue_policy.3"),
    ({"priority_levels": 1, "default_priority_level": 1, "priority_queue_policy": {1: {"size": 2}}},
     "policy.priority_queue_policy.1.size"),
    ({"max_queue_size": -1}, "policy.max_queue_size"),
])
def test_bad_queue_policy_parameters_name_the_field(params, field):
    with pytest.raises(ConfigError) as e:
        make_policy("triton", params)
    assert e.value.field == field and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- invariants on random runs
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_runs_keep_the_queue_policy_and_priority_invariants(seed):
    """Checked from the records alone (an independent reconstruction of the queues): every query is served or
    refused exactly once; under REJECT none is served after its timeout; a query is rejected exactly when it
    finds its level's queue full; no query is batched while one of a higher level waits."""
    rng = np.random.default_rng(seed)
    n, size, timeout = 3000, int(rng.integers(2, 6)), float(rng.uniform(2.0, 6.0))
    params = {"max_batch_size": int(rng.integers(1, 5)), "max_queue_delay_ms": float(rng.uniform(0, 1)),
              "priority_levels": 2, "default_priority_level": 2, "max_queue_size": size,
              "default_timeout_ms": timeout}
    prio = rng.integers(1, 3, n)
    table = make_table(1, lambda s, b: 0.6 + 0.25 * b, batch_sizes=range(1, 9))
    pipe = Pipeline(table, make_policy("triton", params), 1, instances=2, priorities=prio)
    arrivals = poisson_arrivals(float(rng.uniform(1500, 3000)), n, seed=seed)
    res = simulate(pipe, arrivals, np.ones(n, dtype=int), sharing="exclusive")
    df = records_frame(res.queries, 1)
    assert res.stuck is None and len(df) == n and set(df["status"]) == {"ok", "rejected", "timed_out"}
    seen, adm, st, lv = (df[c].to_numpy() for c in ("seen_ms", "admitted_ms", "status", "priority"))
    ok = st == "ok"
    assert np.all(adm[ok] - seen[ok] <= timeout + 1e-9) and np.all(np.isnan(adm[~ok]))
    left = np.where(ok, adm, np.where(st == "timed_out", seen + timeout, seen))  # when each left the queue
    ids = np.arange(n)
    for k in range(n):  # the level's queue when query k arrived (the earlier ones still in it)
        waiting = int(np.count_nonzero((lv == lv[k]) & (ids < k) & (left > seen[k])))
        assert waiting == size if st[k] == "rejected" else waiting < size
    for k in np.flatnonzero(ok & (lv == 2)):
        t = adm[k]
        assert not np.any((lv == 1) & (seen < t) & (left > t))  # a level-1 query waited: it went first
