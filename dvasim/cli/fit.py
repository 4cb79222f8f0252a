"""``dvasim fit DIR... --out engine.toml``: the simulator's engine fitted to replay folders
(:func:`dvasim.fitting.fit.fit`), written as an engine file for ``dvasim run --engine``; with ``--table``, every
folder simulated with the fitted engine and compared with its own queries. Bad input prints one line and exits
with status 2; everything is checked before the engine file is written (``--out``, ``--table``, every replay folder
and, with ``--table``, every folder's simulation), and the file is written under a temporary name and renamed when
complete, so an error leaves nothing behind.

Every fitted value is printed with its 95% interval (``--bootstrap N`` resamples of the executions, 200 by
default, 0 for none; :func:`dvasim.fitting.fit.fit_intervals` says how each is made); the engine file keeps the
point values only, and ``--json FILE`` writes the whole fit, intervals included.

On real Triton server runs (``dvasim triton`` folders) it fits that server's serving stack instead and writes a
stack file (``--out NAME.toml``; ``dvasim run CONFIG --stack NAME.toml``): :mod:`dvasim.fitting.triton_fit`."""

from __future__ import annotations

from pathlib import Path

from dvasim.cli.common import error_line
from dvasim.errors import ConfigError, DvasimError, OneLineParser

MAX_HOST_CORES = 1024  # --host-cores: the launching cores of a replay's host
N_BOOT = 200  # --bootstrap: resamples of the executions (the fit with them: 3.2 s on the two H100 test replays)
MAX_BOOT = 100_000


def fit_parser() -> OneLineParser:
    """``dvasim fit``'s arguments."""
    p = OneLineParser(prog="dvasim fit", description="fit the simulator's engine to replay output folders")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="replay folders (config.toml, queries.csv, executions.csv), or "
                   "dvasim triton folders (then --out is a stack file)")
    p.add_argument("--out", required=True, help="the engine file to write, e.g. engine.toml")
    p.add_argument("--launch-table", default=None, help="a profiled launch table; then only launch_scale is fitted")
    p.add_argument("--gpu-table", default=None,
                   help="a per-stage GPU-time table (CUDA graph replays) for the device model, when the replays' "
                        "table timed host-bound launches")
    p.add_argument("--modules", default=None, help="module kind the replays ran (default: from their configs)")
    p.add_argument("--host-cores", default="16",
                   help=f"launching cores of the replay's host (not fitted; 1..{MAX_HOST_CORES})")
    p.add_argument("--operators", default=None, metavar="N,N,...",
                   help="the operators in each replayed stage, for the launch law (default: the cuts of --table's "
                        "'# slicing:' line when it has them, else the cut the replays recorded ([model] bounds), else "
                        "their [model] resolved today)")
    p.add_argument("--fit-cores", action="store_true",
                   help="fit host.cores from launches that overlapped others (needs DVABatch or multi-instance replays)")
    p.add_argument("--bootstrap", type=int, default=N_BOOT, metavar="N",
                   help=f"resamples of the executions for each fitted value's 95%% interval (0..{MAX_BOOT}; default "
                        f"{N_BOOT}; 0: no intervals); printed, and in --json, never in the engine file")
    p.add_argument("--json", default=None, metavar="FILE.json",
                   help="also write the whole fit as JSON: the engine, the evidence and every value's interval")
    p.add_argument("--table", default=None,
                   help="the stage table the replays' policy decided with: then every folder is simulated with the "
                        "fitted engine and compared with its own queries (printed, and kept in the file's [fit])")
    return p


def host_cores(args) -> int:
    """``--host-cores``, an integer >= 1."""
    try:
        cores = int(args.host_cores)
    except ValueError:
        cores = 0
    if not 1 <= cores <= MAX_HOST_CORES:
        raise ConfigError("--host-cores", f"must be an integer in 1..{MAX_HOST_CORES}, got {args.host_cores!r}")
    return cores


