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
  operators. The per-stage lines themselves are written too, with the cut they belong to (``stage_launch_ms``,
  ``stage_launch_per_row_ms``, ``stage_operators``; a stage never host-bound takes the law's line): a run whose
  stages have exactly that cut launches on them, any other on the law (:func:`stage_lines`; issue 35: the law
  over operator counts moves one stage's fitted cost and slope onto the others). The operators come from ``operators=`` (``--operators``, or ``--table``'s ``# cuts:``), else
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
  is written as ``first_copy_ms`` / ``first_copy_per_row_ms`` (any slicing has a first stage). The simulator
  holds a copy's fixed part under the interpreter lock and runs its per-row part on a core without it, as torch's
  copy bindings do (:meth:`dvasim.server.host.HostModel.copy_rows`);
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

``[fit] identified_by`` says which folders identify which parameter, with the executions or queries each gave
(:func:`identified_by`); a term no folder identifies is written as 0 and named in ``not_identified`` (the slopes
per row) or refused in one line (``--fit-cores`` without overlapped launches).

Not identifiable from executions that never overlapped (ZeroBatch and DelayBatch run one stage at a time): how
launches slow each other down. That comes from the model's structure, not from a fitted number: copies and
Python-level work hold one interpreter lock (eager launches entirely), TorchScript and CUDA-graph launches run on
``host.cores`` cores. ``python_ms`` (Python-level work per launch besides the copies) is not fitted either; the
fit leaves it at 0 unless given, and a given value is taken out of the fitted launch cost (it only moves work
under the lock). Not identifiable from executions that all ran at one batch size (an unbatched replay): the growth
per batch row (``launch_model_per_row_ms``, ``copy_per_row_ms``, ``first_copy_per_row_ms``); the fit keeps the
rest, writes those as 0 and says so in ``[fit] not_identified`` (:func:`per_row_note`).
"""

from __future__ import annotations

import copy
import json
import math
import numbers
from dataclasses import dataclass
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


def replayed_model(runs: list[dict]) -> tuple[dict[str, Any], str]:
    """The replays' ``[model]`` as a config section, and what it says. ``dvasim replay`` writes its ``[model]`` as
    run (:func:`dvasim.engines.replay.engine.to_run_result`): the table's ``provenance``, the ``variant`` and
    ``bounds``, the first operator of each stage it ran. The notes are no config keys and are dropped; ``bounds``,
    where recorded, is the cut the replays ran and becomes ``cuts`` (today's slicing of ``stages`` may differ). The
    folders that record one must record the same."""
    from dvasim.model.catalog import MODEL

    recorded = {json.dumps(r["config"].get("model", {}).get("bounds")) for r in runs} - {"null"}
    if len(recorded) > 1:
        raise ConfigError("fit", f"the folders replay different cuts of the model ([model] bounds "
                                 f"{', '.join(sorted(recorded))}); fit one cut at a time")
    mc = {k: v for k, v in runs[0]["config"].get("model", {}).items() if k in MODEL.by_name}
    if not recorded or "name" not in mc:
        return mc, "the replays' [model] resolved today"
    mc = {k: v for k, v in mc.items() if k not in ("stages", "cuts", "ratios")}
    return {**mc, "cuts": json.loads(recorded.pop())}, "the replays' recorded cuts ([model] bounds)"


def replay_operators(runs: list[dict], n: int) -> tuple[list[int], str]:
    """The operators in each stage of the replays' model: their ``[model]`` (:func:`replayed_model`: the cut they
    recorded, else the section resolved today) resolved as a run would (:func:`dvasim.model.catalog.resolve_model`,
    :func:`dvasim.server.resolve.stage_operators`)."""
    from dvasim.model.catalog import resolve_model
    from dvasim.server.resolve import stage_operators

    mc, where = replayed_model(runs)
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
    return [int(x) for x in ops], f"{src} ({where})"


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


def stage_lines(law: dict[str, Any], ops, lines: dict[str, list], per_row: bool = True) -> dict[str, Any]:
    """``[engine.host]``'s per-stage launch lines at the replayed cut (:data:`dvasim.server.host.STAGE_LAW_KEYS`):
    each stage's own fitted line where its launches were host-bound, the law's line for the stages never
    host-bound (no launch cost of their own was measured), the slopes 0 where the fit did not identify them
    (``per_row`` false). The host model uses them for a run whose stages have exactly ``ops`` operators and the
    law otherwise (issue 35: a law over operator counts hands a GPU-bound first stage's fitted slope to the stages
    after it)."""
    la, lc = law_stage_launch(law, ops)
    bound = [k > 0 for k in lines["n_bound"]]
    a = [round(float(x if u else y), 6) for x, y, u in zip(lines["launch_ms"], la, bound)]
    c = [round(float(x if u else y), 6) if per_row else 0.0 for x, y, u in zip(lines["launch_per_row_ms"], lc, bound)]
    return {"stage_launch_ms": a, "stage_launch_per_row_ms": c, "stage_operators": [int(o) for o in ops]}


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
           "copies more (the batch's inputs brought in; the fixed part under the interpreter lock, the per-row part on a "
           "core without it)")
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
        operators_source: str | None = None, n_boot: int = 0, boot_seed: int = 0) -> dict[str, Any]:
    """Fit the engine to the replay folders ``dirs`` (one model). Returns ``{"engine": {...}, "fit": {...}}``:
    the ``[engine]`` section (with ``[engine.host]``, and ``[engine.transfer]`` for the first stage's input copy)
    and the evidence. ``operators``: the operators in each replayed stage (default: from the replays' ``[model]``,
    :func:`replay_operators`), ``operators_source`` where they come from (kept in ``[fit]``). ``n_boot > 0``: also
    ``"intervals"``, each fitted value's 95% interval (:func:`fit_intervals`, ``n_boot`` resamples seeded by
    ``boot_seed``); the values themselves do not depend on it."""
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
    unidentified = per_row_note(alone)
    if law is not None and ops is not None:  # the replayed cut's own lines, used where a run has that cut
        host.update(stage_lines(law, ops, lines, per_row=unidentified is None))
    if unidentified is not None:
        evidence["not_identified"] = unidentified
    if gpu_table is not None:
        evidence["gpu_table_note"] = "host.gpu_table is per stage: this engine file fits only its stage count"
    engine["host"] = host
    device = _replayed_device(runs) if model is not None else None
    res = {"engine": engine, "fit": evidence, "pinned": fitted_pins(host, model, ops, device)}
    if n_boot > 0:
        res["intervals"] = fit_intervals(res, ex, e, Setting(alone_below, n, table, kind, ops, model, launch),
                                         n_boot=n_boot, seed=boot_seed)
    return res


def fitted_pins(host: dict[str, Any], model: str | None, ops: list[int] | None,
                device: str | None = None) -> dict[str, Any]:
    """The choices outside the fitted numbers that they were fitted under (the engine file's ``[pinned]``, issue 46;
    :mod:`dvasim.config.pins` applies them to a run): DVABatch's Policy I deciding on the GPU's time alone (as a
    replay's policy does, and as the fit's self-check simulates it: :func:`dvasim.fitting.check.recorded_dvabatch`),
    the host model's copy lock and, for the launch law, a launch scale of 1 (today's values, which later defaults
    may move), and the cut of the model the law was fitted through (its first operator of each stage)."""
    from dvasim.fitting.check import REPLAY_CLUSTER_HOST_COST
    from dvasim.server.host import HOST

    keys = {k.name: k.default for k in HOST.keys}
    pinned_host = {"copy_lock": host.get("copy_lock", keys["copy_lock"])}
    if "launch_scale" not in host:
        pinned_host["launch_scale"] = float(keys["launch_scale"])
    out: dict[str, Any] = {"policy": {"cluster_host_cost": REPLAY_CLUSTER_HOST_COST}, "engine": {"host": pinned_host}}
    cut = fitted_cut(model, device, ops)
    if cut is not None:
        out["model"] = cut
    return out


def _replayed_device(runs: list[dict]) -> str | None:
    """The device of the replays' ``[model]`` (whose zoo counts the operators of the pinned cut), or ``None``."""
    try:
        device = replayed_model(runs)[0].get("device")
    except DvasimError:
        return None
    return device if isinstance(device, str) else None


def fitted_cut(model: str | None, device: str | None, ops: list[int] | None) -> dict[str, Any] | None:
    """The cut the law was fitted through as the zoo model's first operator of each stage, with the model's
    operators; ``None`` where ``ops`` is no cut of the zoo's model (``--operators`` counts that do not add up to
    its operators, a model not in the zoo)."""
    from dvasim.config.pins import zoo_operators

    if model is None or ops is None:
        return None
    cuts = [0]
    for o in ops[:-1]:
        cuts.append(cuts[-1] + int(o))
    total = int(sum(int(o) for o in ops))
    mc = {"name": str(model), "cuts": cuts, **({"device": device} if device else {})}
    if zoo_operators(mc) != total:
        return None
    return {"name": str(model), "cuts": cuts, "operators": total}


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
        times = [gt.latency(int(s_), int(b), None if L is None or _nan(L) else int(L))
                 for s_, b, L in zip(e["stage"], e["batch_size"], lens)]
    except TableError as err:  # the table's own errors name model.table: here it is --gpu-table
        raise ConfigError("--gpu-table", err.message if err.field == "model.table" else f"{gpu_table}: {err}") \
            from None
    return _trusted_times(times, "--gpu-table", gpu_table)


def _trusted_times(times: list[float], field: str, path) -> list[float]:
    """Times (ms) from a table the fit reads, each at most :data:`~dvasim.fitting.logs.MAX_MS` (more is beyond any
    replay: a damaged cell, not a time the fit can trust)."""
    from dvasim.fitting.logs import MAX_MS

    for x in times:
        if not x <= MAX_MS:
            raise ConfigError(field, f"{path} gives the replays' executions a time of {x:g} ms, beyond any replay "
                                     f"(at most {MAX_MS:.0e}); fix the table's latencies")
    return times


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
            base = np.array(_trusted_times([table.cost(kind, s, int(b), None if L is None or _nan(L) else int(L))
                                            for b, L in zip(bound["batch_size"], lens)], "--launch-table", table.path))
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
    mod = _modelled(alone, launch)
    cv = _service_cv(alone, mod)
    excess = alone["host_ms"].to_numpy() - mod
    stall_prob, stall_q = stalls(excess)
    cluster = None
    if stall_q is not None:
        flagged = excess > stall_threshold(excess)
        p_near, p_far, n_near = stall_clustering(alone["begin_ms"], flagged, alone["run"])
        if n_near >= 20 and p_near > p_far:
            cluster = (p_far, p_near)
    return cv, stall_prob, stall_q, cluster


def _modelled(alone: pd.DataFrame, launch) -> np.ndarray:
    """Each execution's modelled time: its launch or its GPU time, the longer."""
    lens = alone["seq_len"] if "seq_len" in alone else pd.Series([math.nan] * len(alone), index=alone.index)
    return np.array([max(launch(int(s), int(b), None if _nan(L) else int(L)), g) for s, b, L, g in
                     zip(alone["stage"], alone["batch_size"], lens, alone["table_ms"])])


def _service_cv(alone: pd.DataFrame, mod: np.ndarray) -> float:
    """``service_cv``: :func:`robust_cv` of real / modelled time, each relative to its (stage, batch) median."""
    return robust_cv(_centred_ratios(alone, mod))


def _centred_ratios(alone: pd.DataFrame, mod: np.ndarray) -> list[float]:
    """Real / modelled time of every execution relative to the median of its (stage, batch) group (groups of at
    least 5)."""
    rel = alone["host_ms"].to_numpy() / np.maximum(mod, 1e-9)
    grp = alone["stage"].to_numpy() * 10_000 + alone["batch_size"].to_numpy()
    rr = []
    for g in np.unique(grp):
        v = rel[grp == g]
        if len(v) >= 5 and np.median(v) > 0:  # (a group whose median launch took no time has no ratios)
            rr.extend(v / np.median(v))
    return rr


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
    pieces, work = overlapped_launches(ex, launch)
    if len(work) < 50:
        return None
    c, err = fit_cores(pieces, work)
    host["cores"] = round(c, 1)
    return {"n_overlapped_launches": len(work), "cores": round(c, 1), "median_abs_rel_error": round(err, 4)}


def overlapped_launches(ex: list[pd.DataFrame], launch) -> tuple[list[list[tuple[float, int]]], list[float]]:
    """The host-bound launches that overlapped others: each one's pieces (:func:`segments`) and its modelled work
    (``launch``), as :func:`fit_cores` takes them."""
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
    return pieces, work


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
    evidence["identified_by"] = json.dumps(identified_by(runs, n, e, alone))
    return evidence


def identified_by(runs: list[dict], n: int, e: pd.DataFrame, alone: pd.DataFrame) -> dict[str, Any]:
    """Which replay folders identify which fitted parameter (``[fit] identified_by``, issue 35), by folder name
    with the executions or queries each gave: each stage's launch line (its host-bound executions that ran alone),
    the slopes per batch row (folders whose alone executions had two batch sizes or more), the copies and jitter
    (alone executions), the hand-off and admission delays (every execution and query), the launching cores
    (launches that overlapped others: only with ``--fit-cores``). A parameter no folder identifies lists none:
    the fit writes it as 0 and says so (``not_identified``) or refuses it (``--fit-cores``)."""
    from pathlib import Path

    names = [Path(str(r["dir"])).name for r in runs]

    def count(frame: pd.DataFrame) -> dict[str, int]:
        got = frame.groupby("run").size()
        return {names[int(k)]: int(v) for k, v in got.items() if v}

    bound = alone[alone["host_ms"] > alone["table_ms"]]
    sizes = alone.groupby("run")["batch_size"].nunique()
    out: dict[str, Any] = {f"launch line of stage {s}": count(bound[bound["stage"] == s]) for s in range(n)}
    out["per-row slopes (batch sizes seen alone: two or more)"] = {names[int(k)]: int(v) for k, v in sizes.items()
                                                           if v >= 2}
    out["copies, service_cv, stalls (executions alone)"] = count(alone)
    out["launch_overhead_ms (every execution)"] = count(e)
    out["admission_delay_ms (every query)"] = {nm: int(len(r["queries"])) for nm, r in zip(names, runs)}
    out["host.cores (launches overlapping others, --fit-cores)"] = count(e[e["overlap"] >= 0.5])
    return out


PER_ROW_KEYS = ("launch_model_per_row_ms", "copy_per_row_ms", "first_copy_per_row_ms")  # slopes over the batch size
PER_ROW_STAGE_KEYS = ("launch_per_row_ms_by_stage", "copy_per_row_ms_by_stage")


def per_row_note(alone: pd.DataFrame) -> str | None:
    """Why the growth per batch row is not identified, or ``None`` where it is: every execution that ran alone had
    one batch size (an unbatched replay: ZeroBatch with ``max_batch_size = 1``), and a slope needs two. The fit
    then keeps what those executions do identify (each stage's launch and copy at that size, the law over the
    stages, the delays, the jitter and the stalls) and writes the slopes as 0, said in ``[fit] not_identified``."""
    sizes = sorted({int(b) for b in alone["batch_size"]})
    if len(sizes) != 1:
        return None
    return (f"{', '.join(PER_ROW_KEYS)} (every execution that ran alone had batch size {sizes[0]}: a per-row "
            f"slope needs at least two batch sizes): written as 0, so the engine holds at batch size {sizes[0]} "
            "only; fit replays whose batches have two sizes or more to measure them")


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
            **{f"launch_law_rel_err_by_stage_b{b}": err(b) for b in sorted({1, b_max})},
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


# ----------------------------------------------------------------------------- intervals (issue 24)
BOOT_METHOD = "bootstrap over executions"
CLUSTER_METHOD = "Clopper-Pearson (the stalls the fit flagged, inside and outside their bursts)"
NOT_GIVEN = ("engine.admission_delay_ms and engine.host.stall_ms are distributions (the measured quantiles), not one "
             "estimated number; host.python_ms, host.modules, host.stall_window_ms and (without --fit-cores) "
             "host.cores are given, not fitted")
HOST_KEYS = ("launch_fixed_ms", "launch_per_op_ms", "launch_model_per_row_ms", "first_launch_ms", "last_launch_ms",
             "launch_scale", "copy_ms", "copy_per_row_ms", "first_copy_ms", "first_copy_per_row_ms", "stall_prob",
             "stall_cluster_prob")
STAGE_KEYS = ("launch_ms_by_stage", "launch_per_row_ms_by_stage", "copy_ms_by_stage", "copy_per_row_ms_by_stage")


@dataclass(frozen=True)
class Setting:
    """What a fit was made with, for its resamples (:func:`fit_intervals`): the overlap below which an execution
    ran alone, the stages, the launch table (or ``None``) and module kind, the stages' operators, the model and
    the point fit's launch cost (the launching cores' resamples keep it)."""

    alone_below: float
    n: int
    table: Any
    kind: str
    ops: list[int] | None
    model: str | None
    launch: Any


def fit_intervals(res: dict[str, Any], ex: list[pd.DataFrame], e: pd.DataFrame, setting: Setting, *,
                  n_boot: int = 200, seed: int = 0, confidence: float = 0.95) -> dict[str, Any]:
    """A ``confidence`` interval for every value the fit estimated, shaped as ``res`` (``intervals["engine"]["host"]
    ["launch_per_op_ms"]`` next to ``res["engine"]["host"]["launch_per_op_ms"]``), each an
    :meth:`~dvasim.reporting.intervals.Interval.as_dict` with its ``method``:

    * ``"bootstrap over executions"``: the executions resampled with replacement ``n_boot`` times within each
      (replay folder, stage), seeded by ``seed``, and the fit's estimates (per-stage launch and copy lines, the
      launch and copy laws, ``launch_scale``, ``service_cv``, ``stall_prob``, ``launch_overhead_ms``) made again
      from each resample (whether one ran alone is a property of the real timeline, kept); the percentile
      interval. The launching ``cores`` (``--fit-cores``): the overlapped launches resampled, the launch costs
      kept at the point fit's;
    * ``"Clopper-Pearson ..."`` for ``stall_prob`` and ``stall_cluster_prob`` when stalls come in bursts (their
      time order is what the bursts are: resampling executions would break it): the exact binomial interval of
      the stalls the fit flagged outside and inside bursts.

    ``service_cv``'s resamples are of the executions' ratios to their (stage, batch) median as the fit made them
    (:func:`~dvasim.reporting.intervals.bootstrap`): a resample's duplicates would sit exactly on a re-centred
    group's median and shrink every resampled spread (its interval then missed the truth 70% of the time on
    synthetic replays; resampling the ratios covers it 95%).

    The per-row slopes a fit did not identify (:func:`per_row_note`: written as 0, not estimated) get no interval.
    ``intervals["about"]`` says how, and what has no interval (:data:`NOT_GIVEN`, and those slopes)."""
    from dvasim.reporting.intervals import bootstrap, from_replicates

    point = _flat(res)
    groups = list(e.groupby(["run", "stage"], sort=True).indices.values())
    rng = np.random.default_rng(seed)
    reps = []
    for _ in range(int(n_boot)):
        idx = np.concatenate([g[rng.integers(0, len(g), len(g))] for g in groups])
        reps.append(_estimates(e.iloc[idx], setting))
    flat = {k: from_replicates(v, [r.get(k, math.nan) for r in reps], confidence, n=len(e), method=BOOT_METHOD)
            for k, v in point.items() if k != "engine.host.cores"}
    alone = e[e["overlap"] < setting.alone_below]
    mod = _modelled(alone, setting.launch)  # the point fit's modelled times: for the jitter and the stalls
    rr = np.asarray(_centred_ratios(alone, mod))
    if len(rr):  # the jitter: its executions' ratios resampled (re-centring resamples on their duplicates would not do)
        flat["engine.service_cv"] = bootstrap(rr, robust_cv, confidence, n_boot=int(n_boot), seed=seed,
                                              method=BOOT_METHOD)
    if "stall_cluster_prob" in res["engine"]["host"]:
        flat.update(_cluster_intervals(alone, mod, confidence))
    if "engine.host.cores" in point:
        flat["engine.host.cores"] = _cores_interval(ex, setting, point["engine.host.cores"], rng, int(n_boot),
                                                    confidence)
    out = _nested({k: flat[k].as_dict() for k in point if k in flat})
    out["about"] = {"confidence": confidence, "n_boot": int(n_boot), "seed": int(seed),
                    "resampled": "executions, with replacement within each (replay folder, stage)",
                    "not_given": NOT_GIVEN + (f"; {', '.join(PER_ROW_KEYS)} are not identified (fit.not_identified)"
                                              if "not_identified" in res["fit"] else "")}
    return out


def _flat(res: dict[str, Any]) -> dict[str, float]:
    """The fitted values that get an interval, by dotted path (a stage's line: ``fit.launch_ms_by_stage.0``)."""
    eng, host, f = res["engine"], res["engine"]["host"], res["fit"]
    skip = (*PER_ROW_KEYS, *PER_ROW_STAGE_KEYS) if "not_identified" in f else ()  # written as 0, not estimated
    out = {f"engine.{k}": float(eng[k]) for k in ("launch_overhead_ms", "service_cv")}
    out.update({f"engine.host.{k}": float(host[k]) for k in HOST_KEYS if k in host and k not in skip})
    for k in ("stage_launch_ms", "stage_launch_per_row_ms"):  # the per-stage lines (their slopes 0 if unidentified)
        if k in host and not (skip and k == "stage_launch_per_row_ms"):
            out.update({f"engine.host.{k}.{s}": float(v) for s, v in enumerate(host[k])})
    if "cores_fit" in f:
        out["engine.host.cores"] = float(host["cores"])
    for k in STAGE_KEYS:
        if k in f and k not in skip:
            out.update({f"fit.{k}.{s}": float(v) for s, v in enumerate(f[k])})
    return out


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    """Dotted paths back into nested dicts; a numeric last part makes a list (in the order given)."""
    out: dict[str, Any] = {}
    for key, v in flat.items():
        parts = key.split(".")
        if parts[-1].isdigit():
            d = out
            for part in parts[:-2]:
                d = d.setdefault(part, {})
            d.setdefault(parts[-2], []).append(v)
            continue
        d = out
        for part in parts[:-1]:
            d = d.setdefault(part, {})
        d[parts[-1]] = v
    return out


def _estimates(sample: pd.DataFrame, st: Setting) -> dict[str, float]:
    """The fit's estimates from one resample of the executions, by the paths of :func:`_flat`, made as
    :func:`fit` makes them (the same functions)."""
    out = {"engine.launch_overhead_ms": float((sample["handoff_ms"] + sample["bookkeeping_ms"]).mean())}
    alone = sample[sample["overlap"] < st.alone_below]
    if len(alone) < 10:
        return out
    lines = _stage_lines(alone, st.n, st.table, st.kind)
    host: dict[str, Any] = {}
    if st.table is not None:
        host["launch_scale"] = float(np.median(lines["ratios"])) if lines["ratios"] else 1.0
    else:
        law = launch_law(lines["launch_ms"], lines["launch_per_row_ms"], st.ops, used=[k > 0 for k in lines["n_bound"]])
        host.update({k: law[k] for k in HOST_KEYS if k in law})
        for k in ("launch_ms", "launch_per_row_ms"):
            out.update({f"fit.{k}_by_stage.{s}": float(v) for s, v in enumerate(lines[k])})
        if st.ops is not None:  # the per-stage lines at the replayed cut, as fit() writes them
            for k, vals in stage_lines(law, st.ops, lines).items():
                if k != "stage_operators":
                    out.update({f"engine.host.{k}.{s}": float(v) for s, v in enumerate(vals)})
    copies = copy_law(lines["copy_ms"], lines["copy_per_row_ms"], st.model)
    host.update({k: copies[k] for k in ("copy_ms", "copy_per_row_ms", "first_copy_ms", "first_copy_per_row_ms")})
    for k in ("copy_ms", "copy_per_row_ms"):
        out.update({f"fit.{k}_by_stage.{s}": float(v) for s, v in enumerate(lines[k])})
    mod = _modelled(alone, _stage_launch_cost(st.table, st.kind, host, lines))
    out["engine.service_cv"] = _service_cv(alone, mod)
    host["stall_prob"] = stalls(alone["host_ms"].to_numpy() - mod)[0]
    out.update({f"engine.host.{k}": float(v) for k, v in host.items()})
    return out


def _cluster_intervals(alone: pd.DataFrame, mod: np.ndarray, confidence: float) -> dict[str, Any]:
    """Clopper-Pearson intervals of the stall probabilities outside (``stall_prob``) and inside
    (``stall_cluster_prob``) bursts, from the stalls the point fit flagged (``mod``: its modelled times)."""
    from dvasim.reporting.intervals import Interval, binomial

    excess = alone["host_ms"].to_numpy() - mod
    flagged = excess > stall_threshold(excess)
    p_near, p_far, n_near = stall_clustering(alone["begin_ms"], flagged, alone["run"])
    n_far = len(alone) - n_near
    out = {}
    for key, p, n in (("engine.host.stall_prob", p_far, n_far), ("engine.host.stall_cluster_prob", p_near, n_near)):
        iv = binomial(round(p * n), n, confidence)
        out[key] = Interval(iv.point, iv.lo, iv.hi, iv.n, confidence, CLUSTER_METHOD)
    return out


def _cores_interval(ex: list[pd.DataFrame], st: Setting, point: float, rng, n_boot: int, confidence: float):
    """The launching cores' bootstrap interval: the overlapped launches resampled, :func:`fit_cores`' rule (the
    first core count on its grid where the median of done / work reaches 1) applied to each resample."""
    from dvasim.reporting.intervals import from_replicates

    pieces, work = overlapped_launches(ex, st.launch)
    grid = np.arange(1.0, 16.01, 0.1)
    done = np.empty((len(grid), len(pieces)))
    for i, p in enumerate(pieces):  # done / work of launch i at every core count of the grid
        dt = np.array([x for x, _ in p], float)
        k = np.array([y for _, y in p], float)
        done[:, i] = np.minimum(1.0, grid[:, None] / k[None, :]) @ dt / work[i] if len(p) else 0.0
    reps = []
    for _ in range(n_boot):
        med = np.median(done[:, rng.integers(0, len(work), len(work))], axis=1)
        reps.append(round(float(grid[int(np.argmax(med >= 1.0))] if (med >= 1.0).any() else grid[-1]), 1))
    return from_replicates(point, reps, confidence, n=len(work), method=BOOT_METHOD)


# ----------------------------------------------------------------------------- writing the engine file
def toml_value(v) -> str:
    """One TOML value (a bool, number, string or list of them), floats to 6 decimals, numpy scalars too: the
    engine files', and the replay configs' that experiments/validation/gpu_matrix.py writes."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, numbers.Integral):
        return str(int(v))
    if isinstance(v, numbers.Real):
        v = float(v)
        return repr(round(v, 6)) if math.isfinite(v) else "nan"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def portable(result: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``result`` with its file paths (``engine.host``'s ``launch_table`` and ``gpu_table``, ``fit.folders`` and
    the like) written relative to ``folder``, where the engine file goes: the file then works wherever its folder
    and the tables move together (:func:`dvasim.config.files.apply_engine_file` reads them relative to the file),
    and names no machine's absolute path."""
    import os

    base = Path(folder).resolve()

    def rel(v):
        if isinstance(v, str) and os.path.isabs(v):
            try:
                return os.path.relpath(v, base)
            except ValueError:  # another drive (Windows): keep it
                return v
        if isinstance(v, list):
            return [rel(x) for x in v]
        return v

    out = copy.deepcopy(result)
    host = out["engine"].get("host")
    if isinstance(host, dict):
        for k in ("launch_table", "gpu_table"):
            if k in host:
                host[k] = rel(host[k])
    out["fit"] = {k: rel(v) if k in ("folders", "launch_table", "gpu_table", "table") else v
                  for k, v in out["fit"].items()}
    return out


def engine_toml(result: dict[str, Any]) -> str:
    """The fit as an engine file: ``[engine]``, ``[engine.host]`` and the evidence as ``[fit]``."""
    lines = ["# written by dvasim fit: the simulator's engine fitted to real replays",
             "# use: dvasim run CONFIG.toml --engine THIS_FILE   (or dvasim.run(config, engine=THIS_FILE))", ""]
    eng = dict(result["engine"])
    subs = {k: eng.pop(k) for k in list(eng) if isinstance(eng[k], dict)}  # [engine.host], [engine.transfer]
    lines.append("[engine]")
    lines += [f"{k} = {toml_value(v)}" for k, v in eng.items()]
    for name, table in subs.items():
        if table:
            lines += ["", f"[engine.{name}]"] + [f"{k} = {toml_value(v)}" for k, v in table.items()]
    lines += pinned_toml(result.get("pinned"))
    lines += ["", "[fit]"] + [f"{k} = {toml_value(v)}" for k, v in result["fit"].items() if v is not None]
    return "\n".join(lines) + "\n"


def pinned_toml(pinned: dict[str, Any] | None) -> list[str]:
    """The ``[pinned.*]`` tables of the engine file (:func:`fitted_pins`), lines of TOML; none without pins."""
    if not pinned:
        return []
    lines = ["", "# the choices this file was fitted under: a run applies each where its config is silent and refuses "
                 "a config", "# that says otherwise (dvasim.config.pins)"]
    for name, table in pinned.items():
        flat = {f"{name}.{k}": v for k, v in table.items()} if name == "engine" else {name: table}
        for sec, vals in flat.items():
            lines += [f"[pinned.{sec}]"] + [f"{k} = {toml_value(v)}" for k, v in vals.items()] + [""]
    return lines[:-1]


def check_finite(result: dict[str, Any]) -> None:
    """Every number the engine file would hold is finite and at most :data:`~dvasim.fitting.logs.MAX_MS` in size
    (beyond any replay's time, or any scale of a table's): a fit that produced ``inf``, ``nan`` or such a number
    (from logs or tables whose times say nothing) is refused rather than written."""
    from dvasim.fitting.logs import MAX_MS

    def walk(v, where: str) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{where}.{k}")
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x, where)
        elif isinstance(v, float) and not (math.isfinite(v) and abs(v) <= MAX_MS):
            raise ConfigError("fit", f"the replays give {where} = {v:g}; check their executions.csv and the tables "
                                     f"given (every time a finite number of ms, at most {MAX_MS:.0e}) and fit again")

    walk(result["engine"], "engine")


def check_engine_path(path) -> Path:
    """``--out``: a file path (not a folder) whose folder exists or can be made, checked before any work."""
    from dvasim.errors import check_out_dir

    p = Path(path)
    if not str(path).strip():
        raise ConfigError("--out", "is empty; give a file name such as engine.toml")
    if p.is_dir():
        raise ConfigError("--out", f"{p} is a folder; give a file name such as engine.toml")
    if p.exists() and not p.is_file():  # a device or a pipe (/dev/null) must not be replaced by a file
        raise ConfigError("--out", f"{p} exists and is not a regular file; give a file name such as engine.toml")
    check_out_dir(p.parent, "--out")
    return p


def write_engine(result: dict[str, Any], path) -> Path:
    """Write the engine file atomically (a temporary name, renamed when complete): a full disk leaves no
    half-written file, only a one-line :class:`~dvasim.errors.OutputError`."""
    from dvasim.outputs import write_text

    p = check_engine_path(path)
    check_finite(result)
    text = engine_toml(portable(result, p.parent))
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        from dvasim.outputs import output_error

        raise output_error(p.parent, e) from None
    return write_text(p, text)
