"""``dvasim replay`` and ``dvasim validate`` (need torch; ``--loadgen`` needs ``mlcommons-loadgen``).

    dvasim replay CONFIG.toml --out DIR [--set section.key=value ...] [--device cpu|cuda] [--threads N]
                  [--modules auto|cudagraph|torchscript|eager] [--loadgen [--target-qps X]]
    dvasim validate CONFIG.toml --out DIR [--repeats K] [--set ...] [--device cpu|cuda] [--max-foreign-load CORES]
                    [--table shipped|fresh|serving]

``--modules`` sets ``[replay] modules`` (``auto``: CUDA graphs on cuda, TorchScript on cpu). ``validate --device
cuda`` profiles a GPU-time table of the config's stages as CUDA graphs and their launch costs, replays with graph
stages and simulates with both (:func:`dvasim.fitting.validate.validate`).

Bad input prints one line, ``dvasim replay: error: <field>: <fix>`` (config errors, and ``--device cuda`` on a
machine without CUDA: ``dvasim: error: device: cuda is not available on this machine; ...``), and exits with
status 2. A failed stage exits with status 1 (the records so far are written); Ctrl-C stops the run,
writes the records collected so far and exits with status 130.
"""

from __future__ import annotations

import argparse
import sys

from dvasim.errors import DvasimError


class _UsageError(Exception):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line instead of usage + message
        raise _UsageError("arguments", message)


def _positive_int(field: str, v, minimum: int = 1) -> int:
    try:
        n = int(v)
    except (TypeError, ValueError):
        raise _UsageError(field, f"must be an integer >= {minimum}, got {v!r}") from None
    if n < minimum:
        raise _UsageError(field, f"must be an integer >= {minimum}, got {v!r}")
    return n


def _common(p: argparse.ArgumentParser) -> None:
    from dvasim.cli import add_config_arguments

    add_config_arguments(p, "TOML config file (a named model: name, device, stages)")
    p.add_argument("--device", default="cpu", help="cpu (threads) or cuda (streams and events); default cpu")
    p.add_argument("--threads", default="1", help="torch intra-op threads for the run (process-wide); default 1")


