"""Rerun the committed experiments from this tree, time each, and check each result against the committed one.

Every job below is the command the experiments' README gives for a committed result, with ``experiments/results``
replaced by a scratch folder (``--scratch``, default ``results/rerun``), so the committed results are never
overwritten; each job writes into its own folder under it (``jobs/<job>/``), so what a job wrote is exactly what
is compared, whatever runs beside it. For each job it records the wall time and exit status, then compares every CSV the job wrote with the
committed file of the same name: ``same`` (byte for byte), ``same numbers`` (every number within 1e-9 relative and
every other cell equal, wall-time columns aside), or ``DIFFERS`` with the largest relative difference and the
column. It writes ``rerun.csv`` (one row per job) and ``compared.csv`` (one row per CSV) into the scratch folder,
and prints one line per job as it ends.

The jobs run ``--jobs`` at a time (default 1: each job's time is its own). Jobs marked long (the paper rerun's
figures, the stack question, the long-run check: tens of minutes each) run only with ``--long``.

Usage::

    .venv/bin/python experiments/rerun_all.py [--scratch DIR] [--jobs N] [--long] [--only NAME ...] [--list]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = Path("experiments/results")
PY = sys.executable
DVASIM = [PY, "-m", "dvasim"]
RTOL = 1e-9
# columns that hold how long something took on this machine, not a result
TIME_COLUMNS = ("wall", "elapsed", "seconds", "time_s", "runtime", "cpu_s")


@dataclass(frozen=True)
class Job:
    name: str
    argv: tuple[str, ...]
    long: bool = False
    copy: tuple[str, str] | None = None  # (a committed folder, its copy under the results root) made first


def _script(name: str, *args: str) -> tuple[str, ...]:
    return (PY, f"experiments/{name}.py", *args)


def jobs() -> list[Job]:
    """The committed results' commands (experiments/README.md), ``{R}`` standing for the results root."""
    out: list[Job] = []
    # experiments/results/ holds today's Triton (triton-tensorrt), run before issue 33 made the Titan RTX tables
    # imply the paper's release (triton-tensorrt-21.10), so it is named here; Table 5 and compare were rerun since
    # on the implied stack and take none (their CSVs' stack column says which)
    for stack, sub in (("triton-tensorrt", ""), ("gpu-only", "gpu-only")):
        st = ("--stack", stack)
        implied = () if stack == "triton-tensorrt" else st
        tag = "" if stack == "triton-tensorrt" else f" [{stack}]"
        rdir = f"{{R}}/{sub}".rstrip("/")
        calib = ("--calib-from", str(COMMITTED / sub / "fig15_peaks.csv"))
        out.append(Job("fig15_stepping" + tag, _script("fig15_stepping", "--out", rdir, *st)))
        for fig in ("fig17_glue", "fig18_split", "fig19_buffer_pairs", "fig20_stages"):
            out.append(Job(fig + tag, _script(fig, "--out", rdir, *calib, *st)))
        out.append(Job("fig21_closed_loop" + tag, _script("fig21_closed_loop", "--out", rdir, *st)))
        out.append(Job("table5_strategies" + tag, _script("table5_strategies", "--out", rdir, *implied)))
        for s in ("study_maxbs", "study_window", "study_slicing"):
            out.append(Job(s + tag, _script(s, "--out", rdir, *st)))
        out.append(Job("lazyb_figs12_15" + tag, _script("lazyb_figs12_15", "--workers", "1", "--out", rdir, *st)))
        out.append(Job("dvasim compare" + tag, (*DVASIM, "compare", "--workers", "1", "--out", f"{rdir}/compare", *implied),
                       f"{sub}/compare".lstrip("/")))
    out.append(Job("e2bird_figs13_14", _script("e2bird_figs13_14", "--out", "{R}")))
    out.append(Job("e2bird_figs13_14 [gpu-only]",
                   _script("e2bird_figs13_14", "--stack", "gpu-only", "--out", "{R}/gpu-only")))
    out.append(Job("dvasim compare [tfserving]",
                   (*DVASIM, "compare", "--stack", "tfserving", "--models", "resnet152,linknet", "--policies",
                    "zerobatch,delaybatch", "--workers", "1", "--out", "{R}/tfserving/compare")))
    out.append(Job("paper_rerun", _script("paper_rerun", "--out", "{R}")))
    out.append(Job("policy3_thresholds", _script("policy3_thresholds", "--out", "{R}")))
    out.append(Job("bert_h100_collapse", _script("bert_h100_collapse", "--out", "{R}")))
    out.append(Job("tcomp_wait_sweep", _script("tcomp_wait_sweep", "--out", "{R}", "--stack", "triton-tensorrt")))
    out.append(Job("h100_fit", (PY, "experiments/h100_fit/check.py", "--out", "{R}/h100_fit")))
    out.append(Job("pinned_check (h100_fit)", (PY, "experiments/h100_fit/pinned_check.py", "--out", "{R}/h100_fit")))
    # the shipped GPU tables, rebuilt (traces/gpu/README.md), and the GPU matrix's CPU version (its numbers mean
    # nothing: only its time is kept)
    out.append(Job("build_gpu_tables", (PY, "-m", "dvasim.model.build_gpu_tables", "--out", "{R}/traces")))
    out.append(Job("build_gpu_tables --fit", (PY, "-m", "dvasim.model.build_gpu_tables", "--fit", "--out",
                                              "{R}/traces_fit")))
    out.append(Job("gpu_matrix --cpu --tiny", (PY, "experiments/validation/gpu_matrix.py", "--cpu", "--tiny",
                                              "--traces", "{R}/gpu_matrix_cpu/traces", "--summary",
                                              "{R}/gpu_matrix_cpu/summary", "--out", "{R}/gpu_matrix_cpu/out")))
    # the H200 GPU matrix's fit and predictions, from its committed traces (a copy: the analysis rewrites the
    # traces' README and archive) into a summary compared with experiments/validation/gpu/
    out.append(Job("gpu_matrix --analyse", (PY, "experiments/validation/gpu_matrix.py", "--analyse", "--traces",
                                           "{R}/h200_traces", "--summary", "{R}/validation_gpu", "--out",
                                           "{R}/validation_gpu_out"),
                   copy=("traces/gpu_matrix/h200_2026-11-28", "h200_traces")))
    # the real-Triton check's fit and predictions, from its committed real runs (a copy: --resimulate rewrites
    # cases.csv, fit.json and the stack file beside them) compared with experiments/validation/triton/results
    out.append(Job("triton matrix --resimulate", (PY, "experiments/validation/triton/matrix.py", "--resimulate",
                                                 "--out", "{R}/validation_triton"),
                   copy=("experiments/validation/triton/results", "validation_triton")))
    out.append(Job("paper_rerun --figures", _script("paper_rerun", "--figures", "--out", "{R}"), long=True))
    out.append(Job("stack_question", _script("stack_question", "--out", "{R}"), long=True))
    # the committed log's two capacity cases; the plan case (h100_plan) at the 60 s default is hours on 2 cores
    out.append(Job("long_run_check", _script("long_run_check", "--cases", "titanrtx_dvabatch,h100_notebook_dvabatch",
                                              "--out", "{R}"), long=True))
    return out


