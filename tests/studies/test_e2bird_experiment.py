"""Smoke test of experiments/e2bird_figs13_14.py (E2bird's Figures 13 and 14) in its --quick mode."""

from __future__ import annotations

import numpy as np

from tests.experiments import load_experiment as load


def test_e2bird_figs13_14_quick(tmp_path):
    res = load("e2bird_figs13_14").main(["--quick", "--out", str(tmp_path)])
    caps, lat, per_query = res["fig14"], res["fig13"], res["fig13_queries"]
    for name in ("e2bird_fig14_capacity.csv", "e2bird_fig14_capacity.png", "e2bird_fig13_latency.csv",
                 "e2bird_fig13_queries.csv", "e2bird_fig13.png"):
        assert (tmp_path / name).is_file(), name
    systems = {"NO_Wait", "OPT_Wait", "Static", "N-Ebird", "E-Ebird"}
    assert set(caps.system) == systems and (caps.capacity_qps > 0).all()
    # Static pads every batch to 32: it can never serve more than OPT_Wait, which forms the same batches unpadded
    c = caps.set_index("system")["capacity_qps"]
    assert c["Static"] <= c["OPT_Wait"] * 1.1
    # every query of the diurnal load is there, once per system, with a finite latency
    assert len(per_query) == 5 * 100 and np.isfinite(per_query.latency_ms).all()
    # at low load OPT_Wait waits for its 30 ms timeout (unless 32 arrive first): N-Ebird runs each input at once
    low = lat[lat.phase == "low"].set_index("system")["mean_ms"]
    assert low["OPT_Wait"] > 25.0 and low["N-Ebird"] < low["OPT_Wait"] / 2


# ------------------------------------------------------------------ E-Ebird's offline search on a serving stack
import pytest  # noqa: E402

import dvasim  # noqa: E402
from dvasim.engines.sim.corun import SimCoRun, corun_average_ms, worker_costs  # noqa: E402
from dvasim.errors import ConfigError  # noqa: E402
from dvasim.model.catalog import resolve_model  # noqa: E402
from dvasim.policies.e2bird import EEbird, offline_search  # noqa: E402


@pytest.mark.parametrize("stack", ["tfserving", "pytorch-eager", "triton-tensorrt"])
@pytest.mark.parametrize("workers", [[8, 8, 16], [1] * 8 + [8, 16], [1] * 16 + [16]])
def test_search_charges_each_worker_what_the_engine_charges(stack, workers):
    # 32 inputs at t = 0 and N-Ebird workers that take all of them at once: each worker's batch finishes when the
    # engine says, and the search's co-run average equals the engine's average over the workers (request, launches on
    # the host's cores or under the interpreter lock, synchronisation and copy back). The stack's gathering and copy
    # are made free: the search assumes E2bird's memory pool
    model = {"name": "resnet152", "device": "titanrtx", "stages": 2}
    free = {"gather_per_row_ms": 0.0, "gather_gbps": float("inf"), "h2d_gbps": float("inf")}
    cfg = {"model": model, "policy": {"name": "n-ebird", "workers": sorted(workers + [1], reverse=True),
                                      "max_inf": 32},
           "workload": {"kind": "explicit", "arrivals_ms": [0.0] * 32}, "server": {"stack": stack, **free}}
    q = dvasim.run(cfg).queries
    assert q.exit_batch_id.nunique() == len(workers)  # the extra worker of 1 got nothing
    engine = q.groupby("exit_batch_id")["finish_ms"].max().mean()
    table = resolve_model(model).table
    costs = worker_costs(stack, table)
    assert corun_average_ms(table, workers, None, costs) == pytest.approx(engine, rel=1e-9)
    if stack != "triton-tensorrt":  # the GPU alone is faster: the stack's costs are really charged
        assert corun_average_ms(table, workers, None) < engine - 0.3


def test_search_costs_change_the_configurations_where_launches_serialise():
    # pytorch-eager launches hold the interpreter lock: many small workers queue for it, so the search on that stack
    # picks fewer, larger workers than on the GPU alone; tfserving's per-batch costs are the same for every worker
    # and its launches overlap the GPU, so its choice is the GPU alone's
    table = resolve_model({"name": "resnet152", "device": "titanrtx", "stages": 1}).table
    alone = offline_search(table, (4, 8, 16, 32), SimCoRun(table))
    assert offline_search(table, (4, 8, 16, 32), SimCoRun(table, worker_costs("tfserving", table))) == alone
    eager = offline_search(table, (4, 8, 16, 32), SimCoRun(table, worker_costs("pytorch-eager", table)))
    for t in (4, 8, 16, 32):
        assert sum(eager[t]) < sum(alone[t])
    assert worker_costs("gpu-only", table) is None
    assert worker_costs("tfserving", table).operators == (157,)


def test_eebird_stack_parameter(tmp_path):
    with pytest.raises(ConfigError, match="policy.stack"):
        EEbird(stack=3)
    cfg = {"model": {"name": "resnet152", "device": "titanrtx", "stages": 1},
           "policy": {"name": "e-ebird", "stack": "pytorch-eager"},
           "workload": {"kind": "poisson", "rate_qps": 10.0, "n_queries": 10, "seed": 0},
           "engine": {"transfer": {"mode": "pool"}}, "server": {"stack": "pytorch-eager"}}
    pol = dvasim.run(cfg).config["policy"]
    assert pol["stack"] == "pytorch-eager" and pol["search_costs"]["stack"] == "pytorch-eager"
    # without the parameter the search charges the run's own stack, as the pipeline names it
    cfg["policy"] = {"name": "e-ebird"}
    assert dvasim.run(cfg).config["policy"]["search_costs"]["stack"] == "pytorch-eager"
    cfg["server"] = {"stack": "gpu-only"}
    assert "search_costs" not in dvasim.run(cfg).config["policy"]  # the GPU alone
    # the simulator's profiler resolves the name: an unknown one is refused, naming the parameter
    cfg["policy"] = {"name": "e-ebird", "stack": "tf-serving"}
    with pytest.raises(ConfigError, match="policy.stack") as e:
        dvasim.run(cfg)
    assert e.value.field == "policy.stack"


def test_script_inputs_path_per_stack():
    # under a serving stack TF-Serving's batch copy is the stack's (no [engine.transfer]) and E-Ebird's search
    # charges the stack; under gpu-only the results' setup before serving stacks: the copy on launch at 12 GB/s
    mod = load("e2bird_figs13_14")
    wl = {"kind": "poisson", "rate_qps": 1.0, "n_queries": 10, "seed": 0}
    tfs = mod.config("resnet152", "OPT_Wait", wl, "tfserving")
    assert "transfer" not in tfs["engine"] and tfs["server"] == {"stack": "tfserving"}
    ee = mod.config("resnet152", "E-Ebird", wl, "tfserving")
    assert ee["engine"]["transfer"]["mode"] == "pool" and ee["server"] == {"stack": "tfserving"}
    assert mod.config("resnet152", "OPT_Wait", wl, "gpu-only")["engine"]["transfer"]["mode"] == "on_launch"
