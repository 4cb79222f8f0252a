"""Arrival times (and optionally input lengths) read from trace files: the ``kind = "trace"`` workload.

A trace is a CSV (optionally gzip-compressed, ``.csv.gz``; leading ``# key: value`` provenance lines are read
and skipped), a JSON file (``.json``, ``.jsonl`` / ``.ndjson``, optionally ``.gz``: a list of numbers, a list
of objects, an object of equal-length lists, or JSON lines, one number or object a line; ``# key: value``
lines before the data are skipped too) or a Parquet file (``.parquet`` / ``.pq``) with one row per request.

* The arrival time is the column ``column`` (default: the first of :data:`TIME_COLUMNS` found; names are
  matched case-insensitively). Numbers are in ``unit`` (``"ms"``, ``"s"`` or ``"us"``) and must be >= 0;
  a column of date-time strings (ISO 8601 or anything pandas parses) or a Parquet timestamp column is read as
  date-times (``unit`` is then ignored).
* Times are made relative to the earliest request and sorted (a stable sort; the lengths follow).
* ``length_column``: input lengths (integers >= 1), one per request.
* ``"trace:<name>"`` names a trace shipped in ``traces/arrivals/`` (:func:`shipped_traces`; ``traces/README.md``
  gives their sources, licences and columns), e.g. ``"trace:azure_code"``.

:func:`trace_arrivals` turns a :class:`Trace` into the arrivals of a run: the first ``n_queries`` requests (more
than the trace has: the trace is looped; pass ``p`` is the trace shifted by ``p * (span + mean gap)``, so the
gap between passes is the trace's mean gap and its mean rate is kept), time-scaled (``time_scale`` multiplies
every gap; ``rate_qps`` scales them so that ``(n - 1) / (last - first arrival)`` of the ``n`` queries run is
``rate_qps``), and shifted so that the first arrives at ``start_ms``.

Errors are one line, naming the ``workload.<key>`` at fault (``path``, ``column``, ``length_column``, ...).
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from dvasim.errors import ConfigError, WorkloadError
from dvasim.model.table import read_provenance_csv, traces_dir
from dvasim.schema import find_file
from dvasim.workload.arrivals import MAX_START_MS

__all__ = ["Trace", "TIME_COLUMNS", "UNITS", "load_trace", "trace_arrivals", "trace_path", "shipped_traces"]

TIME_COLUMNS = ("arrival_ms", "timestamp_ms", "timestamp", "time", "arrival")
UNITS = {"ms": 1.0, "s": 1000.0, "us": 1e-3}  # -> ms
SHORT_PREFIX = "trace:"
_CSV = (".csv",)
_JSON = (".json", ".jsonl", ".ndjson")
_PARQUET = (".parquet", ".pq")
_FORMATS = "CSV (.csv) or JSON (.json, .jsonl, .ndjson), optionally gzip-compressed (.gz), or Parquet (.parquet)"
_BARE = "<values>"  # the one column of a JSON list of numbers / strings
_cache: dict[tuple, Trace] = {}
# a trace spans at most workload.start_ms's bound (1e12 ms, 31.7 years: the clock's resolution): beyond, a time in
# the wrong unit (or one that overflows to inf when converted to ms), not a recorded service
MAX_SPAN_MS = MAX_START_MS


@dataclass(frozen=True)
class Trace:
    """A trace file's requests, sorted by arrival: times in ms after the first (``times_ms[0] == 0``)."""

    path: Path
    times_ms: np.ndarray
    lengths: np.ndarray | None
    time_column: str
    columns: tuple[str, ...]
    provenance: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.times_ms.size)

    @property
    def span_ms(self) -> float:
        return float(self.times_ms[-1])

    @property
    def mean_rate_qps(self) -> float:
        """``(rows - 1) / span`` in queries per second (``nan`` for one row or a zero span)."""
        return (len(self) - 1) * 1000.0 / self.span_ms if len(self) > 1 and self.span_ms > 0 else math.nan


