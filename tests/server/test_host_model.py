"""The host model of a GPU run (dvasim.server.host): launch costs, launching cores, one interpreter lock, stalls.

Each expected figure is worked by hand from the model's definition in the module docstring."""

from __future__ import annotations

import pytest

from dvasim.core.pipeline import Pipeline
from dvasim.engines.sim.engine import simulate
from dvasim.errors import ConfigError
from dvasim.policies import make_policy
from dvasim.server.host import HostModel, LaunchTable, host_from_config
from tests.conftest import make_table


def host(n_stages=1, **kw) -> HostModel:
    base = dict(n_stages=n_stages, launch_ms=[0.0] * n_stages, launch_per_row_ms=[0.0] * n_stages,
                copy_ms=[0.0] * n_stages, copy_per_row_ms=[0.0] * n_stages)
    base.update(kw)
    return HostModel(**base)


def latencies(gpu_ms, h, arrivals, max_batch=1, instances=1, n_stages=1, overhead=0.0, seed=0):
    table = make_table(n_stages, lambda s, b: gpu_ms, batch_sizes=range(1, 17))
    pol = make_policy("zerobatch", {"max_batch_size": max_batch})
    pipe = Pipeline(table, pol, 2, instances=instances)
    res = simulate(pipe, arrivals, [1] * len(arrivals), sharing="parallel", host=h, launch_overhead_ms=overhead,
                   seed=seed)
    assert res.stuck is None
    return [q.finish - q.arrival for q in res.queries]


def test_host_bound_and_gpu_bound_execution():
    # copies (locked) first, then launch and GPU work side by side: c + max(launch, gpu)
    h = host(launch_ms=[2.0], copy_ms=[0.3])
    assert latencies(0.5, h, [0.0]) == pytest.approx([2.3])
    assert latencies(3.0, h, [0.0]) == pytest.approx([3.3])
    # the hand-off is Python-level control-plane work under the lock, before the copies
    assert latencies(0.5, h, [0.0], overhead=0.2) == pytest.approx([2.5])


def test_launch_cost_grows_with_batch_and_scale():
    h = host(launch_ms=[1.0], launch_per_row_ms=[0.25], launch_scale=2.0)
    # four simultaneous queries leave as one batch: (1 + 0.25 * 4) * 2 = 4 ms
    assert latencies(0.1, h, [0.0] * 4, max_batch=4) == pytest.approx([4.0] * 4)


@pytest.mark.parametrize("modules,cores,expected", [
    ("torchscript", 16, 2.0),   # C++ launches on their own cores: no interference
    ("torchscript", 1, 4.0),    # one launching core: two launches share it
    ("eager", 16, 4.0),         # eager launches hold the interpreter lock throughout
    ("cudagraph", 2, 2.0),
])
def test_two_launches_at_once(modules, cores, expected):
    # two model instances, two queries at t=0: two launches of 2 ms at the same time
    h = host(launch_ms=[2.0], modules=modules, cores=cores)
    assert latencies(0.1, h, [0.0, 0.0], instances=2) == pytest.approx([expected] * 2)


def test_copies_hold_the_lock_even_for_torchscript():
    # copies 1 ms each under the lock (shared: both end at 2), then 1 ms launches on separate cores -> 3
    h = host(launch_ms=[1.0], copy_ms=[1.0], modules="torchscript", cores=16)
    assert latencies(0.1, h, [0.0, 0.0], instances=2) == pytest.approx([3.0, 3.0])