def operators_of(args, table) -> tuple[list[int] | None, str | None]:
    """The operators in each stage for the launch law and where they come from: ``--operators``, else
    ``table``'s lines (``--table``), else ``(None, None)`` (the fit reads the replays' models)."""
    from dvasim.fitting.fit import table_operators

    ops = ops_src = None
    if args.operators is not None:
        ops_src = "--operators"
        try:
            ops = [int(x) for x in args.operators.split(",") if x.strip()]
        except ValueError:
            ops = []
        if not ops or min(ops) < 1:
            raise ConfigError("--operators", f"must be comma-separated counts >= 1, e.g. 39,39,40,39; got "
                                             f"{args.operators!r}")
    elif table is not None:
        ops = table_operators(table)
        ops_src = f"--table's '# operators:' and '# slicing:' lines ({args.table})" if ops else None
    return ops, ops_src


def table_of(args):
    """``--table`` found and read: ``(its path, its LatencyTable)``, or ``None`` without one; a bad one is an
    error naming --table."""
    if args.table is None:
        return None
    from dvasim.errors import TableError
    from dvasim.model.table import LatencyTable
    from dvasim.schema import find_file

    path = find_file(args.table, None, "--table")
    try:
        return path, LatencyTable.load(path)
    except TableError as e:
        raise ConfigError("--table", e.message) from None


def self_checked(res: dict, runs: list[dict], table_path) -> list[dict]:
    """With ``--table``: every folder simulated with the fitted engine (written to a scratch file, not ``--out``)
    against its own queries; the errors go into ``res["fit"]``. A folder that cannot be simulated is an error
    naming --table and the folder."""
    import tempfile
    from pathlib import Path

    from dvasim.fitting.check import self_check
    from dvasim.fitting.fit import write_engine
    from dvasim.fitting.logs import find_log

    for r in runs:
        if find_log(Path(r["dir"]), "config.toml") is None:
            raise ConfigError("--table", f"{r['dir']}: has no config.toml (or config.toml.gz); the self-check "
                                         "simulates each folder's config.toml")
    with tempfile.TemporaryDirectory(prefix="dvasim-fit-") as tmp:
        engine = write_engine(res, Path(tmp) / "engine.toml")
        checks = []
        for r in runs:
            try:
                checks += self_check([r["dir"]], table_path, engine)
            except DvasimError as e:
                raise ConfigError("--table", f"{r['dir']} simulated on {table_path}: {e}") from None
    for k in ("throughput_qps", "mean_latency_ms", "p99_latency_ms"):
        res["fit"][f"self_check_err_{k}"] = [round(c[f"err_{k}"], 4) for c in checks]
    return checks


def fit_command(args) -> tuple[dict, list[dict] | None, object]:
    """Check everything (``--out``, ``--host-cores``, ``--table``, ``--operators``, every folder), fit, self-check
    with ``--table``, and only then write the engine file; returns ``(fit, self-checks, path written)``."""
    from dvasim.fitting.fit import check_engine_path, fit, write_engine
    from dvasim.fitting.logs import read_replay

    out = check_engine_path(args.out)
    json_out = _json_path(args)
    cores = host_cores(args)
    table_path, table = table_of(args) or (None, None)
    ops, ops_src = operators_of(args, table)
    runs = [read_replay(d) for d in args.dirs]  # every folder read and checked before any fitting
    n = int(runs[0]["executions"]["stage"].max()) + 1
    if table is not None and table.n_stages != n:
        raise ConfigError("--table", f"{table_path} has {table.n_stages} stages; the replays have {n}: give the "
                                     "table their policy decided with")
    res = fit(runs, launch_table=args.launch_table, modules=args.modules, host_cores=cores,
              gpu_table=args.gpu_table, fit_cores_from_overlap=args.fit_cores, operators=ops,
              operators_source=ops_src, n_boot=args.bootstrap)
    checks = self_checked(res, runs, table_path) if table is not None else None
    if json_out is None:
        return res, checks, write_engine(res, out)
    return res, checks, _write_both(res, out, json_out)


