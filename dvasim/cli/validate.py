"""``dvasim validate``: simulator vs replay of one config, ``DIR/fidelity.json`` and an overlay figure (needs torch).

    dvasim validate CONFIG.toml --out DIR [--repeats K] [--set ...] [--device cpu|cuda] [--max-foreign-load CORES]
                    [--table shipped|fresh|serving]

``validate --device cuda`` profiles a GPU-time table of the config's stages as CUDA graphs and their launch costs,
replays with graph stages and simulates with both (:func:`dvasim.fitting.validate.validate`).

Bad input prints one line, ``dvasim validate: error: <field>: <fix>`` (config errors, and ``--device cuda`` on a
machine without CUDA: ``dvasim: error: device: cuda is not available on this machine; ...``), and exits with
status 2 before anything is simulated or written: ``--out`` (a folder that can be made), ``--threads`` (1..4 per
logical CPU, at most 256), ``--repeats`` (1..100), ``--max-foreign-load`` (a finite number >= 0), and the config
as both engines run it; a failed replay exits with status 1. ``--help`` works without torch.
"""

from __future__ import annotations

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
    thread_count,
)
from dvasim.errors import DvasimError, check_out_dir
from dvasim.server.resolve import stack_line

MAX_REPEATS = 100  # --repeats: real runs


def validate_parser() -> StrictParser:
    """``dvasim validate``'s arguments."""
    p = StrictParser(prog="dvasim validate",
                     description="simulate and replay one config; write fidelity.json and an overlay figure")
    add_torch_run_arguments(p)
    p.add_argument("--repeats", default="3", help=f"real runs (1..{MAX_REPEATS}, default 3)")
    p.add_argument("--table", default="shipped", choices=("shipped", "fresh", "serving"),
                   help="simulate with the shipped CPU table (default), or a per-stage table profiled just before "
                        "the replays in a hot loop (fresh) or as the replay runs the stages (serving)")
    p.add_argument("--max-foreign-load", default=None,
                   help="wait for / retry until other processes use at most this many cores during a replay")
    return p


def cli_validate(argv: list[str]) -> int:
    try:
        args = validate_parser().parse_args(argv)
        check_out_dir(args.out)
        dev = check_device(args.device)
        threads = thread_count("--threads", args.threads)
        repeats = positive_int("--repeats", args.repeats, 1, MAX_REPEATS)
        max_foreign = None
        if args.max_foreign_load is not None:
            max_foreign = number("--max-foreign-load", args.max_foreign_load, 0.0)
    except UsageError as e:
        return error_line(e, "validate")
    except DvasimError as e:
        return error_line(e)
    try:
        from dvasim.engines.replay.engine import ReplayError
        from dvasim.fitting.validate import format_fidelity, validate
    except ImportError as e:
        return needs_torch("validate", e)
    try:
        fid = validate(args.config, args.out, repeats=repeats, overrides=args.set, device=dev, threads=threads,
                       figure=not args.no_figure, max_foreign=max_foreign, table=args.table)
    except DvasimError as e:
        return error_line(e)
    except ReplayError as e:
        return error_line(e, "validate", 1)
    except KeyboardInterrupt as e:  # a replay stopped by Ctrl-C: it keeps its records, no other repeat runs
        print(f"dvasim validate: interrupted by SIGINT{'; ' + str(e) if str(e) else ''}", file=sys.stderr)
        return 130
    print(f"dvasim validate {args.config}: results in {args.out}/")
    print_sim_stack(args.out)
    print(format_fidelity(fid))
    return 0


def print_sim_stack(out) -> None:
    """:func:`stack_line` of the simulation validate ran (its summary.json: ``sim/``, or ``sim_0/`` with a table
    per repeat)."""
    import json
    from pathlib import Path

    for sub in ("sim", "sim_0"):
        path = Path(out) / sub / "summary.json"
        if path.is_file():
            s = json.loads(path.read_text(encoding="utf-8"))
            print(stack_line(s.get("stack"), s.get("stack_source")))
            return
