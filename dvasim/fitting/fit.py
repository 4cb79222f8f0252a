"""``dvasim fit``: the simulator's engine parameters fitted to real replay logs.

A replay folder is what ``dvasim replay --out DIR`` writes: ``config.toml`` (or ``config.json``), ``queries.csv``
and ``executions.csv`` (each may be gzipped; :mod:`dvasim.fitting.logs` reads them). Every execution row carries
the table time the policy decided with (``table_ms``, the GPU time), the real time its thread spent
(``compute_ms``), the part of that spent copying buffers (``copy_ms``), and the hand-off and book-keeping around
it. From these the fit takes, per stage, the host model of :mod:`dvasim.server.host` and the engine's delays:

* **launch cost**, first per stage ``a[s] + c[s] * b``: from executions that ran alone (no other stage
  execution overlapping them) and were bound by the host (``compute - copy > table``: the thread spent longer
  than the GPU needed). Per batch size the median, then a least-squares line with a slope >= 0, weighted by
  the number of executions. A stage never host-bound has no measured launch cost (the GPU time dominates) and
  is left out of the law. The per-stage lines are then written as the **launch law** of :mod:`dvasim.server.host`,
  which fits any slicing of the model (:func:`launch_law`): ``launch_fixed_ms + launch_per_op_ms * ops[s]`` per
  launch, ``ops[s]`` the operators in stage ``s``, fitted over the stages by non-negative least squares weighted by
  ``1 / ops[s]`` (so the fitted stages' summed launch cost is kept: the normal equation of ``launch_per_op_ms``
  is a zero sum of residuals); when the stages' operator counts are too alike to separate the two terms (the
  largest below 1.5 times the smallest) ``launch_fixed_ms = 0`` and ``launch_per_op_ms = sum(a) / sum(ops)``; and
  ``launch_model_per_row_ms = sum(c)``, a whole model's growth per row, shared by the stages by their
  operators. The operators come from ``operators=`` (``--operators``, or ``--table``'s ``# cuts:``), else
  from the replays' ``[model]`` (:func:`replay_operators`). ``[fit]`` keeps the per-stage lines and the law's
  error on each stage. With
  ``--launch-table`` (a profiled launch table, :class:`dvasim.server.host.LaunchTable`) the table's shape over batch
  sizes is kept and only ``launch_scale`` is fitted: the median of (compute - copy) / launch over the same
  executions (a launch table is per stage: it fits only its own stage count);
* with ``--gpu-table`` (GPU-true stage times), the GPU's share of every execution comes from that table instead of
  the replay's ``table_ms`` (the device model then sees the GPU work the policy's event-timed table hides);
* **copies**: the same line per stage through the measured ``copy_ms``, written as single numbers that fit any
  slicing (:func:`copy_law`): ``copy_ms``, ``copy_per_row_ms`` the median over the stages after the first (the
  buffer copy every stage pays); the first stage's copy also moves the batch's input from the host (ResNet152 on
  the H100: 0.15 ms more per row, a 602,112-byte image at 4 GB/s; BERT-base: 0.19 ms more per batch): its excess
  is written as ``first_copy_ms`` / ``first_copy_per_row_ms``, held under the interpreter lock as the replay holds
  it (any slicing has a first stage);
* where the cuts leave the intercept unresolvable (time-even cuts give every stage nearly the same operators),
  ``launch_per_op_ms`` comes from the middle stages and the first and last stages' differences from it are
  ``first_launch_ms`` / ``last_launch_ms`` (the model's input and output sides: BERT-base's embedding and head);
* ``launch_overhead_ms``: the mean hand-off + book-keeping per launch;
* ``admission_delay_ms``: quantiles of (seen - arrival) over all queries, at levels 0, 0.05, ..., 0.95 and 0.999;
* **stalls** ``stall_prob``, ``stall_ms``: executions far slower than the model explains (:func:`stalls`), and
  their bursts: ``stall_cluster_prob``, the probability of a stall within ``stall_window_ms`` (50) after another
  began (:func:`stall_clustering`; fitted on the H100 ZeroBatch replays: 0.17-0.26 against 0.007 otherwise);
* ``service_cv``: the coefficient of variation of real / modelled execution time over the executions that ran
  alone, each relative to the median of its stage and batch size (the run-to-run jitter), from the
  interquartile range of its logarithm (:func:`robust_cv`).

* **launching cores** ``host.cores``, only on request (``--fit-cores``) and when some launches overlapped others
  (DVABatch, several model instances): the effective number of cores that best explains how long overlapped host-bound launches took
  (:func:`fit_cores`).

Not identifiable from executions that never overlapped (ZeroBatch and DelayBatch run one stage at a time): how
launches slow each other down. That comes from the model's structure, not from a fitted number: copies and
Python-level work hold one interpreter lock (eager launches entirely), TorchScript and CUDA-graph launches run on
``host.cores`` cores. ``python_ms`` (Python-level work per launch besides the copies) is not fitted either; the
fit leaves it at 0 unless given, and a given value is taken out of the fitted launch cost (it only moves work
under the lock).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dvasim.errors import ConfigError, DvasimError
from dvasim.fitting.logs import read_replay

ADMISSION_LEVELS = (*np.linspace(0.0, 0.95, 20), 0.999)


# ----------------------------------------------------------------------------- the pieces of the fit
def segments(begin, end) -> list[list[tuple[float, int]]]:
    """For every interval, its pieces ``(duration, n)`` with ``n`` the number of intervals open (itself included)."""
    b = np.asarray(begin, float)
    e = np.asarray(end, float)
    out = []
    for i in range(len(b)):
        lo, hi = b[i], e[i]
        if hi <= lo:
            out.append([])
            continue
        others = np.nonzero((b < hi) & (e > lo))[0]
        cuts = np.unique(np.clip(np.concatenate([[lo, hi], b[others], e[others]]), lo, hi))
        mids = (cuts[:-1] + cuts[1:]) / 2
        n = ((b[others][None, :] <= mids[:, None]) & (e[others][None, :] > mids[:, None])).sum(axis=1)
        out.append(list(zip(np.diff(cuts).tolist(), n.tolist())))
    return out


def overlap_fraction(begin, end) -> np.ndarray:
    """For every interval, the fraction of its length during which some other interval was open."""
    b = np.asarray(begin, float)
    e = np.asarray(end, float)
    span = np.maximum(e - b, 0.0)
    shared = np.array([sum(dt for dt, n in p if n > 1) for p in segments(b, e)])
    return np.divide(shared, span, out=np.zeros(len(b)), where=span > 0)


def fit_cores(pieces: list[list[tuple[float, int]]], work, grid=None) -> tuple[float, float]:
    """The launching cores ``c`` that best explain overlapped launches: each launch of (alone) length ``work[i]``
    progresses at ``min(1, c / n)`` while ``n`` launches run (processor sharing, as the simulator's host does),
    so the work it did in its observed pieces is ``done_i(c) = sum(dt * min(1, c / n))``. ``c`` is where the
    median of ``done_i(c) / work_i`` is 1 (a median: a few stalled launches must not decide it), searched on a
    grid; returns ``(c, median |done / work - 1| at c)``. The grid's end (16) means no measurable contention."""
    grid = np.arange(1.0, 16.01, 0.1) if grid is None else np.asarray(grid, float)
    w = np.asarray(work, float)
    best = (float(grid[-1]), math.inf)
    for c in grid:  # median(done / work) grows with c: the first c reaching 1
        ratio = np.array([sum(dt * min(1.0, c / k) for dt, k in p) for p in pieces]) / w
        if np.median(ratio) >= 1.0:
            return float(c), float(np.median(np.abs(ratio - 1.0)))
        best = (float(c), float(np.median(np.abs(ratio - 1.0))))
    return best


def line_fit(x, y) -> tuple[float, float]:
    """``y ~ a + c x`` through the per-``x`` medians, weighted by counts, with ``a, c >= 0``."""
    df = pd.DataFrame({"x": np.asarray(x, float), "y": np.asarray(y, float)}).dropna()
    if df.empty:
        return 0.0, 0.0
    g = df.groupby("x")["y"].agg(["median", "size"])
    xs, ys, w = g.index.to_numpy(float), g["median"].to_numpy(), g["size"].to_numpy(float)
    if len(xs) >= 2:
        A = np.stack([np.ones_like(xs), xs], axis=1) * np.sqrt(w)[:, None]
        a, c = np.linalg.lstsq(A, ys * np.sqrt(w), rcond=None)[0]
        if c >= 0 and a >= 0:
            return float(a), float(c)
        if c < 0:  # flat
            return float(max(0.0, np.average(ys, weights=w))), 0.0
        return 0.0, float(max(0.0, np.sum(w * xs * ys) / np.sum(w * xs * xs)))  # through the origin
    return float(max(0.0, ys[0])), 0.0


def robust_cv(ratios) -> float:
    """The coefficient of variation of a log-normal fitted to ``ratios`` by their interquartile range (a few
    executions stalled by the host for tens of ms must not make every execution jittery)."""
    r = np.asarray(ratios, float)
    r = r[np.isfinite(r) & (r > 0)]
    if len(r) < 10:
        return 0.0
    q25, q75 = np.percentile(np.log(r), [25, 75])
    sigma = (q75 - q25) / 1.349
    return float(math.sqrt(math.expm1(sigma * sigma)))


def stall_threshold(excess) -> float:
    """Far out by Tukey's rule on the excess (real - modelled host time): ``q75 + 3 IQR``, at least 1 ms."""
    x = np.asarray(excess, float)
    x = x[np.isfinite(x)]
    q25, q75 = np.percentile(x, [25, 75])
    return float(max(q75 + 3 * (q75 - q25), 1.0))


def stalls(excess) -> tuple[float, list[float] | None]:
    """Launches that took far longer than the model explains: ``(probability, quantiles of the excess)``
    above :func:`stall_threshold`, at 21 evenly spaced levels (the simulator's ``stall_ms``)."""
    x = np.asarray(excess, float)
    x = x[np.isfinite(x)]
    if len(x) < 50:
        return 0.0, None
    far = x[x > stall_threshold(x)]
    if len(far) < 3:
        return 0.0, None
    return float(len(far) / len(x)), [float(v) for v in np.quantile(far, np.linspace(0, 1, 21))]


STALL_WINDOW_MS = 50.0


def stall_clustering(begin_ms, stalled, run, window_ms: float = STALL_WINDOW_MS) -> tuple[float, float, int]:
    """Host stalls come in bursts (a disturbed host): a stall outside a burst starts one that lasts ``window_ms``
    (later stalls inside it do not prolong it, as in the simulator). Returns ``(P(stall | inside a burst),
    P(stall | outside), launches inside bursts)``, per run in time order."""
    b = np.asarray(begin_ms, float)
    st = np.asarray(stalled, bool)
    rn = np.asarray(run)
    near = np.zeros(len(b), bool)
    for r in np.unique(rn):
        idx = np.nonzero(rn == r)[0]
        idx = idx[np.argsort(b[idx], kind="stable")]
        start = -math.inf  # the stall that began the current burst (stalls inside a burst do not prolong it)
        for i in idx:
            near[i] = b[i] - start < window_ms
            if st[i] and not near[i]:
                start = b[i]
    n_near = int(near.sum())
    p_near = float(st[near].mean()) if n_near else 0.0
    p_far = float(st[~near].mean()) if (~near).any() else 0.0
    return p_near, p_far, n_near


def admission_quantiles(late) -> list[float] | None:
    """Quantiles of the admission delays at :data:`ADMISSION_LEVELS` (the simulator's ``admission_delay_ms``)."""
    late = np.asarray(late, float)
    late = late[np.isfinite(late)]
    if len(late) < 20:
        return None
    return [float(max(0.0, x)) for x in np.quantile(late, ADMISSION_LEVELS)]


# ----------------------------------------------------------------------------- laws that fit any slicing
RESOLVABLE_OPS_RATIO = 1.5  # the launch law's intercept is fitted only when max(ops) >= this * min(ops)


def table_operators(table) -> list[int] | None:
    """The operators in each stage of a stage table (a :class:`LatencyTable` or its file), as a run on that table
    counts them (:func:`dvasim.server.resolve.stage_operators`): a ``# operators:`` line with one count per stage,
    or the model's total there and its cut bounds (``# cuts:``, :attr:`LatencyTable.cuts`, what ``dvasim profile``
    writes: the H100 serving tables say ``operators: 157`` and ``cuts: 0,39,78,118``). ``None``
    when the table says neither."""
    from dvasim.model.catalog import ResolvedModel
    from dvasim.model.table import LatencyTable
    from dvasim.server.resolve import stage_operators

    t = table if isinstance(table, LatencyTable) else LatencyTable.load(table)
    ops, src = stage_operators(ResolvedModel(t))
    return None if src.startswith("unknown") else [int(x) for x in ops]


def replay_operators(runs: list[dict], n: int) -> tuple[list[int], str]:
    """The operators in each stage of the replays' model: their ``[model]`` resolved as a run would
    (:func:`dvasim.model.catalog.resolve_model`, :func:`dvasim.server.resolve.stage_operators`)."""
    from dvasim.model.catalog import resolve_model
    from dvasim.server.resolve import stage_operators

    mc = dict(runs[0]["config"].get("model", {}))
    if isinstance(mc.get("table"), str):
        from dvasim.schema import find_file

        mc["table"] = str(find_file(mc["table"], runs[0]["dir"], "model.table"))
    try:
        model = resolve_model(mc)
        ops, src = stage_operators(model)
    except DvasimError as e:
        raise ConfigError("--operators", f"the replays' [model] gives no operator counts ({e}); give them, e.g. "
                                         "--operators 39,39,40,39") from None
    if len(ops) != n:
        raise ConfigError("--operators", f"the replays' [model] resolves to {len(ops)} stages, their executions have "
                                         f"{n}; give the operators of the replayed cut")
    return [int(x) for x in ops], src + " (the replays' [model] resolved today)"


def launch_law(a, c, ops, used=None) -> dict[str, Any]:
    """The launch law of per-stage launch lines ``a[s] + c[s] * b`` over stages of ``ops[s]`` operators (see the
    module docstring); ``used``: which stages to fit on (default all). Returns the three law keys, ``resolvable``
    and a sentence on how the intercept was found."""
    o_all = np.asarray(ops, float)
    used = np.ones(len(o_all), bool) if used is None else np.asarray(used, bool)
    a_ = np.asarray(a, float)[used]
    c_ = np.asarray(c, float)[used]
    o = o_all[used]
    if len(o) == 0:
        return {"launch_fixed_ms": 0.0, "launch_per_op_ms": 0.0, "launch_model_per_row_ms": 0.0,
                "resolvable": False, "how": "no stage was bound by the host: no launch cost measured, 0 taken"}
    per_row = float(np.sum(c_) * o_all.sum() / o.sum())  # the stages fitted on stand for the whole model
    spread = float(o.max() / o.min())
    if len(o) >= 2 and spread >= RESOLVABLE_OPS_RATIO:
        w = np.sqrt(1.0 / o)
        A = np.stack([np.ones_like(o), o], axis=1) * w[:, None]
        f, p = np.linalg.lstsq(A, a_ * w, rcond=None)[0]
        if f < 0:
            f, p = 0.0, float(a_.sum() / o.sum())
            how = "fitted intercept < 0: launch_fixed_ms = 0, launch_per_op_ms = sum(launch) / sum(ops)"
        elif p < 0:
            f, p = float(a_.mean()), 0.0
            how = "fitted slope < 0: launch_per_op_ms = 0, launch_fixed_ms = the stages' mean launch"
        else:
            how = ("least squares over the stages, weighted by 1 / ops (ops from "
                   f"{int(o.min())} to {int(o.max())}: the intercept is resolved)")
        return {"launch_fixed_ms": float(f), "launch_per_op_ms": float(p), "launch_model_per_row_ms": per_row,
                "resolvable": True, "how": how}
    why = ("one stage" if len(o) < 2 else
           f"the stages have {int(o.min())} to {int(o.max())} operators (max / min {spread:.2f} < "
           f"{RESOLVABLE_OPS_RATIO:g})")
    n = len(o_all)
    a_all = np.asarray(a, float)
    middle = used.copy()
    middle[0] = middle[-1] = False
    if n >= 3 and used[0] and used[-1] and middle.any():
        # the middle stages give the cost per operator; the first and the last stage's differences from it are the
        # model's input and output sides (embedding, head, the batch's own handling), which any slicing keeps
        p = float(a_all[middle].sum() / o_all[middle].sum())
        first, last = float(a_all[0] - p * o_all[0]), float(a_all[-1] - p * o_all[-1])
        return {"launch_fixed_ms": 0.0, "launch_per_op_ms": p, "launch_model_per_row_ms": per_row,
                "first_launch_ms": first, "last_launch_ms": last, "resolvable": False,
                "how": f"intercept not resolvable ({why}): launch_fixed_ms = 0, launch_per_op_ms = the middle "
                       f"stages' sum(launch) / sum(ops); the first and last stages' differences from it are "
                       f"first_launch_ms ({first:+.4f}) and last_launch_ms ({last:+.4f})"}
    return {"launch_fixed_ms": 0.0, "launch_per_op_ms": float(a_.sum() / o.sum()), "launch_model_per_row_ms": per_row,
            "resolvable": False,
            "how": f"intercept not resolvable ({why}): launch_fixed_ms = 0, launch_per_op_ms = sum(launch) / sum(ops)"}


def law_stage_launch(law: dict[str, Any], ops) -> tuple[list[float], list[float]]:
    """The per-stage launch lines ``(a, c)`` the law gives stages of ``ops`` operators: the simulator's host model's
    own (:func:`dvasim.server.host.host_from_config`)."""
    from dvasim.server.host import BOUNDARY_KEYS, LAW_KEYS, host_from_config

    keys = {k: law[k] for k in (*LAW_KEYS, *BOUNDARY_KEYS) if k in law}
    host = host_from_config(keys, len(ops), operators=list(ops))
    return host.launch_ms, host.launch_per_row_ms


def copy_law(copy_a, copy_c, model: str | None = None, seq_len: float | None = None) -> dict[str, Any]:
    """Single-number copies from the per-stage copy lines (see the module docstring): ``copy_ms``,
    ``copy_per_row_ms`` (the buffer copy every stage pays: the median of stages 1.. ), ``first_copy_ms`` and
    ``first_copy_per_row_ms`` (what the first stage copies more: the batch's inputs brought in, under the
    interpreter lock as the replay does it) and a sentence on the choice. ``model``, ``seq_len``: for the note's
    bandwidth of the inputs' copy."""
    from dvasim.server.costs import model_io

    a = [float(x) for x in copy_a]
    c = [float(x) for x in copy_c]
    if len(a) < 2:
        return {"copy_ms": a[0], "copy_per_row_ms": c[0], "first_copy_ms": 0.0, "first_copy_per_row_ms": 0.0,
                "how": "one stage: its copy line, written as single numbers"}
    base_a, base_c = float(np.median(a[1:])), float(np.median(c[1:]))
    extra_a, extra_c = a[0] - base_a, c[0] - base_c
    n = len(a)
    how = (f"copy_ms, copy_per_row_ms: the median of stages 1..{n - 1}'s copy lines (the buffer copy every stage "
           f"pays); first_copy_ms {extra_a:+.4f} and first_copy_per_row_ms {extra_c:+.5f}: what the first stage "
           "copies more (the batch's inputs brought in), under the interpreter lock")
    (i_b, i_tok, _), why = model_io(model)
    row_bytes = i_b + i_tok * float(seq_len or 0.0)
    if extra_c > 0 and row_bytes > 0:
        how += f" ({row_bytes:,.0f} bytes a query, {why}: {row_bytes / (extra_c * 1e6):.2f} GB/s)"
    # a stage's copy may not go below 0
    extra_a, extra_c = max(extra_a, -base_a), max(extra_c, -base_c)
    return {"copy_ms": base_a, "copy_per_row_ms": base_c, "first_copy_ms": extra_a, "first_copy_per_row_ms": extra_c,
            "how": how}


def _n_stages(runs: list[dict]) -> int:
    ns = {int(r["executions"]["stage"].max()) + 1 for r in runs}
    cfg_stages = {r["config"].get("model", {}).get("stages") for r in runs} - {None}
    if len(ns) != 1 or len(cfg_stages) > 1:
        raise ConfigError("fit", "the folders have different stage counts; fit one model and cut at a time")
    return ns.pop()


def _model_of(runs: list[dict]) -> str | None:
    names = {r["config"].get("model", {}).get("name") for r in runs}
    if len(names) > 1:
        raise ConfigError("fit", f"the folders replay different models ({', '.join(sorted(map(str, names)))}); "
                                 "fit one model at a time (per-model engine files)")
    return names.pop()


def fit(dirs, *, launch_table: str | None = None, modules: str | None = None, host_cores: int = 16,
        python_ms: float = 0.0, alone_below: float = 0.05, gpu_table: str | None = None,
        fit_cores_from_overlap: bool = False, operators: list[int] | None = None,
        operators_source: str | None = None) -> dict[str, Any]:
    """Fit the engine to the replay folders ``dirs`` (one model). Returns ``{"engine": {...}, "fit": {...}}``:
    the ``[engine]`` section (with ``[engine.host]``, and ``[engine.transfer]`` for the first stage's input copy)
    and the evidence. ``operators``: the operators in each replayed stage (default: from the replays' ``[model]``,
    :func:`replay_operators`), ``operators_source`` where they come from (kept in ``[fit]``)."""
    from dvasim.server.host import LaunchTable

    runs = [r if isinstance(r, dict) else read_replay(r) for r in dirs]
    if not runs:
        raise ConfigError("fit", "give at least one replay folder")
    model = _model_of(runs)
    n = _n_stages(runs)
    kind = _module_kind(runs, modules)
    ops, ops_src = _stage_operators(runs, n, operators, operators_source, launch_table)
    ex, e = _executions(runs, n, python_ms, gpu_table)
    alone = e[e["overlap"] < alone_below]
    if len(alone) < 10:
        raise ConfigError("fit", f"only {len(alone)} executions ran alone; include ZeroBatch or DelayBatch replays")
    host: dict[str, Any] = {"modules": kind, "cores": host_cores}
    table = LaunchTable.load(launch_table, "--launch-table") if launch_table else None
    lines = _stage_lines(alone, n, table, kind)
    law = None
    if table is not None:
        host["launch_table"] = str(Path(launch_table).resolve())
        host["launch_scale"] = float(np.median(lines["ratios"])) if lines["ratios"] else 1.0
    else:  # the per-stage lines as the law that fits any slicing
        law = launch_law(lines["launch_ms"], lines["launch_per_row_ms"], ops, used=[k > 0 for k in lines["n_bound"]])
        host.update({k: law[k] for k in ("launch_fixed_ms", "launch_per_op_ms", "launch_model_per_row_ms",
                                          "first_launch_ms", "last_launch_ms") if k in law})
        # (jitter, stalls and cores below are measured against each stage's own line: a stall is a launch far
        # slower than its stage's typical one, not the law's error on that stage)
    if gpu_table is not None:
        host["gpu_table"] = str(Path(gpu_table).resolve())
    copies = _copies(host, e, lines, model, python_ms)
    launch = _stage_launch_cost(table, kind, host, lines)
    cv, stall_prob, stall_q, cluster = _jitter_and_stalls(alone, launch)
    cores_fit = _overlapped_launch_cores(ex, e, launch, host, fit_cores_from_overlap)
    if stall_q is not None:
        host["stall_prob"] = stall_prob
        host["stall_ms"] = stall_q
        if cluster is not None:  # bursts: base probability, and the probability within a window after a stall
            host["stall_prob"] = cluster[0]
            host["stall_cluster_prob"] = cluster[1]
            host["stall_window_ms"] = STALL_WINDOW_MS
    q = pd.concat([r["queries"] for r in runs], ignore_index=True)
    engine = _engine_delays(q, e, cv)
    evidence = _evidence(runs, model, kind, n, e, alone, lines["n_bound"], q, cores_fit)
    per_stage = {k: list(lines[k]) for k in ("launch_ms", "launch_per_row_ms", "copy_ms", "copy_per_row_ms")}
    evidence.update(_slicing_notes(per_stage, law, ops, ops_src, copies, int(e["batch_size"].max())))
    if gpu_table is not None:
        evidence["gpu_table_note"] = "host.gpu_table is per stage: this engine file fits only its stage count"
    engine["host"] = host
    return {"engine": engine, "fit": evidence}


def _module_kind(runs: list[dict], modules: str | None) -> str:
    """The module kind the replays ran (``modules`` if given; ``auto`` read as ``cudagraph``): one, and known."""
    from dvasim.server.host import MODULE_KINDS

    if modules and modules not in (*MODULE_KINDS, "auto"):
        raise ConfigError("--modules", f"must be one of {', '.join(MODULE_KINDS)}, got {modules!r}")
    kinds = {modules} if modules else {r["config"].get("replay", {}).get("modules", "torchscript") for r in runs}
    kinds = {"cudagraph" if k == "auto" else k for k in kinds}
    if len(kinds) != 1 or not kinds <= set(MODULE_KINDS):
        raise ConfigError("fit", f"the folders ran different or unknown module kinds ({sorted(kinds)}); give --modules")
    return kinds.pop()


def _stage_operators(runs: list[dict], n: int, operators, operators_source: str | None,
                     launch_table: str | None) -> tuple[list[int] | None, str | None]:
    """The operators in each replayed stage and where they come from: given, else the replays' ``[model]``; none
    with a launch table (its costs are per stage: no law)."""
    if operators is not None:
        ops = [int(x) for x in operators]
        if len(ops) != n or min(ops) < 1:
            raise ConfigError("--operators", f"give {n} operator counts >= 1 (one per replayed stage), got {operators}")
        return ops, operators_source or "given"
    if launch_table is None:
        return replay_operators(runs, n)
    return None, None  # a launch table's costs are per stage: no law, no operators needed


def _executions(runs: list[dict], n: int, python_ms: float, gpu_table: str | None) -> tuple[list[pd.DataFrame],
                                                                                             pd.DataFrame]:
    """Every run's executions with the fraction of each that overlapped others (``overlap``) and the run's index
    (``run``), and all of them together with ``host_ms``, the launch proper (thread time less the copies and
    the given Python-level work), and with ``gpu_table`` its GPU times as ``table_ms``."""
    ex = []
    for k, r in enumerate(runs):
        e = r["executions"].copy()
        e["overlap"] = overlap_fraction(e["begin_ms"], e["end_ms"])
        e["run"] = k
        ex.append(e)
    e = pd.concat(ex, ignore_index=True)
    e["copy_ms"] = e["copy_ms"].fillna(0.0)
    # the launch proper: thread time less the copies and the given Python-level work (both under the lock)
    e["host_ms"] = (e["compute_ms"] - e["copy_ms"] - float(python_ms)).clip(lower=0.0)
    if gpu_table is not None:  # GPU-true times replace the policy's table as the GPU's share of each execution
        e["table_ms"] = _gpu_times(gpu_table, e, n)
    return ex, e


def _gpu_times(gpu_table: str, e: pd.DataFrame, n: int) -> list[float]:
    """The GPU time of every execution from the ``--gpu-table`` (an error naming --gpu-table where the table
    cannot be read, has another stage count or does not cover the executions)."""
    from dvasim.errors import TableError
    from dvasim.model.table import LatencyTable

    try:
        gt = LatencyTable.load(gpu_table)
        if gt.n_stages != n:
            raise ConfigError("--gpu-table", f"{gpu_table} has {gt.n_stages} stages; the replays have {n}")
        if gt.seq_lens is not None and "seq_len" not in e:
            raise ConfigError("--gpu-table", f"{gpu_table} has lengths; the replays' executions have no seq_len")
        lens = e["seq_len"] if gt.seq_lens is not None else [None] * len(e)
        return [gt.latency(int(s_), int(b), None if L is None or _nan(L) else int(L))
                for s_, b, L in zip(e["stage"], e["batch_size"], lens)]
    except TableError as err:  # the table's own errors name model.table: here it is --gpu-table
        raise ConfigError("--gpu-table", err.message if err.field == "model.table" else f"{gpu_table}: {err}") \
            from None


def _stage_lines(alone: pd.DataFrame, n: int, table, kind: str) -> dict[str, list]:
    """Per stage, from the executions that ran alone: the copy line, the launch line through the host-bound ones
    (``0 + 0 b`` where none was; none with a launch ``table``, whose ratios real / table are collected instead) and
    how many were host-bound."""
    out: dict[str, list] = {"launch_ms": [], "launch_per_row_ms": [], "copy_ms": [], "copy_per_row_ms": [],
                            "n_bound": [], "ratios": []}
    for s in range(n):
        a_s = alone[alone["stage"] == s]
        bound = a_s[a_s["host_ms"] > a_s["table_ms"]]
        out["n_bound"].append(int(len(bound)))
        ca, cc = line_fit(a_s["batch_size"], a_s["copy_ms"])
        out["copy_ms"].append(ca)
        out["copy_per_row_ms"].append(cc)
        if table is not None:
            lens = bound["seq_len"] if "seq_len" in bound else [None] * len(bound)
            base = np.array([table.cost(kind, s, int(b), None if L is None or _nan(L) else int(L))
                             for b, L in zip(bound["batch_size"], lens)])
            out["ratios"].extend((bound["host_ms"].to_numpy() / np.maximum(base, 1e-9)).tolist())
        elif len(bound):
            la, lc = line_fit(bound["batch_size"], bound["host_ms"])
            out["launch_ms"].append(la)
            out["launch_per_row_ms"].append(lc)
        else:
            out["launch_ms"].append(0.0)
            out["launch_per_row_ms"].append(0.0)
    return out


def _copies(host: dict[str, Any], e: pd.DataFrame, lines: dict[str, list], model: str | None,
            python_ms: float) -> dict[str, Any]:
    """The copy law (:func:`copy_law`, its bandwidth note at the executions' median length) and the given
    ``python_ms`` written into ``host``; returns the copy law."""
    lens_all = e["seq_len"] if "seq_len" in e else pd.Series(dtype=float)
    med_len = float(np.nanmedian(lens_all.to_numpy(float))) if len(lens_all) and lens_all.notna().any() else None
    copies = copy_law(lines["copy_ms"], lines["copy_per_row_ms"], model, med_len)
    for k in ("copy_ms", "copy_per_row_ms", "first_copy_ms", "first_copy_per_row_ms"):
        host[k] = copies[k]
    host["python_ms"] = float(python_ms)
    return copies


def _stage_launch_cost(table, kind: str, host: dict[str, Any], lines: dict[str, list]):
    """The modelled launch cost ``cost(stage, b, length)``: the launch table's scaled, else the stage's own line."""

    def cost(stage: int, b: int, length: int | None) -> float:
        if table is not None:
            return table.cost(kind, stage, b, length) * host["launch_scale"]
        return lines["launch_ms"][stage] + lines["launch_per_row_ms"][stage] * b

    return cost


def _jitter_and_stalls(alone: pd.DataFrame, launch) -> tuple[float, float, list[float] | None, tuple | None]:
    """From the executions that ran alone against their modelled time (launch or GPU, the longer): ``service_cv``
    (real / modelled relative to its (stage, batch) median, :func:`robust_cv`), the stalls (:func:`stalls`) and
    their bursts ``(p_far, p_near)`` where stalls cluster (:func:`stall_clustering`), else ``None``."""
    lens = alone["seq_len"] if "seq_len" in alone else pd.Series([math.nan] * len(alone), index=alone.index)
    mod = np.array([max(launch(int(s), int(b), None if _nan(L) else int(L)), g) for s, b, L, g in
                    zip(alone["stage"], alone["batch_size"], lens, alone["table_ms"])])
    rel = alone["host_ms"].to_numpy() / np.maximum(mod, 1e-9)
    grp = alone["stage"].to_numpy() * 10_000 + alone["batch_size"].to_numpy()
    rr = []
    for g in np.unique(grp):
        v = rel[grp == g]
        if len(v) >= 5:
            rr.extend(v / np.median(v))
    cv = robust_cv(rr)
    excess = alone["host_ms"].to_numpy() - mod
    stall_prob, stall_q = stalls(excess)
    cluster = None
    if stall_q is not None:
        flagged = excess > stall_threshold(excess)
        p_near, p_far, n_near = stall_clustering(alone["begin_ms"], flagged, alone["run"])
        if n_near >= 20 and p_near > p_far:
            cluster = (p_far, p_near)
    return cv, stall_prob, stall_q, cluster


def _overlapped_launch_cores(ex: list[pd.DataFrame], e: pd.DataFrame, launch, host: dict[str, Any],
                             fit_cores_from_overlap: bool) -> dict[str, Any] | None:
    """Launches that overlapped others (DVABatch, several instances): how many cores launch at once
    (:func:`fit_cores`, only on request), written as ``host["cores"]``; returns the evidence or ``None``."""
    over = e[e["overlap"] >= 0.5]
    if fit_cores_from_overlap and len(over) < 50:
        raise ConfigError("--fit-cores", f"only {len(over)} executions overlapped others; give DVABatch replays "
                                         "(or several instances) to fit the launching cores")
    if not fit_cores_from_overlap:
        return None
    pieces, work = [], []
    for run_e in ex:
        run_e = run_e.assign(copy_ms=run_e["copy_ms"].fillna(0.0))
        lb = (run_e["begin_ms"] + run_e["copy_ms"]).to_numpy()  # the launch follows the copies
        segs = segments(lb, run_e["end_ms"].to_numpy())
        for k, r in enumerate(run_e.itertuples(index=False)):
            if r.overlap < 0.5:
                continue
            w = launch(int(r.stage), int(r.batch_size), None)
            if w > r.table_ms and w > 0:  # host-bound: its span is the launch's
                pieces.append(segs[k])
                work.append(w)
    if len(work) < 50:
        return None
    c, err = fit_cores(pieces, work)
    host["cores"] = round(c, 1)
    return {"n_overlapped_launches": len(work), "cores": round(c, 1), "median_abs_rel_error": round(err, 4)}


def _engine_delays(q: pd.DataFrame, e: pd.DataFrame, cv: float) -> dict[str, Any]:
    """``launch_overhead_ms`` (mean hand-off + book-keeping), ``admission_delay_ms`` (quantiles of seen - arrival,
    or their mean when too few) and ``service_cv``."""
    late = (q["seen_ms"] - q["arrival_ms"]).to_numpy(float)
    adm = admission_quantiles(late)
    overhead = float((e["handoff_ms"] + e["bookkeeping_ms"]).mean())
    return {
        "launch_overhead_ms": overhead,
        "admission_delay_ms": adm if adm is not None else float(np.nanmean(late)) if len(late) else 0.0,
        "service_cv": cv,
    }


def _evidence(runs: list[dict], model: str | None, kind: str, n: int, e: pd.DataFrame, alone: pd.DataFrame,
              n_bound: list[int], q: pd.DataFrame, cores_fit: dict[str, Any] | None) -> dict[str, Any]:
    """``[fit]``: what the fit was made from and what it could not fit."""
    bp = {r["config"].get("engine", {}).get("buffer_pairs") for r in runs} - {None}
    evidence = {
        "model": model, "modules": kind, "stages": n, "folders": [r["dir"] for r in runs],
        "policies": sorted({str(r["config"].get("policy", {}).get("name")) for r in runs}),
        "n_executions": int(len(e)), "n_alone": int(len(alone)), "n_host_bound_by_stage": n_bound,
        "alone_real_over_table_median": float(np.median(alone["host_ms"] / alone["table_ms"])),
        "n_queries": int(len(q)), "buffer_pairs_seen": sorted(bp),
        "not_fitted": ("host.python_ms; " if cores_fit else "host.cores and host.python_ms (executions that never "
                       "overlap cannot show contention); ") + "corun_slowdown and the sharing mode (the config's)",
    }
    if cores_fit:
        evidence["cores_fit"] = json.dumps(cores_fit)
    return evidence


def _slicing_notes(per_stage: dict[str, list[float]], law: dict[str, Any] | None, ops: list[int] | None,
                   ops_src: str | None,
                   copies: dict[str, Any], b_max: int) -> dict[str, Any]:
    """``[fit]`` notes: the per-stage lines the laws were made from, and the launch law's error on each stage."""
    r = lambda xs: [round(float(x), 6) for x in xs]  # noqa: E731
    out: dict[str, Any] = {} if ops is None else {"stage_operators": list(ops), "stage_operators_source": ops_src}
    if law is not None:
        la, lc = law_stage_launch(law, ops)
        a, c = per_stage["launch_ms"], per_stage["launch_per_row_ms"]

        def err(b):
            return [round((x + y * b) / (p + q * b) - 1.0, 4) if p + q * b > 0 else 0.0
                    for x, y, p, q in zip(la, lc, a, c)]

        out.update(
            launch_law="per launch of stage s: launch_fixed_ms + launch_per_op_ms * ops[s] + launch_model_per_row_ms"
                       " * ops[s] / sum(ops) * b (any slicing: dvasim.server.host)",
            launch_law_fit=law["how"],
            launch_ms_by_stage=r(a), launch_per_row_ms_by_stage=r(c),
            launch_law_ms_by_stage=r(la), launch_law_per_row_ms_by_stage=r(lc),
            launch_law_rel_err_by_stage_b1=err(1), **{f"launch_law_rel_err_by_stage_b{b_max}": err(b_max)},
        )
    else:
        out["launch_law"] = ("not written: --launch-table keeps the profiled table's per-stage shape, so this engine "
                             "file fits only that table's stage count")
    out.update(copy_law=copies["how"], copy_ms_by_stage=r(per_stage["copy_ms"]),
               copy_per_row_ms_by_stage=r(per_stage["copy_per_row_ms"]))
    return out


def _nan(x) -> bool:
    try:
        return x is None or math.isnan(float(x))
    except (TypeError, ValueError):
        return True


# ----------------------------------------------------------------------------- writing the engine file
def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(round(v, 6)) if math.isfinite(v) else "nan"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def engine_toml(result: dict[str, Any]) -> str:
    """The fit as an engine file: ``[engine]``, ``[engine.host]`` and the evidence as ``[fit]``."""
    lines = ["# written by dvasim fit: the simulator's engine fitted to real replays",
             "# use: dvasim run CONFIG.toml --engine THIS_FILE   (or dvasim.run(config, engine=THIS_FILE))", ""]
    eng = dict(result["engine"])
    subs = {k: eng.pop(k) for k in list(eng) if isinstance(eng[k], dict)}  # [engine.host], [engine.transfer]
    lines.append("[engine]")
    lines += [f"{k} = {_toml_value(v)}" for k, v in eng.items()]
    for name, table in subs.items():
        if table:
            lines += ["", f"[engine.{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in table.items()]
    lines += ["", "[fit]"] + [f"{k} = {_toml_value(v)}" for k, v in result["fit"].items() if v is not None]
    return "\n".join(lines) + "\n"


def check_finite(result: dict[str, Any]) -> None:
    """Every number the engine file would hold is finite: a fit that produced ``inf`` or ``nan`` (from logs whose
    times say nothing) is refused rather than written."""
    def walk(v, where: str) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{where}.{k}")
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x, where)
        elif isinstance(v, float) and not math.isfinite(v):
            raise ConfigError("fit", f"the replays give {where} = {v}; check their executions.csv (every time a "
                                     "finite number of ms) and fit again")

    walk(result["engine"], "engine")


def check_engine_path(path) -> Path:
    """``--out``: a file path (not a folder) whose folder exists or can be made, checked before any work."""
    from dvasim.errors import check_out_dir

    p = Path(path)
    if not str(path).strip():
        raise ConfigError("--out", "is empty; give a file name such as engine.toml")
    if p.is_dir():
        raise ConfigError("--out", f"{p} is a folder; give a file name such as engine.toml")
    check_out_dir(p.parent, "--out")
    return p


def write_engine(result: dict[str, Any], path) -> Path:
    """Write the engine file atomically (a temporary name, renamed when complete): a full disk leaves no
    half-written file, only a one-line :class:`~dvasim.errors.OutputError`."""
    from dvasim.outputs import write_text

    p = check_engine_path(path)
    check_finite(result)
    text = engine_toml(result)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        from dvasim.outputs import output_error

        raise output_error(p.parent, e) from None
    return write_text(p, text)
