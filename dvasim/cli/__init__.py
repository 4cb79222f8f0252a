"""The ``dvasim`` command line.

    dvasim run CONFIG.toml --out DIR [--set section.key=value ...] [--stack NAME] [--engine ENGINE.toml]
    dvasim policies [NAME]                               every policy a config can name, with its parameters
    dvasim stacks [NAME]                                 every serving stack, its numbers and their provenance
    dvasim config [SECTION] [--reference]                every config key: type, range, default, help
    dvasim compare [--models ...] [--policies ...] [--queries N] [--workers W] [--out DIR] [--stack NAME]
    dvasim capacity CONFIG.toml --slo-ms MS --out DIR [--stack NAME] [--engine ENGINE.toml]
    dvasim plan CONFIG.toml --qps X --slo-ms MS --out DIR [--policies A,B] [--seeds K] [--router R] [--replicas N]
    dvasim sweep SWEEP.toml --out DIR [--stack NAME] [--engine ENGINE.toml]
    dvasim profile --model NAME --stages N --device cpu|cuda --batch-sizes 1,2,4 --out FILE.csv   (needs torch)
    dvasim replay CONFIG.toml --out DIR [--loadgen]       real torch execution of the config (needs torch)
    dvasim validate CONFIG.toml --out DIR [--repeats K]   simulator vs replay: DIR/fidelity.json (needs torch)
    dvasim fit DIR... --out engine.toml                  the engine fitted to replay folders (dvasim run --engine)
    dvasim triton CONFIG.toml --out DIR                  the config served on the real Triton server (CPU)

Errors a user can fix print one line (``dvasim: error: <field>: <what is allowed>``) and exit with status 2.
Every command stops on Ctrl-C (SIGINT) or SIGTERM with one line and status 130 or 143, its files written whole or
not at all; ``dvasim run`` also keeps what it simulated, readable (:mod:`dvasim.cli.run`). A closed standard output (``dvasim policies --json | head``) ends
any command quietly, with status 141 (the shell's for SIGPIPE).

The command line is the top layer: it may import every layer below it, and nothing in the package imports it but
``dvasim.__main__``. One module per subcommand, each with its arguments and its command function (``run``,
``policies``, ``stacks``, ``config``, ``compare``, ``capacity``, ``plan``, ``sweep``, ``fit``, ``profile``, ``replay``, ``validate``);
what several share (the common arguments, the printed summary, the version) is in :mod:`dvasim.cli.common`. This
module keeps :func:`main`, the dispatch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from dvasim.cli.capacity import cmd_capacity
from dvasim.cli.common import (
    add_config_arguments,
    add_stack_arguments,
    check_stack,
    error_line,
    needs_torch,
    print_summary,
    version,
)
from dvasim.cli.policies import cmd_policies
from dvasim.cli.run import cmd_run
from dvasim.cli.stacks import cmd_stacks, stack_reference
from dvasim.cli.sweep import cmd_sweep
from dvasim.errors import DvasimError, OneLineParser

__all__ = ["add_config_arguments", "add_stack_arguments", "check_stack", "cmd_capacity", "cmd_policies", "cmd_run",
           "cmd_stacks", "cmd_sweep", "entry", "main", "print_summary", "stack_reference", "version"]

# the subcommands that parse their own arguments (main hands them the rest of the line), as `dvasim -h` lists them
SELF_PARSED = (
    ("compare", "ZeroBatch / DelayBatch / DVABatch on the six models (paper Figs 14, 16), with Triton x2 and "
                "DVABatch ablations"),
    ("fit", "fit the simulator's engine to replay folders: dvasim fit DIR... --out engine.toml"),
    ("profile", "profile a model's stages into a latency table (needs torch); see dvasim profile -h"),
    ("replay", "replay a config on real torch execution (needs torch); see dvasim replay -h"),
    ("validate", "simulate and replay a config, write fidelity.json (needs torch)"),
    ("triton", "serve a config on the real Triton server on this CPU; see dvasim triton -h"),
)


def build_parser() -> OneLineParser:
    """``dvasim``'s parser: the subcommands parsed here (each module's ``add_parser``: run, capacity, plan, sweep,
    policies, stacks, config) and, for ``dvasim -h``, the ones that parse their own arguments."""
    from dvasim.cli import capacity, config, plan, policies, run, stacks, sweep

    parser = OneLineParser(prog="dvasim", description=__doc__.split("\n")[0])
    parser.add_argument("--version", "-V", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in (run, capacity, plan, sweep, policies, stacks, config):
        command.add_parser(sub)
    for name, help_ in SELF_PARSED:
        sub.add_parser(name, help=help_)
    return parser


def run_parsed(argv: list[str]) -> int:
    """Parse ``argv`` with :func:`build_parser` and run its subcommand: a :class:`DvasimError` is one line and
    status 2, Ctrl-C status 130."""
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except DvasimError as e:
        return error_line(e)
    except KeyboardInterrupt:
        print("dvasim: interrupted", file=sys.stderr)
        return 130


BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a command whose reader went away
TERMINATED = 143  # 128 + SIGTERM


class Terminated(BaseException):
    """SIGTERM (what a scheduler or a container sends) as an exception, so that every command unwinds as it does
    for Ctrl-C: its files are written whole or not at all (:mod:`dvasim.outputs`), its pool is cancelled."""


def _raise_terminated(signum, frame) -> None:
    raise Terminated()


@contextlib.contextmanager
def _sigterm_unwinds():
    """SIGTERM raises :class:`Terminated` for the block (``dvasim run`` installs its own, gentler handler while it
    simulates); the previous handler comes back after. Off the main thread Python cannot install one."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def entry() -> None:
    """The ``dvasim`` console script and ``python -m dvasim``: :func:`main`, then exit with its status. What the
    command made is frozen out of the interpreter's last garbage collection (``gc.freeze``): with torch imported
    that collection took about half a second of a stopped replay's exit, for nothing (the process ends)."""
    import gc

    status = main()
    gc.freeze()
    sys.exit(status)