def test_the_copies_per_row_part_runs_on_a_core_without_the_lock():
    """HostModel.copy_rows: torch's copy_/to bindings release the interpreter lock (python_variable_methods.cpp,
    dispatch_copy_ / dispatch_to), so two executors' per-row copies run side by side on their cores, after the
    locked fixed part and before the GPU starts."""
    # two instances, two single queries at t=0: fixed copies 0.5 ms each under the lock (shared: both at 1.0),
    # then 1 ms of per-row copy each on its own core (2.0), then launch 1 ms beside 0.1 ms of GPU: 3.0
    h = host(launch_ms=[1.0], copy_ms=[0.5], copy_per_row_ms=[1.0], modules="cudagraph", cores=16)
    assert latencies(0.1, h, [0.0, 0.0], instances=2) == pytest.approx([3.0, 3.0])
    # one launching core: the per-row copies share it (both end at 1.0 + 2.0), then the launches do (+2.0)
    h1 = host(launch_ms=[1.0], copy_ms=[0.5], copy_per_row_ms=[1.0], modules="cudagraph", cores=1)
    assert latencies(0.1, h1, [0.0, 0.0], instances=2) == pytest.approx([5.0, 5.0])
    # the GPU starts after the copies: 0.5 + 1.0 + max(launch 1.0, GPU 3.0) = 4.5 for one query alone
    assert latencies(3.0, h, [0.0]) == pytest.approx([4.5])
    # it grows with the batch: four queries as one batch copy 4 ms of rows
    assert latencies(0.1, h, [0.0] * 4, max_batch=4) == pytest.approx([5.5] * 4)
    assert h.locked(0, 4) == 0.5 and h.copy_rows(0, 4) == 4.0
    # copy_lock = "all" (the model before): the whole copy under the lock, shared: 1.5 + 1.5 = 3.0, then 1.0
    ha = host_from_config({"launch_ms": 1.0, "copy_ms": 0.5, "copy_per_row_ms": 1.0, "modules": "cudagraph",
                           "copy_lock": "all"}, 1)
    assert ha.locked(0, 4) == 4.5 and ha.copy_rows(0, 4) == 0.0
    assert latencies(0.1, ha, [0.0, 0.0], instances=2) == pytest.approx([4.0, 4.0])
    # which hosts hold the lock at all (dvabatch.serial_host_cost asks): per-row copies only under "all"
    assert not host(copy_per_row_ms=[1.0]).holds_lock and ha.holds_lock and h.holds_lock  # h: copy_ms 0.5
    with pytest.raises(ConfigError, match="copy_lock"):
        host_from_config({"launch_ms": 1.0, "copy_lock": "some"}, 1)


def test_saturated_throughput_is_batch_over_host_time():
    # one stage, ZeroBatch up to 8, every execution c + launch = 0.5 + 1.5 = 2 ms (GPU 0.4 ms): 4000 qps
    h = host(launch_ms=[1.5], copy_ms=[0.5])
    n = 4000
    lat = latencies(0.4, h, [i * 0.01 for i in range(n)], max_batch=8)  # offered 100,000 qps
    span = max(i * 0.01 + x for i, x in enumerate(lat))
    assert n / span * 1000 == pytest.approx(4000, rel=0.01)


def test_stalls_are_seeded_and_add_host_time():
    h = host(launch_ms=[1.0], stall_prob=1.0, stall_ms=[5.0, 5.0])
    assert latencies(0.1, h, [0.0]) == pytest.approx([6.0])
    h = host(launch_ms=[1.0], stall_prob=0.3, stall_ms=[1.0, 9.0])
    arr = [i * 10.0 for i in range(300)]
    a, b = latencies(0.1, h, arr, seed=3), latencies(0.1, h, arr, seed=3)
    assert a == b
    stalled = sum(x > 1.0 + 1e-9 for x in a) / len(a)
    assert 0.2 < stalled < 0.4
    assert latencies(0.1, h, arr, seed=4) != a


