"""``dvasim replay``: real torch execution of a config (needs torch; ``--loadgen`` needs ``mlcommons-loadgen``).

    dvasim replay CONFIG.toml --out DIR [--set section.key=value ...] [--device cpu|cuda] [--threads N]
                  [--modules auto|cudagraph|torchscript|eager] [--loadgen [--target-qps X]]

``--modules`` sets ``[replay] modules`` (``auto``: CUDA graphs on cuda, TorchScript on cpu).

Bad input prints one line, ``dvasim replay: error: <field>: <fix>`` (config errors, and ``--device cuda`` on a
machine without CUDA: ``dvasim: error: device: cuda is not available on this machine; ...``), and exits with
status 2, before anything runs or is written: ``--out`` (a folder that can be made), ``--threads`` (1..4 per
logical CPU, at most 256), ``--warmup`` (0..1000), ``--target-qps`` (a finite number > 0), the config, and that
``[model] device`` is the table of the machine the replay runs on (``cpu`` on the CPU; on a GPU that GPU's, e.g.
``h100`` on an H100): the policy decides with that table's times. ``--help`` works without torch. A failed stage
exits with status 1 (the records so far are written).

SIGINT (Ctrl-C) and SIGTERM stop the command within moments, whatever it is doing, with one line and status 130 or
143 (128 + the signal's number): during the start-up (E-Ebird's co-run profile, the CUDA graphs' capture, the
warm-up passes) the stop is taken between two steps, never inside a graph capture (a signal that comes during one
is held until it ends), and nothing is written; during the run, admission stops, the running executions finish and
the records collected so far are written (``summary.json`` says ``interrupted``). A second signal, or one while the
files are written, stops at once (the files already written are whole). Without ``--loadgen``; with it, a signal
ends the command as any command's (``dvasim: terminated by SIGTERM``).
"""

from __future__ import annotations

import signal
import sys

from dvasim.cli.common import (
    StrictParser,
    UsageError,
    add_torch_run_arguments,
    check_device,
    error_line,
    needs_torch,
    number,
    positive_int,
    print_summary,
    thread_count,
)
from dvasim.errors import DvasimError, check_out_dir

MODULES = ("auto", "cudagraph", "torchscript", "eager")
MAX_WARMUP = 1000  # --warmup: untimed passes per stage


def replay_parser() -> StrictParser:
    """``dvasim replay``'s arguments."""
    p = StrictParser(prog="dvasim replay", description="replay a config on real torch execution")
    add_torch_run_arguments(p)
    p.add_argument("--loadgen", action="store_true",
                   help="let MLPerf LoadGen (Server scenario) issue the queries and measure latency")
    p.add_argument("--target-qps", default=None, help="LoadGen's target QPS (default: the workload's rate_qps)")
    p.add_argument("--warmup", default="2",
                   help=f"untimed warm-up passes per stage before the run (0..{MAX_WARMUP}, default 2)")
    p.add_argument("--modules", default=None,
                   help="how the stages run: auto (CUDA graphs on cuda, TorchScript on cpu), cudagraph (captured per "
                        "batch size and length bucket at start-up), torchscript or eager; default: the config's "
                        "[replay] modules")
    return p


def replay_options(argv: list[str]):
    """The parsed arguments and the checked ``(device, threads, warmup, target_qps)``; ``--modules`` becomes a
    ``replay.modules`` override. Raises :class:`UsageError` or :class:`DvasimError`."""
    args = replay_parser().parse_args(argv)
    check_out_dir(args.out)
    if args.modules is not None:
        if args.modules not in MODULES:
            raise UsageError("--modules", f"must be one of {', '.join(MODULES)}, got {args.modules!r}")
        args.set = [*(args.set or []), f'replay.modules="{args.modules}"']
    dev = check_device(args.device)
    threads = thread_count("--threads", args.threads)
    warmup = positive_int("--warmup", args.warmup, minimum=0, maximum=MAX_WARMUP)
    target = None
    if args.target_qps is not None:
        target = number("--target-qps", args.target_qps, 0.0, strict=True)
        if not args.loadgen:
            raise UsageError("--target-qps", "only with --loadgen")
    return args, (dev, threads, warmup, target)


