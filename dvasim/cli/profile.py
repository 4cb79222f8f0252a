"""``dvasim profile``: measure a per-stage (or per-operator) latency table of a zoo model on this machine.

    dvasim profile --model NAME (--stages N | --cuts I,J,.. | --ratios A,B,.. | --per-op) --out FILE.csv
                   [--variant small|full] [--device cpu|cuda] [--batch-sizes 1,2,4,8] [--seq-lens 16,32,64]
                   [--modules KINDS] [--launch KINDS|none] [--slice-batch-size B] [--repeats N] [--warmup N]
                   [--threads N] [--seed N] [--max-foreign-load CORES] [--no-stats]

The argument parsing and the printing; the measuring is :mod:`dvasim.model.profiling.profiler`'s (its module
docstring says how). ``python -m dvasim.cli.profile ...`` is the same command. Bad input prints one line,
``dvasim profile: error: <field>: <fix>``, and exits with status 2, before anything is measured or written. The
limits: ``--threads`` 1..4 per logical CPU (at most 256), ``--seed`` 0..2**63-1, ``--batch-sizes`` 1..4096,
``--seq-lens`` up to the model's longest input, ``--repeats`` 1..10000 and ``--warmup`` 0..10000; ``--out`` a
``.csv`` file whose folder can be made. The table (and its side files) are written under temporary names and
renamed when complete.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

from dvasim.cli.common import error_line, max_threads
from dvasim.errors import DvasimError, check_out_dir
from dvasim.model.profiling.profiler import (
    DEFAULT_REPEATS,
    DEFAULT_THREADS,
    DEFAULT_WARMUP,
    LAUNCH_KINDS,
    _check_device,
    launch_path,
    profile_launch,
    profile_ops,
    profile_stages,
    save_launch,
    save_profile,
)

__all__ = ["cli_profile"]

MAX_BATCH_SIZE = 4096  # --batch-sizes
MAX_PASSES = 10_000  # --repeats, --warmup


class _ArgError(Exception):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field
        self.message = message


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage dump
        field = "arguments"
        for word in str(message).replace(",", " ").split():
            if word.startswith("--"):
                field = word.rstrip(":")
                break
        raise _ArgError(field, message)


def _int_list(text: str, field: str, example: str, top: int | None = None) -> list[int]:
    try:
        vals = [int(v) for v in str(text).split(",") if v.strip() != ""]
    except ValueError:
        vals = []
    if not vals or any(v < 1 or (top is not None and v > top) for v in vals):
        within = "positive integers" if top is None else f"integers in 1..{top}"
        raise _ArgError(field, f"must be a comma-separated list of {within}, e.g. {example}; got {text!r}")
    return sorted(set(vals))


def _build_parser() -> _Parser:
    p = _Parser(
        prog="dvasim profile",
        description="Measure a per-stage (or per-operator) latency table of a zoo model on this machine.",
    )
    p.add_argument("--model", required=True, help="zoo model name")
    p.add_argument("--variant", default="small", help="small (default) or full")
    p.add_argument("--stages", default=None, help="number of time-even stages (1..number of operators)")
    p.add_argument("--cuts", default=None, help="slice at these operator indices instead, e.g. 10,25")
    p.add_argument("--ratios", default=None, help="slice by time shares instead, e.g. 0.3,0.7")
    p.add_argument("--per-op", action="store_true", help="write a per-operator table (stage = operator index)")
    p.add_argument("--modules", default=None,
                   help="on cuda: the module kinds whose host launch cost goes to <out>.launch.csv (comma-separated "
                        "among eager,torchscript,cudagraph; default all three; the table is always the GPU time of "
                        "CUDA graph replays); on cpu: how the table's stages run, one of eager (default), "
                        "torchscript, cudagraph (the CPU stand-in graphs, a bucketed table)")
    p.add_argument("--launch", default=None,
                   help="the kinds for <out>.launch.csv, overriding --modules (comma-separated, or 'none'; "
                        "default on cpu: none)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--batch-sizes", default="1,2,4,8", help=f"comma-separated, 1..{MAX_BATCH_SIZE}, default 1,2,4,8")
    p.add_argument("--seq-lens", default=None, help="comma-separated sequence lengths (token models only)")
    p.add_argument("--slice-batch-size", default=None, help="batch size the slicing uses (default: smallest)")
    p.add_argument("--repeats", default=str(DEFAULT_REPEATS), help=f"timed passes per point (default {DEFAULT_REPEATS})")
    p.add_argument("--warmup", default=str(DEFAULT_WARMUP), help=f"untimed passes per point (default {DEFAULT_WARMUP})")
    p.add_argument("--threads", default=str(DEFAULT_THREADS),
                   help=f"torch intra-op threads (1..4 per logical CPU, at most 256; default {DEFAULT_THREADS})")
    p.add_argument("--seed", default="0", help="weight seed (0..2**63-1, default 0)")
    p.add_argument("--max-foreign-load", default=None,
                   help="re-measure a point if other processes used more than this many cores meanwhile")
    p.add_argument("--no-stats", action="store_true", help="do not write the <out>.stats.csv spread file")
    p.add_argument("--out", required=True, help="output CSV path")
    return p


def _parse_int(text, field: str, lo: int, what: str, hi: int | None = None) -> int:
    try:
        v = int(str(text))
    except ValueError:
        raise _ArgError(field, f"must be {what}, got {text!r}") from None
    if v < lo or (hi is not None and v > hi):
        raise _ArgError(field, f"must be {what}, got {text!r}")
    return v


# ----------------------------------------------------------------------------- checking the arguments
def _check_names(args, zoo) -> None:
    """The model, its variant and the device, by name."""
    if args.model not in zoo.MODEL_NAMES:
        raise _ArgError("--model", f"must be one of {', '.join(zoo.MODEL_NAMES)}; got {args.model!r}")
    if args.variant not in ("small", "full"):
        raise _ArgError("--variant", f"must be small or full; got {args.variant!r}")
    if args.device not in ("cpu", "cuda") and not str(args.device).startswith("cuda:"):
        raise _ArgError("--device", f"must be cpu or cuda; got {args.device!r}")


def _max_foreign_load(text) -> float | None:
    """``--max-foreign-load``: a number of cores >= 0, or ``None`` when not given."""
    if text is None:
        return None
    try:
        max_load = float(text)
    except ValueError:
        max_load = -1.0
    if not (max_load >= 0 and max_load != float("inf")):
        raise _ArgError("--max-foreign-load", f"must be a finite number of cores >= 0; got {text!r}")
    return max_load


def _grid_and_counts(args) -> dict:
    """The points to measure (batch sizes, lengths) and how (repeats, warm-up, threads, seed, machine load)."""
    from dvasim.workload.config import MAX_SEED

    top = max_threads()
    return {
        "bss": _int_list(args.batch_sizes, "--batch-sizes", "1,2,4,8", MAX_BATCH_SIZE),
        "sls": None if args.seq_lens is None else _int_list(args.seq_lens, "--seq-lens", "16,32,64"),
        "repeats": _parse_int(args.repeats, "--repeats", 1, f"an integer in 1..{MAX_PASSES}", MAX_PASSES),
        "warmup": _parse_int(args.warmup, "--warmup", 0, f"an integer in 0..{MAX_PASSES}", MAX_PASSES),
        "threads": _parse_int(args.threads, "--threads", 1,
                              f"an integer in 1..{top} (4 per logical CPU of this machine, at most 256)", top),
        "seed": _parse_int(args.seed, "--seed", 0, "an integer in 0..2**63-1", MAX_SEED),
        "max_load": _max_foreign_load(args.max_foreign_load),
    }


def _cuts_and_ratios(args) -> tuple[list[int] | None, list[float] | float | None]:
    """``--cuts`` as operator indices and ``--ratios`` as time shares (one share alone as a number)."""
    cuts = None
    if args.cuts is not None:
        try:
            cuts = [int(v) for v in args.cuts.split(",") if v.strip()]
        except ValueError:
            raise _ArgError("--cuts", f"must be comma-separated operator indices, e.g. 10,25; got {args.cuts!r}") from None
    ratios = None
    if args.ratios is not None:
        try:
            ratios = [float(v) for v in args.ratios.split(",") if v.strip()]
        except ValueError:
            raise _ArgError("--ratios", f"must be comma-separated positive numbers, e.g. 0.3,0.7; got {args.ratios!r}") from None
        if len(ratios) == 1:
            ratios = ratios[0]
    return cuts, ratios


def _slicing(args, bss: list[int]) -> dict:
    """How the model is sliced: exactly one of ``--stages``, ``--cuts``, ``--ratios`` (none with ``--per-op``),
    and the batch size the slicing uses."""
    n_given = sum(x is not None for x in (args.stages, args.cuts, args.ratios))
    if args.per_op and n_given:
        raise _ArgError("--per-op", "a per-operator table takes no --stages/--cuts/--ratios (slice it later)")
    if not args.per_op and n_given != 1:
        raise _ArgError("--stages", "give exactly one of --stages N, --cuts I,J,.. or --ratios A,B,.. (or --per-op)")
    stages = None if args.stages is None else _parse_int(args.stages, "--stages", 1, "an integer >= 1")
    cuts, ratios = _cuts_and_ratios(args)
    sbs = None if args.slice_batch_size is None else _parse_int(args.slice_batch_size, "--slice-batch-size", 1, "a positive integer")
    if sbs is not None and sbs not in bss:
        raise _ArgError("--slice-batch-size", f"must be one of --batch-sizes {bss}; got {sbs}")
    return {"stages": stages, "cuts": cuts, "ratios": ratios, "sbs": sbs}


def _out_path(args) -> Path:
    """``--out``: a ``.csv`` file (not a folder) whose folder exists or can be made."""
    out = Path(args.out)
    if out.suffix.lower() != ".csv":
        raise _ArgError("--out", f"must be a .csv path; got {args.out!r}")
    if out.is_dir():
        raise _ArgError("--out", f"{args.out!r} is a folder; give a file name such as table.csv")
    try:
        check_out_dir(out.parent, "--out")
    except DvasimError as e:
        raise _ArgError("--out", e.message) from None
    return out


def _named_kinds(args) -> tuple[list[str] | None, list[str]]:
    """The module kinds ``--modules`` names (``None`` when not given) and those ``--launch`` names."""
    kinds_given = None
    if args.modules is not None:
        kinds_given = [k.strip() for k in str(args.modules).split(",") if k.strip()]
        bad = [k for k in kinds_given if k not in LAUNCH_KINDS]
        if bad or not kinds_given:
            raise _ArgError("--modules", f"must be among {', '.join(LAUNCH_KINDS)} (comma-separated); "
                                         f"got {args.modules!r}")
    launch_kinds: list[str] = []
    if args.launch is not None:
        launch_kinds = [k.strip() for k in str(args.launch).split(",") if k.strip() and k.strip() != "none"]
        bad = [k for k in launch_kinds if k not in LAUNCH_KINDS]
        if bad:
            raise _ArgError("--launch", f"must be 'none' or among {', '.join(LAUNCH_KINDS)} (comma-separated); "
                                        f"got {args.launch!r}")
    return kinds_given, launch_kinds


def _table_and_launch_kinds(args, device: str, kinds_given, launch_kinds) -> tuple[str, list[str]]:
    """How the table's stages run and whose launch cost goes to the side file, on this device."""
    if device == "cpu":
        if kinds_given is not None and len(kinds_given) != 1:
            raise _ArgError("--modules", f"on cpu give one kind (how the table's stages run); got {args.modules!r}")
        table_kind = kinds_given[0] if kinds_given else "eager"
    else:  # a GPU: the table is GPU time (graphs); --modules says whose launch cost to time
        table_kind = "cudagraph"
        if args.launch is None:
            launch_kinds = list(kinds_given or LAUNCH_KINDS)
    return table_kind, launch_kinds