def test_launch_table_interpolates_and_holds_outside(tmp_path):
    p = tmp_path / "t.launch.csv"
    p.write_text("# source: test\nmodules,stage,batch_size,seq_len,launch_ms\n"
                 "torchscript,0,1,32,1.0\ntorchscript,0,5,32,2.0\ntorchscript,0,1,64,3.0\ntorchscript,0,5,64,4.0\n"
                 "eager,0,1,32,9.0\n")
    t = LaunchTable.load(p)
    assert t.cost("torchscript", 0, 3, 32) == pytest.approx(1.5)
    assert t.cost("torchscript", 0, 3, 48) == pytest.approx(2.5)
    assert t.cost("torchscript", 0, 16, 128) == pytest.approx(4.0)   # held at the nearest profiled point
    assert t.cost("eager", 0, 4, 16) == pytest.approx(9.0)
    h = host_from_config({"launch_table": str(p), "launch_scale": 2.0}, 1)
    assert h.launch(0, 3, 32) == pytest.approx(3.0)
    with pytest.raises(ConfigError, match="engine.host.modules"):
        host_from_config({"launch_table": str(p), "modules": "cudagraph"}, 1)
    with pytest.raises(ConfigError, match="stages"):
        host_from_config({"launch_table": str(p)}, 2)


@pytest.mark.parametrize("d,field", [
    ({"modules": "jit"}, "engine.host.modules"),
    ({"cores": 0}, "engine.host.cores"),
    ({"launch_ms": [1.0, 2.0, 3.0]}, "engine.host.launch_ms"),
    ({"launch_ms": -1}, "engine.host.launch_ms"),
    ({"stall_prob": 0.1}, "engine.host.stall_ms"),
    ({"stall_prob": 2}, "engine.host.stall_prob"),
    ({"launch_scale": 0}, "engine.host.launch_scale"),
    ({"colour": 1}, "engine.host.colour"),
])
def test_bad_host_config_names_the_field(d, field):
    with pytest.raises(ConfigError) as e:
        host_from_config(d, 2)
    assert e.value.field == field


def test_gpu_table_gives_the_device_its_own_times(tmp_path):
    # the policy decides with a 0.5 ms table; the device runs the GPU-true 3 ms: c + max(launch, 3)
    gpu = make_table(1, lambda s, b: 3.0, batch_sizes=range(1, 17))
    p = tmp_path / "gpu.csv"
    gpu.save(p)
    h = host_from_config({"launch_ms": 2.0, "copy_ms": 0.3, "gpu_table": str(p)}, 1)
    assert latencies(0.5, h, [0.0]) == pytest.approx([3.3])
    with pytest.raises(ConfigError, match="stages"):
        host_from_config({"gpu_table": str(p)}, 2)


def test_set_reaches_the_host_subtable():
    from dvasim import config as cfgmod

    raw = {"model": {"table": "traces/default/vgg16_titanx_4stages.csv"},
           "workload": {"kind": "poisson", "rate_qps": 10, "n_queries": 5}}
    cfg = cfgmod.resolve(raw, ["engine.host.launch_ms=2.5", "engine.host.modules=eager"])
    assert cfg["engine"]["host"] == {"launch_ms": 2.5, "modules": "eager"}


def test_stall_bursts_raise_the_stall_rate_after_a_stall():
    # base 0, burst 1: the first stall can never start a burst, so nothing stalls
    h = host(launch_ms=[1.0], stall_prob=0.0, stall_cluster_prob=1.0, stall_ms=[5.0, 5.0], stall_window_ms=50.0)
    assert latencies(0.1, h, [i * 10.0 for i in range(20)]) == pytest.approx([1.0] * 20)
    # base 0.05, burst 1.0 within 25 ms: after the first stall at t0, every launch until t0 + 25 stalls, then
    # the burst ends (stalls inside it do not prolong it)
    h = host(launch_ms=[1.0], stall_prob=0.05, stall_cluster_prob=1.0, stall_ms=[2.0, 2.0], stall_window_ms=25.0)
    arr = [i * 10.0 for i in range(400)]
    lat = latencies(0.1, h, arr, seed=5)
    stalled = [x > 1.5 for x in lat]
    firsts = [i for i, s in enumerate(stalled) if s and (i == 0 or not stalled[i - 1])]
    assert firsts
    for i in firsts:  # a burst covers the launches at +10 and +20 ms after its start
        assert all(stalled[i:i + 3]) or i + 3 > len(stalled)
    frac = sum(stalled) / len(stalled)
    assert 0.1 < frac < 0.3  # about 3 stalled launches per burst start (p = 0.05 outside bursts)
