"""Serving stacks (dvasim/server): each stack's costs against hand-worked timelines, the stack every run names,
the case with a known answer where a per-batch cost makes a batch window pay, and the provenance of every number."""

from __future__ import annotations

import math

import pytest

import dvasim
from dvasim.errors import ConfigError
from dvasim.server.costs import model_io
from dvasim.server.stacks import FIELD_HELP, STACKS

INF = math.inf
# every cost of a stack set to nothing; a test then sets the ones it works through by hand
ZERO = dict(request_ms=0.0, request_per_row_ms=0.0, gather_per_row_ms=0.0, gather_gbps=INF, h2d_gbps=INF,
            d2h_gbps=INF, sync_ms=0.0, launch_fixed_ms=0.0, launch_per_op_ms=0.0, launch_per_row_ms=0.0,
            python_ms=0.0, corun_per_worker=0.0, interpreter_lock=False)


def _table(tmp_path, rows, name="t.csv", header="# operators: 1\n"):
    p = tmp_path / name
    p.write_text(header + "stage,batch_size,latency_ms\n" + "".join(f"{s},{b},{t}\n" for s, b, t in rows))
    return str(p)


def _run(table, arrivals, policy, server, qos=1000.0):
    cfg = {"model": {"table": table}, "policy": policy, "server": server, "qos": {"target_ms": qos},
           "workload": {"kind": "explicit", "arrivals_ms": arrivals}}
    return dvasim.run(cfg)


def _lat(res):
    return res.queries["latency_ms"].tolist()


# one stage, 10 ms at batch 1 and 15 ms at batch 2; an unknown model's query carries 602,112 bytes in, 4,000 out
ROWS = [(0, 1, 10.0), (0, 2, 15.0)]
IN_B, OUT_B = 602112, 4000
HAND = dict(ZERO, request_ms=1.0, request_per_row_ms=0.5, gather_per_row_ms=0.25,
            gather_gbps=IN_B / 1.0 / 1e6,  # 1 ms per row gathered
            h2d_gbps=IN_B / 2.0 / 1e6,     # 2 ms per row copied
            sync_ms=0.5, d2h_gbps=OUT_B / 1.0 / 1e6,  # 1 ms per row copied back
            launch_fixed_ms=3.0, launch_per_op_ms=1.0)  # the table's one operator: a 4 ms launch
ZB1 = {"name": "zerobatch", "max_batch_size": 1}


def test_one_query_pays_entry_copy_gpu_and_exit_as_worked_by_hand(tmp_path):
    # a batch thread that idles the GPU between batches: entry on the host 1 + 0.5 + 0.25 + 1 = 2.75, copy 2 ->
    # GPU from 4.75 for 10 ms (the 4 ms launch overlaps it) -> 14.75, then sync 0.5 + copy back 1 -> 16.25.
    # Asynchronous copies (no idle gap): the entry and the launch run on the host beside the GPU's 10 ms,
    # 2.75 + 2 + 4 = 8.75 < 10 -> 10, then the answer 1.5 later: 11.5
    table = _table(tmp_path, ROWS)
    for idle, want in ((True, 16.25), (False, 11.5)):
        res = _run(table, [0.0], ZB1, {"stack": "tfserving", **HAND, "idle_between_batches": idle})
        assert _lat(res) == pytest.approx([want], abs=1e-9)
        assert res.summary["stack"] == "tfserving"


def test_a_host_bound_launch_ends_the_execution(tmp_path):
    # launch 11 + 1 = 12 ms > 10 ms of GPU: the execution ends with its launch, 4.75 + 12 + 1.5 = 18.25
    res = _run(_table(tmp_path, ROWS), [0.0], ZB1, {"stack": "tfserving", **HAND, "launch_fixed_ms": 11.0})
    assert _lat(res) == pytest.approx([18.25], abs=1e-9)


def test_idle_between_batches_holds_the_executor_through_the_exit(tmp_path):
    # q1 (at 0.1) waits for q0's executor. A batch thread that answers itself frees it at 16.25, and q1 then takes
    # 16.25 itself. With asynchronous copies and a completion thread the executor is free when the GPU is done, at
    # 10; q1's GPU runs 10..20 (its entry and launch beside it until 18.75) and its answer leaves at 21.5
    table = _table(tmp_path, ROWS)
    idle = _run(table, [0.0, 0.1], ZB1, {"stack": "tfserving", **HAND, "idle_between_batches": True})
    busy = _run(table, [0.0, 0.1], ZB1, {"stack": "tfserving", **HAND, "idle_between_batches": False})
    assert _lat(idle) == pytest.approx([16.25, 16.25 + 16.25 - 0.1], abs=1e-9)
    assert _lat(busy) == pytest.approx([11.5, 21.5 - 0.1], abs=1e-9)


