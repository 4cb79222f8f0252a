"""``dvasim compare``: the paper's Figures 14 and 16 in simulation (the study is
:mod:`dvasim.studies.compare` and :func:`dvasim.studies.evaluation.compare`; this is its command line).

    dvasim compare [--models ...] [--policies ...] [--queries N] [--workers W] [--out DIR] [--stack NAME]

Writes compare.csv, calibration.csv, reductions.csv (reductions_built.csv for DVABatch as built), attribution.csv
and the figures in ``--out`` and prints the
report; each table is written under a temporary name and renamed when complete. A bad argument prints one line,
``dvasim compare: error: <flag>: <what is allowed>``, and exits with status 2 before any run: ``--queries``
100..20,000,000 (a run's limit, :data:`dvasim.workload.arrivals.MAX_QUERIES`), ``--workers`` 1..256 (never more
processes than runs), ``--seed`` 0..2**63-1, ``--slo-ms`` a finite number > 0, ``--device`` a table's device,
``--out`` a folder that can be made (not empty), ``--seeds`` 1..100 (with ``--seed + --seeds - 1`` at most
2**63-1). With ``--seeds K > 1`` compare.csv holds the means over the seeds with their intervals and
compare_seeds.csv every seed's run (:mod:`dvasim.studies.compare`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from dvasim.cli.common import error_line
from dvasim.errors import OneLineParser, check_out_dir
from dvasim.outputs import atomic_path
from dvasim.studies import compare as compare_study
from dvasim.studies import evaluation as study
from dvasim.studies.compare import (
    compare_figures,
    print_attribution,
    print_built,
    print_report,
    print_variants,
    with_stacks,
)

MAX_WORKERS = 256  # --workers (and never more processes than runs)
MAX_SEEDS = 100  # --seeds


def compare_parser() -> OneLineParser:
    """``dvasim compare``'s arguments."""
    ap = OneLineParser(prog="dvasim compare", description=compare_study.__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(study.MODELS), help="comma-separated model names")
    ap.add_argument("--device", default="titanrtx", help="titanrtx | a100 | h100 | cpu")
    ap.add_argument("--queries", type=int, default=5000,
                    help="queries per (model, load, policy) run (100..20,000,000)")
    ap.add_argument("--workers", type=int, default=2,
                    help=f"processes (1..{MAX_WORKERS}; never more than the runs that can go at once)")
    ap.add_argument("--seed", type=int, default=1, help="seed of every run's arrivals (0..2**63-1)")
    ap.add_argument("--seeds", type=int, default=1,
                    help=f"repeat every run with seeds SEED..SEED+K-1 (1..{MAX_SEEDS}; default 1): means with 95%% "
                         "intervals, and ties where a difference is within them")
    ap.add_argument("--peak", choices=("stepping", "capacity"), default="stepping",
                    help="how peaks are found: the paper's stepping load and bisection (default) or dvasim "
                         "capacity's confident bisection on Poisson loads")
    ap.add_argument("--slo-ms", type=float, default=study.QOS_MS,
                    help=f"latency SLO (ms) of the peak-throughput search and the QoS rates (default {study.QOS_MS:g})")
    ap.add_argument("--quick", action="store_true", help="fewer queries and bisection steps (a smoke run)")
    ap.add_argument("--out", default="results/compare", help="output directory")
    ap.add_argument("--policies", default=",".join(study.DEFAULT_LABELS),
                    help="comma-separated variant labels to run (default: the DVABatch study's "
                         f"{', '.join(study.DEFAULT_LABELS)}); the papers' peer systems: "
                         + ", ".join(v.label for v in study.PEER_VARIANTS))
    ap.add_argument("--stack", metavar="NAME", default=None,
                    help="the serving stack of every run (default: the one each table implies; `dvasim stacks` "
                         "lists them)")
    ap.add_argument("--engine", metavar="ENGINE.toml", default=None,
                    help="an engine file written by dvasim fit, merged over every run's [engine]")
    return ap


def argument_problem(args, models: list[str], labels: list[str]) -> str | None:
    """What is wrong with the arguments (``<flag>: <what is allowed>``), or None."""
    unknown = [m for m in models if m not in study.MODELS]
    if unknown or not models:
        what = f"unknown {unknown[0]!r}" if unknown else "no model given"
        return f"--models: {what}; allowed: {', '.join(study.MODELS)}"
    twice = [m for i, m in enumerate(models) if m in models[:i]]
    if twice:  # (the study keys its rows by model: a second copy failed after every run, KeyError 'model')
        return f"--models: {twice[0]!r} is given twice; give each model once (more runs of it: --seeds)"
    unknown = [p for p in labels if p not in study.VARIANT_BY_LABEL]
    if unknown or not labels:
        what = f"unknown {unknown[0]!r}" if unknown else "no label given"
        return f"--policies: {what}; allowed: {', '.join(study.VARIANT_BY_LABEL)}"
    return number_problem(args) or slo_problem(args, models)


