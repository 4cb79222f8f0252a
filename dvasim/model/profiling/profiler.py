"""Measure per-operator and per-stage latency tables of a zoo model (``dvasim profile``, whose arguments and
printing are :mod:`dvasim.cli.profile`).

Method
------
For every (batch size[, sequence length]) point the profiler builds the model's example input and runs
``warmup`` untimed passes followed by ``repeats`` timed passes. A *pass* runs the whole model once, one
unit (operator, or stage module) at a time, and timestamps every unit, so each unit is timed in the
context it really runs in (caches holding its predecessor's output). The table records the **median** over
the timed passes; the spread (10th/90th percentiles, min) goes to a side file ``<table>.stats.csv``
because the table format has only ``latency_ms``.

* CPU: a monotonic clock (:func:`time.perf_counter_ns`) around each unit. Intra-op threads are set with
  :func:`torch.set_num_threads` (default **1**, the setting the replay's executor threads use, so one
  stage execution occupies one core and two can co-run on a 2-core machine) and restored afterwards.
* CUDA (and ``modules = "cudagraph"`` anywhere): **GPU time**. Each unit (stage, or with ``--per-op`` each
  operator on the carry its predecessors produced) is captured alone as a CUDA graph, and a pass replays it
  ``GRAPH_REPLAYS`` times back to back between two CUDA events (the per-replay mean); the table holds the
  median over passes (``# timer: CUDA graph replays between CUDA events (GPU time, no host launch cost)``).
  Timing eagerly launched units between events, as this profiler once did, measures the host's launch gaps
  instead: ResNet152's operators summed to 19.6 ms at batch 1 where its GPU time is 2.6 ms. A graph-timed table
  of a token model says ``# length buckets: true``: the replay pads each input up to the next profiled length
  and runs that length's graph, and the simulator pads the same way (:meth:`LatencyTable.bucket`).
  Every capture and timing call goes through one object (:func:`dvasim.model.stages.graphs.graph_ops`: the replay's ``CudaOps``, or on
  the CPU the stand-in ``CpuGraphs`` with a wall clock), so this path runs in the CPU tests too.
* The host's launch cost (:func:`profile_launch`, ``dvasim profile --device cuda`` writes it by default, or
  ``--launch eager,torchscript,cudagraph``): per module kind, stage, batch size (and length), the host wall time
  from the call until it returns, before synchronising (median over repeats), in the side file
  ``<table stem>.launch.csv`` with columns ``modules,stage,batch_size,seq_len,launch_ms`` (``seq_len`` empty
  for image models) after ``# key: value`` provenance lines; :class:`dvasim.server.host.LaunchTable` reads it.

Stage tables (:func:`profile_stages`) slice the model first (time-even from a per-operator profile at a
reference batch size, or at given cuts/ratios; see :mod:`dvasim.model.slicing`) and then time the
real stage modules, since a stage's time is not exactly the sum of its operators' times.

Every table carries its provenance: device name, torch version, threads, warm-up, repeats, timer, date,
model and variant, and (for stage tables) the slicing.
"""

from __future__ import annotations

import datetime as _dt
import functools
import math
import os
import platform
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from dvasim.errors import ConfigError
from dvasim.model.slicing import (
    balance,
    format_slicing,
    reference_seq_len,
    slice_at,
    slice_even,
    slice_ratios,
)

__all__ = [
    "profile_ops",
    "profile_stages",
    "to_table",
    "save_profile",
    "device_name",
    "CpuMonitor",
    "DEFAULT_WARMUP",
    "DEFAULT_REPEATS",
    "DEFAULT_THREADS",
]

DEFAULT_WARMUP = 3
DEFAULT_REPEATS = 10
DEFAULT_THREADS = 1
TABLE_COLUMNS = ("stage", "batch_size", "latency_ms", "seq_len")


# ----------------------------------------------------------------------------- helpers
def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - depends on the install
        raise ConfigError("device", "profiling needs torch: install the replay extra (pip install -e '.[replay]')") from None
    return torch


