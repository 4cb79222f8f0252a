"""``dvasim capacity CONFIG.toml --slo-ms MS --out DIR``: the highest offered rate that meets a latency SLO
(:func:`dvasim.studies.capacity.capacity`), each probe printed as it is decided, the result in DIR/capacity.json
(written when complete). Every setting is checked, with the config, before the first probe runs; the limits
(resolution >= 1e-4, at most 20 million queries a probe, rates up to 1e9 qps) are those of
:data:`dvasim.studies.capacity.OPTIONS`."""

from __future__ import annotations

import sys
from pathlib import Path

from dvasim.cli.common import add_stack_arguments, check_stack, set_help
from dvasim.errors import check_out_dir
from dvasim.outputs import output_error, write_text


def add_parser(sub) -> None:
    """``dvasim capacity``'s arguments, on the subcommand parsers ``sub``."""
    p = sub.add_parser("capacity", help="the highest offered rate that meets a latency SLO (bracketing and "
                                        "bisection, each point with enough queries for a confident percentile)")
    p.add_argument("config", help="TOML config with [workload] kind = \"poisson\" or \"uniform\"")
    p.add_argument("--slo-ms", type=float, required=True, help="the latency SLO (ms)")
    p.add_argument("--percentile", type=float, default=99.0, help="the percentile the SLO bounds (default 99)")
    p.add_argument("--out", required=True, help="output directory (capacity.json)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help=set_help())
    p.add_argument("--confidence", type=float, default=0.95, help="confidence of each probe's verdict (0.95)")
    p.add_argument("--resolution", type=float, default=0.02,
                   help="stop when hi/lo - 1 is at most this (0.02; at least 1e-4)")
    p.add_argument("--lo", type=float, default=None, help="bottom of the first bracket (qps, default 1)")
    p.add_argument("--hi", type=float, default=None, help="top of the first bracket (qps, default: twice the "
                                                          "table's throughput bound)")
    p.add_argument("--max-queries", type=int, default=64_000,
                   help="most queries in one probe (64,000; at most 20,000,000)")
    add_stack_arguments(p, every=True)
    p.set_defaults(func=cmd_capacity)


def show_probe(p: dict) -> None:
    """One decided probe, as ``dvasim capacity`` prints it while it searches."""
    print(f"  {p['rate_qps']:10.2f} qps  n={p['n_queries']:<6} slow {p['slow_fraction']:.4f}  "
          f"{'within' if p['within_slo'] else 'over  '} ({p['decided_by']})", flush=True)


def cmd_capacity(args) -> int:
    import json

    from dvasim.studies.capacity import capacity

    check_stack(args.stack)
    check_out_dir(args.out)
    res = capacity(args.config, args.slo_ms, percentile=args.percentile, overrides=args.set,
                   confidence=args.confidence, resolution=args.resolution, lo=args.lo, hi=args.hi,
                   max_queries=args.max_queries, progress=show_probe, stack=args.stack, engine=args.engine)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(out, e) from None
    write_text(out / "capacity.json", json.dumps(strict_json(res), indent=2, allow_nan=False) + "\n")  # atomically: never a torn file
    print(f"dvasim capacity {args.config} [stack: {res.get('stack')}]: {res['capacity_qps']:.2f} qps with "
          f"p{args.percentile:g} <= "
          f"{args.slo_ms:g} ms (resolution {res['resolution'] if res['resolution'] is not None else float('nan'):.1%}"
          f", {res['n_probes']} probes); {out}/capacity.json")
    if res["note"]:  # a bracket top never exceeded, the SLO missed at the bottom, the bisections' cap reached
        print(f"dvasim: warning: {res['note']}", file=sys.stderr)
    return 0


def strict_json(o):
    """``o`` with every NaN or infinite float made ``null``: capacity.json is strict JSON any reader takes."""
    import math

    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: strict_json(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [strict_json(v) for v in o]
    return o