def committed_twin(root: Path, path: Path) -> Path | None:
    """The committed file a rerun's CSV (under a job's folder ``root``) stands for (``h100_fit`` lives beside its
    script)."""
    rel = path.relative_to(root)
    if rel.parts[0] == "gpu_matrix_cpu":
        return None  # the CPU version's numbers mean nothing
    if rel.parts[0] == "validation_gpu":
        twin = ROOT / "experiments" / "validation" / "gpu" / Path(*rel.parts[1:])
    elif rel.parts[0] == "validation_triton":
        twin = ROOT / "experiments" / "validation" / "triton" / "results" / Path(*rel.parts[1:])
    elif rel.parts[0] in ("traces", "traces_fit"):
        twin = ROOT / "traces" / Path(*rel.parts[1:])
    else:
        twin = ROOT / (Path("experiments") if rel.parts[0] == "h100_fit" else COMMITTED) / rel
    return twin if twin.exists() else None


def compare_csv(new: Path, old: Path) -> tuple[str, float, str]:
    """``(verdict, largest relative difference, its column)`` of a rerun CSV against the committed one."""
    # a table's '# key: value' provenance lines count too, its build date aside
    undated = [[ln for ln in p.read_text(errors="replace").splitlines() if not ln.startswith("# date:")]
               for p in (new, old)]
    if undated[0] == undated[1]:
        return "same", 0.0, ""
    heads = [[ln for ln in u if ln.startswith("#")] for u in undated]
    try:
        a, b = pd.read_csv(new, comment="#" if heads[0] else None), pd.read_csv(old, comment="#" if heads[1] else None)
    except (pd.errors.ParserError, UnicodeDecodeError, EOFError) as err:
        return f"DIFFERS (unreadable: {err})", math.inf, ""
    keep = [c for c in a.columns if not any(t in c.lower() for t in TIME_COLUMNS)]
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return f"DIFFERS (shape {a.shape} against {b.shape})", math.inf, ""
    worst, where = 0.0, ""
    for col in keep:
        x, y = a[col], b[col]
        if pd.api.types.is_numeric_dtype(x) and pd.api.types.is_numeric_dtype(y):
            xs, ys = x.to_numpy(dtype=float), y.to_numpy(dtype=float)
            both_nan = pd.isna(xs) & pd.isna(ys)
            diff = abs(xs - ys) / np.maximum(abs(ys), 1e-300)
            diff[both_nan | (xs == ys)] = 0.0
            d = float(pd.Series(diff).fillna(math.inf).max()) if len(diff) else 0.0
        else:
            d = 0.0 if (x.astype(str) == y.astype(str)).all() else math.inf
        if d > worst:
            worst, where = d, col
    if worst <= RTOL and heads[0] != heads[1]:
        return "DIFFERS (header)", 0.0, "# header"
    return ("same numbers" if worst <= RTOL else "DIFFERS"), worst, where


