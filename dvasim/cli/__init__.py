"""The ``dvasim`` command line.

    dvasim run CONFIG.toml --out DIR [--set section.key=value ...] [--stack NAME] [--engine ENGINE.toml]
    dvasim policies [NAME]                               every policy a config can name, with its parameters
    dvasim stacks [NAME]                                 every serving stack, its numbers and their provenance
    dvasim compare [--models ...] [--policies ...] [--queries N] [--workers W] [--out DIR] [--stack NAME]
    dvasim capacity CONFIG.toml --slo-ms MS --out DIR [--stack NAME] [--engine ENGINE.toml]
    dvasim sweep SWEEP.toml --out DIR [--stack NAME] [--engine ENGINE.toml]
    dvasim profile --model NAME --stages N --device cpu|cuda --batch-sizes 1,2,4 --out FILE.csv   (needs torch)
    dvasim replay CONFIG.toml --out DIR [--loadgen]       real torch execution of the config (needs torch)
    dvasim validate CONFIG.toml --out DIR [--repeats K]   simulator vs replay: DIR/fidelity.json (needs torch)
    dvasim fit DIR... --out engine.toml                  the engine fitted to replay folders (dvasim run --engine)

Errors a user can fix print one line (``dvasim: error: <field>: <what is allowed>``) and exit with status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dvasim.errors import DvasimError, OneLineParser, check_out_dir


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def cmd_policies(args) -> int:
    """``dvasim policies [NAME]``: the registered policies, their aliases and parameters (help and default)."""
    import json
    import textwrap

    from dvasim.errors import ConfigError
    from dvasim.policies.base import canonical_name, policy_names, policy_reference

    if args.name is not None and canonical_name(args.name) not in policy_names():
        raise ConfigError("policy", f"unknown policy {args.name!r}; allowed: {', '.join(policy_names())}")
    names = policy_names() if args.name is None else [canonical_name(args.name)]
    refs = [policy_reference(n) for n in names]
    if args.json:
        print(json.dumps(refs, indent=1, default=str))
        return 0
    for ref in refs:
        alias = f" (also: {', '.join(ref['aliases'])})" if ref["aliases"] else ""
        print(f"{ref['name']}{alias}")
        summary = ref["summary"] if args.name is not None else ref["summary"].split(". ")[0].rstrip(".") + "."
        print(textwrap.fill(summary, 116, initial_indent="    ", subsequent_indent="    "))
        for key, p in ref["params"].items():
            default = "" if p["default"] is None else f" [{p['default']}]"
            print(textwrap.fill(f"{key}{default}: {p['help']}", 116, initial_indent="      ",
                                subsequent_indent="        "))
    return 0


def cmd_stacks(args) -> int:
    """``dvasim stacks [NAME]``: the serving stacks a run can name (``--stack``, ``[server] stack``); for one
    stack every parameter with its value, its meaning and its provenance."""
    import json
    import textwrap

    from dvasim.server.resolve import stack_by_name
    from dvasim.server.stacks import FIELD_HELP, STACKS

    if args.name is not None:
        stack_by_name(args.name, "stacks")
    names = list(STACKS) if args.name is None else [args.name]
    refs = [stack_reference(STACKS[n]) for n in names]
    if args.json:
        print(json.dumps(refs, indent=1, default=str))
        return 0
    width = max(len(n) for n in STACKS)
    for ref in refs:
        if args.name is None:
            first = ref["summary"].split(". ")[0].rstrip(".")
            print(textwrap.fill(f"{ref['name']:<{width}}  {first}", 116, subsequent_indent=" " * (width + 2)))
            continue
        print(ref["name"])
        print(textwrap.fill(ref["summary"], 116, initial_indent="    ", subsequent_indent="    "))
        if not ref["parameters"]:
            print(f"    adds no host cost: {ref['sources'].get('all', '')}")
            continue
        for key, p in ref["parameters"].items():
            print(textwrap.fill(f"{key} = {_fmt(p['value'])}: {FIELD_HELP.get(key, '')}", 116, initial_indent="  ",
                                subsequent_indent="      "))
            print(textwrap.fill(f"source: {p['source']}", 116, initial_indent="      ", subsequent_indent="        "))
    if args.name is None:
        print("\n`dvasim stacks NAME` prints a stack's every number with its provenance; a run names one with "
              "--stack NAME or [server] stack = NAME.")
    return 0


def stack_reference(stack) -> dict:
    """One stack as ``dvasim stacks`` shows it: name, summary, and (unless it adds nothing) every parameter
    with its value (``"inf"`` for an unlimited bandwidth) and provenance (``ServingStack.sources``; ``not given``
    where the stack names none)."""
    import math

    params = {} if stack.adds_nothing else {
        k: {"value": "inf" if isinstance(v, float) and math.isinf(v) else v,
            "source": stack.sources.get(k, "not given")} for k, v in stack.parameters().items()}
    return {"name": stack.name, "summary": stack.summary, "adds_nothing": stack.adds_nothing,
            "parameters": params, "sources": dict(stack.sources)}


def check_stack(name) -> None:
    """A ``--stack`` checked before any work (one line naming --stack, exit 2)."""
    if name is not None:
        from dvasim.server.resolve import stack_by_name

        stack_by_name(name, "--stack")


def print_summary(summary: dict, file=sys.stdout) -> None:
    keys = [
        "policy", "stack", "n_queries", "n_completed", "offered_qps", "throughput_qps", "mean_latency_ms", "p50_latency_ms",
        "p90_latency_ms", "p95_latency_ms", "p99_latency_ms", "qos_target_ms", "qos_violation_rate",
        "mean_exit_batch_size", "n_batches", "n_stretch", "n_split", "device_busy_fraction", "sim_queries_per_wall_s",
        "stable", "stability_reason",
    ]
    width = max(len(k) for k in keys)
    for k in keys:
        if k in summary:
            print(f"  {k:<{width}}  {_fmt(summary[k])}", file=file)


def cmd_run(args) -> int:
    import warnings

    from dvasim.api import run, write_outputs
    from dvasim.errors import IncompleteRunWarning

    check_stack(args.stack)
    check_out_dir(args.out)
    with warnings.catch_warnings():  # an incomplete run is reported below, as an error line
        warnings.simplefilter("ignore", IncompleteRunWarning)
        # records stream to queries.parquet as the run goes: memory stays bounded whatever its length
        result = run(args.config, overrides=args.set, progress=args.progress or None, engine=args.engine,
                     records=Path(args.out) / "queries.parquet", timeline=args.timeline, stack=args.stack)
    out = write_outputs(result, args.out, figure=not args.no_figure, csv=args.csv)
    print(f"dvasim run {args.config}: results in {out}/")
    print_summary(result.summary)
    if result.stuck:
        done = result.summary["n_completed"]
        print(f"dvasim: error: run incomplete ({done} of {result.summary['n_queries']} queries finished; all "
              f"records kept in {out}/queries.parquet): {result.stuck}", file=sys.stderr)
        return 1
    return 0


def cmd_sweep(args) -> int:
    from dvasim.studies.sweep import sweep

    if args.workers is not None and args.workers < 1:
        print("dvasim sweep: error: --workers must be >= 1", file=sys.stderr)
        return 2
    check_stack(args.stack)
    check_out_dir(args.out)
    table = sweep(args.sweep, args.out, workers=args.workers, dask=args.dask, figure=not args.no_figure,
                  stack=args.stack, engine=args.engine)
    stuck = int((table["stuck"] != "").sum()) if "stuck" in table else 0
    print(f"dvasim sweep {args.sweep}: {len(table)} runs; results in {args.out}/results.csv, results.parquet"
          + ("" if args.no_figure else ", latency_vs_load.png"))
    if stuck:
        print(f"dvasim: error: {stuck} runs did not finish every query (column 'stuck' says where)", file=sys.stderr)
        return 1
    return 0


def cmd_capacity(args) -> int:
    import json

    from dvasim.studies.capacity import capacity

    check_stack(args.stack)
    check_out_dir(args.out)

    def show(p: dict) -> None:
        print(f"  {p['rate_qps']:10.2f} qps  n={p['n_queries']:<6} slow {p['slow_fraction']:.4f}  "
              f"{'within' if p['within_slo'] else 'over  '} ({p['decided_by']})", flush=True)

    res = capacity(args.config, args.slo_ms, percentile=args.percentile, overrides=args.set,
                   confidence=args.confidence, resolution=args.resolution, lo=args.lo, hi=args.hi,
                   max_queries=args.max_queries, progress=show, stack=args.stack, engine=args.engine)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "capacity.json").write_text(json.dumps(res, indent=2) + "\n")
    print(f"dvasim capacity {args.config} [stack: {res.get('stack')}]: {res['capacity_qps']:.2f} qps with "
          f"p{args.percentile:g} <= "
          f"{args.slo_ms:g} ms (resolution {res['resolution'] if res['resolution'] is not None else float('nan'):.1%}"
          f", {res['n_probes']} probes); {out}/capacity.json")
    if not res["top_exceeded"]:
        print(f"dvasim: warning: {res['note']}", file=sys.stderr)
    return 0


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
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a config value (repeatable); the value is read as TOML")
    p.add_argument("--no-figure", action="store_true", help="do not write latency.png")


def version() -> str:
    from importlib import metadata

    try:
        return metadata.version("dvasim")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree without install
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("--version", "-V"):
        print(f"dvasim {version()}")
        return 0
    if argv and argv[0] == "compare":
        from dvasim.studies.compare import main as compare_main

        try:
            return compare_main(argv[1:])
        except DvasimError as e:
            print(f"dvasim: error: {e}", file=sys.stderr)
            return 2
    if argv and argv[0] == "fit":
        from dvasim.fitting.fit import cli_fit

        return cli_fit(argv[1:])
    if argv and argv[0] == "profile":
        try:
            from dvasim.model.profiling.profiler import cli_profile
        except ImportError as e:
            print(f"dvasim profile: error: needs torch ({e}); install the replay extra: pip install 'dvasim[replay]'",
                  file=sys.stderr)
            return 2
        return cli_profile(argv[1:])
    if argv and argv[0] in ("replay", "validate"):
        try:
            from dvasim.cli.replay import cli_replay, cli_validate
        except ImportError as e:
            print(f"dvasim {argv[0]}: error: needs torch ({e}); install the replay extra: pip install 'dvasim[replay]'",
                  file=sys.stderr)
            return 2
        return (cli_replay if argv[0] == "replay" else cli_validate)(argv[1:])
    parser = OneLineParser(prog="dvasim", description=__doc__.split("\n")[0])
    parser.add_argument("--version", "-V", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="simulate one config")
    add_config_arguments(p, "TOML config file")
    p.add_argument("--progress", action="store_true", help="show a progress bar (on a terminal)")
    p.add_argument("--csv", action=argparse.BooleanOptionalAction, default=None,
                   help="also write queries.csv (default: for runs of at most 100,000 queries; queries.parquet "
                        "is always written)")
    add_stack_arguments(p)
    p.add_argument("--timeline", type=int, nargs="?", const=20_000, default=0, metavar="N",
                   help="also write the first N stage executions (default 20,000) as timeline.json (open it in "
                        "https://ui.perfetto.dev or chrome://tracing) and a Gantt chart timeline.png")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("capacity", help="the highest offered rate that meets a latency SLO (bracketing and "
                                        "bisection, each point with enough queries for a confident percentile)")
    p.add_argument("config", help="TOML config with [workload] kind = \"poisson\" or \"uniform\"")
    p.add_argument("--slo-ms", type=float, required=True, help="the latency SLO (ms)")
    p.add_argument("--percentile", type=float, default=99.0, help="the percentile the SLO bounds (default 99)")
    p.add_argument("--out", required=True, help="output directory (capacity.json)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE", help="override a config key")
    p.add_argument("--confidence", type=float, default=0.95, help="confidence of each probe's verdict (0.95)")
    p.add_argument("--resolution", type=float, default=0.02, help="stop when hi/lo - 1 is at most this (0.02)")
    p.add_argument("--lo", type=float, default=None, help="bottom of the first bracket (qps, default 1)")
    p.add_argument("--hi", type=float, default=None, help="top of the first bracket (qps, default: twice the "
                                                          "table's throughput bound)")
    p.add_argument("--max-queries", type=int, default=64_000, help="most queries in one probe (64,000)")
    add_stack_arguments(p, every=True)
    p.set_defaults(func=cmd_capacity)
    p = sub.add_parser("sweep", help="many runs of one config with keys changed (grid, random draws, seeds), in "
                                     "parallel or on a Dask cluster; resumable")
    p.add_argument("sweep", help="sweep file (TOML): base = CONFIG, [grid], [random], [seeds]; see dvasim.studies.sweep")
    p.add_argument("--out", required=True, help="output directory (runs/ cache, results.csv/.parquet, figure)")
    p.add_argument("--workers", type=int, default=None, help="local processes (default: one per core; 1 = serial)")
    p.add_argument("--dask", metavar="tcp://HOST:PORT", default=None, help="run on this Dask scheduler instead")
    p.add_argument("--no-figure", action="store_true", help="skip latency_vs_load.png")
    add_stack_arguments(p, every=True)
    p.set_defaults(func=cmd_sweep)
    p = sub.add_parser("policies", help="every batching policy a config can name, with its parameters")
    p.add_argument("name", nargs="?", default=None, help="one policy (or alias): its whole reference")
    p.add_argument("--json", action="store_true", help="as JSON")
    p.set_defaults(func=cmd_policies)
    p = sub.add_parser("stacks", help="every serving stack a run can name (--stack), with its numbers and their "
                                      "provenance")
    p.add_argument("name", nargs="?", default=None, help="one stack: every parameter, its value and its source")
    p.add_argument("--json", action="store_true", help="as JSON")
    p.set_defaults(func=cmd_stacks)
    sub.add_parser("compare", help="ZeroBatch / DelayBatch / DVABatch on the six models (paper Figs 14, 16), "
                                   "with Triton x2 and DVABatch ablations")
    sub.add_parser("fit", help="fit the simulator's engine to replay folders: dvasim fit DIR... --out engine.toml")
    sub.add_parser("profile", help="profile a model's stages into a latency table (needs torch); see dvasim profile -h")
    sub.add_parser("replay", help="replay a config on real torch execution (needs torch); see dvasim replay -h")
    sub.add_parser("validate", help="simulate and replay a config, write fidelity.json (needs torch)")
    try:
        args = parser.parse_args(argv)
        return args.func(args)
    except DvasimError as e:
        print(f"dvasim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dvasim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
