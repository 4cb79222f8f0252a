"""Measured device sharing: how much stage executions slow each other down when run at once.

The simulator's device-sharing model (the *fluid* model) gives every running execution its standalone time
``T(b)`` and a demand ``d = min(1, thr(b) / thr_max)`` with ``thr(b) = b / T(b)`` and ``thr_max`` the stage's
best throughput over the profiled batch sizes. While the demands of the running executions sum to at most
``capacity`` (1 in the simulator's default) all run at standalone speed; beyond that each progresses at rate
``capacity / sum(d)``. On top of that an optional multiplicative ``corun_slowdown`` stretches every execution
while two or more run at once (shared caches, memory bandwidth, the Python GIL between operators, ...).

For a group of executions that overlap for their whole duration (the steady state measured here) the model
predicts for member A::

    T_A' = T_A * max(1, (d_A + sum of the others' d) / capacity) * corun_slowdown

:func:`measure_sharing` measures every member alone and then all together for groups of (stage, batch size)
of a small zoo model: one Python thread per execution (CPU; each with ``torch.set_num_threads(threads)``,
default 1, the replay's setting) or additionally one CUDA stream each (GPU; written against the torch API,
not exercised on this machine), each running its execution in a loop; a run counts as co-run only if it lies
entirely in the window where all loops are running. :func:`fit_sharing` fits ``corun_slowdown`` (geometric
mean of measured / predicted) for the default capacity 1 and compares variants of the model (fluid alone,
slowdown alone, best capacity, and *per-core*: every single-threaded execution occupies one of ``cores``
cores whatever its batch size) by the mean / max absolute relative error of the predicted co-run times.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import itertools
import math
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from dvasim.errors import ConfigError

__all__ = ["measure_sharing", "fit_sharing", "predict_corun", "corun_times", "alone_times", "default_groups"]

DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16)


def predict_corun(alone_ms, demand, partner_demand, slowdown: float = 1.0, capacity: float = 1.0) -> np.ndarray:
    """Fluid(-with-slowdown) prediction of a co-run time (two executions overlapping throughout)."""
    alone = np.asarray(alone_ms, dtype=float)
    total = np.asarray(demand, dtype=float) + np.asarray(partner_demand, dtype=float)
    stretch = np.maximum(1.0, total / capacity) if math.isfinite(capacity) else np.ones_like(total)
    return alone * stretch * slowdown


def _errors(pred: np.ndarray, meas: np.ndarray) -> dict[str, float]:
    rel = np.abs(pred / meas - 1.0)
    return {"mean_abs_rel_err": float(rel.mean()), "max_abs_rel_err": float(rel.max())}


def _fit_slowdown(base_pred: np.ndarray, meas: np.ndarray) -> float:
    return float(np.exp(np.mean(np.log(meas / base_pred))))


def _bounded(s: float, lo: float | None) -> float:
    return s if lo is None else max(float(lo), s)


def _variant(base_pred: np.ndarray, meas: np.ndarray, n_params: int, cap, min_slowdown: float | None) -> dict:
    """One variant of the sharing model: its slowdown fitted (when it has parameters, raised to ``min_slowdown``)
    and the errors of its predictions ``base_pred * slowdown``."""
    raw = _fit_slowdown(base_pred, meas) if n_params else 1.0
    s = _bounded(raw, min_slowdown) if n_params else 1.0
    return {**_errors(base_pred * s, meas), "capacity": cap, "corun_slowdown": s, "corun_slowdown_unclamped": raw}


def _best_capacity(alone, dem, pdem, meas, capacities, min_slowdown: float | None) -> tuple[float, np.ndarray]:
    """The capacity (among ``capacities``, default 1..4 step 0.05 and infinity) whose fluid prediction, with its
    own fitted slowdown, has the smallest mean error (ties: the smaller capacity); returns it and that
    prediction without the slowdown."""
    caps = list(np.round(np.arange(1.0, 4.0001, 0.05), 4)) + [math.inf] if capacities is None else list(capacities)
    best = None
    for c in caps:
        b = predict_corun(alone, dem, pdem, capacity=c)
        s = _bounded(_fit_slowdown(b, meas), min_slowdown)
        err = _errors(b * s, meas)["mean_abs_rel_err"]
        if best is None or (round(err, 12), c) < best[0]:
            best = ((round(err, 12), c), c, b)
    _, c_best, b_best = best
    return c_best, b_best


def _sharing_columns(df: pd.DataFrame, capacity: float) -> tuple[pd.DataFrame, tuple[np.ndarray, ...]]:
    """The co-run rows with every needed value and their columns as arrays: (rows, (alone, measured, demand,
    partner demand, group size))."""
    need = ("alone_ms", "corun_ms", "demand", "partner_demand")
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise ConfigError("sharing", f"measurements lack column(s) {', '.join(missing)}")
    d = df.dropna(subset=list(need))
    if len(d) == 0:
        raise ConfigError("sharing", "no co-run measurements to fit")
    if not capacity > 0:
        raise ConfigError("sharing.capacity", f"must be > 0, got {capacity!r}")
    alone = d["alone_ms"].to_numpy(float)
    meas = d["corun_ms"].to_numpy(float)
    dem = d["demand"].to_numpy(float)
    pdem = d["partner_demand"].to_numpy(float)
    n_co = d["n_corun"].to_numpy(float) if "n_corun" in d.columns else np.full(len(d), 2.0)
    if np.any(alone <= 0) or np.any(meas <= 0):
        raise ConfigError("sharing", "times must be > 0")
    return d, (alone, meas, dem, pdem, n_co)


def fit_sharing(df: pd.DataFrame, capacity: float = 1.0, cores: float | None = None,
                capacities: Sequence[float] | None = None, min_slowdown: float | None = 1.0) -> dict:
    """Fit the sharing model to co-run measurements.

    ``df`` needs columns ``alone_ms``, ``corun_ms``, ``demand``, ``partner_demand`` (one row per execution of
    a co-running group; ``partner_demand`` = sum of the other members' demands) and, for the per-core
    variant, ``n_corun`` (group size; 2 if absent). Returns a dict with ``corun_slowdown`` fitted for the
    fluid model at ``capacity`` (the simulator's default 1) and ``errors`` for the variants:

    * ``fluid``: capacity 1, no slowdown (the simulator's default without ``corun_slowdown``);
    * ``fluid_with_slowdown``: ``capacity`` and the fitted ``corun_slowdown``;
    * ``slowdown_only``: no fluid stretching, its own fitted slowdown;
    * ``best_capacity``: capacity searched over ``capacities`` (default 1..4 step 0.05 and infinity) with its
      own fitted slowdown;
    * ``per_core`` (only if ``cores`` is given): demand 1 for every execution and capacity ``cores``, i.e.
      ``T' = T * max(1, n_corun / cores) * slowdown``.

    ``recommended`` names the variant with the smallest mean error (ties within 0.005: fewer fitted
    parameters) and its parameters. Each fit is the geometric mean of measured / predicted, raised to
    ``min_slowdown`` (default 1: the simulator accepts no speed-up from co-running; ``None`` = no bound); the
    errors are those of the bounded value and ``corun_slowdown_unclamped`` keeps the raw fit.
    """
    d, (alone, meas, dem, pdem, n_co) = _sharing_columns(df, capacity)
    variants: dict[str, dict] = {}
    cands = []  # (name, number of fitted parameters)

    def add(name, base_pred, n_params, cap):
        variants[name] = _variant(base_pred, meas, n_params, cap, min_slowdown)
        cands.append((name, n_params))

    add("fluid", predict_corun(alone, dem, pdem), 0, 1.0)
    add("fluid_with_slowdown", predict_corun(alone, dem, pdem, capacity=capacity), 1, float(capacity))
    add("slowdown_only", predict_corun(alone, dem, pdem, capacity=math.inf), 1, None)
    c_best, b_best = _best_capacity(alone, dem, pdem, meas, capacities, min_slowdown)
    add("best_capacity", b_best, 2, None if not math.isfinite(c_best) else float(c_best))
    if cores is not None:
        if not cores > 0:
            raise ConfigError("sharing.cores", f"must be > 0, got {cores!r}")
        add("per_core", alone * np.maximum(1.0, n_co / float(cores)), 1, float(cores))
    rec = min(cands, key=lambda c: (round(variants[c[0]]["mean_abs_rel_err"] / 0.005), c[1]))[0]
    return {
        "model": "fluid",
        "capacity": float(capacity),
        "corun_slowdown": variants["fluid_with_slowdown"]["corun_slowdown"],
        "n": int(len(d)),
        "n_groups": int(d["group"].nunique()) if "group" in d.columns else None,
        "measured_over_alone": _ratio_summary(meas / alone),
        "errors": variants,
        "recommended": {"variant": rec, **{k: v for k, v in variants[rec].items() if k in ("capacity", "corun_slowdown")}},
    }


def _ratio_summary(ratio: np.ndarray) -> dict[str, float]:
    """Median, 10th and 90th percentiles, min and max of measured / alone."""
    return {
        "median": float(np.median(ratio)),
        "p10": float(np.percentile(ratio, 10)),
        "p90": float(np.percentile(ratio, 90)),
        "min": float(np.min(ratio)),
        "max": float(np.max(ratio)),
    }


# ----------------------------------------------------------------------------- measurement
def _worker_setup(threads: int | None, device: str):
    """Per-thread torch setup (``torch.set_num_threads`` acts on the calling thread's pool); ``None`` if unused."""
    if threads is None and device == "cpu":
        return None
    import torch

    if threads is not None:
        torch.set_num_threads(int(threads))
    return torch


def _run_loop(fn: Callable[[], object], device: str, threads: int | None, warmup: int, start: threading.Barrier | None,
              keep_going: Callable[[list], bool], out: list, errors: list) -> None:
    """Worker body: ``warmup`` untimed runs, wait at ``start``, then timed runs until ``keep_going`` is False.

    Appends ``(t0_ns, t1_ns, dur_ms)`` per run to ``out`` (host monotonic stamps; on CUDA ``dur_ms`` is from
    events on this thread's own stream).
    """
    try:
        torch = _worker_setup(threads, device)
        cuda = device != "cpu"
        stream = torch.cuda.Stream(device=torch.device(device)) if cuda else None
        with torch.inference_mode() if torch is not None else contextlib.nullcontext():
            if cuda:
                with torch.cuda.stream(stream):
                    for _ in range(warmup):
                        fn()
                stream.synchronize()
            else:
                for _ in range(warmup):
                    fn()
            if start is not None:
                start.wait()
            while keep_going(out):
                if cuda:
                    ev0 = torch.cuda.Event(enable_timing=True)
                    ev1 = torch.cuda.Event(enable_timing=True)
                    t0 = time.perf_counter_ns()
                    with torch.cuda.stream(stream):
                        ev0.record(stream)
                        fn()
                        ev1.record(stream)
                    stream.synchronize()
                    t1 = time.perf_counter_ns()
                    out.append((t0, t1, float(ev0.elapsed_time(ev1))))
                else:
                    t0 = time.perf_counter_ns()
                    fn()
                    t1 = time.perf_counter_ns()
                    out.append((t0, t1, (t1 - t0) / 1e6))
    except BaseException as exc:  # surface worker failures in the caller
        errors.append(exc)
        if start is not None:
            start.abort()


def alone_times(fn: Callable[[], object], repeats: int, warmup: int, device: str = "cpu", threads: int | None = 1) -> np.ndarray:
    """Times (ms) of ``repeats`` runs of ``fn`` alone, in a worker thread set up like a co-run worker."""
    out: list = []
    errors: list = []
    th = threading.Thread(
        target=_run_loop, args=(fn, device, threads, warmup, None, lambda o: len(o) < repeats, out, errors)
    )
    th.start()
    th.join()
    if errors:
        raise errors[0]
    return np.array([r[2] for r in out])


def corun_times(fns: Sequence[Callable[[], object]], repeats: int, warmup: int, device: str = "cpu",
                threads: int | None = 1, max_seconds: float = 30.0) -> list[np.ndarray]:
    """Times (ms) of runs of the callables ``fns`` looping at once, one thread each, kept while all loops ran.

    All loops go on until each has at least ``repeats`` runs that started after every loop had started (or
    ``max_seconds`` passed since the first timed run); a run is kept only if it started after every loop had
    started and ended before any stopped.
    """
    k_all = len(fns)
    if k_all < 2:
        raise ConfigError("sharing", "a co-run needs at least two executions")
    outs: list[list] = [[] for _ in range(k_all)]
    errors: list = []
    stop = threading.Event()
    budget_ns = int(max_seconds * 1e9)  # counted from the first timed run (the warm-up is not counted)

    def keep(k):
        def go(out):
            if stop.is_set():
                return False
            if all(len(o) >= repeats for o in outs):
                # enough runs *while all loops ran*: count only runs that started after every loop had started
                # (a loop the scheduler kept waiting could otherwise end up with no run in the common window)
                lo = max(o[0][0] for o in outs)
                if all(sum(1 for r in o if r[0] >= lo) >= repeats for o in outs):
                    stop.set()
                    return False
            if outs[k] and time.perf_counter_ns() - outs[k][0][0] > budget_ns:
                stop.set()
                return False
            return True

        return go

    barrier = threading.Barrier(k_all)
    ths = [
        threading.Thread(target=_run_loop, args=(f, device, threads, warmup, barrier, keep(k), outs[k], errors))
        for k, f in enumerate(fns)
    ]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    if errors:
        raise errors[0]
    if not all(outs):
        raise RuntimeError("co-run produced no runs")
    lo = max(o[0][0] for o in outs)
    hi = min(o[-1][1] for o in outs)
    return [np.array([r[2] for r in o if r[0] >= lo and r[1] <= hi]) for o in outs]


Item = tuple[int, int]


def default_groups(n_stages: int, batch_sizes: Sequence[int]) -> list[tuple[Item, ...]]:
    """The co-run groups :func:`measure_sharing` measures by default.

    Pairs: all unordered pairs (including an execution with a copy of itself) of {first, last stage} x
    {smallest, middle, largest batch size}. Triples (more executions than a 2-core CPU has cores): the
    first, a middle and the last stage at each of those batch sizes, and three copies of the first stage at
    the smallest and of the last stage at the largest batch size. One group of every stage at the middle
    batch size (a full pipeline).
    """
    bss = sorted(batch_sizes)
    pick_b = sorted({bss[0], bss[len(bss) // 2], bss[-1]})
    last = n_stages - 1
    pick_s = sorted({0, last})
    items = [(s, b) for s in pick_s for b in pick_b]
    groups: list[tuple[Item, ...]] = list(itertools.combinations_with_replacement(items, 2))
    if n_stages >= 3:
        mid = n_stages // 2
        groups += [((0, b), (mid, b), (last, b)) for b in pick_b]
    groups += [((0, bss[0]),) * 3, ((last, bss[-1]),) * 3]
    if n_stages >= 4:
        groups.append(tuple((s, pick_b[len(pick_b) // 2]) for s in range(n_stages)))
    return groups


def measure_sharing(
    model_name: str = "resnet152",
    variant: str = "small",
    n_stages: int = 4,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    groups: Sequence[Sequence[Item]] | None = None,
    seq_len: int | None = None,
    device: str = "cpu",
    threads: int | None = 1,
    repeats: int = 15,
    warmup: int = 3,
    seed: int = 0,
    max_seconds: float = 20.0,
    model=None,
    max_foreign_load: float | None = 0.3,
    retries: int = 5,
    max_wait: float = 60.0,
    progress: Callable[[str], object] | None = None,
) -> pd.DataFrame:
    """Measure co-run vs standalone times of groups of (stage, batch size) executions of a small model.

    The model is sliced time-evenly into ``n_stages`` from a per-operator profile at the smallest batch
    size. Standalone times are measured for every stage at every batch size in ``batch_sizes`` (that is the
    grid the demands ``d = min(1, thr / thr_max)`` come from); then each group (default:
    :func:`default_groups`, pairs and a few groups of 3 and 4) is co-run, one thread per execution. Returns
    one row per execution of a group with ``alone_ms``, ``corun_ms`` (medians), ``n_corun`` (group size),
    ``demand``, ``partner_demand`` (sum of the other members' demands), the fluid prediction and the spread;
    provenance in ``df.attrs["provenance"]``, the standalone grid in ``df.attrs["alone"]``.

    The members' standalone times are re-measured right before each co-run (``alone_ms``; the grid value the
    demand came from is ``alone_grid_ms``), so slow drifts of the machine cancel. ``foreign_cpu`` is how many
    cores other processes used meanwhile; a group measured while that exceeded ``max_foreign_load`` is
    measured again (up to ``retries`` times); before each attempt it waits up to ``max_wait`` s for the
    machine to become quiet.
    """
    import torch

    from dvasim.model.profiling.profiler import _check_device, _resolve_model

    device = _check_device(device)
    model = _resolve_model(model if model is not None else model_name, variant, seed)
    bss = sorted({int(b) for b in batch_sizes})
    if not bss or bss[0] < 1:
        raise ConfigError("batch_sizes", "must be positive integers")
    n = model.n_ops()
    if not 1 <= n_stages <= n:
        raise ConfigError("model.stages", f"must be 1..{n}, got {n_stages}")
    if model.input_kind != "tokens":
        seq_len = None
    elif seq_len is None:
        seq_len = model.default_seq_len
    t_start = time.perf_counter()
    ref, bounds, stages = _sliced_stages(model, n_stages, bss[0], seq_len, device, repeats, threads, seed,
                                         max_foreign_load, retries)
    runs = _StageRuns(stages, _stage_inputs(model, stages, bss, seq_len, device, seed), repeats, warmup, device,
                      threads, max_seconds, max_foreign_load, retries, max_wait)
    alone = runs.alone_grid(n_stages, bss)
    demand = _demands(alone, n_stages, bss)
    groups = default_groups(n_stages, bss) if groups is None else [tuple(tuple(m) for m in g) for g in groups]
    label = getattr(model, "name", model_name)
    rows = []
    for gid, group in enumerate(groups):
        for s_, b_ in group:
            if not (0 <= s_ < n_stages) or b_ not in bss:
                raise ConfigError("groups", f"(stage, batch size) {(s_, b_)} outside 0..{n_stages - 1} x {bss}")
        (alone_now, times), foreign, attempts = runs.corun(group)
        if progress is not None:
            progress(f"{model_name} group {gid + 1}/{len(groups)} {group}: foreign load {foreign}, attempts {attempts}")
        rows += _group_rows(label, gid, group, seq_len, alone_now, alone, times, [demand[m] for m in group], foreign,
                            attempts)
    df = pd.DataFrame(rows)
    df["fluid_pred_ms"] = predict_corun(df["alone_ms"], df["demand"], df["partner_demand"])
    df.attrs["alone"] = pd.DataFrame([
        {"stage": s, "batch_size": b, "alone_ms": alone[(s, b)], "demand": demand[(s, b)]}
        for s in range(n_stages) for b in bss
    ])
    df.attrs["provenance"] = _sharing_provenance(model, model_name, variant, device, torch.__version__, threads,
                                                 repeats, warmup, ref, bounds, bss, seq_len, t_start)
    return df


def _sliced_stages(model, n_stages: int, ref_bs: int, seq_len: int | None, device: str, repeats: int,
                   threads: int | None, seed: int, max_foreign_load: float | None, retries: int):
    """The model sliced time-evenly into ``n_stages`` from a per-operator profile at ``ref_bs``: (the operator
    times, the bounds, the stage modules on ``device``)."""
    from dvasim.model.profiling.profiler import _move_model, profile_ops
    from dvasim.model.slicing import slice_even

    ops = profile_ops(
        model, [ref_bs], None if seq_len is None else [seq_len], device, warmup=2, repeats=max(5, repeats),
        threads=threads, seed=seed, max_foreign_load=max_foreign_load, retries=retries,
    )
    ref = ops.sort_values("stage")["latency_ms"].to_numpy()
    bounds = slice_even(ref, n_stages)
    ends = [*bounds[1:], model.n_ops()]
    _move_model(model, device)
    return ref, bounds, [model.stage_module(a, b) for a, b in zip(bounds, ends, strict=True)]


class _StageRuns:
    """The executions of a sliced model's stages, each ``(stage, batch size)`` on its own input, timed alone or
    co-run (one thread per execution), each measurement on a quiet machine where asked
    (:func:`dvasim.model.profiling.profiler._measure_quiet`)."""

    def __init__(self, stages, inputs: dict, repeats: int, warmup: int, device: str, threads: int | None,
                 max_seconds: float, max_foreign_load: float | None, retries: int, max_wait: float):
        self.stages, self.inputs = stages, inputs
        self.repeats, self.warmup, self.device, self.threads = repeats, warmup, device, threads
        self.max_seconds, self.max_foreign_load, self.retries, self.max_wait = max_seconds, max_foreign_load, retries, max_wait

    def fn(self, s: int, b: int) -> Callable[[], object]:
        mod, x = self.stages[s], self.inputs[(s, b)]
        return lambda: mod(x)

    def _quiet(self, measure):
        from dvasim.model.profiling.profiler import _measure_quiet

        return _measure_quiet(measure, self.max_foreign_load, self.retries, 2.0, self.max_wait)

    def alone_grid(self, n_stages: int, bss: list[int]) -> dict[tuple[int, int], float]:
        """The standalone time (median, ms) of every stage at every batch size."""
        alone: dict[tuple[int, int], float] = {}
        for s in range(n_stages):
            for b in bss:
                t, _, _ = self._quiet(
                    lambda s=s, b=b: alone_times(self.fn(s, b), self.repeats, self.warmup, self.device, self.threads)
                )
                alone[(s, b)] = float(np.median(t))
        return alone

    def corun(self, group):
        """The members' standalone times measured again, then the group co-run: ((standalone medians by member,
        co-run times per member), foreign cores, attempts)."""

        def one_group():
            alone_now = {}
            for m in dict.fromkeys(group):
                alone_now[m] = float(np.median(alone_times(self.fn(*m), self.repeats, self.warmup, self.device,
                                                           self.threads)))
            times = corun_times([self.fn(*m) for m in group], self.repeats, self.warmup, self.device, self.threads,
                                self.max_seconds)
            return alone_now, times

        return self._quiet(one_group)


def _stage_inputs(model, stages, bss: list[int], seq_len: int | None, device: str, seed: int) -> dict:
    """Every stage's input at every batch size (the carry at the stage's start), keyed ``(stage, batch size)``."""
    import torch

    from dvasim.model.profiling.profiler import _example

    inputs: dict[tuple[int, int], object] = {}
    with torch.inference_mode():
        for b in bss:
            carry = _example(model, b, seq_len, device, seed)
            for s, mod in enumerate(stages):
                inputs[(s, b)] = carry
                carry = mod(carry)
    return inputs


def _demands(alone: dict[tuple[int, int], float], n_stages: int, bss: list[int]) -> dict[tuple[int, int], float]:
    """The demand ``min(1, thr / thr_max)`` of every (stage, batch size), ``thr_max`` the stage's best throughput
    over ``bss``."""
    thr_max = {s: max(b / alone[(s, b)] for b in bss) for s in range(n_stages)}
    return {(s, b): min(1.0, (b / alone[(s, b)]) / thr_max[s]) for s in range(n_stages) for b in bss}


def _group_rows(label: str, gid: int, group, seq_len, alone_now: dict, alone_grid: dict, times, demands: list[float],
                foreign, attempts: int) -> list[dict]:
    """One row per member of a measured co-run group (members without a run in the common window left out)."""
    rows = []
    for k, (me, t) in enumerate(zip(group, times, strict=True)):
        if t.size == 0:
            continue
        rows.append({
            "model": label,
            "group": gid,
            "member": k,
            "n_corun": len(group),
            "stage": me[0],
            "batch_size": me[1],
            "partners": " ".join(f"{s_}:{b_}" for j, (s_, b_) in enumerate(group) if j != k),
            "seq_len": seq_len,
            "alone_ms": alone_now[me],
            "alone_grid_ms": alone_grid[me],
            "corun_ms": float(np.median(t)),
            "corun_p10_ms": float(np.percentile(t, 10)),
            "corun_p90_ms": float(np.percentile(t, 90)),
            "corun_runs": int(t.size),
            "demand": demands[k],
            "partner_demand": float(sum(demands) - demands[k]),
            "foreign_cpu": np.nan if foreign is None else round(float(foreign), 3),
            "attempts": attempts,
        })
    return rows


def _sharing_provenance(model, model_name: str, variant: str, device: str, torch_version: str, threads, repeats: int,
                        warmup: int, ref, bounds, bss: list[int], seq_len, t_start: float) -> dict[str, str]:
    """Where and how the co-runs were measured (``df.attrs["provenance"]``)."""
    from dvasim.model.profiling.profiler import device_name
    from dvasim.model.slicing import balance, format_slicing

    return {
        "model": f"{getattr(model, 'name', model_name)} {getattr(model, 'variant', variant)}",
        "device": device,
        "device name": device_name(device),
        "torch": torch_version,
        "threads per executor": str(threads),
        "executors": "one Python thread per execution" + ("" if device == "cpu" else ", one CUDA stream each"),
        "repeats": str(repeats),
        "warmup": str(warmup),
        "slicing": format_slicing("time-even", bounds, balance(ref, bounds), f"at bs={bss[0]}"),
        "batch sizes": ",".join(map(str, bss)),
        "seq_len": str(seq_len),
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds": f"{time.perf_counter() - t_start:.1f}",
    }


# ----------------------------------------------------------------------------- shipping
def sharing_report(df: pd.DataFrame, threads: int | None = 1, cores: int | None = None, command: str = "") -> dict:
    """The content of ``sharing.json``: fitted parameters, fit quality (all models and per model), provenance.

    ``cores`` defaults to the logical cores divided by ``threads`` (how many single-stage executions the CPU
    runs truly in parallel).
    """
    import os

    if cores is None:
        cores = max(1, (os.cpu_count() or 1) // max(1, int(threads or 1)))
    fit = fit_sharing(df, cores=cores)
    per_model = {}
    for name, g in df.groupby("model"):
        f = fit_sharing(g, cores=cores)
        per_model[str(name)] = {
            "n": f["n"],
            "measured_over_alone_median": f["measured_over_alone"]["median"],
            "errors": {k: {kk: v[kk] for kk in ("mean_abs_rel_err", "max_abs_rel_err", "corun_slowdown")}
                       for k, v in f["errors"].items()},
        }
    prov = {}
    for p in df.attrs.get("provenances", []) or [df.attrs.get("provenance", {})]:
        for k, v in p.items():
            prov.setdefault(k, [])
            if v not in prov[k]:
                prov[k].append(v)
    return {
        "schema": "dvasim.sharing/1",
        "what": "co-run vs standalone stage execution times and the fitted device-sharing model (see "
                "dvasim.model.profiling.sharing); errors are |predicted/measured - 1| over every execution of every "
                "measured co-run group",
        "device": ", ".join(prov.get("device", ["cpu"])),
        "device_name": ", ".join(prov.get("device name", [])),
        "torch": ", ".join(prov.get("torch", [])),
        "threads_per_executor": threads,
        "cores": cores,
        "date": max(prov.get("date", [""])),
        "models": sorted(df["model"].unique().tolist()),
        "command": command,
        "measurements": "sharing_measurements.csv",
        "provenance": {k: v if len(v) > 1 else v[0] for k, v in prov.items()},
        "recommended": fit["recommended"],
        "fluid": {
            "capacity": fit["capacity"],
            "corun_slowdown": fit["corun_slowdown"],
            "corun_slowdown_unclamped": fit["errors"]["fluid_with_slowdown"]["corun_slowdown_unclamped"],
        },
        "parallel": {"corun_slowdown": fit["errors"]["slowdown_only"]["corun_slowdown"]},
        "per_core": {"capacity": cores, "corun_slowdown": fit["errors"]["per_core"]["corun_slowdown"]},
        "n": fit["n"],
        "n_groups": int(df.groupby(["model", "group"]).ngroups),
        "measured_over_alone": fit["measured_over_alone"],
        "errors": fit["errors"],
        "per_model": per_model,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dvasim.model.profiling.sharing --models resnet152,bert_base --out traces/cpu/sharing.json``."""
    import argparse
    import json
    import sys
    from pathlib import Path

    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m dvasim.model.profiling.sharing", description=main.__doc__)
    p.add_argument("--models", default="resnet152,bert_base,linknet")
    p.add_argument("--variant", default="small")
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--batch-sizes", default="1,2,4,8,16")
    p.add_argument("--repeats", type=int, default=25)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--max-foreign-load", type=float, default=0.2)
    p.add_argument("--retries", type=int, default=8)
    p.add_argument("--max-wait", type=float, default=60.0, help="seconds to wait for a quiet machine per attempt")
    p.add_argument("--out", required=True, help="sharing.json path; the measurements go next to it")
    a = p.parse_args(argv)
    bss = [int(b) for b in a.batch_sizes.split(",")]
    frames, provs = [], []
    for m in a.models.split(","):
        t0 = time.perf_counter()
        d = measure_sharing(m, a.variant, a.stages, bss, device=a.device, threads=a.threads, repeats=a.repeats,
                            warmup=a.warmup, max_foreign_load=a.max_foreign_load, retries=a.retries,
                            max_wait=a.max_wait, progress=lambda m: print(m, flush=True))
        print(f"{m}: {len(d)} executions in {d['group'].nunique()} groups, {time.perf_counter() - t0:.0f} s", flush=True)
        provs.append(d.attrs["provenance"])
        alone_grid = d.attrs["alone"].assign(model=m)
        d.attrs = {}  # DataFrame-valued attrs break pd.concat
        frames.append((d, alone_grid))
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        d.to_csv(Path(a.out).parent / f"sharing_partial_{m}.csv", index=False)  # nothing lost on a later failure
    df = pd.concat([f[0] for f in frames], ignore_index=True)
    alone_all = pd.concat([f[1] for f in frames], ignore_index=True)
    df.attrs["provenances"] = provs
    cmd = "python -m dvasim.model.profiling.sharing " + " ".join(argv)
    report = sharing_report(df, threads=a.threads, command=cmd)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out.parent / report["measurements"], index=False, lineterminator="\n", float_format="%.6g")
    alone_all.to_csv(out.parent / "sharing_alone.csv", index=False, lineterminator="\n", float_format="%.6g")
    for m in a.models.split(","):
        (out.parent / f"sharing_partial_{m}.csv").unlink(missing_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: report[k] for k in ("recommended", "fluid", "parallel", "per_core", "measured_over_alone")}, indent=1))
    for k, v in report["errors"].items():
        print(f"{k:22s} mean |err| {v['mean_abs_rel_err']:.3f}  max |err| {v['max_abs_rel_err']:.3f}  "
              f"slowdown {v['corun_slowdown']:.3f}  capacity {v['capacity']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