def _request(args) -> SimpleNamespace:
    """Every argument checked (in the order the errors are reported) and the model built."""
    from dvasim.model import zoo

    _check_names(args, zoo)
    grid = _grid_and_counts(args)
    slicing = _slicing(args, grid["bss"])
    out = _out_path(args)
    kinds_given, launch_kinds = _named_kinds(args)
    device = _check_device(args.device)
    table_kind, launch_kinds = _table_and_launch_kinds(args, device, kinds_given, launch_kinds)
    model = zoo.build(args.model, variant=args.variant, seed=grid["seed"])
    if grid["sls"] is not None and getattr(model, "input_kind", None) != "tokens":
        raise _ArgError("--seq-lens", f"only token models take sequence lengths; {args.model} takes images")
    longest = getattr(model, "max_seq_len", None)
    if grid["sls"] is not None and longest and max(grid["sls"]) > int(longest):
        raise _ArgError("--seq-lens", f"must be at most {longest} ({args.model}'s longest input); got {args.seq_lens!r}")
    return SimpleNamespace(**grid, **slicing, out=out, device=device, table_kind=table_kind,
                           launch_kinds=launch_kinds, model=model, per_op=args.per_op, stats=not args.no_stats)


# ----------------------------------------------------------------------------- measuring and printing
def _profile_and_save(r: SimpleNamespace, cmd: str):
    """Measure the table (and the launch costs), write them; returns (the table, what the launch side file
    adds to the printed line)."""
    if r.per_op:
        df = profile_ops(r.model, r.bss, r.sls, r.device, r.warmup, r.repeats, r.threads, seed=r.seed,
                         max_foreign_load=r.max_load, graphs=r.table_kind == "cudagraph")
    else:
        df = profile_stages(
            r.model, r.stages, r.bss, r.sls, r.device, r.warmup, r.repeats, r.threads, cuts=r.cuts, ratios=r.ratios,
            slice_batch_size=r.sbs, seed=r.seed, max_foreign_load=r.max_load, modules=r.table_kind,
        )
    df.attrs["provenance"]["command"] = cmd
    table = save_profile(df, r.out, stats=r.stats)
    if r.launch_kinds and not r.per_op:
        ldf = profile_launch(r.model, df.attrs["bounds"], r.bss, r.sls, r.device, r.launch_kinds, r.warmup,
                             r.repeats, seed=r.seed)
        ldf.attrs["provenance"]["command"] = cmd
        save_launch(ldf, launch_path(r.out))
        return table, f"; launch costs of {','.join(r.launch_kinds)} in {launch_path(r.out)}"
    return table, ""