def cpu_model_name() -> str:
    """The CPU model from /proc/cpuinfo (Linux), else :func:`platform.processor`."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: str = "cpu") -> str:
    """Human-readable device name: the CPU model with its logical core count, or the CUDA device name."""
    if str(device).startswith("cuda"):
        torch = _torch()
        idx = torch.device(device).index
        return torch.cuda.get_device_name(0 if idx is None else idx)
    return f"{cpu_model_name()} ({os.cpu_count()} logical cores)"


def _check_device(device: str) -> str:
    dev = str(device)
    if dev == "cpu":
        return dev
    if dev == "cuda" or dev.startswith("cuda:"):
        torch = _torch()
        if not torch.cuda.is_available():
            raise ConfigError("--device", "cuda requested but torch.cuda.is_available() is False; use cpu")
        return dev
    raise ConfigError("--device", f"must be cpu or cuda, got {device!r}")


def _to_device(obj, device):
    torch = _torch()
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, tuple):
        return tuple(_to_device(o, device) for o in obj)
    if isinstance(obj, list):
        return [_to_device(o, device) for o in obj]
    if isinstance(obj, dict):
        return {k: _to_device(v, device) for k, v in obj.items()}
    return obj


def _resolve_model(model, variant: str = "small", seed: int = 0):
    if isinstance(model, str):
        from dvasim.model import zoo

        if model not in zoo.MODEL_NAMES:
            raise ConfigError("--model", f"must be one of {', '.join(zoo.MODEL_NAMES)}, got {model!r}")
        return zoo.build(model, variant=variant, seed=seed)
    return model


def _model_label(model) -> tuple[str, str]:
    name = getattr(model, "name", None) or type(model).__name__
    variant = getattr(model, "variant", None) or "unknown"
    return str(name), str(variant)


def _check_sizes(values, field: str, what: str) -> list[int]:
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or int(v) < 1:
            raise ConfigError(field, f"must be positive integers ({what}), got {v!r}")
        out.append(int(v))
    if not out:
        raise ConfigError(field, f"must be a non-empty list of positive integers ({what})")
    return sorted(set(out))


def _grid(model, batch_sizes, seq_lens) -> tuple[list[int], list[int] | None]:
    bss = _check_sizes(batch_sizes, "--batch-sizes", "e.g. 1,2,4,8")
    if seq_lens is None:
        return bss, None
    if getattr(model, "input_kind", "tokens") != "tokens":
        raise ConfigError("--seq-lens", "only token models (bert_base, bert_large) take sequence lengths")
    return bss, _check_sizes(seq_lens, "--seq-lens", "e.g. 16,32,64")


def _example(model, bs: int, sl: int | None, device: str, seed: int = 0):
    torch = _torch()
    gen = torch.Generator().manual_seed(int(seed))
    try:
        x = model.example_input(bs, sl, generator=gen)
    except TypeError:  # a model whose example_input takes no generator
        x = model.example_input(bs, sl) if sl is not None else model.example_input(bs)
    return _to_device(x, device)


def _move_model(model, device: str) -> None:
    if device == "cpu":
        return
    for _, mod in model.ops:
        mod.to(device)


class _Threads:
    """Set torch's intra-op thread count for a block and restore it afterwards."""

    def __init__(self, threads: int | None):
        self.threads = threads

    def __enter__(self):
        torch = _torch()
        self.old = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(int(self.threads))
        return torch.get_num_threads()

    def __exit__(self, *exc):
        _torch().set_num_threads(self.old)
        return False


class CpuMonitor:
    """How much CPU *other* processes used since construction, in cores (Linux /proc; ``None`` elsewhere).

    Profiling on a shared machine is only as good as the machine is quiet: the profiler and the sharing
    measurement record this per point and can retry a point measured while others were busy.
    """

    def __init__(self):
        self.start = self._read()

    @staticmethod
    def _read():
        try:
            with open("/proc/stat", encoding="ascii") as fh:
                vals = [int(v) for v in fh.readline().split()[1:9]]
            with open("/proc/self/stat", encoding="ascii") as fh:
                text = fh.read()
            fields = text[text.rindex(")") + 2 :].split()
            own = int(fields[11]) + int(fields[12])  # utime + stime of all our threads, in clock ticks
        except (OSError, ValueError, IndexError):
            return None
        busy = sum(vals) - vals[3] - vals[4]  # all but idle and iowait
        return time.monotonic(), busy, own

    def foreign_cores(self) -> float | None:
        now = self._read()
        if now is None or self.start is None:
            return None
        dt = now[0] - self.start[0]
        if dt <= 0:
            return 0.0
        ticks = (now[1] - self.start[1]) - (now[2] - self.start[2])
        return max(0.0, ticks / os.sysconf("SC_CLK_TCK") / dt)


