"""``dvasim sweep SWEEP.toml --out DIR``: many runs of one config with keys changed (:mod:`dvasim.studies.sweep`),
in parallel or on a Dask cluster, resumable. Every point is checked before the first run; ``--set`` applies to
every point. Writes DIR/runs/ (the cache), DIR/results.csv and results.parquet, and a figure (latency against the
swept key, ``latency_vs_load.png`` when the load is what varies; ``capacity.png`` for capacity searches), prints
the paths actually written and a results table (the swept keys, the main metrics, and flags for unstable,
SLO-missing and unfinished runs). Runs that did not finish every query exit with status 1.

``--export perf-analyzer`` (a sweep of ``workload.rate_qps`` or ``workload.clients`` alone) also writes the CSV that
``perf_analyzer -f`` writes (:mod:`dvasim.reporting.perf_analyzer`) to ``--export-out`` (default
DIR/perf_analyzer.csv), with ``--verbose-csv``'s columns when asked; ``--overlay MEASURED.csv`` (a measured
perf_analyzer CSV, read before any run) draws the simulated table over it, DIR/perf_analyzer_overlay.png."""

from __future__ import annotations

import sys

from dvasim.cli.common import add_stack_arguments, check_stack, fmt, set_help
from dvasim.errors import check_out_dir

MAX_PRINTED = 40  # rows of the results table printed; results.csv holds them all


def add_parser(sub) -> None:
    """``dvasim sweep``'s arguments, on the subcommand parsers ``sub``."""
    from dvasim.studies.sweep import DASK_CONNECT_TIMEOUT_S, MAX_POINTS, MAX_WORKERS, MAX_WORKERS_PER_CORE

    p = sub.add_parser("sweep", help="many runs of one config with keys changed (grid, random draws, seeds), in "
                                     "parallel or on a Dask cluster; resumable")
    p.add_argument("sweep", help=f"sweep file (TOML): base = CONFIG, [grid], [random], [seeds], [capacity]; at most "
                                 f"{MAX_POINTS:,} runs; see dvasim config sweep")
    p.add_argument("--out", required=True, help="output directory (runs/ cache, results.csv/.parquet, figure)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="for every point, after the sweep file's set (not a key the sweep varies); " + set_help())
    p.add_argument("--workers", type=int, default=None,
                   help=f"local processes (default: one per core; 1 = serial; at most {MAX_WORKERS_PER_CORE} per "
                        f"core and {MAX_WORKERS})")
    p.add_argument("--dask", metavar="tcp://HOST:PORT", default=None,
                   help=f"run on this Dask scheduler instead (it must answer within {DASK_CONNECT_TIMEOUT_S:g} s)")
    p.add_argument("--no-figure", action="store_true", help="skip the figure")
    p.add_argument("--export", choices=["perf-analyzer"], default=None,
                   help="also write perf_analyzer's CSV (its columns, microseconds, rows by throughput) of a sweep "
                        "that varies only workload.rate_qps (request-rate mode) or workload.clients (concurrency)")
    p.add_argument("--export-out", metavar="PATH", default=None,
                   help="where --export writes (default: OUT/perf_analyzer.csv)")
    p.add_argument("--verbose-csv", action="store_true",
                   help="with --export: perf_analyzer's --verbose-csv columns too (Avg latency, request/response, "
                        "response wait)")
    p.add_argument("--overlay", metavar="MEASURED.csv", default=None,
                   help="with --export: a measured perf_analyzer CSV to draw the simulated table over "
                        "(OUT/perf_analyzer_overlay.png: p50 and p99 latency against throughput)")
    add_stack_arguments(p, every=True)
    p.add_argument("--stack-follows-device", action="store_true",
                   help="let each point's device imply its own stack (default: a sweep that varies the device "
                        "holds the stack at the base config's, so that only the device changes)")
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args) -> int:
    from dvasim.studies.sweep import check_workers, sweep

    check_workers(args.workers)
    check_stack(args.stack)
    check_out_dir(args.out)
    measured = check_export_arguments(args)
    table = sweep(args.sweep, args.out, workers=args.workers, dask=args.dask, figure=not args.no_figure,
                  stack=args.stack, engine=args.engine, overrides=args.set, export=args.export,
                  export_out=args.export_out, verbose_csv=args.verbose_csv,
                  stack_follows_device=args.stack_follows_device)
    if measured is not None:
        table.attrs["files"].append(str(overlay(table.attrs["perf_analyzer_csv"], measured, args.out)))
    files = ", ".join(table.attrs.get("files", []))
    print(f"dvasim sweep {args.sweep}: {len(table)} runs; results in {files}")
    if table.attrs.get("perf_analyzer_left_out"):
        print(f"note: {table.attrs['perf_analyzer_left_out']} runs finished no query and have no row in "
              f"{table.attrs['perf_analyzer_csv']}")
    flagged = show_results(table)
    for line in table.attrs.get("stack_lines", []):  # the stack of the runs, and why (held across devices?)
        print(line)
    stuck = flagged.get("stuck", 0)
    if stuck:
        print(f"dvasim: error: {stuck} runs did not finish every query (column 'stuck' of results.csv says where)",
              file=sys.stderr)
        return 1
    return 0


