"""``dvasim triton``: a config served on the real Triton server (2.51.0, r24.10) on this machine's CPU.

    dvasim triton CONFIG.toml --out DIR [--set section.key=value ...] [--http-port P] [--grpc-port P]
                  [--no-pin] [--no-figure]

It writes what ``dvasim run`` writes (``queries.parquet``, ``summary.json``, ``config.json``, ``latency.png``) from
the real server's records, plus ``executions.csv`` (every batch Triton formed), ``stats.json`` (the server's
statistics), ``config.pbtxt`` (what it served) and ``server/`` (the model repository, the server's log and trace,
the client's and the model's raw records). See :mod:`dvasim.engines.triton`.

Bad input, a server that cannot run here (no Triton environment: ``make triton-env``; glibc < 2.35; no system
Python 3.11 for the stub), a port in use, or a pbtxt the engine cannot serve: one line and status 2, before the
server starts. A server that dies during the run: one line and status 2, the records collected so far written.
Ctrl-C stops the server and the client (nothing is left running) and exits with status 130.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dvasim.cli.common import (
    StrictParser,
    UsageError,
    add_config_arguments,
    error_line,
    positive_int,
    print_summary,
)
from dvasim.errors import DvasimError, check_out_dir


def triton_parser() -> StrictParser:
    p = StrictParser(prog="dvasim triton", description="serve a config on the real Triton server (CPU)")
    add_config_arguments(p, "TOML config file (one stage; policy zerobatch, delaybatch or triton)")
    p.add_argument("--http-port", default=None, help="the server's HTTP port (default: a free one)")
    p.add_argument("--grpc-port", default=None, help="the server's gRPC port (default: a free one)")
    p.add_argument("--no-pin", action="store_true", help="do not keep the client on its own core")
    return p


def cli_triton(argv: list[str]) -> int:
    from dvasim.api import write_outputs
    from dvasim.engines.triton.engine import ServerDied, serve, write_extras

    try:
        args = triton_parser().parse_args(argv)
        ports = {}
        for name in ("http", "grpc"):
            v = getattr(args, f"{name}_port")
            if v is not None:
                ports[name] = positive_int(f"--{name}-port", v, 1, 65535)
        check_out_dir(args.out)
    except UsageError as e:
        return error_line(e, "triton")
    except DvasimError as e:
        return error_line(e)
    out = Path(args.out)
    try:
        result = serve(args.config, args.set, work_dir=out / "server", ports=ports or None, pin=not args.no_pin)
    except ServerDied as e:
        write_extras(e.result, write_outputs(e.result, out, figure=False))
        return error_line(f"{e} (the records until then are in {out}/)", "triton")
    except DvasimError as e:
        return error_line(e, "triton")
    except KeyboardInterrupt:
        print("dvasim triton: interrupted; the server is stopped", file=sys.stderr)
        return 130
    write_extras(result, write_outputs(result, out, figure=not args.no_figure))
    print(f"dvasim triton {args.config}: results in {out}/")
    print_summary(result.summary)
    s = result.summary
    print(f"  served on {s['stack']}; mean batch {s['mean_batch_size']:.3g}, client lag p99 "
          f"{s['client_lag_ms_p99']:.3g} ms{' (BEHIND)' if s['client_behind'] else ''}, device error p99 "
          f"{s['device_error_ms_p99']:.3g} ms")
    return 0