def _summary(out: Path, table, per_op: bool, wrote_launch: str) -> str:
    """The one line ``dvasim profile`` prints when it wrote a table."""
    prov = table.provenance
    return (
        f"wrote {out} ({table.n_stages} {'operators' if per_op else 'stages'}, "
        f"{len(table.batch_sizes)} batch sizes{'' if table.seq_lens is None else f' x {len(table.seq_lens)} seq_lens'}, "
        f"{prov.get('profiling seconds', '?')} s"
        + (f"; {prov['slicing']}" if "slicing" in prov else "")
        + wrote_launch
        + ")"
    )


def cli_profile(argv: Sequence[str] | None = None) -> int:
    """``dvasim profile ...``: returns the exit status (0 ok, 2 bad arguments)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            args = _build_parser().parse_args(argv)
        except SystemExit as exc:  # --help
            return int(exc.code or 0)
        r = _request(args)
        table, wrote_launch = _profile_and_save(r, "dvasim profile " + " ".join(argv))
    except (_ArgError, DvasimError) as exc:
        return error_line(f"{exc.field}: {exc.message}", "profile")
    print(_summary(r.out, table, r.per_op, wrote_launch))
    return 0


if __name__ == "__main__":  # ``python -m dvasim.cli.profile ...`` == ``dvasim profile ...``
    sys.exit(cli_profile())
