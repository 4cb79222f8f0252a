"""``dvasim plan CONFIG.toml --qps X --slo-ms Y [--percentile 99] --out DIR``: how many GPUs (replicas behind a
router) serve X qps with the percentile's latency within Y ms (:func:`dvasim.studies.plan.plan`); with
``--replicas N`` the inverse: what N replicas hold (:func:`dvasim.studies.plan.replicas_hold`).

Per policy (``--policies a,b,c``; default the config's): one replica's capacity, the fewest replicas found by probes
of the cluster itself at X qps, a confirming run at that count (stable, within the SLO, each replica's utilisation)
and the headroom there (what that many replicas hold, over X), each with its interval over ``--seeds K`` and the
serving stack and router named; policies whose counts (or capacities) differ by less than their intervals are
printed as a tie. Written to DIR/plan.json and DIR/plan.csv (one row per policy), whole. Every setting is checked
before the first probe; the limits: ``--qps`` up to 1e9, ``--replicas`` 1..1024, ``--seeds`` 1..100, a probe's
queries at most 20 million.
"""

from __future__ import annotations

from pathlib import Path

from dvasim.cli.capacity import add_probe_arguments, probe_kwargs, rules_text, show_probe, write_json
from dvasim.cli.common import add_stack_arguments, check_stack, print_config_stack, set_help
from dvasim.errors import check_out_dir
from dvasim.outputs import write_text


