"""What the subcommands share: the arguments several take (the config, ``--out``, ``--set``, ``--stack``,
``--engine``), the checks made before any work, the printed summary of a run, the version, and the strict option
parsing of the commands that need torch (``replay``, ``validate``), whose errors are ``dvasim CMD: error: ...``."""

from __future__ import annotations

import argparse
import sys


def fmt(v) -> str:
    """A value as the command line prints it: floats to 4 significant digits."""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def check_stack(name) -> None:
    """A ``--stack`` checked before any work (one line naming --stack, exit 2)."""
    if name is not None:
        from dvasim.server.resolve import stack_by_name

        stack_by_name(name, "--stack")


def print_config_stack(config, overrides=None, stack=None, engine=None) -> None:
    """:func:`dvasim.server.resolve.stack_line` of a config before it runs (a study's runs): the stack it resolves to and why. A config
    that does not resolve prints nothing here (the study's own checks then say what is wrong)."""
    from dvasim.errors import DvasimError
    from dvasim.studies.sweep import config_stack

    try:
        name, reason = config_stack(config, overrides, stack=stack, engine=engine)
    except DvasimError:
        return
    from dvasim.server.resolve import stack_line

    print(stack_line(name, reason), flush=True)


def print_summary(summary: dict, file=None) -> None:
    """The summary's main numbers, one a line (a cluster's replicas after them); ``file``: default the standard
    output as it is when called (not as it was when this module was imported)."""
    file = sys.stdout if file is None else file
    keys = [
        "policy", "stack", "replicas", "router", "triton_config", "n_queries", "n_completed", "n_rejected", "n_timed_out", "n_not_arrived",
        "offered_qps", "throughput_qps",
        "mean_latency_ms", "p50_latency_ms",
        "p90_latency_ms", "p95_latency_ms", "p99_latency_ms", "qos_target_ms", "qos_violation_rate",
        "mean_exit_batch_size", "n_batches", "n_stretch", "n_split", "device_busy_fraction", "sim_queries_per_wall_s",
        "verdict", "verdict_reason", "stable", "stability_reason",
    ]
    width = max(len(k) for k in keys)
    for k in keys:
        if k in summary:
            print(f"  {k:<{width}}  {fmt(summary[k])}", file=file)
    for r in summary.get("per_replica", []):  # a cluster's replicas, one line each
        print(f"  replica {r['replica']:<{max(1, width - 8)}}  {r['n_queries']} queries, mean "
              f"{fmt(r['mean_latency_ms'])} ms, p99 {fmt(r['p99_latency_ms'])} ms, device busy "
              f"{fmt(r['device_busy_fraction'])}", file=file)


def add_stack_arguments(p: argparse.ArgumentParser, every: bool = False) -> None:
    """--stack and --engine, as run, capacity, sweep and compare take them."""
    runs = "every run" if every else "the run"
    p.add_argument("--stack", metavar="NAME", default=None,
                   help=f"the serving stack {runs} simulates (over the config's [server] stack; `dvasim stacks` "
                        "lists them)")
    p.add_argument("--engine", metavar="ENGINE.toml", default=None,
                   help=f"an engine file written by dvasim fit, merged over the config's [engine] for {runs}")


def add_config_arguments(p: argparse.ArgumentParser, config_help: str) -> None:
    """The arguments every config-running command takes: the config, --out, --set, --no-figure."""
    p.add_argument("config", help=config_help)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help=set_help())
    p.add_argument("--no-figure", action="store_true", help="do not write latency.png")


def set_help() -> str:
    """``--set``'s help, from the schema: the sections a key may name."""
    from dvasim.config.sections import SECTIONS, SUBSECTIONS

    return (f"override a config key (repeatable; the value is read as TOML): sections {', '.join(SECTIONS)} and "
            f"{', '.join(SUBSECTIONS)}; every key with its type and default: dvasim config SECTION")


def version() -> str:
    from importlib import metadata

    try:
        return metadata.version("dvasim")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree without install
        return "unknown (not installed)"


# ---- strict options of the torch commands (replay, validate): each error one line naming the option


class UsageError(Exception):
    """A bad option of ``replay`` or ``validate``: printed as ``dvasim CMD: error: <field>: <message>``."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")


class StrictParser(argparse.ArgumentParser):
    """A parser whose errors are one :class:`UsageError` (field ``arguments``) instead of usage + message."""

    def error(self, message):  # one line instead of usage + message
        raise UsageError("arguments", message)


def positive_int(field: str, v, minimum: int = 1, maximum: int | None = None) -> int:
    """An integer option >= ``minimum`` (and <= ``maximum`` when given)."""
    allowed = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
    try:
        n = int(v)
    except (TypeError, ValueError):
        raise UsageError(field, f"must be an integer {allowed}, got {v!r}") from None
    if n < minimum or (maximum is not None and n > maximum):
        raise UsageError(field, f"must be an integer {allowed}, got {v!r}")
    return n


def max_threads() -> int:
    """The most intra-op threads a torch command takes: 4 per logical CPU of this machine, at most 256 (torch
    crashes on a thread pool far beyond the machine)."""
    import os

    return min(256, 4 * (os.cpu_count() or 1))


def thread_count(field: str, v) -> int:
    """A thread-count option: an integer in 1..:func:`max_threads`."""
    return positive_int(field, v, 1, max_threads())


def number(field: str, v, minimum: float, strict: bool = False) -> float:
    """A finite number option: > ``minimum`` if ``strict``, else >= ``minimum``."""
    import math

    try:
        x = float(v)
    except (TypeError, ValueError):
        x = float("nan")
    if not math.isfinite(x) or not (x > minimum if strict else x >= minimum):
        raise UsageError(field, f"must be a finite number {'>' if strict else '>='} {minimum:g}, got {v!r}")
    return x


def check_device(dev: str) -> str:
    """``cpu`` or ``cuda`` (the replay takes the whole "cuda" device, not "cuda:N"); ``cuda`` on a machine without
    CUDA raises the config error :func:`dvasim.engines.replay.engine.prepare` would (``device: cuda is not available on
    this machine; ...``), before anything runs."""
    if dev != "cuda":
        if dev != "cpu":
            raise UsageError("--device", f"must be cpu or cuda, got {dev!r}")
        return dev
    import torch

    from dvasim.errors import ConfigError

    if not torch.cuda.is_available():
        raise ConfigError("device", "cuda is not available on this machine; use --device cpu")
    return dev


def add_torch_run_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of both torch commands: the config's, --device and --threads."""
    add_config_arguments(p, "TOML config file (a named model: name, device, stages)")
    p.add_argument("--device", default="cpu", help="cpu (threads) or cuda (streams and events); default cpu")
    p.add_argument("--threads", default="1", help="torch intra-op threads for the run (process-wide; 1..4 per "
                                                  "logical CPU, at most 256); default 1")


TORCH_EXTRA = "install the replay extra: pip install 'dvasim[replay]'"


def error_line(e, command: str | None = None, status: int = 2) -> int:
    """Print a user error as the one line every subcommand prints (``dvasim[ COMMAND]: error: <field>: ...``) and
    return the exit status."""
    print(f"{'dvasim' if command is None else f'dvasim {command}'}: error: {e}", file=sys.stderr)
    return status


def needs_torch(command: str, e: ImportError) -> int:
    """The one line for a torch command on a machine without torch."""
    return error_line(f"needs torch ({e}); {TORCH_EXTRA}", command)