def _arrivals_dir() -> Path:
    return traces_dir() / "arrivals"


def _split_suffix(name: str) -> tuple[str, bool]:
    """(format suffix, gzip-compressed) of a file name, e.g. ``(".csv", True)`` for ``x.csv.gz``."""
    low = name.lower()
    gz = low.endswith(".gz")
    if gz:
        low = low[:-3]
    return os.path.splitext(low)[1], gz


def shipped_traces() -> list[str]:
    """Short names of the traces shipped in ``traces/arrivals/`` (usable as ``path = "trace:<name>"``)."""
    d = _arrivals_dir()
    if not d.is_dir():
        return []
    names = set()
    for p in d.iterdir():
        suffix, gz = _split_suffix(p.name)
        if p.is_file() and suffix in _CSV + _JSON + _PARQUET:
            names.add(p.name[: len(p.name) - len(suffix) - (3 if gz else 0)])
    return sorted(names)


def trace_path(spec, base_dir: str | Path | None = None) -> Path:
    """The file named by ``spec``: ``"trace:<name>"`` (shipped) or a path; a relative path is looked up in
    ``base_dir`` (the config's directory; default: the working directory), the working directory, then the
    project root (where the shipped ``traces/`` live). ConfigError (``workload.path``) if there is none."""
    if not isinstance(spec, str | os.PathLike) or str(spec).strip() == "":
        raise ConfigError("workload.path", f"must be a file path string or \"trace:<name>\" "
                                           f"(shipped: {', '.join(shipped_traces()) or 'none'}), got {spec!r}")
    text = str(spec).strip()
    if text.lower().startswith(SHORT_PREFIX):
        name = text[len(SHORT_PREFIX):].strip()
        if name and Path(name).name == name:
            for suffix in (*(s + g for s in _CSV + _JSON for g in (".gz", "")), *_PARQUET):
                p = _arrivals_dir() / f"{name}{suffix}"
                if p.is_file():
                    return p.resolve()
        raise ConfigError("workload.path", f"unknown shipped trace {name!r}; shipped traces are "
                                           f"{', '.join(shipped_traces()) or '(none found in ' + str(_arrivals_dir()) + ')'}"
                                           " (write e.g. path = \"trace:azure_code\")")
    return find_file(text, None if base_dir is None else str(base_dir), "workload.path",
                     hint=f"; give the path of a {_FORMATS} file, or \"trace:<name>\" (shipped: "
                          f"{', '.join(shipped_traces()) or 'none'})")


def _read_text(path: Path, gz: bool) -> tuple[dict[str, str], str]:
    try:
        raw = path.read_bytes()
        if gz:
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8-sig")
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise WorkloadError("workload.path", f"cannot read trace file {path} ({_one_line(exc)}); "
                                             f"it must be a {'gzip-compressed ' if gz else ''}UTF-8 text file") from None
    return read_provenance_csv(text)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _json_frame(path: Path, body: str) -> tuple[pd.DataFrame, bool]:
    """(frame, bare) of a JSON / JSON-lines document; ``bare``: a list of scalars (one unnamed column)."""
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        data = []
        for i, line in enumerate(body.splitlines(), start=1):
            if line.strip() == "":
                continue
            try:
                data.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise WorkloadError("workload.path", f"trace file {path} is neither JSON nor JSON lines "
                                                     f"(line {i}: {_one_line(exc)})") from None
    if isinstance(data, Mapping):
        if data and all(isinstance(v, list) for v in data.values()):  # column-oriented
            lengths = {len(v) for v in data.values()}
            if len(lengths) != 1:
                raise WorkloadError("workload.path", f"trace file {path}: the JSON object's lists have different "
                                                     f"lengths ({sorted(lengths)}); give one value per request in each")
            return pd.DataFrame(data), False
        data = [data]  # one record
    if not isinstance(data, list):
        raise WorkloadError("workload.path", f"trace file {path}: expected a JSON list of numbers or of objects, "
                                             f"got {type(data).__name__}")
    if not data:
        return pd.DataFrame(), False
    if all(isinstance(x, Mapping) for x in data):
        return pd.DataFrame.from_records(data), False
    for i, x in enumerate(data):
        if isinstance(x, Mapping | list) or x is None:
            raise WorkloadError("workload.path", f"trace file {path}: entry {i} is {json.dumps(x)[:60]}; the JSON must "
                                                 "be a list of numbers or a list of objects (one per request)")
    return pd.DataFrame({_BARE: data}), True


