"""``dvasim run CONFIG.toml --out DIR``: simulate one config; queries.parquet (and queries.csv), summary.json,
config.json and latency.png in DIR, the summary printed. An incomplete run keeps every record and exits with
status 1.

SIGINT (Ctrl-C) and SIGTERM (what a scheduler or a container sends) stop the run within moments: the engine looks
at the request every few thousand events, the records collected so far are closed (``queries.parquet`` readable),
``summary.json`` says ``interrupted`` (and why; the queries that had not arrived are left out of the records and
the metrics), and the command prints one line and exits with 128 + the signal's number (130, 143). The figures
are not drawn then. A signal while the files are being written, or a second one, stops at once: the files already
written are complete, the one being written is not left behind."""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

from dvasim.cli.common import add_config_arguments, add_stack_arguments, check_stack, print_summary
from dvasim.errors import ConfigError, check_out_dir
from dvasim.server.resolve import stack_line

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def add_parser(sub) -> None:
    """``dvasim run``'s arguments, on the subcommand parsers ``sub``."""
    p = sub.add_parser("run", help="simulate one config")
    add_config_arguments(p, "TOML config file")
    p.add_argument("--progress", action="store_true", help="show a progress bar (on a terminal)")
    p.add_argument("--csv", action=argparse.BooleanOptionalAction, default=None,
                   help="also write queries.csv (default: for runs of at most 100,000 queries; queries.parquet "
                        "is always written)")
    add_stack_arguments(p)
    p.add_argument("--trigger", action="store_true",
                   help="also run the config from a backlog of one SLO of arrivals ([qos] trigger = \"backlog\"): a "
                        "run that holds from an empty queue but does not recover is metastable")
    p.add_argument("--triton-config", metavar="PATH", default=None,
                   help="a Triton model configuration (config.pbtxt) for the policy: the config's [policy] is "
                        "replaced by Triton's dynamic batcher as the file sets it, and [engine] instances by its "
                        "instance_group counts (as [policy] triton_config = PATH does)")
    p.add_argument("--timeline", type=int, nargs="?", const=20_000, default=0, metavar="N",
                   help="also write the first N stage executions (default 20,000) as timeline.json (open it in "
                        "https://ui.perfetto.dev or chrome://tracing) and a Gantt chart timeline.png")
    p.set_defaults(func=cmd_run)


class Interrupted(KeyboardInterrupt):
    """A stop signal that could not wait for the engine (a second one, or one while the outputs are written)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class StopSignals:
    """SIGINT and SIGTERM as a stop request: while ``soft``, a first signal is noted (``signum``) and
    :meth:`reason` tells the engine to stop; a second one, or any once ``soft`` is false, raises
    :class:`Interrupted` at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.soft = True

    def __call__(self, signum: int, _frame) -> None:
        first = self.signum is None
        if first:
            self.signum = signum
        if not (first and self.soft):
            raise Interrupted(signum)

    def reason(self) -> str | None:
        """The engine's ``stop``: the signal's name once one came, else ``None``."""
        return None if self.signum is None else signal.Signals(self.signum).name

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopSignals]:
        """The handlers, for the block (not installed off the main thread, where Python cannot)."""
        previous = {}
        try:
            for s in STOP_SIGNALS:
                previous[s] = signal.signal(s, self)
        except ValueError:  # not the main thread: the default behaviour stays
            pass
        try:
            yield self
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def cmd_run(args) -> int:
    if args.timeline < 0:
        raise ConfigError("--timeline", f"must be an integer >= 0 (the stage executions to draw; 0: none), got "
                                       f"{args.timeline}")
    check_stack(args.stack)
    check_out_dir(args.out)
    stop = StopSignals()
    with stop.installed():
        try:
            return _run_and_write(args, stop)
        except Interrupted as e:
            print(f"dvasim: interrupted by {signal.Signals(e.signum).name} while writing the results: the files in "
                  f"{args.out}/ are complete, those not yet written are missing", file=sys.stderr)
            return 128 + e.signum


def _run_and_write(args, stop: StopSignals) -> int:
    """Simulate (the stop signals noted), write the files (a signal then stops at once), print, give the status."""
    import warnings

    from dvasim.api import run, write_outputs
    from dvasim.errors import IncompleteRunWarning

    with warnings.catch_warnings():  # an incomplete run is reported below, as an error line
        warnings.simplefilter("ignore", IncompleteRunWarning)
        # records stream to queries.parquet as the run goes: memory stays bounded whatever its length
        triton = [] if args.triton_config is None else [  # the whole [policy] replaced: the file sets it
            f"policy={{triton_config = {json.dumps(str(Path(args.triton_config).absolute()))}}}"]
        result = run(args.config, overrides=triton + args.set + (["qos.trigger=backlog"] if args.trigger else []), progress=args.progress or None, engine=args.engine,
                     records=Path(args.out) / "queries.parquet", timeline=args.timeline, stack=args.stack,
                     stop=stop.reason)
    signum = stop.signum
    stop.soft = False
    if signum is not None:  # stopped by a signal (or one came as the run ended): no figures, then the line
        out = write_outputs(result, args.out, figure=False, csv=args.csv)
        print(f"dvasim run {args.config}: results in {out}/")
        print(stack_line(result.summary.get("stack"), result.summary.get("stack_source")))
        print_summary(result.summary)
        s, name = result.summary, signal.Signals(signum).name
        what = (f"{s['interrupted_reason']} ({s['n_completed']:,} of {s['n_queries']:,} recorded queries finished; "
                f"partial results in {out}/)" if result.interrupted else
                f"interrupted by {name} as the run ended (results in {out}/, without the figures)")
        print(f"dvasim: {what}", file=sys.stderr)
        return 128 + signum
    out = write_outputs(result, args.out, figure=not args.no_figure, csv=args.csv)
    print(f"dvasim run {args.config}: results in {out}/")
    print(stack_line(result.summary.get("stack"), result.summary.get("stack_source")))
    print_summary(result.summary)
    if result.stuck:
        done = result.summary["n_completed"]
        print(f"dvasim: error: run incomplete ({done} of {result.summary['n_queries']} queries finished; all "
              f"records kept in {out}/queries.parquet): {result.stuck}", file=sys.stderr)
        return 1
    return 0