def _write_both(res: dict, out, json_out):
    """The engine file and ``--json`` together: both renamed into place only when both are written whole."""
    import json

    from dvasim.fitting.fit import check_finite, engine_toml, portable
    from dvasim.outputs import output_error, write_whole
    from dvasim.reporting.result import strict_json

    check_finite(res)
    engine_text = engine_toml(portable(res, out.parent))  # its paths relative to the file, as write_engine's
    json_text = json.dumps(strict_json(res), indent=2, allow_nan=False) + "\n"
    for folder in {out.parent, json_out.parent}:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise output_error(folder, e) from None
    write_whole({out: lambda t: t.write_text(engine_text, encoding="utf-8"),
                 json_out: lambda t: t.write_text(json_text, encoding="utf-8")})
    return out


def _json_path(args):
    """``--json`` checked before any work (a file whose folder can be made), and ``--bootstrap``'s range."""
    from pathlib import Path

    from dvasim.errors import check_out_dir

    if not 0 <= args.bootstrap <= MAX_BOOT:
        raise ConfigError("--bootstrap", f"must be an integer in 0..{MAX_BOOT:,}, got {args.bootstrap}")
    if args.json is None:
        return None
    p = Path(args.json)
    if not str(args.json).strip() or p.is_dir() or (p.exists() and not p.is_file()):
        raise ConfigError("--json", f"{args.json!r} is not a regular file's name; give e.g. fit.json")
    if p.resolve() == Path(args.out).resolve():
        raise ConfigError("--json", f"{args.json!r} is --out's engine file; give another name, e.g. fit.json")
    check_out_dir(p.parent, "--json")
    return p


def cli_fit(argv=None) -> int:
    try:
        args = fit_parser().parse_args(argv)
        from dvasim.fitting.triton_fit import is_triton_folder

        triton = [is_triton_folder(d) for d in args.dirs]
        if any(triton):
            return fit_triton(args, triton)
        res, checks, out = fit_command(args)
    except DvasimError as e:
        return error_line(e)
    print_fit(res, out, checks)
    return 0


def fit_triton(args, triton: list[bool]) -> int:
    """``dvasim fit`` on real Triton server runs (``dvasim triton`` folders): the stack file ``--out`` (a
    ``.toml``: ``dvasim run CONFIG --stack FILE.toml``); see :mod:`dvasim.fitting.triton_fit`."""
    from dvasim.fitting.triton_fit import fit_stack, write_stack

    if not all(triton):
        bad = args.dirs[triton.index(False)]
        raise ConfigError("DIR", f"{bad} is not a dvasim triton folder, but the others are: fit real-server runs "
                                 "and replays apart")
    if not str(args.out).endswith(".toml"):
        raise ConfigError("--out", f"{args.out}: a stack file ends in .toml (dvasim run --stack FILE.toml)")
    stack, report = fit_stack(args.dirs, name=Path(args.out).stem)
    out = write_stack(stack, report, args.out)
    print(f"dvasim fit: {len(args.dirs)} real Triton runs, {report['n_executions']} executions, "
          f"{report['n_queries']} queries -> stack file {out}")
    print(f"  entry {report['entry_ms'][0]:.3f} + {report['entry_ms'][1]:.4f} b ms (rmse "
          f"{report['entry_rmse_ms']:.3f}), exit {report['exit_ms'][0]:.3f} + {report['exit_ms'][1]:.4f} b ms, client "
          f"path p50 "
          f"{report['client_path_ms']['p50']:.3f} / p99 {report['client_path_ms']['p99']:.3f} ms; release "
          f"{stack.triton_release}")
    print(f"  predict: dvasim run CONFIG --out DIR --stack {out}")
    return 0