def add_parser(sub) -> None:
    """``dvasim plan``'s arguments."""
    p = sub.add_parser("plan", help="the fewest GPUs (replicas behind a router) that serve a rate within a "
                                    "latency SLO, per policy, with error bars; --replicas N: what N replicas hold")
    p.add_argument("config", help="TOML config with [workload] kind = \"poisson\" or \"uniform\"")
    p.add_argument("--qps", type=float, default=None, help="the rate to serve (queries per second)")
    p.add_argument("--slo-ms", type=float, required=True, help="the latency SLO (ms)")
    p.add_argument("--percentile", type=float, default=99.0, help="the percentile the SLO bounds (default 99)")
    p.add_argument("--replicas", type=int, default=None,
                   help="the inverse question: the highest rate N replicas serve within the SLO (1..1024)")
    p.add_argument("--router", default=None, help="the front end's router (over the config's [cluster] router: "
                   "round_robin, random, join_shortest_queue, power_of_two, least_work)")
    p.add_argument("--policies", default=None, metavar="A,B,...",
                   help="plan for each of these policies (each with its defaults, the config's own with its "
                        "[policy]); default: the config's policy")
    p.add_argument("--seeds", type=int, default=1, help="independent searches per policy (1..100): intervals")
    p.add_argument("--out", required=True, help="output directory (plan.json, plan.csv)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help=set_help())
    p.add_argument("--resolution", type=float, default=0.02, help="capacity searches' resolution (0.02)")
    p.add_argument("--per-replica-queries", type=int, default=2000,
                   help="a cluster probe's queries per replica, at least (2000)")
    p.add_argument("--no-headroom", action="store_true", help="skip the capacity search at the answer's count")
    p.add_argument("--quiet", action="store_true", help="do not print the probes")
    add_probe_arguments(p)
    add_stack_arguments(p, every=True)
    p.set_defaults(func=cmd_plan)


def cmd_plan(args) -> int:
    from dvasim.errors import UsageError
    from dvasim.studies.plan import plan, replicas_hold

    check_stack(args.stack)
    check_out_dir(args.out)
    if (args.qps is None) == (args.replicas is None):
        raise UsageError("--qps", "give --qps X (the fewest replicas for X qps) or --replicas N (what N hold), "
                                  "one of them")
    names = None if args.policies is None else [x.strip() for x in args.policies.split(",") if x.strip()]
    kw = dict(percentile=args.percentile, seeds=args.seeds, router=args.router, overrides=args.set,
              engine=args.engine, stack=args.stack, resolution=args.resolution,
              per_replica_queries=args.per_replica_queries, policies=names,
              progress=None if args.quiet else show_probe, **probe_kwargs(args))
    print_config_stack(args.config, args.set, args.stack, args.engine)
    if args.replicas is not None:
        res = replicas_hold(args.config, args.replicas, args.slo_ms, **kw)
    else:
        res = plan(args.config, args.qps, args.slo_ms, headroom=not args.no_headroom, **kw)
    out = Path(args.out)
    _write(res, out)
    print(plan_text(res, args), end="")
    return 0


def plan_rows(res: dict) -> list[dict]:
    """One row per policy: the answer and its intervals (plan.csv)."""
    rows = []
    for name, p in res["by_policy"].items():
        if "qps" in res:  # the fewest replicas for a rate
            c = p["confirmation"]
            row = {"policy": name, "stack": p["stack"], "router": p["router"], "qps": p["qps"], "slo_ms": p["slo_ms"],
                   "percentile": p["percentile"], "replicas": p["replicas"],
                   "replicas_lo": p["replicas_interval"]["lo"], "replicas_hi": p["replicas_interval"]["hi"],
                   "replicas_by_seed": " ".join(str(x) for x in p["replicas_by_seed"]),
                   "capacity_per_replica_qps": p["capacity_per_replica_qps"],
                   "capacity_per_replica_lo": p["capacity_per_replica_interval"]["lo"],
                   "capacity_per_replica_hi": p["capacity_per_replica_interval"]["hi"],
                   "replicas_probed": p["replicas_probed"], "confirmed": p["confirmed_at"]["holds"],
                   "confirm_queries": p["confirm_queries"],
                   "confirm_verdicts": " ".join(r["verdict"] for r in p["confirmed_at"]["runs"]),
                   "confirm_latency_ms": max(r[f"p{p['percentile']:g}_latency_ms"] for r in p["confirmed_at"]["runs"]),
                   "below_verdicts": "" if p["confirmed_below"] is None else " ".join(
                       r["verdict"] for r in p["confirmed_below"]["runs"]),
                   "utilisation_mean": c["utilisation_mean"],
                   "headroom_%": 100 * p["headroom"] if "headroom" in p else float("nan")}
        else:  # what N replicas hold
            row = {"policy": name, "stack": p["stack"], "replicas": p["replicas"], "capacity_qps": p["capacity_qps"],
                   "capacity_lo": p["capacity_interval"]["lo"], "capacity_hi": p["capacity_interval"]["hi"]}
        rows.append(row)
    return rows


def _write(res: dict, out: Path) -> None:
    import pandas as pd

    write_json(out, "plan.json", res)
    write_text(out / "plan.csv", pd.DataFrame(plan_rows(res)).to_csv(index=False))


def _confirmation_text(c: dict | None, pct: float) -> str:
    """One count's long runs: its verdict per seed, the worst percentile latency, the throughput."""
    if c is None:
        return "none below 1"
    key = f"p{pct:g}_latency_ms"
    verdicts = ", ".join(r["verdict"] for r in c["runs"])
    worst = max(r[key] for r in c["runs"])
    return (f"{c['replicas']} replica{'s' if c['replicas'] != 1 else ''}: {verdicts} (p{pct:g} up to {worst:.4g} ms, "
            f"{c['runs'][0]['n_queries']:,} queries a seed)")


def plan_text(res: dict, args) -> str:
    """The printed answer: per policy the count (interval), the per-replica capacity, the long runs at the count
    and one below, and the headroom; then the ranking against the best (ties shown)."""
    lines = []
    for name, p in res["by_policy"].items():
        if "qps" in res:
            iv = p["replicas_interval"]
            spread = "" if len(p["replicas_by_seed"]) == 1 else (
                f" [{iv['lo']:.0f}, {iv['hi']:.0f}] (probes per seed: {', '.join(map(str, p['replicas_by_seed']))})")
            c = p["confirmation"]
            head = (f"; headroom {100 * p['headroom']:+.1f}% ({p['capacity_at_replicas_qps']:.1f} qps)"
                    if "headroom" in p else "")
            lines.append(f"  {name}: {p['replicas']} replica{'s' if p['replicas'] > 1 else ''}{spread} "
                         f"[stack {p['stack']}, router {p['router']}]; one replica holds "
                         f"{p['capacity_per_replica_qps']:.1f} qps; utilisation {c['utilisation_mean']:.0%}{head}")
            lines.append(f"    confirmed: {_confirmation_text(p['confirmed_at'], p['percentile'])}")
            lines.append(f"    one below: {_confirmation_text(p['confirmed_below'], p['percentile'])}")
        else:
            lines.append(f"  {name}: {p['replicas']} replicas hold {p['capacity_qps']:.1f} qps [stack {p['stack']}]")
    for name, p in res["by_policy"].items():
        lines += [f"  note: {name}: {n}" for n in p.get("notes", [])]
    if res["comparisons"]:
        lines.append(f"  ranking (each against the best; = a tie): {res['comparisons'][0]['ranking']}")
    for c in res["comparisons"]:
        if "replicas_label" in c:
            lines.append(f"  {c['policy']}: {c['replicas_label']}; per replica: {c['capacity_label']}")
        else:
            lines.append(f"  {c['label']}")
    what = (f"{res['qps']:g} qps" if "qps" in res else f"{res['replicas']} replicas")
    first = next(iter(res["by_policy"].values()))
    rules = first.get("rules") or first.get("search", {}).get("rules")
    head = (f"dvasim plan {args.config}: {what}, p{res['percentile']:g} <= {res['slo_ms']:g} ms, {res['seeds']} "
            f"seed{'s' if res['seeds'] > 1 else ''}; {Path(args.out)}/plan.json")
    return "\n".join([head, *( [f"  rules: {rules_text(rules)}"] if rules else []), *lines]) + "\n"