def _number(field: str, v, minimum: float, strict: bool = False) -> float:
    """A number option: > ``minimum`` if ``strict``, else >= ``minimum``."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        x = float("nan")
    if not (x > minimum if strict else x >= minimum):
        raise _UsageError(field, f"must be a number {'>' if strict else '>='} {minimum:g}, got {v!r}")
    return x


def _check_device(dev: str) -> str:
    """``cpu`` or ``cuda`` (the replay takes the whole "cuda" device, not "cuda:N"); ``cuda`` on a machine without
    CUDA raises the config error :func:`dvasim.engines.replay.engine.prepare` would (``device: cuda is not available on
    this machine; ...``), before anything runs."""
    if dev != "cuda":
        if dev != "cpu":
            raise _UsageError("--device", f"must be cpu or cuda, got {dev!r}")
        return dev
    import torch

    from dvasim.errors import ConfigError

    if not torch.cuda.is_available():
        raise ConfigError("device", "cuda is not available on this machine; use --device cpu")
    return dev


MODULES = ("auto", "cudagraph", "torchscript", "eager")


def cli_replay(argv: list[str]) -> int:
    p = _Parser(prog="dvasim replay", description="replay a config on real torch execution")
    _common(p)
    p.add_argument("--loadgen", action="store_true",
                   help="let MLPerf LoadGen (Server scenario) issue the queries and measure latency")
    p.add_argument("--target-qps", default=None, help="LoadGen's target QPS (default: the workload's rate_qps)")
    p.add_argument("--warmup", default="2", help="untimed warm-up passes per stage before the run (default 2)")
    p.add_argument("--modules", default=None,
                   help="how the stages run: auto (CUDA graphs on cuda, TorchScript on cpu), cudagraph (captured per "
                        "batch size and length bucket at start-up), torchscript or eager; default: the config's "
                        "[replay] modules")
    try:
        args = p.parse_args(argv)
        if args.modules is not None:
            if args.modules not in MODULES:
                raise _UsageError("--modules", f"must be one of {', '.join(MODULES)}, got {args.modules!r}")
            args.set = [*(args.set or []), f'replay.modules="{args.modules}"']
        dev = _check_device(args.device)
        threads = _positive_int("--threads", args.threads)
        warmup = _positive_int("--warmup", args.warmup, minimum=0)
        target = None
        if args.target_qps is not None:
            target = _number("--target-qps", args.target_qps, 0.0, strict=True)
            if not args.loadgen:
                raise _UsageError("--target-qps", "only with --loadgen")
    except _UsageError as e:
        print(f"dvasim replay: error: {e}", file=sys.stderr)
        return 2
    except DvasimError as e:
        print(f"dvasim: error: {e}", file=sys.stderr)
        return 2
    from dvasim.api import write_outputs
    from dvasim.cli import print_summary
    from dvasim.engines.replay.engine import ReplayError, write_executions

    try:
        if args.loadgen:
            try:
                from dvasim.engines.replay.loadgen import replay_loadgen
            except ImportError as e:
                print(f"dvasim replay: error: --loadgen: needs mlcommons-loadgen ({e}); "
                      "pip install mlcommons-loadgen", file=sys.stderr)
                return 2
            result = replay_loadgen(args.config, args.out, overrides=args.set, device=dev, threads=threads,
                                    target_qps=target, warmup=warmup)
        else:
            from dvasim.engines.replay.engine import replay

            result = replay(args.config, overrides=args.set, device=dev, threads=threads, warmup=warmup)
    except DvasimError as e:
        print(f"dvasim: error: {e}", file=sys.stderr)
        return 2
    except ReplayError as e:
        partial = getattr(e, "run_result", None)
        if partial is not None:  # keep the records collected before the failure
            write_executions(partial, write_outputs(partial, args.out, figure=False))
        print(f"dvasim replay: error: {e}", file=sys.stderr)
        return 1
    out = write_outputs(result, args.out, figure=not args.no_figure)
    write_executions(result, out)
    print(f"dvasim replay {args.config}: results in {out}/")
    print_summary(result.summary)
    extra = [k for k in ("launch_overhead_ms_mean", "loadgen_p50_latency_ms", "loadgen_p99_latency_ms")
             if k in result.summary]
    for k in extra:
        print(f"  {k}  {result.summary[k]:.4g}")
    if result.summary.get("interrupted"):
        print("dvasim replay: interrupted; the records collected so far are written", file=sys.stderr)
        return 130
    if result.stuck:
        print(f"dvasim: warning: {result.stuck}", file=sys.stderr)
        return 1
    return 0


def cli_validate(argv: list[str]) -> int:
    p = _Parser(prog="dvasim validate",
                description="simulate and replay one config; write fidelity.json and an overlay figure")
    _common(p)
    p.add_argument("--repeats", default="3", help="real runs (default 3)")
    p.add_argument("--table", default="shipped", choices=("shipped", "fresh", "serving"),
                   help="simulate with the shipped CPU table (default), or a per-stage table profiled just before "
                        "the replays in a hot loop (fresh) or as the replay runs the stages (serving)")
    p.add_argument("--max-foreign-load", default=None,
                   help="wait for / retry until other processes use at most this many cores during a replay")
    try:
        args = p.parse_args(argv)
        dev = _check_device(args.device)
        threads = _positive_int("--threads", args.threads)
        repeats = _positive_int("--repeats", args.repeats)
        max_foreign = None
        if args.max_foreign_load is not None:
            max_foreign = _number("--max-foreign-load", args.max_foreign_load, 0.0)
    except _UsageError as e:
        print(f"dvasim validate: error: {e}", file=sys.stderr)
        return 2
    except DvasimError as e:
        print(f"dvasim: error: {e}", file=sys.stderr)
        return 2
    from dvasim.engines.replay.engine import ReplayError
    from dvasim.fitting.validate import format_fidelity, validate

    try:
        fid = validate(args.config, args.out, repeats=repeats, overrides=args.set, device=dev, threads=threads,
                       figure=not args.no_figure, max_foreign=max_foreign, table=args.table)
    except DvasimError as e:
        print(f"dvasim: error: {e}", file=sys.stderr)
        return 2
    except ReplayError as e:
        print(f"dvasim validate: error: {e}", file=sys.stderr)
        return 1
    print(f"dvasim validate {args.config}: results in {args.out}/")
    print(format_fidelity(fid))
    return 0
