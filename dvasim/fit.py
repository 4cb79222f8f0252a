"""``dvasim fit``: the simulator's engine parameters fitted to real replay logs.

A replay folder is what ``dvasim replay --out DIR`` writes: ``config.toml`` (or ``config.json``), ``queries.csv``
and ``executions.csv`` (each may be gzipped). Every execution row carries the table time the policy decided
with (``table_ms``, the GPU time), the real time its thread spent (``compute_ms``), the part of that spent
copying buffers (``copy_ms``), and the hand-off and book-keeping around it. From these the fit takes, per stage,
the host model of :mod:`dvasim.sim.host` and the engine's delays:

* **launch cost** ``launch_ms[s] + launch_per_row_ms[s] * b``: from executions that ran alone (no other stage
  execution overlapping them) and were bound by the host (``compute - copy > table``: the thread spent longer
  than the GPU needed). Per batch size the median, then a least-squares line with a slope >= 0, weighted by
  the number of executions. A stage never host-bound gets launch cost 0 (the GPU time dominates). With
  ``--launch-table`` (a profiled launch table, :class:`dvasim.sim.host.LaunchTable`) the table's shape over batch
  sizes is kept and only ``launch_scale`` is fitted: the median of (compute - copy) / launch over the same
  executions;
* with ``--gpu-table`` (GPU-true stage times), the GPU's share of every execution comes from that table instead of
  the replay's ``table_ms`` (the device model then sees the GPU work the policy's event-timed table hides);
* **copies** ``copy_ms[s] + copy_per_row_ms[s] * b``: the same line through the measured ``copy_ms``;
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

import gzip
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dvasim.errors import ConfigError, DvasimError, OneLineParser

ADMISSION_LEVELS = (*np.linspace(0.0, 0.95, 20), 0.999)


# ----------------------------------------------------------------------------- reading replay folders
def _find(d: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz"):
        if (d / name).is_file():
            return d / name
    return None


def read_replay(path) -> dict[str, Any]:
    """One replay folder: ``{"dir", "config", "queries", "executions"}`` (DataFrames)."""
    d = Path(path)
    if not d.is_dir():
        raise ConfigError("fit", f"{str(d)!r} is not a folder; give replay output folders (dvasim replay --out DIR)")
    cfg_path = _find(d, "config.toml") or _find(d, "config.json")
    if cfg_path is None:
        raise ConfigError("fit", f"{d}: no config.toml or config.json; give a folder written by dvasim replay")
    raw = _read_text(cfg_path)
    try:
        if cfg_path.name.startswith("config.toml"):
            import tomllib

            cfg = tomllib.loads(raw)
        else:
            cfg = json.loads(raw).get("config", {})
    except ValueError as e:
        raise ConfigError("fit", f"{cfg_path}: cannot be read ({e})") from None
    frames = {}
    for stem, need in (("queries.csv", {"arrival_ms", "seen_ms", "finish_ms"}),
                       ("executions.csv", {"stage", "batch_size", "table_ms", "begin_ms", "end_ms", "compute_ms",
                                           "copy_ms", "handoff_ms", "bookkeeping_ms"})):
        p = _find(d, stem)
        if p is None:
            raise ConfigError("fit", f"{d}: no {stem} (or {stem}.gz); give a folder written by dvasim replay")
        try:
            df = pd.read_csv(p)
        except (ValueError, OSError, UnicodeDecodeError) as e:
            raise ConfigError("fit", f"{p}: not a readable CSV ({e})") from None
        missing = sorted(need - set(df.columns))
        if missing:
            raise ConfigError("fit", f"{p}: missing columns {', '.join(missing)}; is it a replay's {stem}?")
        frames[stem.split(".")[0]] = df
    if frames["executions"].empty:
        raise ConfigError("fit", f"{d}: executions.csv has no rows")
    return {"dir": str(d), "config": cfg, **frames}


def _read_text(p: Path) -> str:
    try:
        if p.suffix == ".gz":
            with gzip.open(p, "rt", encoding="utf-8") as f:
                return f.read()
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("fit", f"{p}: cannot be read ({e})") from None


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
        fit_cores_from_overlap: bool = False) -> dict[str, Any]:
    """Fit the engine to the replay folders ``dirs`` (one model). Returns ``{"engine": {...}, "fit": {...}}``:
    the ``[engine]`` section (with ``[engine.host]``) and the evidence."""
    from dvasim.sim.host import MODULE_KINDS, LaunchTable

    runs = [r if isinstance(r, dict) else read_replay(r) for r in dirs]
    if not runs:
        raise ConfigError("fit", "give at least one replay folder")
    model = _model_of(runs)
    n = _n_stages(runs)
    kinds = {modules} if modules else {r["config"].get("replay", {}).get("modules", "torchscript") for r in runs}
    kinds = {"cudagraph" if k == "auto" else k for k in kinds}
    if len(kinds) != 1 or not kinds <= set(MODULE_KINDS):
        raise ConfigError("fit", f"the folders ran different or unknown module kinds ({sorted(kinds)}); give --modules")
    kind = kinds.pop()
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
        from dvasim.calibration.table import LatencyTable

        gt = LatencyTable.load(gpu_table)
        if gt.n_stages != n:
            raise ConfigError("--gpu-table", f"{gpu_table} has {gt.n_stages} stages; the replays have {n}")
        lens = e["seq_len"] if gt.seq_lens is not None else [None] * len(e)
        e["table_ms"] = [gt.latency(int(s_), int(b), None if L is None else int(L))
                         for s_, b, L in zip(e["stage"], e["batch_size"], lens)]
    alone = e[e["overlap"] < alone_below]
    if len(alone) < 10:
        raise ConfigError("fit", f"only {len(alone)} executions ran alone; include ZeroBatch or DelayBatch replays")
    host: dict[str, Any] = {"modules": kind, "cores": host_cores}
    launch_a, launch_c, copy_a, copy_c, n_bound = [], [], [], [], []
    table = LaunchTable.load(launch_table, "--launch-table") if launch_table else None
    ratios = []
    for s in range(n):
        a_s = alone[alone["stage"] == s]
        bound = a_s[a_s["host_ms"] > a_s["table_ms"]]
        n_bound.append(int(len(bound)))
        ca, cc = line_fit(a_s["batch_size"], a_s["copy_ms"])
        copy_a.append(ca)
        copy_c.append(cc)
        if table is not None:
            lens = bound["seq_len"] if "seq_len" in bound else [None] * len(bound)
            base = np.array([table.cost(kind, s, int(b), None if L is None or _nan(L) else int(L))
                             for b, L in zip(bound["batch_size"], lens)])
            ratios.extend((bound["host_ms"].to_numpy() / np.maximum(base, 1e-9)).tolist())
        elif len(bound):
            la, lc = line_fit(bound["batch_size"], bound["host_ms"])
            launch_a.append(la)
            launch_c.append(lc)
        else:
            launch_a.append(0.0)
            launch_c.append(0.0)
    if table is not None:
        host["launch_table"] = str(Path(launch_table).resolve())
        host["launch_scale"] = float(np.median(ratios)) if ratios else 1.0
    else:
        host["launch_ms"] = launch_a
        host["launch_per_row_ms"] = launch_c
    if gpu_table is not None:
        host["gpu_table"] = str(Path(gpu_table).resolve())
    host["copy_ms"] = copy_a
    host["copy_per_row_ms"] = copy_c
    host["python_ms"] = float(python_ms)

    # jitter: real / modelled time of the executions that ran alone, relative to their (stage, batch) median
    def modelled(row_stage, b, L, g):
        if table is not None:
            lc = table.cost(kind, row_stage, b, L) * host["launch_scale"]
        else:
            lc = launch_a[row_stage] + launch_c[row_stage] * b
        return max(lc, g)

    lens = alone["seq_len"] if "seq_len" in alone else pd.Series([math.nan] * len(alone), index=alone.index)
    mod = np.array([modelled(int(s), int(b), None if _nan(L) else int(L), g) for s, b, L, g in
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

    # launches that overlapped others (DVABatch, several instances): how many cores launch at once
    cores_fit = None
    over = e[e["overlap"] >= 0.5]
    if fit_cores_from_overlap and len(over) < 50:
        raise ConfigError("--fit-cores", f"only {len(over)} executions overlapped others; give DVABatch replays "
                                         "(or several instances) to fit the launching cores")
    if fit_cores_from_overlap:
        pieces, work = [], []
        for run_e in ex:
            run_e = run_e.assign(copy_ms=run_e["copy_ms"].fillna(0.0))
            lb = (run_e["begin_ms"] + run_e["copy_ms"]).to_numpy()  # the launch follows the copies
            segs = segments(lb, run_e["end_ms"].to_numpy())
            for k, r in enumerate(run_e.itertuples(index=False)):
                if r.overlap < 0.5:
                    continue
                if table is not None:
                    w = table.cost(kind, int(r.stage), int(r.batch_size), None) * host["launch_scale"]
                else:
                    w = launch_a[int(r.stage)] + launch_c[int(r.stage)] * r.batch_size
                if w > r.table_ms and w > 0:  # host-bound: its span is the launch's
                    pieces.append(segs[k])
                    work.append(w)
        if len(work) >= 50:
            c, err = fit_cores(pieces, work)
            host["cores"] = round(c, 1)
            cores_fit = {"n_overlapped_launches": len(work), "cores": round(c, 1), "median_abs_rel_error": round(err, 4)}
    if stall_q is not None:
        host["stall_prob"] = stall_prob
        host["stall_ms"] = stall_q
        if cluster is not None:  # bursts: base probability, and the probability within a window after a stall
            host["stall_prob"] = cluster[0]
            host["stall_cluster_prob"] = cluster[1]
            host["stall_window_ms"] = STALL_WINDOW_MS
    q = pd.concat([r["queries"] for r in runs], ignore_index=True)
    late = (q["seen_ms"] - q["arrival_ms"]).to_numpy(float)
    adm = admission_quantiles(late)
    overhead = float((e["handoff_ms"] + e["bookkeeping_ms"]).mean())
    engine: dict[str, Any] = {
        "launch_overhead_ms": overhead,
        "admission_delay_ms": adm if adm is not None else float(np.nanmean(late)) if len(late) else 0.0,
        "service_cv": cv,
    }
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
    engine["host"] = host
    return {"engine": engine, "fit": evidence}


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
    host = eng.pop("host", None)
    lines.append("[engine]")
    lines += [f"{k} = {_toml_value(v)}" for k, v in eng.items()]
    if host:
        lines += ["", "[engine.host]"] + [f"{k} = {_toml_value(v)}" for k, v in host.items()]
    lines += ["", "[fit]"] + [f"{k} = {_toml_value(v)}" for k, v in result["fit"].items() if v is not None]
    return "\n".join(lines) + "\n"


def write_engine(result: dict[str, Any], path) -> Path:
    p = Path(path)
    if p.is_dir():
        raise ConfigError("--out", f"{p} is a folder; give a file name such as engine.toml")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(engine_toml(result))
    except OSError as e:
        raise ConfigError("--out", f"cannot write {p} ({e.strerror or e})") from None
    return p


# ----------------------------------------------------------------------------- command line
def cli_fit(argv=None) -> int:
    p = OneLineParser(prog="dvasim fit", description="fit the simulator's engine to replay output folders")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="replay folders (config.toml, queries.csv, executions.csv)")
    p.add_argument("--out", required=True, help="the engine file to write, e.g. engine.toml")
    p.add_argument("--launch-table", default=None, help="a profiled launch table; then only launch_scale is fitted")
    p.add_argument("--gpu-table", default=None,
                   help="a per-stage GPU-time table (CUDA graph replays) for the device model, when the replays' "
                        "table timed host-bound launches")
    p.add_argument("--modules", default=None, help="module kind the replays ran (default: from their configs)")
    p.add_argument("--host-cores", default="16", help="launching cores of the replay's host (not fitted)")
    p.add_argument("--fit-cores", action="store_true",
                   help="fit host.cores from launches that overlapped others (needs DVABatch or multi-instance replays)")
    p.add_argument("--table", default=None,
                   help="the stage table the replays' policy decided with: then every folder is simulated with the "
                        "fitted engine and compared with its own queries (printed, and kept in the file's [fit])")
    try:
        args = p.parse_args(argv)
        try:
            cores = int(args.host_cores)
        except ValueError:
            cores = 0
        if cores < 1:
            raise ConfigError("--host-cores", f"must be an integer >= 1, got {args.host_cores!r}")
        res = fit(args.dirs, launch_table=args.launch_table, modules=args.modules, host_cores=cores,
                  gpu_table=args.gpu_table, fit_cores_from_overlap=args.fit_cores)
        out = write_engine(res, args.out)
        checks = None
        if args.table is not None:
            from dvasim.config import find_file
            from dvasim.fitcheck import self_check

            checks = self_check(args.dirs, find_file(args.table, None, "--table"), out)
            for k in ("throughput_qps", "mean_latency_ms", "p99_latency_ms"):
                res["fit"][f"self_check_err_{k}"] = [round(c[f"err_{k}"], 4) for c in checks]
            out = write_engine(res, args.out)
    except DvasimError as e:
        print(f"dvasim: error: {e}", file=sys.stderr)
        return 2
    f = res["fit"]
    h = res["engine"]["host"]
    print(f"dvasim fit: {len(f['folders'])} folders, {f['n_executions']} executions ({f['n_alone']} alone) of "
          f"{f['model']} ({f['modules']}, {f['stages']} stages) -> {out}")
    if "launch_ms" in h:
        print("  launch ms per stage: " + ", ".join(f"{a:.3f}+{c:.4f}b" for a, c in
                                                    zip(h["launch_ms"], h["launch_per_row_ms"])))
    else:
        print(f"  launch_scale: {h['launch_scale']:.3f} on {h['launch_table']}")
    print("  copy ms per stage:   " + ", ".join(f"{a:.3f}+{c:.4f}b" for a, c in zip(h["copy_ms"], h["copy_per_row_ms"])))
    print(f"  launch_overhead_ms {res['engine']['launch_overhead_ms']:.3f}, service_cv {res['engine']['service_cv']:.3f}")
    for c in checks or []:
        print(f"  {c['folder']}: simulated vs real throughput {c['err_throughput_qps']:+.1%}, mean "
              f"{c['err_mean_latency_ms']:+.1%}, p99 {c['err_p99_latency_ms']:+.1%}")
    return 0