def wait_quiet(max_foreign: float, max_wait: float = 60.0, probe: float = 0.5) -> float | None:
    """Wait (up to ``max_wait`` s) until other processes use at most ``max_foreign`` cores over a ``probe`` s
    window; returns the last probe's load (``None`` where it cannot be measured)."""
    deadline = time.monotonic() + max_wait
    while True:
        mon = CpuMonitor()
        time.sleep(probe)
        load = mon.foreign_cores()
        if load is None or load <= max_foreign or time.monotonic() >= deadline:
            return load
        time.sleep(probe)


def _measure_quiet(measure, max_foreign: float | None, retries: int, pause: float = 2.0, max_wait: float = 60.0):
    """Run ``measure()`` and note how many cores other processes used meanwhile.

    With ``max_foreign`` set, each attempt first waits for a quiet machine (:func:`wait_quiet`, up to
    ``max_wait`` s) and a point measured while others used more than ``max_foreign`` cores is measured again,
    up to ``retries`` more times, keeping the attempt with the least foreign load. Returns (result, foreign
    cores of the kept attempt, attempts made).
    """
    best = None
    attempt = 0
    while True:
        attempt += 1
        if max_foreign is not None:
            wait_quiet(max_foreign, max_wait)
        mon = CpuMonitor()
        res = measure()
        foreign = mon.foreign_cores()
        if best is None or (foreign is not None and best[1] is not None and foreign < best[1]):
            best = (res, foreign)
        if max_foreign is None or foreign is None or foreign <= max_foreign or attempt > retries:
            return best[0], best[1], attempt
        time.sleep(pause)


def _timed_passes(units, x, device: str, warmup: int, repeats: int) -> np.ndarray:
    """Run ``warmup + repeats`` passes of ``units`` (callables carry -> carry) from input ``x``.

    Returns a ``(repeats, len(units))`` array of per-unit times in ms.
    """
    torch = _torch()
    n = len(units)
    out = np.empty((repeats, n))
    cuda = device != "cpu"
    with torch.inference_mode():
        for p in range(warmup + repeats):
            carry = x
            if cuda:
                stream = torch.cuda.current_stream(torch.device(device))
                events = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
                events[0].record(stream)
                for i, unit in enumerate(units):
                    carry = unit(carry)
                    events[i + 1].record(stream)
                stream.synchronize()
                if p >= warmup:
                    out[p - warmup] = [events[i].elapsed_time(events[i + 1]) for i in range(n)]
            else:
                stamps = [0] * (n + 1)
                stamps[0] = time.perf_counter_ns()
                for i, unit in enumerate(units):
                    carry = unit(carry)
                    stamps[i + 1] = time.perf_counter_ns()
                if p >= warmup:
                    out[p - warmup] = np.diff(np.asarray(stamps, dtype=np.int64)) / 1e6
            del carry
    return out


GRAPH_REPLAYS = 10  # back-to-back replays per timed pass


def _graph_passes(units, x, device: str, warmup: int, repeats: int, replays: int = GRAPH_REPLAYS,
                  ops=None) -> np.ndarray:
    """GPU time of every unit: each captured as a CUDA graph on the carry its predecessors produce, then
    ``replays`` back-to-back replays timed between two CUDA events (``ops.time_replays``), per pass
    (``warmup + repeats`` passes); returns a ``(repeats, len(units))`` array of per-replay means in ms.
    Back-to-back replays keep the GPU busy, so the host's launch gaps are not in the figure. On the CPU
    (stand-in graphs) the clock is the wall clock."""
    torch = _torch()
    from dvasim.model.stages.graphs import GraphStage, graph_ops

    ops = graph_ops(device) if ops is None else ops
    graphs = []
    carry = x
    with torch.inference_mode():
        for i, unit in enumerate(units):
            gs = GraphStage(unit, ops, i)
            gs.capture(carry)
            graphs.append(next(iter(gs.graphs.values())))
            carry = unit(carry)
    del carry
    out = np.empty((repeats, len(units)))
    with torch.inference_mode():
        for p in range(warmup + repeats):
            for i, g in enumerate(graphs):
                ms = ops.time_replays(g, replays)
                if p >= warmup:
                    out[p - warmup, i] = ms
    return out