def _read_frame(path: Path) -> tuple[pd.DataFrame, dict[str, str], bool]:
    suffix, gz = _split_suffix(path.name)
    if suffix in _CSV:
        prov, body = _read_text(path, gz)
        if body.strip() == "":
            return pd.DataFrame(), prov, False
        try:
            df = pd.read_csv(io.StringIO(body), skipinitialspace=True)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
            raise WorkloadError("workload.path", f"cannot parse trace file {path} as CSV ({_one_line(exc)})") from None
        return df, prov, False
    if suffix in _JSON:
        prov, body = _read_text(path, gz)
        if body.strip() == "":
            return pd.DataFrame(), prov, False
        df, bare = _json_frame(path, body)
        return df, prov, bare
    if suffix in _PARQUET and not gz:
        try:
            df = pd.read_parquet(path)
        except ImportError as exc:
            raise WorkloadError("workload.path", f"reading Parquet trace {path} needs pyarrow ({_one_line(exc)}); "
                                                 "install it or convert the trace to CSV") from None
        except Exception as exc:  # pyarrow raises its own error types for corrupt files
            raise WorkloadError("workload.path", f"cannot read trace file {path} as Parquet ({_one_line(exc)})") from None
        return df, _parquet_provenance(path), False
    raise ConfigError("workload.path", f"trace file {path.name!r} has an unknown format; give a {_FORMATS} file")


def _parquet_provenance(path: Path) -> dict[str, str]:
    """The Parquet file's key/value metadata (pandas' and Arrow's own entries left out)."""
    try:
        import pyarrow.parquet as pq

        meta = pq.read_schema(path).metadata or {}
    except Exception:  # provenance is optional
        return {}
    out = {}
    for k, v in meta.items():
        key = k.decode("utf-8", "replace")
        if key != "pandas" and not key.startswith("ARROW:"):
            out[key.strip().lower()] = " ".join(v.decode("utf-8", "replace").split())
    return out


def _find_column(df: pd.DataFrame, name, key: str, path: Path, bare: bool) -> str:
    cols = [str(c) for c in df.columns]
    listed = ", ".join(cols) or "(none)"
    if bare:
        if name is not None:
            raise ConfigError(f"workload.{key}", f"trace file {path} is a JSON list of values, which has no columns; "
                                                 f"remove {key} (or write a list of objects)")
        return _BARE
    if name is not None:
        if not isinstance(name, str) or name.strip() == "":
            raise ConfigError(f"workload.{key}", f"must be a column name (string), got {name!r}")
        want = name.strip()
        for c in cols:
            if c == want:
                return c
        for c in cols:
            if c.strip().lower() == want.lower():
                return c
        raise ConfigError(f"workload.{key}", f"trace file {path} has no column {want!r} (columns: {listed}); "
                                             f"set {key} to one of them")
    for cand in TIME_COLUMNS:
        for c in cols:
            if c.strip().lower() == cand:
                return c
    raise ConfigError("workload.column", f"trace file {path} has none of the default time columns "
                                         f"{', '.join(TIME_COLUMNS)} (columns: {listed}); set column = \"<name>\"")


def _is_missing(v) -> bool:
    return v is None or v is pd.NA or v is pd.NaT or (isinstance(v, float | np.floating) and math.isnan(v))


