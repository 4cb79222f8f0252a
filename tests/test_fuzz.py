"""The fuzzing suite: random tables, policies, engines, workloads and time offsets, with the simulator's
invariants as assertions. Every policy: Triton's, DVABatch's (with its ablations) and the papers' peer systems
(TF-Serving, Serial, GraphB, LazyBatching, N-Ebird, E-Ebird).

For every scenario:

* every query exits exactly once, and the run reports nothing stuck;
* each query passes the stages in order (start <= finish <= next stage's start);
* no batch (and no execution) is larger than the policy's maximum (its largest worker for E2bird's);
* no execution is faster than its table time (service jitter off);
* no two running executions share a buffer, and no unread row is overwritten (the monitor of
  ``test_pipeline_properties``);
* throughput never exceeds the table's bound: every stage executor of every instance serves one batch at a time,
  so over the run's span at most ``instances x min over stages of max over b of b / T_s(b)`` queries per ms;
* with one buffer pair, no two executions of an instance overlap (the serial manner, stretch included);
* a rerun of the same scenario gives identical records.

``make test`` runs a short version (``DVASIM_FUZZ_EXAMPLES``, default 60 scenarios); ``make fuzz`` runs 2,000.
"""

from __future__ import annotations

import math
import os

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dvasim.core.pipeline import Pipeline
from dvasim.engines.sim.corun import sim_corun
from dvasim.engines.sim.engine import simulate
from dvasim.policies import make_policy
from tests.conftest import make_table
from tests.core.test_pipeline_properties import Monitor

EXAMPLES = int(os.environ.get("DVASIM_FUZZ_EXAMPLES", "60"))
BATCHES = (1, 2, 4, 8, 16)
LENS = (16, 64, 128)


# the papers' peer systems (issue 14), each with random parameters
PEERS = ("serial", "graphbatch", "tfserving-nowait", "tfserving-optwait", "tfserving-static", "lazybatch", "n-ebird",
         "e-ebird")


def peer_policy(draw, kind: str, max_bs: int) -> tuple[str, dict]:
    if kind == "serial":
        return kind, {}
    if kind == "graphbatch":
        return kind, {"max_batch_size": max_bs, "window_ms": draw(st.floats(0.0, 20.0))}
    if kind == "tfserving-nowait":
        return kind, {"max_batch_size": max_bs}
    if kind in ("tfserving-optwait", "tfserving-static"):
        return kind, {"max_batch_size": max_bs, "max_queue_delay_ms": draw(st.floats(0.0, 30.0))}
    if kind == "lazybatch":
        return kind, {"max_batch_size": max_bs, "predictor": draw(st.sampled_from(["conservative", "oracle"])),
                      "sla_ms": draw(st.sampled_from([0.5, 5.0, 50.0, 1e6]))}
    if kind == "n-ebird":
        workers = [1, *draw(st.lists(st.sampled_from(BATCHES), max_size=4))]
        return kind, {"workers": workers, "max_inf": draw(st.sampled_from([None, 1, 4, 64]))}
    return kind, {"total_bs": sorted(set(draw(st.lists(st.sampled_from([2, 4, 8, 16]), min_size=1, max_size=3)))),
                  "max_inf": draw(st.sampled_from([None, 4, 64]))}


def batch_limit(pipe) -> int:
    """The largest batch the scenario's policy may form: its max_batch_size, or its largest worker (E2bird)."""
    pol = pipe.policy
    return getattr(pol, "max_batch_size", None) or max(pol.sizes)


@st.composite
def scenarios(draw):
    n_stages = draw(st.integers(1, 4))
    tokens = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    # per stage: a fixed cost and a per-query slope (from flat to linear), and a length factor
    base = rng.uniform(0.05, 3.0, n_stages)
    slope = rng.uniform(0.0, 1.0, n_stages) * base
    lenf = rng.uniform(0.2, 2.0, n_stages)
    max_bs = draw(st.sampled_from([1, 2, 4, 8, 16]))
    kind = draw(st.sampled_from(["zerobatch", "delaybatch", "dvabatch", "dvabatch-split", "dvabatch-ablation",
                                 "dvabatch-load", *PEERS]))
    if kind in PEERS:
        policy = peer_policy(draw, kind, max_bs)
    elif kind == "zerobatch":
        policy = ("zerobatch", {"max_batch_size": max_bs})
    elif kind == "delaybatch":
        policy = ("delaybatch", {"max_batch_size": max_bs, "max_queue_delay_ms": draw(st.floats(0.01, 20.0))})
    elif kind == "dvabatch-split":
        policy = ("dvabatch-split", {"max_batch_size": max_bs, "max_queue_delay_ms": draw(st.floats(0.0, 5.0)),
                                     "split_factor": draw(st.floats(1.0, 3.0))})
    else:
        params = {"max_batch_size": max_bs, "split_manner": draw(st.sampled_from(["serial", "pipelined"])),
                  "t_comp_wait_frac": draw(st.sampled_from([0.0, 0.25, 1.0, 4.0])),
                  "split_factor": draw(st.sampled_from([1.0, 1.5, 2.0]))}
        if kind == "dvabatch-load":  # stretch only, started batches too
            params.update(policies=["load"], t_comp_wait_frac=draw(st.sampled_from([1.0, 4.0, 100.0])))
        elif kind == "dvabatch-ablation":
            kinds = ["load", "operator"] + (["input"] if tokens else [])
            params["policies"] = draw(st.lists(st.sampled_from(kinds), unique=True, max_size=len(kinds)))
        policy = ("dvabatch", params)
    n = draw(st.integers(1, 120))
    rate = draw(st.sampled_from([0.001, 0.05, 1.0, 50.0, 500.0, 5000.0]))  # per ms: 1 qps .. 5 M qps
    offset = draw(st.sampled_from([0.0, 0.0, 1e3, 2.7e7, 1e9, 1e12]))
    load = draw(st.sampled_from(["poisson", "burst", "closed"]))
    return {
        "n_stages": n_stages, "tokens": tokens, "base": base, "slope": slope, "lenf": lenf, "policy": policy,
        "n": n, "rate": rate, "offset": offset, "load": load, "seed": seed,
        "sharing": draw(st.sampled_from(["fluid", "exclusive", "parallel", "cores"])),
        "pairs": draw(st.integers(1, 3)),
        "instances": 1 if policy[0] in ("n-ebird", "e-ebird") else draw(st.integers(1, 2)),
        "clients": draw(st.integers(1, 8)),
    }


