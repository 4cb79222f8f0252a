"""The device-sharing model: hand-computed finish times of overlapping executions."""

import pytest
import simpy

from dvasim.engines.sim.device import Device


def finish_times(mode, jobs, slowdown=1.0, **device_kw):
    """jobs: (start, work, demand) -> finish time of each (``device_kw``: more of the Device's settings)."""
    env = simpy.Environment()
    dev = Device(env, mode, slowdown, **device_kw)
    out = [None] * len(jobs)

    def proc(k, start, work, demand):
        yield env.timeout(start)
        yield dev.run(work, demand)
        out[k] = env.now

    for k, j in enumerate(jobs):
        env.process(proc(k, *j))
    env.run()
    return out


def test_fluid_undersubscribed_runs_at_standalone_speed():
    assert finish_times("fluid", [(0, 4.0, 0.5), (0, 2.0, 0.5)]) == pytest.approx([4.0, 2.0])


def test_fluid_oversubscribed_shares_in_proportion():
    # two saturating executions (demand 1): each runs at rate 1/2 while both run
    assert finish_times("fluid", [(0, 2.0, 1.0), (0, 2.0, 1.0)]) == pytest.approx([4.0, 4.0])
    # the second starts at 1: A has 1 left, both at rate 1/2 -> A ends at 3, then B alone: 2 - 1 = 1 left -> 4
    assert finish_times("fluid", [(0, 2.0, 1.0), (1, 2.0, 1.0)]) == pytest.approx([3.0, 4.0])


def test_fluid_partial_oversubscription():
    # demands 0.75 + 0.75 = 1.5: both at rate 2/3; A (work 2) ends at 3, B (work 4) has 2 left, alone -> 5
    assert finish_times("fluid", [(0, 2.0, 0.75), (0, 4.0, 0.75)]) == pytest.approx([3.0, 5.0])


def test_exclusive_serialises_in_launch_order():
    assert finish_times("exclusive", [(0, 2.0, 0.1), (0.5, 1.0, 0.1)]) == pytest.approx([2.0, 3.0])


def test_parallel_ignores_interference_and_slowdown_applies_while_overlapping():
    assert finish_times("parallel", [(0, 2.0, 1.0), (0, 2.0, 1.0)]) == pytest.approx([2.0, 2.0])
    # slowdown 2 while both run: both at rate 1/2 until A finishes at 4 (work 2) ... B identical
    assert finish_times("parallel", [(0, 2.0, 1.0), (0, 3.0, 1.0)], slowdown=2.0) == pytest.approx([4.0, 5.0])


def test_bad_mode_and_slowdown():
    env = simpy.Environment()
    with pytest.raises(ValueError):
        Device(env, "magic")
    with pytest.raises(ValueError):
        Device(env, "fluid", 0.5)


def test_cores_mode_gives_each_execution_a_core():
    # two cores: two executions at full speed, a third shares (each at 2/3) until one ends
    assert finish_times("cores", [(0, 2.0, 0.1), (0, 2.0, 0.1)]) == pytest.approx([2.0, 2.0])
    # three jobs of work 3 on 2 cores: all at rate 2/3 -> all finish at 4.5
    assert finish_times("cores", [(0, 3.0, 0.1)] * 3) == pytest.approx([4.5] * 3)
