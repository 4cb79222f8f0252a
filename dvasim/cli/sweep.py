"""``dvasim sweep SWEEP.toml --out DIR``: many runs of one config with keys changed (:mod:`dvasim.studies.sweep`),
in parallel or on a Dask cluster, resumable. Every point is checked before the first run; ``--set`` applies to
every point. Writes DIR/runs/ (the cache), DIR/results.csv and results.parquet, and a figure (latency against the
swept key, ``latency_vs_load.png`` when the load is what varies; ``capacity.png`` for capacity searches), prints
the paths actually written and a results table (the swept keys, the main metrics, and flags for unstable,
SLO-missing and unfinished runs). Runs that did not finish every query exit with status 1."""

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
    add_stack_arguments(p, every=True)
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args) -> int:
    from dvasim.studies.sweep import check_workers, sweep

    check_workers(args.workers)
    check_stack(args.stack)
    check_out_dir(args.out)
    table = sweep(args.sweep, args.out, workers=args.workers, dask=args.dask, figure=not args.no_figure,
                  stack=args.stack, engine=args.engine, overrides=args.set)
    files = ", ".join(table.attrs.get("files", []))
    print(f"dvasim sweep {args.sweep}: {len(table)} runs; results in {files}")
    flagged = show_results(table)
    stuck = flagged.get("stuck", 0)
    if stuck:
        print(f"dvasim: error: {stuck} runs did not finish every query (column 'stuck' of results.csv says where)",
              file=sys.stderr)
        return 1
    return 0


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