def slo_problem(args, models: list[str]) -> str | None:
    """``--slo-ms`` below a model's fastest query (batch 1 alone, its shortest input, on ``--device``'s table): no
    load meets it, and the study would find a peak of 0 and fail only after its runs. None if every model can."""
    import math

    from dvasim.model.catalog import resolve_model

    if args.engine is not None:  # its [engine.host] gpu_table may time the stages otherwise: the study finds out
        return None
    for m in models:
        table = resolve_model({"name": m, "device": args.device, "stages": study.MODELS[m]["stages"]}).table
        fastest = min(table.total(1, int(s)) for s in table.seq_lens) if table.seq_lens is not None else table.total(1)
        if args.slo_ms < fastest:
            least = math.ceil(fastest * 1000) / 1000  # (rounded up: the least value it names is accepted)
            return (f"--slo-ms: {args.slo_ms:g} ms is below {m}'s fastest query on {args.device} ({fastest:.4g} ms at "
                    f"batch 1): no load can meet it; give at least {least:g}")
    return None


def number_problem(args) -> str | None:
    """What is wrong with the numbers, the device and ``--out`` (``<flag>: <what is allowed>``), or None."""
    import math

    from dvasim.model.catalog import DEVICES
    from dvasim.schema import MAX_MS
    from dvasim.workload.arrivals import MAX_QUERIES
    from dvasim.workload.config import MAX_SEED

    if not 100 <= args.queries <= MAX_QUERIES:
        return (f"--queries: must be an integer in 100..{MAX_QUERIES:,} (the queries one run takes), "
                f"got {args.queries:,}")
    if not 1 <= args.workers <= MAX_WORKERS:
        return f"--workers: must be an integer in 1..{MAX_WORKERS}, got {args.workers}"
    if not (math.isfinite(args.slo_ms) and 0 < args.slo_ms <= MAX_MS):  # a time: at most MAX_MS (dvasim.schema)
        return f"--slo-ms: must be a finite number in (0, {MAX_MS:g}] (ms), got {args.slo_ms}"
    if not 0 <= args.seed <= MAX_SEED:
        return f"--seed: must be an integer in 0..2**63-1, got {args.seed}"
    if not 1 <= args.seeds <= MAX_SEEDS:
        return f"--seeds: must be an integer in 1..{MAX_SEEDS}, got {args.seeds}"
    if args.seed + args.seeds - 1 > MAX_SEED:
        return (f"--seeds: {args.seeds} seeds from --seed {args.seed} go beyond 2**63-1; give --seed at most "
                f"{MAX_SEED - args.seeds + 1}")
    if args.device not in DEVICES:
        return f"--device: must be one of {', '.join(DEVICES)}, got {args.device!r}"
    if not args.out.strip():
        return "--out: is empty; give an output directory, e.g. results/compare"
    return None


def served_by(args) -> dict:
    """The serving keywords of every run (``stack``, ``engine_file``), each checked before any run (a bad one:
    one line naming --stack or --engine)."""
    served = {}
    if args.stack is not None:
        from dvasim.server.resolve import stack_by_name

        stack_by_name(args.stack, "--stack")
        served["stack"] = args.stack
    if args.engine is not None:
        from dvasim.config import apply_engine_file

        apply_engine_file({}, args.engine)  # a bad file: one line naming --engine, before any run
        served["engine_file"] = args.engine
    return served