def print_fit(res: dict, out, checks: list[dict] | None) -> None:
    """What ``dvasim fit`` prints: the folders and executions fitted, the launch and copy laws, and each folder's
    self-check (with ``--table``)."""
    f = res["fit"]
    h = res["engine"]["host"]
    print(f"dvasim fit: {len(f['folders'])} folders, {f['n_executions']} executions ({f['n_alone']} alone) of "
          f"{f['model']} ({f['modules']}, {f['stages']} stages) -> {out}")
    if "launch_per_op_ms" in h:
        print("  launch ms per stage fitted: " + ", ".join(f"{a:.3f}+{c:.4f}b" for a, c in
                                                           zip(f["launch_ms_by_stage"], f["launch_per_row_ms_by_stage"])))
        print(f"  launch law (any slicing): {h['launch_fixed_ms']:.3f} + {h['launch_per_op_ms']:.4f} * ops + "
              f"{h['launch_model_per_row_ms']:.4f} * ops/sum(ops) * b ms; stages of {f['stage_operators']} "
              f"operators: " + ", ".join(f"{x:+.1%}" for x in f["launch_law_rel_err_by_stage_b1"]) + " at batch 1")
        print(f"    {f['launch_law_fit']}")
    else:
        print(f"  launch_scale: {h['launch_scale']:.3f} on {h['launch_table']}")
    print("  copy ms per stage fitted:   " + ", ".join(f"{a:.3f}+{c:.4f}b" for a, c in
                                                       zip(f["copy_ms_by_stage"], f["copy_per_row_ms_by_stage"])))
    print(f"  copies (any slicing): {h['copy_ms']:.3f} + {h['copy_per_row_ms']:.4f}b ms per launch; the first stage "
          f"{h.get('first_copy_ms', 0.0):+.3f} {h.get('first_copy_per_row_ms', 0.0):+.4f}b more (its inputs)")
    print(f"  launch_overhead_ms {res['engine']['launch_overhead_ms']:.3f}, service_cv {res['engine']['service_cv']:.3f}")
    if "not_identified" in f:
        print(f"  not identified: {f['not_identified']}")
    if "identified_by" in f:
        import json

        ident = json.loads(f["identified_by"])
        print("  identified by: " + "; ".join(f"{k}: " + (", ".join(f"{d} ({n})" for d, n in v.items()) or "none")
                                              for k, v in ident.items()))
    for c in checks or []:
        print(f"  {c['folder']}: simulated vs real throughput {c['err_throughput_qps']:+.1%}, mean "
              f"{c['err_mean_latency_ms']:+.1%}, p99 {c['err_p99_latency_ms']:+.1%}")
    if "intervals" in res:
        print_intervals(res["intervals"])


def print_intervals(iv: dict) -> None:
    """Every fitted value with its interval, one a line (``engine.host.launch_per_op_ms  0.06323 [0.0334,
    0.06930]``), the method after each that is not the bootstrap."""
    from dvasim.fitting.fit import BOOT_METHOD
    from dvasim.reporting.intervals import Interval

    about = iv["about"]
    print(f"  intervals ({about['confidence']:.0%}; {BOOT_METHOD}, {about['n_boot']} resamples seeded "
          f"{about['seed']}, unless said):")
    rows = []

    def walk(d, path):
        for k, v in d.items():
            if k == "about":
                continue
            if isinstance(v, list):
                rows.extend((f"{path}{k}[{i}]", x) for i, x in enumerate(v))
            elif "method" in v:
                rows.append((f"{path}{k}", v))
            else:
                walk(v, f"{path}{k}.")

    walk(iv, "")
    width = max((len(name) for name, _ in rows), default=0)
    for name, v in rows:
        x = Interval(**v)
        how = "" if x.method == BOOT_METHOD else f"  ({x.method})"
        print(f"    {name:<{width}}  {x}{how}")
    print(f"    not given: {about['not_given']}")