def build(sc):
    def lat(s, b, L=None):
        t = sc["base"][s] + sc["slope"][s] * (b - 1)
        return t * (1.0 + sc["lenf"][s] * (L / 128.0 - 0.1)) if L is not None else t

    table = make_table(sc["n_stages"], lat, batch_sizes=BATCHES, seq_lens=LENS if sc["tokens"] else None)
    rng = np.random.default_rng(sc["seed"])
    if sc["load"] == "burst":
        arrivals = np.sort(rng.choice([0.0, 1.0, 5.0, 30.0], size=sc["n"]))
    else:
        arrivals = np.cumsum(rng.exponential(1.0 / sc["rate"], size=sc["n"]))
    arrivals = (sc["offset"] + arrivals).tolist()
    lens = rng.choice(LENS, size=sc["n"]).tolist() if sc["tokens"] else [1] * sc["n"]
    return table, arrivals, lens


def simulate_scenario(sc, monitor: bool):
    table, arrivals, lens = build(sc)
    name, params = sc["policy"]
    policy = make_policy(name, dict(params))
    pipe = Pipeline(table, policy, sc["pairs"], instances=sc["instances"],
                    qos_target_ms=200.0, input_lengths=lens if sc["tokens"] else None,
                    corun=sim_corun(policy, table))  # E-Ebird's offline search on the simulator's device model
    mon = Monitor(pipe, batch_limit(pipe)) if monitor else None
    execs = []
    pipe.on_finish.append(lambda ex: execs.append((ex.stage, ex.batch_size, ex.seq_len, ex.start, ex.end,
                                                   ex.lane)))
    closed = sc["clients"] if sc["load"] == "closed" else None
    res = simulate(pipe, arrivals, lens, sharing=sc["sharing"], closed_clients=closed, cores=2)
    return table, res, mon, execs


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenarios())
def test_invariants_hold_in_random_scenarios(sc):
    table, res, mon, execs = simulate_scenario(sc, monitor=True)
    event(f"policy {sc['policy'][0]}"), event(f"offset {sc['offset']:g}"), event(f"load {sc['load']}")
    event(f"queries {'>= 60' if sc['n'] >= 60 else '< 60'}")
    event(f"splits {'yes' if any(op[0] == 'split' for op in res.pipeline.table.log) else 'no'}")
    event(f"stretches {'yes' if any(op[0] == 'stretch' for op in res.pipeline.table.log) else 'no'}")
    n, n_st = sc["n"], sc["n_stages"]
    max_bs = batch_limit(res.pipeline)
    instances = res.pipeline.instances  # E2bird's engine has one instance per worker
    assert res.stuck is None, res.stuck
    assert mon.errors == [], mon.errors[:3]
    assert sorted(mon.exits) == list(range(n)) and set(mon.exits.values()) == {1}
    assert all(mon.passes[(q, s)] == 1 for q in range(n) for s in range(n_st))
    for q in res.queries:
        times = [t for s in range(n_st) for t in (q.stage_start[s], q.stage_finish[s])]
        assert times == sorted(times) and q.finish == times[-1] and q.stage_start[0] >= q.arrival
        assert q.exit_batch_size <= max_bs
    clock = max(1e-9, 64 * math.ulp(max(abs(sc["offset"]), 1.0) * 2))
    for stage, b, L, start, end, _ in execs:
        assert b <= max_bs
        want = table.latency(stage, b, L if sc["tokens"] else None)
        assert end - start >= want * (1 - 1e-9) - clock, (stage, b, end - start, want)
    if sc["pairs"] == 1:  # one buffer pair: one stage at a time in each instance (§6.2), stretch included
        for lane in range(instances):
            spans = sorted((a, b) for *_, a, b, ln in execs if ln == lane)
            assert all(b0 >= a1 - clock for (_, a1), (b0, _) in zip(spans, spans[1:]))
    # throughput bound: each stage executor of each instance serves one batch at a time
    best = min(max(b / table.latency(s, b, min(LENS) if sc["tokens"] else None) for b in BATCHES if b <= max_bs)
               for s in range(n_st))
    first = min(q.arrival for q in res.queries)
    span = max(q.finish for q in res.queries) - first
    if span > 0:
        # n queries need at least n / best of one executor's time: n <= instances x best x span
        assert n <= instances * best * (span + n * clock) * (1 + 1e-9)
    # a rerun gives identical records
    _, again, _, _ = simulate_scenario(sc, monitor=False)
    rec = [(q.qid, q.arrival, q.finish, tuple(q.stage_start), q.batch_id, q.exit_batch_size) for q in res.queries]
    assert rec == [(q.qid, q.arrival, q.finish, tuple(q.stage_start), q.batch_id, q.exit_batch_size)
                   for q in again.queries]
