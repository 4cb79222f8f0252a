"""``dvasim run CONFIG.toml --out DIR``: simulate one config; queries.parquet (and queries.csv), summary.json,
config.json and latency.png in DIR, the summary printed. An incomplete run keeps every record and exits with
status 1."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dvasim.cli.common import add_config_arguments, add_stack_arguments, check_stack, print_summary
from dvasim.errors import check_out_dir


def add_parser(sub) -> None:
    """``dvasim run``'s arguments, on the subcommand parsers ``sub``."""
    p = sub.add_parser("run", help="simulate one config")
    add_config_arguments(p, "TOML config file")
    p.add_argument("--progress", action="store_true", help="show a progress bar (on a terminal)")
    p.add_argument("--csv", action=argparse.BooleanOptionalAction, default=None,
                   help="also write queries.csv (default: for runs of at most 100,000 queries; queries.parquet "
                        "is always written)")
    add_stack_arguments(p)
    p.add_argument("--timeline", type=int, nargs="?", const=20_000, default=0, metavar="N",
                   help="also write the first N stage executions (default 20,000) as timeline.json (open it in "
                        "https://ui.perfetto.dev or chrome://tracing) and a Gantt chart timeline.png")
    p.set_defaults(func=cmd_run)


def cmd_run(args) -> int:
    import warnings

    from dvasim.api import run, write_outputs
    from dvasim.errors import IncompleteRunWarning

    check_stack(args.stack)
    check_out_dir(args.out)
    with warnings.catch_warnings():  # an incomplete run is reported below, as an error line
        warnings.simplefilter("ignore", IncompleteRunWarning)
        # records stream to queries.parquet as the run goes: memory stays bounded whatever its length
        result = run(args.config, overrides=args.set, progress=args.progress or None, engine=args.engine,
                     records=Path(args.out) / "queries.parquet", timeline=args.timeline, stack=args.stack)
    out = write_outputs(result, args.out, figure=not args.no_figure, csv=args.csv)
    print(f"dvasim run {args.config}: results in {out}/")
    print_summary(result.summary)
    if result.stuck:
        done = result.summary["n_completed"]
        print(f"dvasim: error: run incomplete ({done} of {result.summary['n_queries']} queries finished; all "
              f"records kept in {out}/queries.parquet): {result.stuck}", file=sys.stderr)
        return 1
    return 0