def _describe_value(v) -> str:
    if _is_missing(v):
        return "a missing value (empty cell)"
    return repr(v.item() if isinstance(v, np.generic) else v)


def _times_ms(s: pd.Series, col: str, unit_ms: float, path: Path) -> np.ndarray:
    """Times in ms after the earliest, in file order."""
    where = f"trace file {path}, column {col!r}" if col != _BARE else f"trace file {path}"
    if pd.api.types.is_datetime64_any_dtype(s):
        return _within_span(_datetime_ms(s, s, where), s, where)
    if pd.api.types.is_bool_dtype(s):
        raise WorkloadError("workload.column", f"{where}: must hold numbers (times) or date-times, got true/false values")
    if pd.api.types.is_numeric_dtype(s):
        num = s.astype(np.float64)
    else:
        num = pd.to_numeric(s, errors="coerce")
        present = s.notna()
        if present.any() and num[present].isna().all():  # no numbers at all: date-time strings?
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                dt = pd.to_datetime(s, errors="coerce", utc=True, format="ISO8601")
                if (dt.isna() & present).any():
                    dt = pd.to_datetime(s, errors="coerce", utc=True, format="mixed")
            bad_dt = (dt.isna() & present).to_numpy()
            if not bad_dt.any():
                return _within_span(_datetime_ms(dt, s, where), s, where)
            if dt.notna().any():  # a column of date-times with some that are not
                r = int(np.flatnonzero(bad_dt)[0])
                raise WorkloadError("workload.column", f"{where}: {_describe_value(s.iloc[r])} in data row {r + 1} is "
                                                       "not a date-time (the column's other values are)")
    vals = num.to_numpy(dtype=np.float64, na_value=np.nan)
    bad = np.flatnonzero(~np.isfinite(vals))
    if bad.size:
        r = int(bad[0])
        what = "non-numeric value " if not _is_missing(s.iloc[r]) else ""
        raise WorkloadError("workload.column", f"{where}: {what}{_describe_value(s.iloc[r])} in data row {r + 1}; "
                                               "times must be numbers (in unit) or date-time strings")
    neg = np.flatnonzero(vals < 0)
    if neg.size:
        r = int(neg[0])
        raise WorkloadError("workload.column", f"{where}: negative time {_describe_value(s.iloc[r])} in data row {r + 1}; "
                                               "times must be >= 0")
    with np.errstate(over="ignore", invalid="ignore"):  # a time that overflows in ms is refused just below
        return _within_span((vals - vals.min()) * unit_ms, s, where)


def _within_span(ms: np.ndarray, raw: pd.Series, where: str) -> np.ndarray:
    """``ms`` (times after the earliest), refused in one line when one is beyond :data:`MAX_SPAN_MS`."""
    far = np.flatnonzero(~(ms <= MAX_SPAN_MS))
    if far.size:
        r = int(far[0])
        raise WorkloadError("workload.column", f"{where}: {_describe_value(raw.iloc[r])} in data row {r + 1} is "
                                               f"{float(ms[r]):g} ms after the earliest time; a trace spans at most "
                                               f"{MAX_SPAN_MS:g} ms (31.7 years): check the times and the unit")
    return ms


def _datetime_ms(dt: pd.Series, raw: pd.Series, where: str) -> np.ndarray:
    if dt.isna().any():
        r = int(np.flatnonzero(dt.isna().to_numpy())[0])
        raise WorkloadError("workload.column", f"{where}: a missing value (empty cell) in data row {r + 1}; "
                                               "every request needs a date-time")
    rel = (dt - dt.min()) / pd.Timedelta(milliseconds=1)
    return rel.to_numpy(dtype=np.float64)