def test_a_batch_pays_per_row_and_per_byte(tmp_path):
    # two queries at 0 in one batch: entry 1 + 2 * (0.5 + 0.25) + 2 * 1 = 4.5, copy 4 -> GPU 8.5 .. 23.5 (15 ms at
    # batch 2), exit 0.5 + 2 * 1 = 2.5 -> 26
    res = _run(_table(tmp_path, ROWS), [0.0, 0.0], {"name": "zerobatch", "max_batch_size": 2},
               {"stack": "tfserving", **HAND})
    assert _lat(res) == pytest.approx([26.0, 26.0], abs=1e-9)


def test_copies_of_two_instances_share_one_link(tmp_path):
    # two instances take q0 and q1 (both at 0): their entries run side by side (2.75 each) but the link copies one
    # input at a time: q0's copy 2.75..4.75, q1's 4.75..6.75, so q1 ends 2 ms later than q0
    table = _table(tmp_path, ROWS)
    cfg = {"model": {"table": table}, "policy": ZB1, "server": {"stack": "tfserving", **HAND},
           "engine": {"instances": 2, "sharing": "parallel"},
           "workload": {"kind": "explicit", "arrivals_ms": [0.0, 0.0]}}
    lat = sorted(_lat(dvasim.run(cfg)))
    assert lat == pytest.approx([16.25, 18.25], abs=1e-9)


def test_python_entry_work_and_launches_wait_for_the_interpreter_lock(tmp_path):
    # a Python stack: both instances' entry work (2.75 each) holds the one lock, so the second's starts at 2.75;
    # the copies then queue on the link behind each other anyway: q1's copy runs 5.5..7.5 -> ends 7.5 + 10 + 1.5
    table = _table(tmp_path, ROWS)
    cfg = {"model": {"table": table}, "policy": ZB1,
           "server": {"stack": "torchscript", **HAND, "interpreter_lock": True},
           "engine": {"instances": 2, "sharing": "parallel"},
           "workload": {"kind": "explicit", "arrivals_ms": [0.0, 0.0]}}
    lat = sorted(_lat(dvasim.run(cfg)))
    # processor sharing of the lock: both entries progress at half speed and end together at 5.5; the copies then
    # run 5.5..7.5 and 7.5..9.5
    assert lat == pytest.approx([7.5 + 10 + 1.5, 9.5 + 10 + 1.5], abs=1e-9)


@pytest.mark.parametrize("name", [n for n, s in STACKS.items() if not s.adds_nothing])
def test_each_named_stack_serves_one_query_as_its_numbers_say(name):
    # ResNet152 in one stage (157 operators) on the Titan RTX table, one query alone: the Python-level work (a
    # Python stack's hand-off and copies), the entry on the host and the input's copy (before the GPU, or beside it
    # for a stack that copies asynchronously), the GPU and the launch side by side, then the sync and the copy back
    # -- computed here from the stack's own numbers
    st = STACKS[name]
    cfg = {"model": {"name": "resnet152", "device": "titanrtx", "stages": 1}, "policy": ZB1,
           "server": {"stack": name}, "workload": {"kind": "explicit", "arrivals_ms": [0.0]}}
    res = dvasim.run(cfg)
    (i_b, _tok, o_b), _ = model_io("resnet152")
    model_cfg = res.config["model"]  # the stage's GPU time is the table's
    from dvasim.model.catalog import resolve_model

    t1 = resolve_model(cfg["model"]).table.latency(0, 1)

    def ms(n, gbps):
        return 0.0 if math.isinf(gbps) else n / (gbps * 1e6)

    entry = st.request_ms + st.request_per_row_ms + st.gather_per_row_ms + ms(i_b, st.gather_gbps)
    h2d = ms(i_b, st.h2d_gbps)
    locked = st.python_ms if st.interpreter_lock else 0.0
    launch = st.launch_fixed_ms + st.launch_per_op_ms * 157 + st.launch_per_row_ms
    exit_ = st.sync_ms + ms(o_b, st.d2h_gbps)
    assert model_cfg["name"] == "resnet152"
    # a stack fitted to a real server carries its client's path (ServingStack.client_path_ms): the query reaches
    # the front door after a draw from it, and only such a stack delays it
    path = float(res.queries["seen_ms"].iloc[0] - res.queries["arrival_ms"].iloc[0])
    assert (st.client_path_ms[0] <= path <= st.client_path_ms[-1]) if st.client_path_ms else path == 0.0
    if st.idle_between_batches:  # the entry before the GPU starts
        want = locked + entry + h2d + max(launch, t1) + exit_
    else:  # asynchronous copies: the entry on the host beside the GPU's work, with the launch
        want = locked + max(entry + h2d + launch, t1) + exit_
    assert _lat(res) == pytest.approx([want + path], rel=1e-9)
    assert res.summary["stack"] == name