def cli_compare(argv: list[str] | None = None) -> int:
    """``dvasim compare``: run the study, write its tables and figures in ``--out`` and print the report."""
    args = compare_parser().parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    labels = list(dict.fromkeys(p.strip() for p in args.policies.split(",") if p.strip()))
    problem = argument_problem(args, models, labels)
    if problem is not None:
        return error_line(problem, "compare")
    served = served_by(args)
    check_out_dir(args.out)
    for line in compare_study.stack_lines(models, args.device, args.stack, args.engine):
        print(line, flush=True)
    out = Path(args.out)
    t0 = time.perf_counter()
    results, calib = study.compare(models, n_queries=1000 if args.quick else args.queries, seed=args.seed,
                                   workers=args.workers, device=args.device, refine=2 if args.quick else 4,
                                   policies=labels, qos_ms=args.slo_ms, peak=args.peak, seeds=args.seeds, **served)
    by_seed = results.attrs.get("by_seed")
    warn_peaks_at_the_top(calib, args)
    results, calib = with_stacks(results, calib, args.device, **served)
    try:  # made only now: a study that fails leaves no folder behind
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        from dvasim.outputs import output_error

        raise output_error(out, e) from None
    report(results, calib, out, args)
    if by_seed:  # --seeds K > 1: every seed's run, as compare.csv's rows were for one seed
        import pandas as pd

        with atomic_path(out / "compare_seeds.csv") as tmp:
            pd.DataFrame(by_seed).to_csv(tmp, index=False)
    print(f"\n{len(results) * args.seeds} runs in {time.perf_counter() - t0:.0f} s; results in {out}/")
    return 0


def warn_peaks_at_the_top(calib, args) -> None:
    """A warning line for each peak that is only a lower bound (the SLO held at the top of the search)."""
    for what in calib.attrs.get("peak_at_ladder_top", []):
        where = (f"every level of the load ladder (up to {study.STEPPING['end_qps']:g} qps)" if args.peak == "stepping"
                 else "the top of the capacity search's bracket")
        print(f"dvasim compare: warning: {what}: {where} met the {args.slo_ms:g} ms SLO; its peak is only a lower "
              "bound", file=sys.stderr)


def report(results, calib, out: Path, args) -> None:
    """The study's tables (compare, calibration, reductions, attribution) and figures in ``out``, and the printed
    report."""
    red_mean = study.reductions(results, "mean_latency_ms")
    red_p99 = study.reductions(results, "p99_latency_ms")
    att = study.attribution(results, "mean_latency_ms")
    red = red_mean.merge(red_p99, on=["model", "load"], suffixes=("_mean", "_p99"))
    tables = [("compare.csv", results), ("calibration.csv", calib), ("reductions.csv", red), ("attribution.csv", att)]
    built = "dvabatch-built" in set(results["policy"])
    if built:  # DVABatch as its authors built it: its reductions beside the described one's
        red_built = study.reductions(results, "mean_latency_ms", "dvabatch-built").merge(
            study.reductions(results, "p99_latency_ms", "dvabatch-built"), on=["model", "load"],
            suffixes=("_mean", "_p99"))
        tables.append(("reductions_built.csv", red_built))
    for name, df in tables:
        with atomic_path(out / name) as tmp:  # renamed when complete: a full disk leaves no torn table
            df.to_csv(tmp, index=False)
    from dvasim.reporting import plots

    # this process draws bars only: seaborn without its scipy (half a second to import); matplotlib and seaborn
    # imported before a figure process forks from this one
    plots.import_seaborn_without_scipy()
    draw_figures(compare_figures(results, att, out, args.device, args.slo_ms), args.workers)
    print_report(results, calib, red, sys.stdout, args.slo_ms)
    if built:
        print_built(red_built, calib, sys.stdout)
    if set(results["policy"]) - set(study.POLICIES):
        print_variants(results, sys.stdout)
    print_attribution(att, sys.stdout)


def draw_figures(figures: list[tuple[str, tuple, dict]], workers: int) -> None:
    """Draw ``figures`` (each ``(name of a dvasim.reporting.plots function, args, kwargs)``, writing one file):
    the first in a second process (:func:`figure_process`) while this one draws the others, or all here (the
    files are the same). An error of either (a full disk) is raised here once both are done; a second process
    that dies leaves its figure to this one."""
    pool = figure_process(workers) if len(figures) > 1 else None
    if pool is None:
        for name, a, kw in figures:
            _draw(name, a, kw)
        return
    from concurrent.futures.process import BrokenProcessPool

    with pool:
        aside = pool.submit(_draw, *figures[0])
        for name, a, kw in figures[1:]:
            _draw(name, a, kw)
        try:
            aside.result()
        except BrokenProcessPool:
            _draw(*figures[0])


def _draw(name: str, a: tuple, kw: dict):
    from dvasim.reporting import plots

    return getattr(plots, name)(*a, **kw)


def figure_process(workers: int):
    """A process forked from this one (it starts at once, with this process's imports) to draw a figure in
    beside it: when ``--workers`` allows two processes, two cores are there for them, and on Linux (where
    forking is the platform's own way); else None."""
    import os

    if workers < 2 or not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2:
        return None
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"))