def _lengths(s: pd.Series, col: str, path: Path) -> np.ndarray:
    if pd.api.types.is_bool_dtype(s):
        raise WorkloadError("workload.length_column", f"trace file {path}, column {col!r}: must hold integers >= 1 "
                                                      "(input lengths), got true/false values")
    vals = pd.to_numeric(s, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = np.flatnonzero(~np.isfinite(vals) | (vals < 1) | (vals != np.round(vals)))
    if bad.size:
        r = int(bad[0])
        raise WorkloadError("workload.length_column", f"trace file {path}, column {col!r}: input lengths must be "
                                                      f"integers >= 1, got {_describe_value(s.iloc[r])} in data row {r + 1}")
    return vals.astype(np.int64)


def load_trace(spec, column: str | None = None, unit: str = "ms", length_column: str | None = None,
               base_dir: str | Path | None = None) -> Trace:
    """Read a trace file (see the module docstring) into a :class:`Trace` (cached; its arrays are read-only)."""
    if not isinstance(unit, str) or unit not in UNITS:
        raise ConfigError("workload.unit", f"must be one of {', '.join(repr(u) for u in UNITS)} (the time column's "
                                           f"unit), got {unit!r}")
    path = trace_path(spec, base_dir)
    st = path.stat()
    key = (str(path), st.st_mtime_ns, st.st_size, column, unit, length_column)
    got = _cache.get(key)
    if got is not None:
        return got
    df, prov, bare = _read_frame(path)
    if len(df) == 0:
        raise WorkloadError("workload.path", f"trace file {path} has no rows; it needs at least one request")
    tcol = _find_column(df, column, "column", path, bare)
    lcol = None if length_column is None else _find_column(df, length_column, "length_column", path, bare)
    times = _times_ms(df[tcol], tcol, UNITS[unit], path)
    lens = None if lcol is None else _lengths(df[lcol], lcol, path)
    order = np.argsort(times, kind="stable")
    times = times[order]
    times.setflags(write=False)
    if lens is not None:
        lens = lens[order]
        lens.setflags(write=False)
    trace = Trace(path=path, times_ms=times, lengths=lens, time_column=tcol if tcol != _BARE else "",
                  columns=tuple(str(c) for c in df.columns if c != _BARE), provenance=dict(prov))
    if len(_cache) > 64:
        _cache.clear()
    _cache[key] = trace
    return trace


def trace_arrivals(trace: Trace, n_queries: int | None = None, rate_qps: float | None = None,
                   time_scale: float | None = None, start_ms: float = 0.0) -> tuple[np.ndarray, np.ndarray | None]:
    """(arrival times in ms, input lengths or None) of a run on ``trace`` (see the module docstring)."""
    if rate_qps is not None and time_scale is not None:
        raise ConfigError("workload.time_scale", "set only one of rate_qps (scale to a mean rate) or time_scale")
    m = len(trace)
    n = m if n_queries is None else int(n_queries)
    idx = np.arange(n)
    if n <= m:
        t = trace.times_ms[:n].copy()
    else:
        span = trace.span_ms
        if m == 1 or span <= 0:
            raise WorkloadError("workload.n_queries", f"the trace {trace.path.name} has {m} request(s)"
                                f"{' all at the same time' if m > 1 else ''}, so it cannot be looped to {n} queries; "
                                f"set n_queries <= {m}")
        period = span * m / (m - 1)  # the span plus one mean gap
        t = trace.times_ms[idx % m] + (idx // m) * period
    lens = None if trace.lengths is None else trace.lengths[idx % m]
    if time_scale is not None:
        t = t * float(time_scale)
    elif rate_qps is not None and n > 1:
        if t[-1] <= 0:
            raise WorkloadError("workload.rate_qps", f"the first {n} requests of trace {trace.path.name} all arrive "
                                                     "at the same time, so they have no rate to scale; take more "
                                                     "n_queries or use time_scale")
        t = t * ((n - 1) * 1000.0 / float(rate_qps) / t[-1])
    return float(start_ms) + t, lens