def main(argv: list[str] | None = None) -> int:
    """``dvasim COMMAND ...`` (``argv``: the words after ``dvasim``; default ``sys.argv[1:]``): the subcommands that
    parse their own arguments are handed the rest of the line, the others are parsed here. Returns the exit
    status; a standard output closed by its reader ends the command quietly (:data:`BROKEN_PIPE`). Started with
    standard output or error closed (``>&-``: Python then has ``None`` for them), what would go there is dropped."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))  # noqa: SIM115 (for the process's life)
    try:
        try:
            with _sigterm_unwinds():
                return dispatch(argv)
        except KeyboardInterrupt:  # Ctrl-C where no command handles it (while starting up, say): one line
            print("dvasim: interrupted", file=sys.stderr)
            return 130
        except Terminated:
            print("dvasim: terminated by SIGTERM", file=sys.stderr)
            return TERMINATED
        finally:  # flushed here, not at exit (-h ends with SystemExit): a closed pipe is met where it is handled
            sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE
    except OSError as e:  # standard output on a full device (> /dev/full), or a write no command turned into a line
        _silence_stdout()
        print(f"dvasim: error: {e.filename or 'standard output'}: cannot write ({e.strerror or e})", file=sys.stderr)
        return 2


def _silence_stdout() -> None:
    """The Python docs' recipe for a closed pipe: point standard output at devnull, so that nothing more (the
    interpreter's last flush included) fails on it."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's capture): nothing to silence
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def dispatch(argv: list[str] | None = None) -> int:
    """:func:`main` without the closed-pipe handling: the subcommand of ``argv`` run, its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--version", "-V"):
        from dvasim.compiled import core

        print(f"dvasim {version()}, core: {core()}")
        return 0
    if argv and argv[0] == "compare":
        from dvasim.cli.compare import cli_compare

        try:
            return cli_compare(argv[1:])
        except DvasimError as e:
            return error_line(e)
    if argv and argv[0] == "fit":
        from dvasim.cli.fit import cli_fit

        return cli_fit(argv[1:])
    if argv and argv[0] == "profile":
        try:
            from dvasim.cli.profile import cli_profile
        except ImportError as e:
            return needs_torch("profile", e)
        return cli_profile(argv[1:])
    if argv and argv[0] == "triton":
        from dvasim.cli.triton import cli_triton

        return cli_triton(argv[1:])
    if argv and argv[0] in ("replay", "validate"):
        try:
            from dvasim.cli.replay import cli_replay
            from dvasim.cli.validate import cli_validate
        except ImportError as e:
            return needs_torch(argv[0], e)
        return (cli_replay if argv[0] == "replay" else cli_validate)(argv[1:])
    return run_parsed(argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