def _launch_times(fn, x, ops, warmup: int, repeats: int) -> float:
    """The host's cost of launching ``fn(x)``: wall time until the call returns, before synchronising (median
    of ``repeats`` after ``warmup``; ``ops.synchronize()`` between calls so each starts on an idle device). On
    a CPU the call is the work itself."""
    torch = _torch()
    ts = []
    with torch.inference_mode():
        for k in range(warmup + repeats):
            t0 = time.perf_counter_ns()
            fn(x)
            t1 = time.perf_counter_ns()
            ops.synchronize()
            if k >= warmup:
                ts.append((t1 - t0) / 1e6)
    return float(np.median(ts))


LAUNCH_KINDS = ("eager", "torchscript", "cudagraph")
LAUNCH_COLUMNS = ("modules", "stage", "batch_size", "seq_len", "launch_ms")
LAUNCH_TIMER = "host time until the launching call returned, before synchronising (time.perf_counter_ns)"


def profile_launch(model, bounds: Sequence[int], batch_sizes: Sequence[int], seq_lens: Sequence[int] | None = None,
                   device: str = "cpu", kinds: Sequence[str] = LAUNCH_KINDS, warmup: int = DEFAULT_WARMUP,
                   repeats: int = DEFAULT_REPEATS, seed: int = 0, variant: str = "small") -> pd.DataFrame:
    """Host launch cost of every stage in every module kind: columns ``modules,stage,batch_size,seq_len,
    launch_ms`` (the launch-table format of :class:`dvasim.server.host.LaunchTable`), provenance in
    ``df.attrs["provenance"]``. A graph launch includes its one input copy (as the replay launches it)."""
    torch = _torch()
    from dvasim.model.stages.compiled import stage_modules
    from dvasim.model.stages.graphs import GraphStage

    model = _resolve_model(model, variant, seed)
    device = _check_device(device)
    _check_counts(warmup, repeats)
    bss, sls = _grid(model, batch_sizes, seq_lens)
    bad = [k for k in kinds if k not in LAUNCH_KINDS]
    if bad:
        raise ConfigError("--modules", f"must be among {', '.join(LAUNCH_KINDS)}; got {bad[0]!r}")
    _move_model(model, device)
    n = model.n_ops()
    bounds = list(bounds)
    ends = [*bounds[1:], n]
    eager = [model.stage_module(a, b) for a, b in zip(bounds, ends, strict=True)]
    mods = {"eager": eager}
    if "torchscript" in kinds:
        mods["torchscript"] = stage_modules(model, bounds, "torchscript")
    from dvasim.model.stages.graphs import graph_ops

    ops = graph_ops(device)
    rows = []
    t_start = time.perf_counter()
    for bs in bss:
        for sl in sls or [None]:
            x = _example(model, bs, sl, device, seed)
            with torch.inference_mode():
                carries = [x]
                for st in eager[:-1]:
                    carries.append(st(carries[-1]))
            for kind in kinds:
                for s_, carry in enumerate(carries):
                    if kind == "cudagraph":
                        gs = GraphStage(eager[s_], ops, s_)
                        with torch.inference_mode():
                            gs.capture(carry)
                        fn = gs
                    else:
                        fn = mods[kind][s_]
                    rows.append({"modules": kind, "stage": s_, "batch_size": bs, "seq_len": sl,
                                 "launch_ms": _launch_times(fn, carry, ops, warmup, repeats)})
    df = pd.DataFrame(rows)
    prov = _base_provenance(model, device, torch.get_num_threads(), warmup, repeats, "launch cost")
    prov["timer"] = LAUNCH_TIMER
    prov["statistic"] = "median over repeats (one call each, the device synchronised between calls)"
    prov["cudagraph launch"] = "the copy of the input rows into the graph's static input, then the replay call"
    prov["cuts"] = str(bounds)
    prov["modules"] = ",".join(kinds)
    prov["profiling seconds"] = f"{time.perf_counter() - t_start:.1f}"
    df.attrs["provenance"] = prov
    return df