def cli_replay(argv: list[str]) -> int:
    try:
        args, (dev, threads, warmup, target) = replay_options(argv)
    except UsageError as e:
        return error_line(e, "replay")
    except DvasimError as e:
        return error_line(e)
    try:
        from dvasim.engines.replay.engine import ReplayError  # noqa: F401  (torch: the replay's own imports)

        check_model_device(args, dev)
    except ImportError as e:
        return needs_torch("replay", e)
    except DvasimError as e:
        return error_line(e)
    if args.loadgen:
        try:
            from dvasim.engines.replay.loadgen import replay_loadgen
        except ImportError as e:
            return error_line(f"--loadgen: needs mlcommons-loadgen ({e}); pip install mlcommons-loadgen", "replay")
        return _finish(args, lambda: replay_loadgen(args.config, args.out, overrides=args.set, device=dev,
                                                    threads=threads, target_qps=target, warmup=warmup))
    from dvasim.cli.run import Interrupted, StopSignals

    stop = StopSignals()
    with stop.installed():
        try:
            return _finish(args, lambda: _replay_stoppable(args, dev, threads, warmup, stop), stop)
        except Interrupted as e:  # a second signal, or one while the files were written
            print(f"dvasim replay: interrupted by {signal.Signals(e.signum).name}; the files in {args.out}/ are "
                  "complete, those not yet written are missing", file=sys.stderr)
            return 128 + e.signum


def _replay_stoppable(args, dev: str, threads: int, warmup: int, stop):
    """The replay with ``stop``'s request asked between the start-up's steps and during the run."""
    from dvasim.engines.replay.engine import replay

    return replay(args.config, overrides=args.set, device=dev, threads=threads, warmup=warmup, stop=stop.reason)


def _finish(args, run, stop=None) -> int:
    """``run()`` the replay, then write and report what it gave: the files and the summary, one line and the
    status of a failure (1, its records so far written) or of a stop request during the start-up (128 + the
    signal's number; nothing written)."""
    from dvasim.api import write_outputs
    from dvasim.engines.replay.engine import ReplayError, Stopped, write_executions

    try:
        result = run()
    except DvasimError as e:
        return error_line(e)
    except Stopped as e:
        signum = stop.signum if stop is not None and stop.signum is not None else signal.SIGINT
        print(f"dvasim replay: {e}; nothing was written", file=sys.stderr)
        return 128 + signum
    except ReplayError as e:
        if stop is not None:
            stop.soft = False
        partial = getattr(e, "run_result", None)
        if partial is not None:  # keep the records collected before the failure
            write_executions(partial, write_outputs(partial, args.out, figure=False))
        return error_line(e, "replay", 1)
    if stop is not None:
        stop.soft = False  # a signal from now on stops at once (the files are written whole or not at all)
    return report_replay(args, result, None if stop is None else stop.signum)


def check_model_device(args, dev: str) -> None:
    """The config resolved (with ``--set``) and its ``[model] device`` checked against the machine the replay
    runs on (:func:`dvasim.engines.replay.engine.check_table_device`), before anything runs."""
    from dvasim import config as cfgmod
    from dvasim.engines.replay.engine import check_table_device

    check_table_device(cfgmod.resolve(args.config, args.set)["model"], dev)


def report_replay(args, result, signum: int | None = None) -> int:
    """Write a finished replay's files, print its summary and return the exit status (128 + ``signum`` when
    interrupted, the stop signal's number, 130 for Ctrl-C; 1 with a query unfinished)."""
    from dvasim.api import write_outputs
    from dvasim.engines.replay.engine import write_executions

    # a stopped replay writes its records at once and draws no figure (a second of matplotlib after the signal)
    stopped = bool(result.summary.get("interrupted")) or signum is not None
    out = write_outputs(result, args.out, figure=not (args.no_figure or stopped))
    write_executions(result, out)
    print(f"dvasim replay {args.config}: results in {out}/")
    print_summary(result.summary)
    extra = [k for k in ("launch_overhead_ms_mean", "loadgen_p50_latency_ms", "loadgen_p99_latency_ms")
             if k in result.summary]
    for k in extra:
        print(f"  {k}  {result.summary[k]:.4g}")
    if result.summary.get("interrupted") or signum is not None:
        signum = signum if signum is not None else signal.SIGINT
        what = ("the records collected so far are written" if result.summary.get("interrupted") else
                "as the run ended (its results are written)")
        print(f"dvasim replay: interrupted by {signal.Signals(signum).name}; {what}", file=sys.stderr)
        return 128 + signum
    if result.stuck:
        print(f"dvasim: warning: {result.stuck}", file=sys.stderr)
        return 1
    return 0
