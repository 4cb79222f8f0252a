"""Results independent of the Python version (issue 25, item 4): no ``sum()``, ``math.fsum``, ``statistics`` or
numpy reduction on the simulation's clock path, where the rounding differs between versions.

Python 3.12 made the builtin ``sum()`` of floats compensated (Neumaier summation: "What's New In Python 3.12",
``sum()`` "now uses Neumaier summation"), so ``sum([1e16, 1.0, -1e16])`` is 0.0 up to 3.11 and 1.0 from 3.12 on,
and a simulated time added with ``sum()`` depended on the interpreter (emulating 3.12's ``sum()`` here, 5 of the 95
golden runs differed). The clock path adds floats with :func:`dvasim.core.arith.left_sum` (plain left to right:
the rounding of ``sum()`` up to 3.11, on every version) and counts with :func:`~dvasim.core.arith.int_sum`.

The clock path (:data:`CLOCK_PATH`, one line of reason each): whatever computes a simulated time, a duration, a
rate, or a decision made from float arithmetic while a run is built and runs -- the mechanism, the policies, the
SimPy engine and its device, replicas and co-run profiler, the serving stacks' costs, the latency table's lookups
and the arrival instants. Every module under :data:`SCANNED_DIRS` must be listed (a new one is checked, or
listed here with a reason it is not).

Out of scope (numpy/pandas reductions allowed; none of them uses ``sum()`` on the clock):

* ``dvasim/reporting/*``: summaries, metrics, figures and records written after the events (not the clock);
* ``dvasim/studies/*``, ``dvasim/fitting/*``, ``dvasim/api.py``, ``dvasim/cli/*``, ``dvasim/config/*``: many
  runs, fits, the command line and config parsing, around the runs;
* ``dvasim/engines/replay/*``, ``dvasim/model/profiling/*``, ``dvasim/model/stages/*``, ``dvasim/model/zoo/*``:
  real torch execution, timed by the wall clock;
* ``dvasim/model/gpu_model.py``, ``dvasim/model/build_gpu_tables.py``: the analytic GPU model, run offline to
  write the shipped ``traces/gpu`` tables (data, not code, at run time);
* ``dvasim/model/slicing.py``, ``dvasim/model/catalog.py``: a named model's stage table, built once before the
  run from the shipped operator table with pandas' groupby sum and numpy's ``cumsum``/``reduceat`` (their
  rounding is the library's, the same on every interpreter for one numpy/pandas version; changing it would
  change every named model's table);
* ``dvasim/workload/config.py``, ``dvasim/workload/lengths.py``: the priority shares (normalised by numpy) and
  the input lengths, integers drawn by numpy's generator before the run.
"""

from __future__ import annotations

import ast
import builtins
import math
import random
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import dvasim
from dvasim.core.arith import int_sum, left_sum
from tests.conftest import make_table