def launch_path(table_path) -> Path:
    """``t.csv`` -> ``t.launch.csv`` (the launch-cost side file of a stage table)."""
    p = Path(table_path)
    return p.with_name(p.stem + ".launch.csv")


def save_launch(df: pd.DataFrame, path) -> Path:
    """Write a launch-cost frame as ``modules,stage,batch_size,seq_len,launch_ms`` (``seq_len`` empty for image
    models) after its provenance as ``# key: value`` lines; returns the path."""
    from dvasim.model.table import provenance_header
    from dvasim.outputs import atomic_path

    p = Path(path)
    out = df.copy()
    out["seq_len"] = out["seq_len"].map(lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v))
                                        else int(v))
    with atomic_path(p) as tmp, open(tmp, "w", encoding="utf-8") as fh:  # renamed when complete
        fh.write(provenance_header(df.attrs.get("provenance", {})))
        out[list(LAUNCH_COLUMNS)].to_csv(fh, index=False, lineterminator="\n")
    return p


def _base_provenance(model, device: str, threads_used: int, warmup: int, repeats: int, kind: str) -> dict[str, str]:
    torch = _torch()
    name, variant = _model_label(model)
    timer = "cuda events on the current stream, synchronised per pass" if device != "cpu" else "time.perf_counter_ns (monotonic)"
    return {
        "source": f"dvasim profile (dvasim.model.profiling.profiler), {kind}",
        "model": name,
        "variant": variant,
        "seed": str(getattr(model, "seed", None) if getattr(model, "seed", None) is not None
                    else (getattr(model, "config", None) or {}).get("seed", "unknown")),
        "kind": kind,
        "device": device,
        "device name": device_name(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": str(threads_used),
        "warmup": str(warmup),
        "repeats": str(repeats),
        "statistic": "median over repeats (spread in the .stats.csv side file)",
        "timer": timer,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def _check_counts(warmup: int, repeats: int) -> None:
    if isinstance(warmup, bool) or not isinstance(warmup, (int, np.integer)) or warmup < 0:
        raise ConfigError("--warmup", f"must be an integer >= 0, got {warmup!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats < 1:
        raise ConfigError("--repeats", f"must be an integer >= 1, got {repeats!r}")


def _stats_rows(times: np.ndarray, names: Sequence[str], bs: int, sl: int | None, foreign=None, attempts=1) -> list[dict]:
    med = np.median(times, axis=0)
    p10 = np.percentile(times, 10, axis=0)
    p90 = np.percentile(times, 90, axis=0)
    mn = times.min(axis=0)
    rows = []
    for i, nm in enumerate(names):
        row = {"stage": i, "name": nm, "batch_size": bs}
        if sl is not None:
            row["seq_len"] = sl
        # a unit can be below the clock's resolution; keep latencies strictly positive
        row.update(
            latency_ms=max(float(med[i]), 1e-6),
            p10_ms=float(p10[i]),
            p90_ms=float(p90[i]),
            min_ms=float(mn[i]),
            repeats=int(times.shape[0]),
            foreign_cpu=np.nan if foreign is None else round(float(foreign), 3),
            attempts=int(attempts),
        )
        rows.append(row)
    return rows


def _spread_summary(df: pd.DataFrame) -> str:
    rel = (df["p90_ms"] - df["p10_ms"]) / df["latency_ms"]
    return f"(p90-p10)/median median={float(rel.median()):.3f} max={float(rel.max()):.3f}"


def _foreign_summary(df: pd.DataFrame) -> str:
    f = df["foreign_cpu"].dropna()
    if f.empty:
        return "not measured"
    return (
        f"cores used by other processes while measuring: median {float(f.median()):.2f} max {float(f.max()):.2f}; "
        f"points re-measured {int((df.groupby(['batch_size'] + (['seq_len'] if 'seq_len' in df else []))['attempts'].first() > 1).sum())}"
    )


# ----------------------------------------------------------------------------- public API
def profile_ops(
    model,
    batch_sizes: Sequence[int],
    seq_lens: Sequence[int] | None = None,
    device: str = "cpu",
    warmup: int = DEFAULT_WARMUP,
    repeats: int = DEFAULT_REPEATS,
    threads: int | None = DEFAULT_THREADS,
    variant: str = "small",
    seed: int = 0,
    max_foreign_load: float | None = None,
    retries: int = 5,
    graphs: bool | None = None,
) -> pd.DataFrame:
    """Per-operator latency profile.

    On a GPU (``graphs`` defaults to ``device != "cpu"``) every operator is captured alone as a CUDA graph on the
    carry its predecessors produced and its replays are timed with CUDA events: GPU time, with none of the host's
    launch gaps that timing eagerly launched operators would put in the figure.

    ``model`` is a zoo model (or its name, built with ``variant``/``seed``). Returns one row per
    (operator, batch size[, seq_len]) with columns ``stage`` (operator index), ``name``, ``batch_size``,
    [``seq_len``,] ``latency_ms`` (median), ``p10_ms``, ``p90_ms``, ``min_ms``, ``repeats``; the provenance
    is in ``df.attrs["provenance"]``. ``threads=None`` keeps torch's current thread count.

    ``foreign_cpu`` records how many cores other processes used while a point was measured; with
    ``max_foreign_load`` set, a point measured while they used more is re-measured (up to ``retries`` times,
    pausing 2 s in between) and the last attempt kept.
    """
    model = _resolve_model(model, variant, seed)
    device = _check_device(device)
    _check_counts(warmup, repeats)
    bss, sls = _grid(model, batch_sizes, seq_lens)
    _move_model(model, device)
    n = model.n_ops()
    names = [nm for nm, _ in model.ops]
    # call the operator modules directly (as a stage module does), not through run_ops' per-call checks
    units = [mod for _, mod in model.ops]
    use_graphs = device != "cpu" if graphs is None else bool(graphs)
    from dvasim.model.stages.graphs import graph_ops

    ops = graph_ops(device) if use_graphs else None
    passes = functools.partial(_graph_passes, ops=ops) if use_graphs else _timed_passes
    t0 = time.perf_counter()
    df, used = _measure_units(model, units, names, bss, sls, device, warmup, repeats, threads, seed, passes,
                              max_foreign_load, retries)
    prov = _base_provenance(model, device, used, warmup, repeats, "per-operator")
    _graph_provenance(prov, use_graphs, ops, sls)
    prov["machine load"] = _foreign_summary(df)
    prov["operators"] = str(n)
    prov["spread"] = _spread_summary(df)
    prov["profiling seconds"] = f"{time.perf_counter() - t0:.1f}"
    df.attrs["provenance"] = prov
    df.attrs["name"] = f"{prov['model']}_{prov['variant']}_ops"
    return df


def profile_stages(
    model,
    n_stages: int | None = None,
    batch_sizes: Sequence[int] = (1, 2, 4, 8),
    seq_lens: Sequence[int] | None = None,
    device: str = "cpu",
    warmup: int = DEFAULT_WARMUP,
    repeats: int = DEFAULT_REPEATS,
    threads: int | None = DEFAULT_THREADS,
    cuts: Sequence[int] | None = None,
    ratios: Sequence[float] | float | None = None,
    slice_batch_size: int | None = None,
    slice_seq_len: int | None = None,
    op_profile: pd.DataFrame | None = None,
    variant: str = "small",
    seed: int = 0,
    max_foreign_load: float | None = None,
    retries: int = 5,
    modules: str | None = None,
) -> pd.DataFrame:
    """Per-stage latency profile of the real stage modules.

    ``modules = "torchscript"`` times the stages traced and frozen (:mod:`dvasim.model.stages.compiled`); ``"eager"``
    (default on a CPU) the plain modules; ``"cudagraph"`` (default on a GPU) each stage captured as a CUDA graph
    per point, its back-to-back replays timed with CUDA events: the stage's GPU time with no host launch cost in
    it (on a CPU, the stand-in graphs of :mod:`dvasim.model.stages.graphs`, wall clock). A graph-timed table of a token
    model is *bucketed* (``# length buckets: true``): the replay pads inputs to its lengths.

    Give one of ``n_stages`` (time-even), ``cuts`` or ``ratios``. The slicing uses the operator times
    at ``slice_batch_size`` (default: the smallest of ``batch_sizes``) and ``slice_seq_len`` (default:
    the lower median of ``seq_lens``), taken from ``op_profile`` if given, else measured here with the
    same warm-up/repeats. Returns the same columns as :func:`profile_ops` (``stage`` = stage index,
    ``name`` = ``ops a-b``) with ``df.attrs["provenance"]`` and ``df.attrs["bounds"]``.
    """
    model = _resolve_model(model, variant, seed)
    device = _check_device(device)
    _check_counts(warmup, repeats)
    bss, sls = _grid(model, batch_sizes, seq_lens)
    if sum(x is not None for x in (n_stages, cuts, ratios)) != 1:
        raise ConfigError("--stages", "give exactly one of a stage count, cut indices or slicing ratios")
    n = model.n_ops()
    if n_stages is not None and (isinstance(n_stages, bool) or not isinstance(n_stages, (int, np.integer)) or not 1 <= n_stages <= n):
        raise ConfigError("--stages", f"must be 1..{n} (the model has {n} operators), got {n_stages!r}")
    ref_bs = bss[0] if slice_batch_size is None else int(slice_batch_size)
    ref_sl = None if sls is None else (reference_seq_len(sls) if slice_seq_len is None else int(slice_seq_len))
    t0 = time.perf_counter()
    if cuts is not None:
        bounds, ref_times, method = slice_at(n, cuts, field="--cuts"), None, "at-cuts"
    else:
        if op_profile is None:
            op_profile = profile_ops(
                model, [ref_bs], None if ref_sl is None else [ref_sl], device, warmup, repeats, threads,
                seed=seed, max_foreign_load=max_foreign_load, retries=retries,
            )
        ref_times = _reference_op_times(op_profile, n, ref_bs, ref_sl)
        bounds, method = _slice_by_time(ref_times, n_stages, ratios)
    _move_model(model, device)
    kind, units, names = _stage_units(model, bounds, device, modules)
    from dvasim.model.stages.graphs import graph_ops

    ops = graph_ops(device) if kind == "cudagraph" else None
    passes = functools.partial(_graph_passes, ops=ops) if kind == "cudagraph" else _timed_passes
    df, used = _measure_units(model, units, names, bss, sls, device, warmup, repeats, threads, seed, passes,
                              max_foreign_load, retries)
    prov = _base_provenance(model, device, used, warmup, repeats, "per-stage")
    prov["modules"] = kind
    _graph_provenance(prov, kind == "cudagraph", ops, sls)
    prov["machine load"] = _foreign_summary(df)
    _slicing_provenance(prov, df, method, bounds, ref_times, ref_bs, ref_sl)
    prov["operators"] = str(n)
    prov["stages"] = str(len(bounds))
    prov["spread"] = _spread_summary(df)
    prov["profiling seconds"] = f"{time.perf_counter() - t0:.1f}"
    df.attrs["provenance"] = prov
    df.attrs["bounds"] = list(bounds)
    df.attrs["name"] = f"{prov['model']}_{prov['variant']}_{len(bounds)}st"
    return df


def _reference_op_times(op_profile: pd.DataFrame, n: int, ref_bs: int, ref_sl: int | None) -> np.ndarray:
    """The operator times the slicing uses: ``op_profile``'s point at ``ref_bs`` (and ``ref_sl``), in operator
    order; every one of the ``n`` operators must be there."""
    sel = op_profile[op_profile["batch_size"] == ref_bs]
    if ref_sl is not None and "seq_len" in sel.columns:
        sel = sel[sel["seq_len"] == ref_sl]
    ref_times = sel.sort_values("stage")["latency_ms"].to_numpy()
    if ref_times.size != n:
        raise ConfigError("--slice-batch-size", f"the operator profile has no complete point at bs={ref_bs}")
    return ref_times


def _slice_by_time(ref_times: np.ndarray, n_stages: int | None, ratios) -> tuple[list[int], str]:
    """Stage bounds from operator times: time-even into ``n_stages``, else by the time shares ``ratios``."""
    if n_stages is not None:
        return slice_even(ref_times, n_stages), "time-even"
    return slice_ratios(ref_times, ratios, field="--ratios"), "ratios"


def _stage_units(model, bounds, device: str, modules: str | None) -> tuple[str, list, list[str]]:
    """The module kind (``auto`` or ``None``: eager on a CPU, CUDA graphs on a GPU), the stage modules to time
    (on ``device``; TorchScript ones traced and frozen) and their names (``ops a-b``)."""
    if modules is None or modules == "auto":
        modules = "eager" if device == "cpu" else "cudagraph"
    if modules not in ("eager", "torchscript", "cudagraph"):
        raise ConfigError("--modules", f"must be eager, torchscript or cudagraph, got {modules!r}")
    ends = [*bounds[1:], model.n_ops()]
    units = [model.stage_module(a, b) for a, b in zip(bounds, ends, strict=True)]
    if device != "cpu":
        for m in units:
            m.to(device)
    if modules == "torchscript":
        from dvasim.model.stages.compiled import stage_modules

        units = stage_modules(model, list(bounds), "torchscript")
    return modules, units, [f"ops {a}-{b - 1}" for a, b in zip(bounds, ends, strict=True)]


def _measure_units(model, units, names, bss, sls, device: str, warmup: int, repeats: int, threads: int | None,
                   seed: int, passes, max_foreign_load: float | None, retries: int) -> tuple[pd.DataFrame, int]:
    """Every (batch size[, seq_len]) point of ``units`` timed by ``passes`` (on a quiet machine where asked),
    one row per unit and point (:func:`_stats_rows`); returns the frame and the intra-op threads used."""
    rows: list[dict] = []
    with _Threads(threads) as used:
        for bs in bss:
            for sl in sls or [None]:
                x = _example(model, bs, sl, device, seed)
                times, foreign, att = _measure_quiet(
                    lambda x=x: passes(units, x, device, warmup, repeats), max_foreign_load, retries, 2.0
                )
                rows.extend(_stats_rows(times, names, bs, sl, foreign, att))
    return pd.DataFrame(rows), used


def _slicing_provenance(prov: dict, df: pd.DataFrame, method: str, bounds, ref_times, ref_bs: int,
                        ref_sl: int | None) -> None:
    """``slicing`` (method, bounds, the balance the operator times predicted) and ``measured balance`` (the
    stages' slowest over fastest at the reference point)."""
    at = f"at bs={ref_bs}" + ("" if ref_sl is None else f" seq_len={ref_sl}")
    bal = balance(ref_times, bounds) if ref_times is not None else float("nan")
    prov["slicing"] = format_slicing(method, bounds, bal, at)
    prov["cuts"] = ",".join(str(int(b)) for b in bounds)  # the bounds as data (LatencyTable.cuts)
    ref = df[df["batch_size"] == ref_bs]
    if ref_sl is not None:
        ref = ref[ref["seq_len"] == ref_sl]
    meas = ref["latency_ms"].to_numpy()
    prov["measured balance"] = f"{float(meas.max() / meas.min()):.3f} {at}"


def _graph_provenance(prov: dict, graphs: bool, ops, sls) -> None:
    if graphs:
        prov["timer"] = ops.timer
        prov["graph replays"] = (f"{GRAPH_REPLAYS} back to back per pass, each unit captured alone as a graph on the "
                                 "carry its predecessors produced; the table holds the median over passes of the "
                                 "per-replay mean")
        if sls is not None:
            prov["length buckets"] = "true"


def to_table(df: pd.DataFrame, name: str | None = None):
    """The :class:`~dvasim.model.table.LatencyTable` of a profile frame (median latencies + provenance)."""
    from dvasim.model.table import LatencyTable

    cols = [c for c in TABLE_COLUMNS if c in df.columns]
    return LatencyTable.from_frame(
        df[cols], provenance=dict(df.attrs.get("provenance", {})), name=name or df.attrs.get("name", "profile")
    )


def stats_path(path) -> Path:
    """Side file with the spread of a profile: ``x.csv`` -> ``x.stats.csv``."""
    p = Path(path)
    return p.with_name(p.stem + ".stats.csv")


def save_profile(df: pd.DataFrame, path, stats: bool = True):
    """Write the table (``path``) and, if ``stats``, the spread side file, each under a temporary name renamed
    when complete (:func:`dvasim.outputs.atomic_path`: a full disk leaves no half-written table); returns the
    LatencyTable."""
    from dvasim.outputs import atomic_path, output_error

    table = to_table(df, name=Path(path).stem)
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(path, e) from None
    with atomic_path(path) as tmp:
        table.save(tmp)
    if stats:
        with atomic_path(stats_path(path)) as tmp:
            df.to_csv(tmp, index=False, lineterminator="\n", float_format="%.6g")
    return table
