"""perf_analyzer's latency report (``perf_analyzer -f FILE``), written from simulated runs: lay a simulated
concurrency or request-rate sweep over one measured with Triton's perf_analyzer.

**The format** is perf_analyzer's own, read from its source: repository ``triton-inference-server/perf_analyzer``,
commit ``263c5f6e0c7a6c15472a54409174981f67930cfe`` (2025-12-15), ``src/report_writer.cc``
(``ReportWriter::GenerateReport``), with the example and the row order of ``docs/measurements_metrics.md``
("Visualizing Latency vs. Throughput") and the percentile rule of ``src/inference_profiler.cc``
(``InferenceProfiler::SummarizeLatency``). The header (:func:`header`), in order:

* ``Concurrency`` (concurrency mode, ``--concurrency-range``) or ``Request Rate`` (``--request-rate-range``);
* ``Inferences/Second``; (``Response Throughput`` for a decoupled model: never here);
* ``Client Send``;
* only with server-side statistics (a Triton server with the statistics extension: perf_analyzer's default
  against Triton): ``Network+Server Send/Recv``, ``Server Queue``, ``Server Compute Input``,
  ``Server Compute Infer``, ``Server Compute Output`` (then ``Server Cache Hit``, ``Server Cache Miss`` only with
  Triton's response cache: never here);
* ``Client Recv``, then ``p50 latency``, ``p90 latency``, ``p95 latency``, ``p99 latency`` (``--percentile=P``
  would add ``pP latency`` in its place among them: not written here);
* only with ``--verbose-csv``: ``Avg latency`` (left out under ``--percentile``), ``request/response``,
  ``response wait`` (then four GPU metric columns with ``--collect-metrics``: not written here).

Units: every latency column is in **microseconds**, an integer (perf_analyzer divides nanosecond integers by
1000, truncating); ``Inferences/Second`` and ``Request Rate`` are doubles printed as C++ streams print them (6
significant digits); ``Concurrency`` an integer. Rows are sorted by **increasing Inferences/Second**, not by the
load (the documentation's example lists concurrency 1, 3, 4, 2); ties here by the load. Percentiles are
perf_analyzer's: the sorted latencies' element ``int(p / 100 * (n - 1) + 0.5)``; averages are integer
nanosecond sums divided by the count, then by 1000.

**From a simulated run** (:func:`point_columns`, from its per-query records and summary; the served queries only
(finished, and ``status`` ``"ok"`` where the records have one), over the whole run, where perf_analyzer measures
stable windows):

* ``Client Send``, ``Client Recv``, ``request/response``: **0**. There is no client: a query's latency runs from
  its arrival at the server (``arrival_ms``) to its answer (``finish_ms``). The front door's admission delay
  (``seen_ms - arrival_ms``: ``[engine] admission_delay_ms``, the receiving thread's wake-up) is server-side
  time, and goes into ``Network+Server Send/Recv`` with the stack's request handling, as Triton's endpoint time
  does.
* ``Server Queue``: ``start_ms - seen_ms``, from the front door to the launch of the query's first stage (the
  batch window included, as Triton's queue time includes its dynamic batcher's delay).
* ``Server Compute Input``: the serving stack's batch entry cost without its request handling
  (:class:`dvasim.server.costs.BatchCosts`: ``entry_host_ms - request part + h2d_ms``: the inputs' gathering and
  host-to-device copy) for the rows that launched with the query's first stage (the records' rows with its
  ``batch_id`` and ``start_ms``; their longest input as the batch's length); 0 on a stack without batch costs.
* ``Server Compute Output``: the stack's exit cost (``exit_ms``: synchronisation and the outputs' copy back) for
  the query's exit batch (``exit_batch_size``).
* ``Server Compute Infer``: the rest of the time from the first stage's launch to the answer (``finish_ms -
  start_ms`` less the three costs above and the request handling, at least 0): every stage's GPU time, launches,
  the waits between stages of a multi-stage pipeline, ``[engine.transfer]`` copies. Where the stack's entry runs
  beside the first stage's GPU work (asynchronous copies: ``idle_between_batches = false``), the overlap is
  taken out of this column.
* ``Network+Server Send/Recv``: perf_analyzer's remainder, average latency less average queue and compute
  (at least 0): here the admission delay plus the stack's request handling.
* ``Inferences/Second``: the summary's ``throughput_qps`` (finished queries over the run's span); ``p50`` ..
  ``p99 latency``, ``Avg latency`` and ``response wait`` from ``finish_ms - arrival_ms``.

:func:`perf_analyzer_table` gathers a sweep's points into the table, :func:`perf_analyzer_csv` /
:func:`write_perf_analyzer_csv` write it byte for byte as perf_analyzer would, :func:`read_perf_analyzer_csv`
reads a measured (or a simulated) one back, and :func:`overlay_figure` draws a simulated sweep over a measured
one (latency against throughput).

May import: the foundation, model data, serving stacks, config and the rest of :mod:`dvasim.reporting`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dvasim.errors import ConfigError
from dvasim.outputs import write_text

SOURCE = ("triton-inference-server/perf_analyzer@263c5f6e0c7a6c15472a54409174981f67930cfe src/report_writer.cc, "
          "docs/measurements_metrics.md")
MODES = {"concurrency": "Concurrency", "request-rate": "Request Rate"}  # mode -> its load column
PERCENTILES = (50, 90, 95, 99)  # perf_analyzer's always (a std::set: ascending)
SERVER_COLUMNS = ("Network+Server Send/Recv", "Server Queue", "Server Compute Input", "Server Compute Infer",
                  "Server Compute Output")
LATENCY_COLUMNS = tuple(f"p{p} latency" for p in PERCENTILES)
VERBOSE_COLUMNS = ("Avg latency", "request/response", "response wait")
THROUGHPUT = "Inferences/Second"


def header(mode: str, server_stats: bool = True, verbose: bool = False) -> list[str]:
    """perf_analyzer's CSV header for ``mode`` (``"concurrency"`` or ``"request-rate"``), with the server-side
    columns (``server_stats``: a Triton server with statistics) and the ``--verbose-csv`` ones (``verbose``)."""
    if mode not in MODES:
        raise ConfigError("perf_analyzer.mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
    cols = [MODES[mode], THROUGHPUT, "Client Send"]
    if server_stats:
        cols += SERVER_COLUMNS
    cols += ["Client Recv", *LATENCY_COLUMNS]
    if verbose:
        cols += VERBOSE_COLUMNS
    return cols


# ----------------------------------------------------------------------------- one run's columns
def batch_costs_of(config: Any, stack: str | None = None):
    """The serving stack's per-batch costs (:class:`dvasim.server.costs.BatchCosts`, or ``None`` for a stack
    without) of a raw config (a path or a dict, as :func:`dvasim.run` takes it), resolved as its run resolves
    them; ``stack``: the stack by name, over the config's ``[server] stack``."""
    from dvasim import config as cfgmod
    from dvasim.model.catalog import resolve_model
    from dvasim.server.resolve import resolve_stack
    from dvasim.server.transfer import transfer_from_config

    cfg = cfgmod.resolve(config)
    model = resolve_model(cfg["model"])
    return resolve_stack(cfg, model, transfer_from_config(cfg["engine"].get("transfer")), stack=stack).batch