def test_a_per_batch_cost_makes_a_batch_window_pay(tmp_path):
    """Known answer: one stage of 2 ms at batch 1 or 2, q0 at 0 and q1 at 1.5.

    GPU only: ZeroBatch runs q0 0..2, q1 2..4 (latencies 2, 2.5: mean 2.25); a 1.5 ms window runs both 1.5..3.5
    (3.5, 2: mean 2.75) -- the window only adds waiting. With 8 ms of per-batch host cost: ZeroBatch 0..10 and
    10..20 (10, 18.5: mean 14.25); the window pays it once, 1.5..11.5 (11.5, 10: mean 10.75)."""
    table = _table(tmp_path, [(0, 1, 2.0), (0, 2, 2.0)])
    zb = {"name": "zerobatch", "max_batch_size": 2}
    db = {"name": "delaybatch", "max_batch_size": 2, "max_queue_delay_ms": 1.5}
    cost = {"stack": "tfserving", **ZERO, "request_ms": 8.0, "idle_between_batches": True}
    arr = [0.0, 1.5]
    assert _lat(_run(table, arr, zb, {"stack": "gpu-only"})) == pytest.approx([2.0, 2.5])
    assert _lat(_run(table, arr, db, {"stack": "gpu-only"})) == pytest.approx([3.5, 2.0])
    assert _lat(_run(table, arr, zb, cost)) == pytest.approx([10.0, 18.5])
    assert _lat(_run(table, arr, db, cost)) == pytest.approx([11.5, 10.0])


def test_every_run_names_its_stack_and_the_table_implies_it(tmp_path):
    cfg = {"policy": ZB1, "workload": {"kind": "explicit", "arrivals_ms": [0.0]}}
    for model, stack in (({"name": "vgg19", "device": "titanrtx", "stages": 2}, "triton-tensorrt-21.10"),
                         ({"name": "vgg19", "device": "a100", "stages": 2}, "triton-tensorrt"),
                         ({"name": "vgg19", "device": "h100", "stages": 2}, "cudagraph"),
                         ({"name": "vgg19", "device": "cpu", "stages": 2}, "as-profiled"),
                         ({"table": _table(tmp_path, ROWS)}, "as-profiled"),
                         ({"table": _table(tmp_path, ROWS, "s.csv", "# stack: tfserving\n# operators: 3\n")},
                          "tfserving")):
        res = dvasim.run({**cfg, "model": model})
        assert res.summary["stack"] == stack
        assert res.config["server"]["name"] == stack and res.config["server"]["source"].startswith("implied")
    res = dvasim.run({**cfg, "model": {"table": _table(tmp_path, ROWS)},
                      "engine": {"host": {"launch_ms": 0.5}}})
    assert res.summary["stack"] == "custom"


def test_gpu_only_is_the_lower_bound_of_every_stack():
    cfg = {"model": {"name": "bert_base", "device": "titanrtx", "stages": 2}, "policy": {"name": "zerobatch"},
           "workload": {"kind": "poisson", "rate_qps": 100, "n_queries": 400, "seed": 2, "seq_len_dist": "glue:RTE"}}
    floor = dvasim.run(cfg, stack="gpu-only").summary["mean_latency_ms"]
    for name, st in STACKS.items():
        if not st.adds_nothing:
            assert dvasim.run(cfg, stack=name).summary["mean_latency_ms"] > floor


