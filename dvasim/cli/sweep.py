"""``dvasim sweep SWEEP.toml --out DIR``: many runs of one config with keys changed (:mod:`dvasim.studies.sweep`),
in parallel or on a Dask cluster, resumable; DIR/results.csv, results.parquet and latency_vs_load.png. Runs that
did not finish every query exit with status 1."""

from __future__ import annotations

import sys

from dvasim.cli.common import add_stack_arguments, check_stack
from dvasim.errors import check_out_dir


def add_parser(sub) -> None:
    """``dvasim sweep``'s arguments, on the subcommand parsers ``sub``."""
    p = sub.add_parser("sweep", help="many runs of one config with keys changed (grid, random draws, seeds), in "
                                     "parallel or on a Dask cluster; resumable")
    p.add_argument("sweep", help="sweep file (TOML): base = CONFIG, [grid], [random], [seeds]; see dvasim.studies.sweep")
    p.add_argument("--out", required=True, help="output directory (runs/ cache, results.csv/.parquet, figure)")
    p.add_argument("--workers", type=int, default=None, help="local processes (default: one per core; 1 = serial)")
    p.add_argument("--dask", metavar="tcp://HOST:PORT", default=None, help="run on this Dask scheduler instead")
    p.add_argument("--no-figure", action="store_true", help="skip latency_vs_load.png")
    add_stack_arguments(p, every=True)
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args) -> int:
    from dvasim.studies.sweep import sweep

    if args.workers is not None and args.workers < 1:
        print("dvasim sweep: error: --workers must be >= 1", file=sys.stderr)
        return 2
    check_stack(args.stack)
    check_out_dir(args.out)
    table = sweep(args.sweep, args.out, workers=args.workers, dask=args.dask, figure=not args.no_figure,
                  stack=args.stack, engine=args.engine)
    stuck = int((table["stuck"] != "").sum()) if "stuck" in table else 0
    print(f"dvasim sweep {args.sweep}: {len(table)} runs; results in {args.out}/results.csv, results.parquet"
          + ("" if args.no_figure else ", latency_vs_load.png"))
    if stuck:
        print(f"dvasim: error: {stuck} runs did not finish every query (column 'stuck' says where)", file=sys.stderr)
        return 1
    return 0