def check_export_arguments(args):
    """``--export-out``, ``--verbose-csv`` and ``--overlay`` need ``--export``; the measured table of
    ``--overlay`` read (and checked) before any run: returned, or ``None``."""
    from dvasim.errors import UsageError

    if args.export is None:
        for flag, given in (("--export-out", args.export_out is not None), ("--verbose-csv", args.verbose_csv),
                            ("--overlay", args.overlay is not None)):
            if given:
                raise UsageError(flag, "needs --export perf-analyzer (the table it belongs to)")
        return None
    if args.overlay is None:
        return None
    from dvasim.reporting.perf_analyzer import read_perf_analyzer_csv

    return read_perf_analyzer_csv(args.overlay, field="--overlay")


def overlay(simulated_csv: str, measured, out: str):
    """OUT/perf_analyzer_overlay.png: the simulated table (just written) over the measured one."""
    from pathlib import Path

    from dvasim.reporting.perf_analyzer import overlay_figure, read_perf_analyzer_csv

    sim = read_perf_analyzer_csv(simulated_csv)
    return overlay_figure({"simulated (dvasim)": sim, "measured (perf_analyzer)": measured},
                          Path(out) / "perf_analyzer_overlay.png")


def show_results(table, file=None) -> dict[str, int]:
    """Print a sweep's results table (:func:`dvasim.studies.sweep.overview`: at most :data:`MAX_PRINTED` rows) and
    a line counting the flagged runs to ``file`` (default: stdout); returns the count of each flag."""
    from dvasim.studies.sweep import overview

    file = sys.stdout if file is None else file
    view = overview(table)
    if not len(view):
        return {}
    shown = view.head(MAX_PRINTED).copy()
    for c in shown.columns:
        shown[c] = [fmt(v) for v in shown[c]]
    print(shown.to_string(index=False), file=file)
    if len(view) > MAX_PRINTED:
        print(f"... {len(view) - MAX_PRINTED:,} more rows in results.csv", file=file)
    counts: dict[str, int] = {}
    for flags in view["flags"]:
        for f in filter(None, flags.split(", ")):
            counts[f] = counts.get(f, 0) + 1
    if counts:
        what = {"unstable": "unstable (served less than offered)",
                "SLO missed": "missed the SLO" + ("" if "capacity_qps" in table else " (p99 over [qos] target_ms)"),
                "stuck": "did not finish every query", "at least": "never exceeded the bracket's top"}
        print(f"flagged: {'; '.join(f'{n} of {len(view)} runs {what.get(f, f)}' for f, n in counts.items())}",
              file=file)
    return counts