def test_bad_server_keys_are_one_line_errors():
    base = {"model": {"name": "vgg19", "device": "titanrtx", "stages": 2}, "policy": ZB1,
            "workload": {"kind": "explicit", "arrivals_ms": [0.0]}}
    for server, field in (({"stack": "nope"}, "server.stack"), ({"stack": "tfserving", "h2d_gbps": 0}, "server.h2d_gbps"),
                          ({"stack": "tfserving", "pinned": 1}, "server.pinned"),
                          ({"stack": "tfserving", "colour": 1}, "server.colour"),
                          ({"stack": "gpu-only", "request_ms": 1.0}, "server.request_ms"),
                          ({"stack": "tfserving", "modules": "jax"}, "server.modules")):
        with pytest.raises(ConfigError) as e:
            dvasim.run({**base, "server": server})
        assert e.value.field == field and "\n" not in str(e.value)


def test_every_number_of_every_stack_has_its_provenance():
    for st in STACKS.values():
        if st.adds_nothing:
            assert st.sources
            continue
        for key in FIELD_HELP:
            src = st.sources.get(key, "")
            assert src.split(":")[0] in ("measured", "published", "estimate", "by definition"), (st.name, key, src)


def test_the_memory_pool_replaces_the_gather_and_the_copy(tmp_path):
    # [engine.transfer] pool: the input is copied on arrival (602,112 B at 0.602112 GB/s = 1 ms), gathered on the
    # GPU, so the batch pays only its request handling (1 + 0.5) before the GPU: 1 + 1.5 + 10 + 1.5 = 14; on_launch keeps the
    # host gather (2.75 in all) and replaces the stack's copy by its own (1 ms): 2.75 + 1 + 10 + 1.5 = 15.25
    table = _table(tmp_path, ROWS)
    xfer = {"input_bytes": IN_B, "bandwidth_gbps": IN_B / 1e6}
    for mode, want in (("pool", 14.0), ("on_launch", 15.25)):
        cfg = {"model": {"table": table}, "policy": ZB1, "server": {"stack": "tfserving", **HAND},
               "engine": {"transfer": {"mode": mode, **xfer}},
               "workload": {"kind": "explicit", "arrivals_ms": [0.0]}}
        assert _lat(dvasim.run(cfg)) == pytest.approx([want], abs=1e-9), mode


def test_a_launch_per_operator_needs_the_stages_operators(tmp_path):
    table = _table(tmp_path, ROWS, "bare.csv", header="")
    with pytest.raises(ConfigError) as e:
        _run(table, [0.0], ZB1, {"stack": "tfserving"})
    assert e.value.field == "model.table" and "operators" in str(e.value)
    # a stack without a per-operator cost, or a table that names them, runs
    assert _run(table, [0.0], ZB1, {"stack": "tfserving", "launch_per_op_ms": 0.0}).summary["n_completed"] == 1


def test_an_engine_host_replaces_the_stack_launch_model_and_its_measured_inputs(tmp_path):
    # [engine.host] with the inputs' path measured (first_copy_ms): the stack keeps only its request and exit costs
    table = _table(tmp_path, ROWS)
    cfg = {"model": {"table": table}, "policy": ZB1, "server": {"stack": "tfserving", **HAND},
           "engine": {"host": {"modules": "torchscript", "launch_ms": 2.0, "first_copy_ms": 3.0}},
           "workload": {"kind": "explicit", "arrivals_ms": [0.0]}}
    # request 1 + 0.5, the measured input copy 3 (under the lock), GPU 10 (the 2 ms launch beside it), exit 1.5
    assert _lat(dvasim.run(cfg)) == pytest.approx([1.5 + 3.0 + 10.0 + 1.5], abs=1e-9)


def test_the_co_run_penalty_grows_with_the_executions_running_at_once(tmp_path):
    # two instances run q0 and q1 (both at 0) side by side on a device with no interference ("parallel"): 10 ms
    # each alone; with corun_per_worker = 0.5 both run 1 + 0.5 * (2 - 1) = 1.5 times slower: 15 ms
    table = _table(tmp_path, ROWS)
    base = {"model": {"table": table}, "policy": ZB1, "engine": {"instances": 2, "sharing": "parallel"},
            "workload": {"kind": "explicit", "arrivals_ms": [0.0, 0.0]}}
    alone = dvasim.run({**base, "server": {"stack": "tfserving", **ZERO}})
    slowed = dvasim.run({**base, "server": {"stack": "tfserving", **ZERO, "corun_per_worker": 0.5}})
    assert _lat(alone) == pytest.approx([10.0, 10.0], abs=1e-9)
    assert _lat(slowed) == pytest.approx([15.0, 15.0], abs=1e-9)
