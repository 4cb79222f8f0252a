"""TorchScript stage modules (the replay's default) and the fit of the simulator's CPU model to replays."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from dvasim.errors import ConfigError  # noqa: E402
from dvasim.fitting.validate import fit_engine  # noqa: E402
from dvasim.model import zoo  # noqa: E402
from dvasim.model.stages.buffers import flatten  # noqa: E402
from dvasim.model.stages.compiled import TorchScriptStage, stage_modules  # noqa: E402


@pytest.mark.parametrize("name", zoo.MODEL_NAMES)
def test_traced_stages_equal_the_eager_ones_at_other_shapes(name):
    """Traced at 2 rows (16 tokens), the frozen graphs must generalise: same structure, same values."""
    m = zoo.build(name, "small")
    n = m.n_ops()
    bounds = [0, n // 4, n // 2, 3 * n // 4]
    traced = stage_modules(m, bounds, "torchscript")
    eager = stage_modules(m, bounds, "eager")
    assert all(isinstance(t, TorchScriptStage) for t in traced)
    shapes = ((1, 8), (5, 100), (3, 33)) if m.input_kind == "tokens" else ((1, None), (5, None))
    torch.set_num_threads(1)
    with torch.inference_mode():
        for bs, length in shapes:
            x = m.example_input(bs, length) if length else m.example_input(bs)
            a = b = x
            for e, t in zip(eager, traced):
                a, b = e(a), t(b)
                la, sa = flatten(a)
                lb, sb = flatten(b)
                assert sa == sb
                for p, q in zip(la, lb):
                    assert (p is None) == (q is None)
                    if p is not None:
                        assert p.shape == q.shape and p.dtype == q.dtype
                        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-4)


def test_a_carry_of_another_structure_is_refused():
    m = zoo.build("linknet", "small")
    st = stage_modules(m, [0, 3, 6], "torchscript")[1]
    with pytest.raises(ValueError, match="structure"):
        st(m.example_input(1))  # a bare image where the traced stage takes (x, identity, skips)


def test_replay_modules_setting_is_checked():
    from dvasim import config

    base = {"model": {"name": "vgg19", "device": "cpu", "stages": 2},
            "workload": {"kind": "poisson", "rate_qps": 10, "n_queries": 5}}
    # "auto": CUDA graphs on a GPU, TorchScript on a CPU (resolved when the replay knows its device)
    from dvasim.engines.replay.engine import modules_for

    assert config.resolve(base)["replay"]["modules"] == "auto"
    assert modules_for("auto", "cpu") == "torchscript" and modules_for("auto", "cuda") == "cudagraph"
    assert config.resolve({**base, "replay": {"modules": "cudagraph"}})["replay"]["modules"] == "cudagraph"
    with pytest.raises(ConfigError, match="replay.modules"):
        config.resolve({**base, "replay": {"modules": "jit"}})
    with pytest.raises(ConfigError, match="replay"):
        config.resolve({**base, "replay": {"module": "eager"}})


def test_eager_and_torchscript_replays_give_the_same_outputs():
    from dvasim.engines.replay import replay

    c = {"model": {"name": "resnet152", "device": "cpu", "stages": 3},
         "policy": {"name": "dvabatch", "max_batch_size": 8},
         "workload": {"kind": "poisson", "rate_qps": 300, "n_queries": 40, "seed": 3}}
    outs = {}
    for kind in ("eager", "torchscript"):
        r = replay({**c, "replay": {"modules": kind}}, record_outputs=True)
        assert r.summary["replay_modules"] == kind and r.summary["n_completed"] == 40
        assert r.summary["stack"] == f"real {kind} stages on cpu"  # every run names its stack, a replay too
        outs[kind] = r.extra["replay"].outputs
    for qid, want in outs["eager"].items():
        torch.testing.assert_close(outs["torchscript"][qid], want, rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- fit_engine
class _Q:
    def __init__(self, arrival, seen):
        self.arrival, self.seen = arrival, seen


class _Run:
    def __init__(self, executions, queries):
        self.extra = {"replay": type("R", (), {"executions": executions, "queries": queries})()}


def _cores_schedule(jobs, cores, slow):
    """A second implementation of the cores model: exact event-driven progress of ``jobs`` (start, work)."""
    t, active, pending, ends = 0.0, {}, sorted(range(len(jobs)), key=lambda i: jobs[i][0]), {}
    left = {i: jobs[i][1] for i in range(len(jobs))}
    while pending or active:
        n = len(active)
        rate = 0.0 if n == 0 else (1.0 if n == 1 else min(1.0, cores / n) / slow)
        t_next_start = jobs[pending[0]][0] if pending else math.inf
        t_next_end = min((t + left[i] / rate for i in active), default=math.inf)
        t_new = min(t_next_start, t_next_end)
        for i in active:
            left[i] -= (t_new - t) * rate
        t = t_new
        for i in [i for i in active if left[i] <= 1e-12]:
            del active[i]
            ends[i] = t
        while pending and jobs[pending[0]][0] <= t + 1e-15:
            active[pending.pop(0)] = True
    return ends


@pytest.mark.parametrize("slow", [1.0, 1.3])
def test_fit_engine_recovers_the_cores_model(slow):
    rng = np.random.default_rng(7)
    jobs = []
    t = 0.0
    for k in range(120):  # groups of 1, 2 or 3 overlapping executions, far apart
        size = 1 + k % 3
        for j in range(size):
            jobs.append((t + j * rng.uniform(0.0, 0.3), rng.uniform(1.0, 3.0)))
        t += 50.0
    ends = _cores_schedule(jobs, cores=2, slow=slow)
    ex = [{"begin_ms": s, "end_ms": ends[i], "table_ms": w, "copy_ms": 0.0, "handoff_ms": 0.1, "bookkeeping_ms": 0.02,
           "stage": i % 3, "batch_size": 1}
          for i, (s, w) in enumerate(jobs)]
    qs = [_Q(10.0 * i, 10.0 * i + 0.25) for i in range(50)]
    fit = fit_engine([_Run(ex, qs)], cores=2)
    assert fit["service_cv"] == pytest.approx(0.0, abs=1e-9)  # exact model: no jitter
    assert fit["corun_slowdown"] == pytest.approx(slow, rel=1e-6)
    assert fit["alone_ratio"] == pytest.approx(1.0)
    assert fit["launch_overhead_ms"] == pytest.approx(0.12)
    assert fit["admission_delay_ms"] == pytest.approx(0.25)
    # a fit that assumed the wrong number of cores would not recover the slowdown
    assert fit_engine([_Run(ex, qs)], cores=3)["corun_slowdown"] != pytest.approx(slow, rel=1e-3)


def test_fit_engine_measures_the_execution_jitter():
    rng = np.random.default_rng(3)
    cv = 0.2
    sigma = math.sqrt(math.log1p(cv * cv))
    ex, t = [], 0.0
    for i in range(3000):
        w = [1.0, 2.0, 4.0][i % 3]
        d = w * 1.1 * rng.lognormal(-sigma * sigma / 2, sigma)  # a table 10% optimistic, plus jitter
        ex.append({"begin_ms": t, "end_ms": t + d, "table_ms": w, "copy_ms": 0.0, "handoff_ms": 0.0,
                   "bookkeeping_ms": 0.0, "stage": i % 3, "batch_size": 1})
        t += 10.0
    fit = fit_engine([_Run(ex, [])], cores=2)
    assert fit["alone_ratio"] == pytest.approx(1.1, rel=0.03)
    assert fit["service_cv"] == pytest.approx(cv, rel=0.1)
