"""``dvasim capacity CONFIG.toml --slo-ms MS --out DIR``: the highest offered rate that meets a latency SLO
(:func:`dvasim.studies.capacity.capacity`), each probe printed as it is decided, the result in DIR/capacity.json
(written when complete). Every setting is checked, with the config, before the first probe runs; the limits
(resolution >= 1e-4, at most 20 million queries a probe, rates up to 1e9 qps) are those of
:data:`dvasim.studies.capacity.OPTIONS`.

``--seeds K`` (1..100) runs K independent searches: the capacity printed and in ``capacity_qps`` is their mean,
with its 95% t interval (``capacity_interval``) and each search's (``capacity_by_seed``). ``--policies A,B,C``
finds the capacity under each policy and prints each against the first: ``B ahead by 6.1% [3.2, 9.0]`` or ``tie``
(within the intervals or the search's resolution; :func:`dvasim.reporting.intervals.tie`); capacity.json then
holds ``by_policy`` (each policy's result) and ``comparisons``."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from dvasim.cli.common import add_stack_arguments, check_stack, print_config_stack, set_help
from dvasim.errors import check_out_dir
from dvasim.outputs import output_error, write_text
from dvasim.reporting.result import strict_json


def add_parser(sub) -> None:
    """``dvasim capacity``'s arguments, on the subcommand parsers ``sub``."""
    p = sub.add_parser("capacity", help="the highest offered rate that meets a latency SLO (bracketing and "
                                        "bisection, each point with enough queries for a confident percentile)")
    p.add_argument("config", help="TOML config with [workload] kind = \"poisson\" or \"uniform\"")
    p.add_argument("--slo-ms", type=float, required=True, help="the latency SLO (ms)")
    p.add_argument("--percentile", type=float, default=99.0, help="the percentile the SLO bounds (default 99)")
    p.add_argument("--out", required=True, help="output directory (capacity.json)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help=set_help())
    add_probe_arguments(p)
    p.add_argument("--resolution", type=float, default=0.02,
                   help="stop when hi/lo - 1 is at most this (0.02; at least 1e-4)")
    p.add_argument("--lo", type=float, default=None, help="bottom of the first bracket (qps, default 1)")
    p.add_argument("--hi", type=float, default=None, help="top of the first bracket (qps, default: twice the "
                                                          "table's throughput bound)")
    p.add_argument("--seeds", type=int, default=1,
                   help="independent searches (1..100; default 1): the capacity is their mean, with its 95%% t "
                        "interval")
    p.add_argument("--policies", default=None, metavar="A,B,...",
                   help="the capacity under each of these policies (each with its defaults, the config's own with "
                        "its [policy]), each compared with the first: the difference or a tie")
    add_stack_arguments(p, every=True)
    p.set_defaults(func=cmd_capacity)


def add_probe_arguments(p) -> None:
    """The probes' rules (:data:`dvasim.studies.capacity.OPTIONS`), as ``capacity`` and ``plan`` take them."""
    from dvasim.studies.capacity import CONFIRM_FACTOR, MIN_DURATION_S

    p.add_argument("--confidence", type=float, default=0.99,
                   help="confidence of each probe's verdict (0.99: LoadGen's early stopping)")
    p.add_argument("--min-duration-s", type=float, default=MIN_DURATION_S,
                   help=f"simulated seconds of arrivals a probe runs at least ({MIN_DURATION_S:g}; LoadGen's "
                        "Server rule: 600)")
    p.add_argument("--max-queries", type=int, default=None,
                   help="most queries of one probe as it doubles them (default: 8x its first; at most 20,000,000)")
    p.add_argument("--trigger", choices=("backlog", "none"), default="backlog",
                   help="test every accepted rate from a backlog; one that does not recover is metastable "
                        "(default backlog)")
    p.add_argument("--trigger-slos", type=float, default=1.0,
                   help="the backlog in SLOs of arrivals at the probed rate (default 1)")
    p.add_argument("--confirm-factor", type=int, default=CONFIRM_FACTOR,
                   help=f"confirm the answer with runs this many times a probe long, stepping down while they fail "
                        f"(default {CONFIRM_FACTOR}: 600 s runs for 60 s probes, LoadGen's Server rule; 0: none)")
    p.add_argument("--workers", type=int, default=None,
                   help="processes for independent searches (seeds, policies): default one per core")
    p.add_argument("--dask", default=None, metavar="tcp://HOST:PORT",
                   help="run the independent searches on this Dask scheduler instead")


def probe_kwargs(args) -> dict:
    """The probes' rules from the parsed flags (:func:`add_probe_arguments`)."""
    return dict(confidence=args.confidence, min_duration_s=args.min_duration_s, max_queries=args.max_queries,
                trigger=args.trigger, trigger_slos=args.trigger_slos, confirm_factor=args.confirm_factor,
                workers=args.workers, dask=args.dask)


def show_probe(p: dict) -> None:
    """One decided probe, as ``dvasim capacity`` prints it while it searches (with its policy and its search's
    seed when there are several): its rate, queries, share of slow queries, verdict and the rule that decided
    it."""
    who = (f"{p['policy']} " if "policy" in p else "") + (f"seed {p['search_seed']} " if "search_seed" in p else "")
    who += f"{p['replicas']} replicas " if "replicas" in p else ""
    who += "long run " if p.get("confirmation") else ""
    print(f"  {who}{p['rate_qps']:10.2f} qps  n={p['n_queries']:<7} ({p.get('duration_s', math.nan):.3g} s) slow "
          f"{p['slow_fraction']:.4f}  {p.get('verdict', 'stable' if p['within_slo'] else 'over-SLO'):<10} "
          f"({p['decided_by']})", flush=True)


def cmd_capacity(args) -> int:
    from dvasim.studies.capacity import capacity, compare_policies

    check_stack(args.stack)
    check_out_dir(args.out)
    kw = dict(percentile=args.percentile, overrides=args.set, resolution=args.resolution, lo=args.lo, hi=args.hi,
              progress=show_probe, stack=args.stack, engine=args.engine, seeds=args.seeds, **probe_kwargs(args))
    print_config_stack(args.config, args.set, args.stack, args.engine)
    if args.policies is not None:
        names = [x.strip() for x in args.policies.split(",") if x.strip()]
        res = compare_policies(args.config, args.slo_ms, names, **kw)
        _write(res, Path(args.out))
        _print_policies(res, args)
        return 0
    res = capacity(args.config, args.slo_ms, **kw)
    _write(res, Path(args.out))
    print(f"dvasim capacity {args.config} [stack: {res.get('stack')}]: {_capacity_text(res)} with "
          f"p{args.percentile:g} <= "
          f"{args.slo_ms:g} ms (resolution {res['resolution'] if res['resolution'] is not None else float('nan'):.1%}"
          f", {res['n_probes']} probes); {Path(args.out)}/capacity.json")
    print(f"  rules: {rules_text(res['rules'])}")
    if res.get("confirmation"):
        print(f"  {confirmation_text(res)}")
    if res.get("n_metastable"):
        print(f"  metastable: {res['n_metastable']} probed rate(s) held from an empty queue but not after a backlog "
              f"(their probes say which)")
    if res["note"]:  # a bracket top never exceeded, the SLO missed at the bottom, the bisections' cap reached
        print(f"dvasim: warning: {res['note']}", file=sys.stderr)
    return 0


def confirmation_text(res: dict) -> str:
    """The long runs' word on a capacity: held at the searches' answer, or overturned it (the rate they held)."""
    c = res["confirmation"]
    n = len(c["seeds"])
    runs = f"{n} run{'s' if n > 1 else ''} {c['factor']}x a probe long"
    if not c["overturned"]:
        return f"confirmed: {runs} at {c['searched_qps']:.2f} qps held"
    if c["confirmed_qps"] <= 0:
        return f"overturned: the searches said {c['searched_qps']:.2f} qps; {c['note']}"
    return (f"overturned: the searches said {c['searched_qps']:.2f} qps, where {runs} failed; they hold from "
            f"{c['confirmed_qps']:.2f} qps ({len(c['runs'])} long runs)")


def rules_text(rules: dict) -> str:
    """The probes' rules in words: which decided every verdict."""
    trig = ("no trigger test" if rules["trigger"] == "none" else
            f"every accepted rate tested from a backlog of {rules['trigger_slos']:g} SLO of arrivals (no recovery: "
            f"metastable)")
    most = "8x its first" if rules["max_queries"] is None else f"{rules['max_queries']:,}"
    k = rules.get("confirm_factor", 0)
    conf = ("; the answer not confirmed by long runs" if not k else
            f"; the answer confirmed by runs {k}x a probe long ({k * rules['min_duration_s']:g} s), stepping down "
            f"while they fail")
    return (f"each probe >= {rules['min_duration_s']:g} s of arrivals and >= {rules['min_queries']:,} queries, "
            f"decided by LoadGen's early-stopping bound at {rules['confidence']:g} (doubling up to {most}); {trig}"
            f"{conf}")


def _capacity_text(res: dict) -> str:
    """``412.30 qps`` for one search; ``412.3 [405.1, 419.6] qps (mean of 5 seeds, 95% t interval; per seed:
    ...)`` for several."""
    c = res.get("confirmation") or {}
    moved = f" (held by long runs; the searches said {c['searched_qps']:.2f})" if c.get("overturned") else ""
    if len(res["capacity_by_seed"]) == 1:
        return f"{res['capacity_qps']:.2f} qps{moved}"
    from dvasim.reporting.intervals import Interval

    iv = Interval(**res["capacity_interval"])
    per = ", ".join(f"{c:.2f}" for c in res["capacity_by_seed"])
    scaled, searched = (", scaled to the long runs", " searched") if moved else ("", "")
    return f"{iv} qps{moved} (mean of {iv.n} seeds, {iv.confidence:.0%} t interval{scaled}; per seed{searched}: {per})"


def _write(res: dict, out: Path) -> None:
    """``capacity.json`` in ``out``, written whole (atomically: never a torn file)."""
    write_json(out, "capacity.json", res)


def write_json(out: Path, name: str, res: dict) -> None:
    """``name`` in the folder ``out`` (made if needed): ``res`` as strict JSON (:func:`strict_json`), written whole
    (atomically: never a torn file)."""
    import json

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(out, e) from None
    write_text(out / name, json.dumps(strict_json(res), indent=2, allow_nan=False) + "\n")


def _print_policies(res: dict, args) -> None:
    """Each policy's capacity (with its interval over seeds) and each against the first."""
    first = res["policies"][0]
    stack = res["by_policy"][first].get("stack")
    print(f"dvasim capacity {args.config} [stack: {stack}]: p{args.percentile:g} <= {args.slo_ms:g} ms, "
          f"{args.seeds} seed{'s' if args.seeds > 1 else ''} per policy; {Path(args.out)}/capacity.json")
    width = max(len(n) for n in res["policies"])
    for name in res["policies"]:
        print(f"  {name:<{width}}  {_capacity_text(res['by_policy'][name])}")
    if res["comparisons"]:
        print(f"  ranking (each against the best; = a tie): {res['ranking']}")
    for c in res["comparisons"]:
        print(f"  {c['label']}")
    for name in res["policies"]:
        if res["by_policy"][name]["note"]:
            print(f"dvasim: warning: {name}: {res['by_policy'][name]['note']}", file=sys.stderr)