def markdown(rows: pd.DataFrame, compared: pd.DataFrame) -> str:
    """One table row per job: its wall time and how its CSVs compare with the committed ones."""
    out = ["| job | wall time | CSVs compared | same | same numbers | differ (largest relative difference, column) |",
           "| --- | ---: | ---: | ---: | ---: | --- |"]
    for r in rows.itertuples():
        c = compared[compared.job == r.job] if len(compared) else compared
        v = c.verdict if len(c) else pd.Series(dtype=str)
        diff = c[v.str.startswith("DIFFERS")] if len(c) else c
        worst = ""
        if len(diff):
            top = diff.sort_values("max_rel_diff").iloc[-1]
            size = "" if not math.isfinite(top.max_rel_diff) or top.max_rel_diff > 1e6 else f"{top.max_rel_diff:.2g}, "
            what = top.column if isinstance(top.column, str) and top.column else top.verdict.removeprefix("DIFFERS ")
            worst = f"{len(diff)} ({size}`{what}` in `{Path(top.file).name}`)"
        wall = f"{r.wall_s:,.0f} s" + ("" if r.rc == 0 else f" (exit {r.rc})")
        out.append(f"| `{r.job}` | {wall} | {len(c)} | {(v == 'same').sum()} | {(v == 'same numbers').sum()} | "
                   f"{worst or '0'} |")
    return "\n".join(out) + "\n"


def slug(name: str) -> str:
    """A job's name as a file name (its log, its folder)."""
    return name.replace(" ", "_").replace("[", "").replace("]", "").replace("-", "_")


def run_job(job: Job, root: Path, logs: Path) -> dict:
    """Run ``job`` with ``{R}`` standing for ``root``, its own folder."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    argv = [a.replace("{R}", str(root)) for a in job.argv]
    if job.copy is not None:
        src, dst = ROOT / job.copy[0], root / job.copy[1]
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
    log = logs / f"{slug(job.name)}.log"
    t0 = time.perf_counter()
    with open(log, "w") as fh:
        rc = subprocess.run(argv, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"}).returncode
    return {"job": job.name, "rc": rc, "wall_s": round(time.perf_counter() - t0, 1),
            "command": " ".join(a.replace(str(ROOT) + "/", "").replace(PY, "python") for a in argv),
            "log": str(log)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scratch", type=Path, default=Path("results/rerun"), help="where the reruns write")
    ap.add_argument("--jobs", type=int, default=1, help="jobs at a time (default 1)")
    ap.add_argument("--long", action="store_true", help="run the long jobs too")
    ap.add_argument("--only", nargs="+", default=None, help="jobs whose name starts so")
    ap.add_argument("--list", action="store_true", help="print the jobs and stop")
    a = ap.parse_args(argv)
    if a.jobs < 1:
        print("rerun_all: --jobs must be at least 1", file=sys.stderr)
        return 2
    todo = [j for j in jobs() if (a.long or not j.long)
            and (a.only is None or any(j.name.startswith(o) for o in a.only))]
    if a.list:
        for j in todo:
            print(f"{j.name:34s} {' '.join(j.argv).replace(PY, 'python')}")
        return 0
    root = (ROOT / a.scratch).resolve() if not a.scratch.is_absolute() else a.scratch
    (root / "logs").mkdir(parents=True, exist_ok=True)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = "?"
    print(f"rerun_all: {len(todo)} jobs, {a.jobs} at a time, tree {commit}, {platform.node()}, "
          f"{os.cpu_count()} cores, into {root}", flush=True)
    rows: list[dict] = []
    compared: list[dict] = []
    t0 = time.perf_counter()

    def one(job: Job) -> dict:
        where = root / "jobs" / slug(job.name)
        row = run_job(job, where, root / "logs")
        verdicts = []
        if row["rc"] == 0:
            for f in sorted(where.rglob("*.csv")):
                twin = committed_twin(where, f)
                if twin is None:
                    continue
                verdict, worst, col = compare_csv(f, twin)
                compared.append({"job": job.name, "file": str(twin.relative_to(ROOT)), "verdict": verdict,
                                 "max_rel_diff": worst, "column": col})
                verdicts.append(verdict)
        n_diff = sum(v.startswith("DIFFERS") for v in verdicts)
        row.update(csvs=len(verdicts), differ=n_diff)
        print(f"{job.name:34s} rc={row['rc']} {row['wall_s']:7.1f} s  {len(verdicts)} CSVs, {n_diff} differ",
              flush=True)
        return row

    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        rows = list(pool.map(one, todo))
    pd.DataFrame(rows).assign(tree=commit, jobs_at_a_time=a.jobs).to_csv(root / "rerun.csv", index=False)
    pd.DataFrame(compared).to_csv(root / "compared.csv", index=False)
    (root / "rerun.md").write_text(markdown(pd.DataFrame(rows), pd.DataFrame(compared)), encoding="utf-8")
    bad = [r for r in rows if r["rc"] != 0]
    print(f"rerun_all: {time.perf_counter() - t0:.0f} s in all; {len(bad)} failed; "
          f"{sum(r['differ'] for r in rows)} CSVs differ (see {root / 'compared.csv'})", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