def _ns(ms: np.ndarray) -> np.ndarray:
    """Milliseconds as integer nanoseconds (the nearest: perf_analyzer's clocks count nanoseconds)."""
    return np.rint(np.asarray(ms, dtype=np.float64) * 1e6).astype(np.int64)


def _sum(ns: np.ndarray) -> int:
    """The exact sum of integer nanoseconds (in two parts, so that no int64 overflows on long runs)."""
    giga = 1_000_000_000
    return int(np.sum(ns // giga)) * giga + int(np.sum(ns % giga))


def _per_value(fn, *keys: np.ndarray) -> np.ndarray:
    """``fn(*key)`` for every row of ``keys``, computed once per distinct key."""
    stacked = np.stack([np.asarray(k, dtype=np.int64) for k in keys], axis=1)
    uniq, inverse = np.unique(stacked, axis=0, return_inverse=True)
    return np.array([fn(*map(int, u)) for u in uniq], dtype=np.float64)[np.ravel(inverse)]


def _entry_and_exit_ms(q: pd.DataFrame, costs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per finished query: the request handling, the inputs' gathering and copy (Compute Input) and the exit
    (Compute Output), in ms, by the stack's :class:`~dvasim.server.costs.BatchCosts` (zeros without)."""
    zeros = np.zeros(len(q))
    if costs is None or not len(q):
        return zeros, zeros, zeros
    launch = q.groupby(["batch_id", "start_ms"], sort=False)
    rows, length = launch["query_id"].transform("size").to_numpy(), launch["seq_len"].transform("max").to_numpy()

    def request(r: int, _: int) -> float:
        return costs.request_ms + costs.request_per_row_ms * r

    def copy_in(r: int, L: int) -> float:
        return costs.entry_host_ms(r, L) - request(r, L) + costs.h2d_ms(r, L)

    out = _per_value(lambda b: costs.exit_ms(b), q["exit_batch_size"].to_numpy())
    return _per_value(request, rows, length), _per_value(copy_in, rows, length), out


def point_columns(records: pd.DataFrame, summary: Mapping[str, Any], costs=None) -> dict[str, float | int] | None:
    """Every column of perf_analyzer's row (but the load) for one run, from its per-query ``records`` (as
    :attr:`dvasim.RunResult.queries`), its ``summary`` and its stack's per-batch ``costs``
    (:func:`batch_costs_of`; ``None``: no batch costs); see the module docstring for the mapping. ``None`` when
    no query finished (perf_analyzer reports no row without a valid request)."""
    started = records[records["start_ms"].notna()]
    done = started["finish_ms"].notna().to_numpy()
    if "status" in started:  # served only: a rejected or timed-out request is no valid request
        done = done & (started["status"] == "ok").to_numpy()
    n = int(done.sum())
    if not n:
        return None
    req_ms, in_ms, out_ms = (x[done] for x in _entry_and_exit_ms(started, costs))  # launches: every started row
    q = started[done]
    arrival, seen = q["arrival_ms"].to_numpy(), q["seen_ms"].fillna(q["arrival_ms"]).to_numpy()
    start, finish = q["start_ms"].to_numpy(), q["finish_ms"].to_numpy()
    lat = np.sort(_ns(finish - arrival))
    queue = _ns(start - seen)
    comp_in, comp_out = _ns(in_ms), _ns(out_ms)
    comp_infer = np.maximum(_ns(finish - start) - _ns(req_ms) - comp_in - comp_out, 0)
    avg = {k: _sum(v) // n for k, v in (("lat", lat), ("queue", queue), ("in", comp_in), ("infer", comp_infer),
                                        ("out", comp_out))}
    avg_compute = (_sum(comp_in) + _sum(comp_infer) + _sum(comp_out)) // n
    network = max(avg["lat"] - avg["queue"] - avg_compute, 0)  # perf_analyzer's remainder (send/recv are 0)
    row: dict[str, float | int] = {THROUGHPUT: float(summary.get("throughput_qps", math.nan)), "Client Send": 0,
                                   "Network+Server Send/Recv": network // 1000, "Server Queue": avg["queue"] // 1000,
                                   "Server Compute Input": avg["in"] // 1000,
                                   "Server Compute Infer": avg["infer"] // 1000,
                                   "Server Compute Output": avg["out"] // 1000, "Client Recv": 0}
    for p, col in zip(PERCENTILES, LATENCY_COLUMNS):
        row[col] = int(lat[int((p / 100.0) * (n - 1) + 0.5)]) // 1000
    row.update({"Avg latency": avg["lat"] // 1000, "request/response": 0, "response wait": avg["lat"] // 1000})
    return row


def run_columns(result, config: Any, stack: str | None = None) -> dict[str, float | int] | None:
    """:func:`point_columns` of a :class:`dvasim.RunResult` run from the raw ``config`` (and ``stack``) given to
    :func:`dvasim.run`."""
    return point_columns(result.queries, result.summary, batch_costs_of(config, stack))


# ----------------------------------------------------------------------------- the table and its file
def perf_analyzer_table(points: Iterable[tuple[float, Mapping[str, Any] | None]], mode: str,
                        server_stats: bool = True, verbose: bool = False) -> pd.DataFrame:
    """perf_analyzer's table of a sweep: ``points`` are ``(load, columns)`` pairs (the clients or the request rate,
    and :func:`point_columns`' dict; a point whose columns are ``None``, where no query finished, is left out and
    counted in ``attrs["left_out"]``), rows sorted by increasing ``Inferences/Second`` (ties by the load), the
    columns :func:`header`'s; ``attrs["mode"]`` says the mode."""
    cols = header(mode, server_stats, verbose)
    rows, left_out = [], 0
    for load, columns in points:
        if columns is None:
            left_out += 1
            continue
        missing = [c for c in cols[1:] if c not in columns]
        if missing:
            raise ConfigError("perf_analyzer", f"a point's columns lack {missing[0]!r}; compute them with "
                                               "point_columns")
        rows.append({cols[0]: int(load) if mode == "concurrency" else float(load),
                     **{c: columns[c] for c in cols[1:]}})
    table = pd.DataFrame(rows, columns=cols)
    if len(table):
        table = table.sort_values([THROUGHPUT, cols[0]], kind="mergesort").reset_index(drop=True)
    table.attrs.update(mode=mode, left_out=left_out)
    return table


def _cpp(v: Any) -> str:
    """A value as perf_analyzer's ``std::ofstream <<`` prints it: integers whole, doubles to 6 significant digits
    (``%g``)."""
    if isinstance(v, bool | np.bool_):
        return str(int(v))
    if isinstance(v, int | np.integer):
        return str(int(v))
    if isinstance(v, float | np.floating):
        return f"{float(v):.6g}"
    return str(v)


def perf_analyzer_csv(table: pd.DataFrame) -> str:
    """The text of ``perf_analyzer -f``'s file for ``table`` (:func:`perf_analyzer_table`): its header, then one
    line per row, comma-separated, unquoted, each line ended by a newline."""
    lines = [",".join(table.columns)]
    for row in table.itertuples(index=False):
        lines.append(",".join(_cpp(v) for v in row))
    return "\n".join(lines) + "\n"


def write_perf_analyzer_csv(table: pd.DataFrame, path: str | Path) -> Path:
    """Write :func:`perf_analyzer_csv` of ``table`` to ``path``, whole (:func:`dvasim.outputs.write_text`)."""
    return write_text(path, perf_analyzer_csv(table))


def read_perf_analyzer_csv(path: str | Path, field: str | None = None) -> pd.DataFrame:
    """A perf_analyzer CSV (measured by ``perf_analyzer -f``, or written here) as a DataFrame, rows as in the file;
    ``attrs["mode"]`` is ``"concurrency"`` or ``"request-rate"`` (from its first column). Lines starting with
    ``#`` before the header are provenance notes, skipped. Anything else is a one-line :class:`ConfigError` on
    ``field`` (default: the path)."""
    field = field or str(path)
    if Path(path).exists() and not Path(path).is_file():  # a FIFO or a device would block the read, or never end
        raise ConfigError(field, f"{str(path)!r} is not a regular file; give the file perf_analyzer -f wrote")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(field, f"cannot read it as a perf_analyzer CSV ({e.__class__.__name__}: "
                                 f"{getattr(e, 'strerror', None) or e}); give the file perf_analyzer -f wrote") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    while lines and lines[0].startswith("#"):
        lines.pop(0)
    first = lines[0].split(",")[0] if lines else ""
    mode = next((m for m, c in MODES.items() if c == first), None)
    if mode is None:
        raise ConfigError(field, f"not a perf_analyzer CSV: its first column must be 'Concurrency' or 'Request "
                                 f"Rate', got {first!r}")
    import csv
    import io

    try:  # every row as wide as the header (pandas would fill a short row with NaN, or fail on a long one)
        rows = list(csv.reader(io.StringIO("\n".join(lines) + "\n"), strict=True))
    except csv.Error as e:
        raise ConfigError(field, f"not a perf_analyzer CSV: cannot parse it ({e}); give the file perf_analyzer -f "
                                 "wrote") from None
    width = len(rows[0]) - (rows[0][-1] == "")
    for k, row in enumerate(rows[1:], start=2):
        if len(row) - (row[-1] == "" if row else 0) != width:
            raise ConfigError(field, f"not a perf_analyzer CSV: data row {k - 1} has {len(row)} fields, its header "
                                     f"{width}; give the file perf_analyzer -f wrote")
    # index_col=False: a line ending in a comma (the documentation's --collect-metrics example) is no index
    try:
        df = pd.read_csv(io.StringIO("\n".join(lines) + "\n"), index_col=False)
    except (pd.errors.ParserError, ValueError) as e:
        raise ConfigError(field, f"not a perf_analyzer CSV: cannot parse it ({' '.join(str(e).split())[:200]})") \
            from None
    need = [THROUGHPUT, *LATENCY_COLUMNS]
    lacking = [c for c in need if c not in df.columns]
    if lacking:
        raise ConfigError(field, f"not a perf_analyzer CSV: no {lacking[0]!r} column (it has "
                                 f"{', '.join(map(str, df.columns))})")
    for c in [first, *need] if len(df) else []:
        if not pd.api.types.is_numeric_dtype(df[c]):
            raise ConfigError(field, f"its {c!r} column must hold numbers, got {df[c].iloc[0]!r}")
    df.attrs["mode"] = mode
    return df


# ----------------------------------------------------------------------------- simulated over measured
def overlay_figure(tables: Mapping[str, pd.DataFrame], path: str | Path, title: str = "",
                   latencies: tuple[str, ...] = ("p50 latency", "p99 latency")) -> Path:
    """Latency (ms) against ``Inferences/Second`` for each of ``tables`` (label -> a perf_analyzer table, e.g.
    ``{"simulated": sim, "measured": read_perf_analyzer_csv("perf.csv")}``), one panel per latency column, each
    table's points joined in the order of its load and labelled with it; written whole to ``path``."""
    from dvasim.reporting.plots import _plt, save_figure

    plt, sns = _plt()
    frames = []
    for label, t in tables.items():
        load = t.columns[0]
        for c in (THROUGHPUT, *latencies):
            if c not in t.columns:
                raise ConfigError("perf_analyzer", f"the table {label!r} has no {c!r} column")
        df = t.sort_values(load, kind="mergesort")
        frames.append(pd.DataFrame({"table": label, "x": df[THROUGHPUT].to_numpy(float), "load": df[load].to_numpy(),
                                    "load_name": load, **{c: df[c].to_numpy(float) / 1000.0 for c in latencies}}))
    data = pd.concat(frames, ignore_index=True)
    fig, axes = plt.subplots(1, len(latencies), figsize=(5.5 * len(latencies), 4.2), squeeze=False)
    for ax, c in zip(axes[0], latencies):
        sns.lineplot(data=data, x="x", y=c, hue="table", style="table", markers=True, dashes=False, sort=False,
                     estimator=None, ax=ax)
        for _, r in data.iterrows():
            ax.annotate(f"{r['load']:g}", (r["x"], r[c]), textcoords="offset points", xytext=(4, 4), fontsize=7)
        ax.set(xlabel="throughput (inferences/s)", ylabel=f"{c} (ms)", title=c)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.05)
        ax.legend(fontsize=8, title=None)
    loads = sorted(set(data["load_name"]))
    return save_figure(fig, path, title or f"perf_analyzer tables: latency against throughput (points: "
                                           f"{' / '.join(loads)})")