ROOT = Path(dvasim.__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
sys.path.insert(0, str(GOLDEN))

from cases import CASES  # noqa: E402
from make_golden import frame_arrays  # noqa: E402

from tests.test_golden import CHANGED_ON_PURPOSE  # noqa: E402

# every module here is on the clock path unless listed otherwise; each must appear in CLOCK_PATH
SCANNED_DIRS = ("dvasim/core", "dvasim/policies", "dvasim/engines/sim", "dvasim/server")

CLOCK_PATH: dict[str, str] = {
    "dvasim/core/__init__.py": "re-exports the mechanism the engines drive",
    "dvasim/core/arith.py": "the shared sums themselves",
    "dvasim/core/batch_table.py": "the batch table: batch sizes, stretch/split/new at simulated instants",
    "dvasim/core/buffers.py": "buffer pairs: which execution may start",
    "dvasim/core/compiling.py": "mypyc's class decorator for the compiled core (no arithmetic)",
    "dvasim/core/errors.py": "the mechanism's errors (no arithmetic; their own module so mypyc leaves them pure)",
    "dvasim/core/executor.py": "executor states: which stage runs when",
    "dvasim/core/operations.py": "time_eps: the tolerance every 'is it now' comparison uses",
    "dvasim/core/pipeline.py": "the control plane: each execution's standalone time and demand, wake-up times",
    "dvasim/core/query.py": "every query's timestamps",
    "dvasim/policies/__init__.py": "the policy registry",
    "dvasim/policies/base.py": "the policies' view of the pipeline, batch windows' timers",
    "dvasim/policies/dvabatch.py": "Policies I-III: padding waste, clusters, fluid finish times, QoS margins",
    "dvasim/policies/dvabatch_built.py": "the authors' backend: stretch thresholds, the merge window from the table",
    "dvasim/policies/e2bird.py": "N-/E-Ebird: worker sizes, MaxInf from the table, the co-run search",
    "dvasim/policies/lazybatch.py": "LazyBatching's slack predictor: sums of stage latencies",
    "dvasim/policies/peers.py": "TF-Serving, Serial, GraphB: timeouts and batch sizes",
    "dvasim/policies/triton.py": "Triton's dynamic batcher (ZeroBatch, DelayBatch): batch windows",
    "dvasim/policies/triton_server.py": "Triton's batcher whole: batch windows, queue policy timeouts",
    "dvasim/policies/triton_release.py": "Triton's instance pipeline by release: payload ages at dequeue",
    "dvasim/engines/sim/__init__.py": "the simulator's entry points",
    "dvasim/engines/sim/collector.py": "the garbage collector's thresholds during a run (no arithmetic)",
    "dvasim/engines/sim/engine.py": "the SimPy engine: the clock itself, arrivals, launches, host costs",
    "dvasim/engines/sim/result.py": "a run's result and the engine's errors (no arithmetic; their own module so "
                                     "mypyc leaves them pure)",
    "dvasim/engines/sim/device.py": "device sharing: each execution's progress rate (fluid: 1 / sum of demands)",
    "dvasim/engines/sim/corun.py": "E-Ebird's simulated co-runs: the average latency that picks the engine",
    "dvasim/engines/sim/cluster.py": "replicas behind a router: hand-offs, network delays, busy time",
    "dvasim/server/__init__.py": "the serving stacks' registry",
    "dvasim/server/costs.py": "per-batch host costs: entry, copies, exit",
    "dvasim/server/host.py": "the host model: launch costs per stage, the launch law over operators",
    "dvasim/server/transfer.py": "input copies: the link's busy time, E2bird's memory pool",
    "dvasim/server/stacks.py": "the stacks' numbers the costs are made of",
    "dvasim/server/resolve.py": "which stack a run serves on and its cost numbers",
    "dvasim/server/router.py": "which replica gets a query (least work: batch-1 model times)",
    "dvasim/model/table.py": "every stage time, remaining and total time, demand the engine and policies read",
    "dvasim/workload/arrivals.py": "the arrival instants (Poisson, gamma, uniform, stepping, phases)",
    "dvasim/workload/traces.py": "a trace's arrival instants, rescaled to a rate",
}

# (module, the line's text stripped) -> why the call is exact or the same on every version
ALLOWED: dict[tuple[str, str], str] = {
    ("dvasim/workload/arrivals.py", "return _check_start(start_ms) + np.cumsum(gaps)"):
        "numpy's cumsum adds left to right by definition (out[i] = out[i-1] + x[i]; numpy's docs contrast it "
        "with sum's pairwise summation), the same on every interpreter: test_numpy_cumsum_is_left_to_right",
}

NAMES = {"sum", "fsum", "fmean", "sumprod"}  # any use, called or passed on (map(sum, ...))
CALLED_NAMES = {"prod"}  # ``from math import prod``
METHODS = {"sum", "mean", "cumsum", "prod", "cumprod", "average", "dot", "vdot", "inner", "matmul", "einsum",
           "nansum", "nanmean", "nancumsum", "nanprod", "std", "var", "fsum", "fmean", "sumprod", "trapz",
           "trapezoid"}
UFUNC_REDUCTIONS = ({"add", "multiply", "subtract"}, {"reduce", "reduceat", "accumulate"})  # np.add.reduce(...)


def forbidden(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for every sum-like reduction in ``source`` whose rounding may differ between versions."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in NAMES:
            found.append((node.lineno, node.id))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in CALLED_NAMES:
            found.append((node.lineno, node.func.id))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            if f.attr in METHODS:
                found.append((node.lineno, ast.unparse(f)))
            elif isinstance(f.value, ast.Name) and f.value.id == "statistics":
                found.append((node.lineno, ast.unparse(f)))
            elif (f.attr in UFUNC_REDUCTIONS[1] and isinstance(f.value, ast.Attribute)
                  and f.value.attr in UFUNC_REDUCTIONS[0]):
                found.append((node.lineno, ast.unparse(f)))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
            found.append((node.lineno, "@"))
        elif isinstance(node, ast.Import) and any(a.name == "statistics" for a in node.names):
            found.append((node.lineno, "import statistics"))
        elif isinstance(node, ast.ImportFrom) and node.module == "statistics":
            found.append((node.lineno, "from statistics import"))
    return sorted(found)


def _sites() -> list[tuple[str, int, str, str]]:
    """Every reduction on the clock path: (module, line, the line's text, what)."""
    out = []
    for rel in CLOCK_PATH:
        text = (ROOT / rel).read_text(encoding="utf-8")
        lines = text.splitlines()
        out += [(rel, n, lines[n - 1].strip(), what) for n, what in forbidden(text)]
    return out


def test_every_module_of_the_scanned_packages_is_listed():
    have = {str(p.relative_to(ROOT)) for d in SCANNED_DIRS for p in (ROOT / d).glob("*.py")}
    assert have - set(CLOCK_PATH) == set(), "a new module: add it to CLOCK_PATH with its reason"
    assert [m for m in CLOCK_PATH if not (ROOT / m).is_file()] == []


def test_no_sum_on_the_clock_path():
    bad = [f"{m}:{n}: {what} in `{line}`" for m, n, line, what in _sites() if (m, line) not in ALLOWED]
    assert not bad, ("on the clock path add floats with dvasim.core.arith.left_sum and counts with int_sum "
                     "(sum() rounds differently from Python 3.12 on):\n" + "\n".join(bad))


def test_every_allowance_is_used():
    used = {(m, line) for m, _, line, _ in _sites()}
    assert set(ALLOWED) <= used, f"stale allowances: {sorted(set(ALLOWED) - used)}"


def test_the_check_finds_every_form():
    source = """
import statistics
from statistics import mean
import numpy as np
from math import fsum, prod
a = sum(xs)
b = sum(x for x in xs)
c = list(map(sum, rows))
d = math.fsum(xs)
e = fsum(xs)
f = np.sum(arr) + np.mean(arr) + np.cumsum(arr) + np.dot(u, v) + np.prod(arr) + np.average(arr)
g = arr.sum() + arr.mean() + arr.cumsum() + arr.prod() + df["x"].sum(axis=0)
h = statistics.mean(xs) + statistics.fmean(xs)
i = np.add.reduce(arr) + np.add.reduceat(arr, idx) + np.add.accumulate(arr)
j = u @ v
k = prod(xs)
"""
    flagged = {n for n, _ in forbidden(source)}
    lines = source.splitlines()
    want = {n for n, text in enumerate(lines, start=1) if text and not text.startswith(("import numpy", "from math"))}
    assert flagged == want, [lines[n - 1] for n in want - flagged]
    assert len(forbidden(source)) == 25  # every call on a line, not only the first
    fine = """
a = left_sum(xs) + int_sum(counts) + max(xs) + min(xs) + len(xs)
b = np.maximum.accumulate(arr) + np.minimum.reduce(arr) + arr.max() + arr.min() + np.searchsorted(arr, 1.0)
c = sorted(xs, key=lambda x: x.total) + profile.total(4)
"""
    assert forbidden(fine) == []


# ----------------------------------------------------------------------------- the helpers
def _round_each_step(xs) -> float:
    """Left to right, each partial sum the exact rational sum rounded to the nearest double (ties to even):
    IEEE 754 addition, computed independently of the machine's adder."""
    total = 0.0
    for x in xs:
        total = float(Fraction(total) + Fraction(x))
    return total


ADVERSARIAL = [
    ([1e16, 1.0, -1e16], 0.0),  # 3.12's sum(): 1.0
    ([1.0, 1e-16, 1e-16], 1.0),  # 3.12's: 1.0000000000000002
    ([0.1] * 10, 0.9999999999999999),  # 3.12's: 1.0
    ([1e100, 1.0, -1e100, 1.0], 1.0),  # 3.12's: 2.0
    ([0.1, 0.2, 0.3], 0.6000000000000001),  # 3.12's: 0.6
]


@pytest.mark.parametrize(("xs", "plain"), ADVERSARIAL)
def test_left_sum_is_the_sum_of_python_up_to_311(xs, plain):
    """The pre-3.12 answer whatever the interpreter, worked out by hand and by exact rationals; where the
    compensated sum differs, the emulation of 3.12 below gives the other answer."""
    assert left_sum(xs) == plain == _round_each_step(xs)
    assert sum312(xs) != plain
    assert sum311(xs) == plain


def test_left_sum_agrees_with_exact_rounding_and_with_this_interpreters_sum():
    rng = random.Random(25)
    for _ in range(500):
        xs = [rng.choice([1.0, -1.0]) * rng.random() * 10.0 ** rng.randint(-20, 20) for _ in range(rng.randint(0, 12))]
        assert left_sum(xs) == _round_each_step(xs)
        if sys.version_info < (3, 12):  # Python 3.10 and 3.11: the builtin is the plain loop
            assert left_sum(xs) == sum(xs)
        else:  # 3.12 and later: the builtin is compensated, as the emulation says
            assert sum(xs) == sum312(xs)


def test_left_sum_starts_like_sum_from_int_zero():
    """``sum()`` starts from the int 0, ``left_sum`` from 0.0: the same floats, -0.0 included (0 + -0.0 = 0.0)."""
    assert math.copysign(1.0, left_sum([-0.0])) == math.copysign(1.0, sum311([-0.0])) == 1.0
    assert math.copysign(1.0, left_sum([-0.0, -0.0])) == 1.0
    assert left_sum([]) == 0.0 and isinstance(left_sum([]), float)
    assert left_sum([2, 0.5]) == 2.5  # ints mixed in are added as floats, as sum() does
    assert left_sum(x for x in (0.25, 0.5)) == 0.75  # any iterable


def test_int_sum_is_exact_and_takes_integers_only():
    assert int_sum([2**60, 1, -(2**60)]) == 1
    assert int_sum([np.int64(3), True, 4]) == 8 and int_sum([]) == 0
    with pytest.raises(TypeError):
        int_sum([1, 2.0])


def test_numpy_cumsum_is_left_to_right():
    """The arrivals' ``np.cumsum`` (allowed above) gives exactly the left-to-right partial sums."""
    rng = np.random.default_rng(25)
    gaps = rng.exponential(1.0, 10_000) * 10.0 ** rng.integers(-8, 8, 10_000)
    want, total = [], 0.0
    for g in gaps.tolist():
        total += g
        want.append(total)
    assert np.cumsum(gaps).tolist() == want
    assert np.cumsum(np.array([1e16, 1.0, -1e16]))[-1] == 0.0


# ----------------------------------------------------------------------------- the modules use them
def sum311(iterable, /, start=0):
    """The builtin ``sum()`` of Python 3.10 and 3.11 for numbers: ``start + x0 + x1 + ...`` left to right."""
    result = start
    for x in iterable:
        result = result + x
    return result


def sum312(iterable, /, start=0):
    """The builtin ``sum()`` of Python 3.12 for numbers (CPython's ``builtin_sum_impl``): ints exactly while the
    result is an int; from the first float on, exact floats added with Neumaier's compensation, the compensation
    added at the end (when finite and non-zero)."""
    it = iter(iterable)
    result = start
    if type(result) is int:
        for x in it:
            if type(x) in (int, bool):
                result += x
                continue
            result = result + x
            break
    if type(result) is float:
        f, c = result, 0.0
        for x in it:
            if type(x) is float:
                t = f + x
                c += (f - t) + x if abs(f) >= abs(x) else (x - t) + f
                f = t
            elif type(x) is int:
                f += float(x)
            else:
                if c and math.isfinite(c):
                    f += c
                result = f + x
                break
        else:
            return f + c if c and math.isfinite(c) else f
    for x in it:
        result = result + x
    return result


@pytest.fixture(scope="module")
def golden():
    with np.load(GOLDEN / "golden.npz") as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_run_is_the_same_with_python_312s_sum(name, golden, monkeypatch):
    """Every golden run, with the builtin ``sum()`` replaced by Python 3.12's: bit for bit the golden file (made
    with 3.11's), or for a run changed on purpose since (tests/test_golden.py's ``CHANGED_ON_PURPOSE``) the same
    run with 3.11's ``sum()``. Before the clock path used left_sum, 5 cases differed here (VGG19 DVABatch on fluid
    sharing and in bursts: the device's sum of demands, the table's remaining times)."""
    if name in CHANGED_ON_PURPOSE:
        want = frame_arrays(dvasim.run(CASES[name]).queries)
    else:
        want = {k.split("/", 1)[1]: v for k, v in golden.items() if k.startswith(name + "/")}
    monkeypatch.setattr(builtins, "sum", sum312)
    got = frame_arrays(dvasim.run(CASES[name]).queries)
    assert set(got) == set(want)
    for col, arr in want.items():
        np.testing.assert_array_equal(got[col], arr, err_msg=f"{name}: column {col}", strict=True)


_RTE = {"kind": "poisson", "rate_qps": 250.0, "n_queries": 300, "seed": 3, "seq_len_dist": "glue:RTE"}
_LOAD = {"kind": "poisson", "rate_qps": 300.0, "n_queries": 300, "seed": 2}
BERT = {"name": "bert_base", "device": "titanrtx", "stages": 4}
VGG = {"name": "vgg19", "device": "titanrtx", "stages": 4}
RESNET1 = {"name": "resnet152", "device": "titanrtx", "stages": 1}
BEYOND_GOLDEN = {  # the policies, stacks and engine parts the golden cases leave out
    "lazybatch-conservative": {"model": BERT, "policy": {"name": "lazybatch", "sla_ms": 50.0}, "workload": _RTE},
    "lazybatch-oracle": {"model": VGG, "policy": {"name": "lazybatch", "predictor": "oracle"}, "workload": _LOAD},
    "dvabatch-input-clusters": {"model": BERT, "policy": {"name": "dvabatch", "policies": ["input", "load"]},
                                "workload": _RTE},
    "dvabatch-split-operator": {"model": VGG, "policy": {"name": "dvabatch-split"}, "workload": _LOAD},
    "n-ebird-pool": {"model": RESNET1, "policy": {"name": "n-ebird"}, "workload": _LOAD,
                     "engine": {"transfer": {"mode": "pool"}}},
    "e-ebird": {"model": RESNET1, "policy": {"name": "e-ebird", "total_bs": [4, 8]}, "workload": _LOAD},
    "tfserving-stack": {"model": VGG, "policy": {"name": "tfserving-optwait"}, "workload": _LOAD,
                        "server": {"stack": "tfserving"}},
    "triton-stack-host": {"model": BERT, "policy": {"name": "delaybatch", "max_queue_delay_ms": 4.0},
                          "workload": _RTE, "server": {"stack": "triton-tensorrt"}},
    "graphbatch": {"model": VGG, "policy": {"name": "graphbatch"}, "workload": _LOAD},
    "replicas-least-work": {"model": BERT, "policy": {"name": "dvabatch"}, "workload": _RTE,
                            "cluster": {"replicas": 2, "router": "least_work"}},
}


@pytest.mark.parametrize("name", sorted(BEYOND_GOLDEN))
def test_runs_are_the_same_with_python_311s_and_312s_sum(name, monkeypatch):
    """Policies, stacks, replicas and co-runs the golden cases do not cover: the same records, bit for bit, with
    the builtin ``sum()`` of Python 3.11 and of 3.12 (both emulated, so the check means the same on any
    interpreter)."""
    runs = []
    for emulated in (sum311, sum312):
        monkeypatch.setattr(builtins, "sum", emulated)
        res = dvasim.run(BEYOND_GOLDEN[name])
        assert res.stuck is None
        runs.append(frame_arrays(res.queries))
        monkeypatch.undo()
    assert set(runs[0]) == set(runs[1])
    for col in runs[0]:
        np.testing.assert_array_equal(runs[1][col], runs[0][col], err_msg=f"{name}: column {col}", strict=True)


def _tenths():
    """Ten stages of 0.1 ms at batch sizes 1..10: left to right the ten stages add to 0.9999999999999999 ms,
    compensated to 1.0; each stage's demand at batch 1 is 0.1."""
    return make_table(10, lambda s, b: 0.1, batch_sizes=range(1, 11))


def _device_finishes():
    import simpy

    from dvasim.engines.sim.device import Device

    env = simpy.Environment()
    dev = Device(env, "fluid")
    done = []
    for k in range(11):  # eleven executions of demand 0.1: the device is shared at rate 1 / (eleven 0.1s)
        dev.run(1.0 + k, 0.1).callbacks.append(lambda _ev: done.append(env.now))
    env.run()
    return done


def _lazybatch_run():
    from dvasim.policies.lazybatch import LazyBatch

    policy = LazyBatch()
    policy.has_len = False
    return policy._run(_tenths(), 0, 10, [None])


def _corun():
    from dvasim.engines.sim.corun import corun_average_ms

    table = make_table(3, lambda s, b: 0.3 * (1 + 0.1 * b), batch_sizes=range(1, 11))
    return corun_average_ms(table, [3] * 7)  # seven workers ending together: seven equal ends averaged


def _dvabatch(what):
    from dvasim.policies import dvabatch

    if what == "mean_demand":
        return dvabatch._mean_demand(_tenths(), 1, None)
    if what == "fluid":
        return dvabatch.fluid_finish_times([(1.0 + k, 0.1) for k in range(11)])
    one_stage = make_table(1, lambda s, b, L: {8: 0.1, 16: 0.2, 24: 0.3}[L], batch_sizes=range(1, 5),
                           seq_lens=[8, 16, 24])
    return dvabatch.padding_waste(one_stage, [8, 16, 24], 4)  # E[total] adds 0.1 + 0.2 + 0.3


CLOCK_CALLS = {  # the clock path's own additions, called directly
    "LatencyTable.remaining": lambda: _tenths().remaining(0, 1),
    "Device fluid rate": _device_finishes,
    "lazybatch slack predictor": _lazybatch_run,
    "E-Ebird co-run average": _corun,
    "dvabatch mean demand": lambda: _dvabatch("mean_demand"),
    "dvabatch fluid finish times": lambda: _dvabatch("fluid"),
    "dvabatch padding waste": lambda: _dvabatch("padding"),
}


@pytest.mark.parametrize("name", sorted(CLOCK_CALLS))
def test_clock_path_additions_are_the_same_with_python_311s_and_312s_sum(name, monkeypatch):
    """Each addition on the clock path gives the same float with the builtin ``sum()`` of Python 3.11 and of 3.12
    (on inputs where the two differ); each of these differed before the clock path used left_sum."""
    got = []
    for emulated in (sum311, sum312):
        monkeypatch.setattr(builtins, "sum", emulated)
        got.append(CLOCK_CALLS[name]())
        monkeypatch.undo()
    assert got[0] == got[1]


def test_the_table_adds_its_stages_left_to_right():
    assert _tenths().remaining(0, 1) == _round_each_step([0.1] * 10) == 0.9999999999999999
    assert _tenths().total(1) == 0.9999999999999999
