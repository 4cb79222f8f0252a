"""Per-stage latency tables: how long each stage of a sliced DNN takes for a batch.

File format
-----------
A CSV with columns ``stage,batch_size,latency_ms`` and optionally ``seq_len`` (any order, no other columns).
Stages are 0-indexed integers ``0..N-1`` with no gaps. Every stage must have exactly the same grid of
profiled points: the full cross product of the table's batch sizes (and sequence lengths, if the table has
a ``seq_len`` column); no duplicate rows. Latencies are in milliseconds, finite and > 0.

Provenance is kept in leading comment lines of the form ``# key: value`` before the CSV header, e.g.::

    # source: uwsampl/nexus tests/data/model_db/profiles/... (commit ...)
    # gpu: NVIDIA TITAN X (Pascal)
    stage,batch_size,latency_ms
    0,1,1.52

Keys are lower-cased; a repeated key has its values joined with a space; comment lines without a colon are
ignored. A table without provenance loads with ``provenance == {"source": "unspecified"}``.

Lookup semantics (``LatencyTable.latency`` and everything built on it)
---------------------------------------------------------------------
* Batch sizes between profiled points are linearly interpolated (piecewise linear in the batch size).
* Sequence lengths between profiled points are likewise linearly interpolated; with both dimensions the
  lookup is bilinear on the (batch_size, seq_len) grid.
* A ``seq_len`` below the smallest profiled length is *padded up* to it (padding an input is always
  possible, so the query costs what the shortest profiled length costs). Likewise a ``batch_size`` below
  the smallest profiled batch size (but >= 1) is padded up to that batch size.
* ``batch_size`` < 1, not an integer, or > the largest profiled batch size raises ``TableError`` naming
  ``batch_size``; ``seq_len`` < 1, not an integer, or > the largest profiled length raises ``TableError``
  naming ``seq_len``. Nothing is ever extrapolated upwards.
* If the table has a ``seq_len`` column, ``seq_len=None`` raises ``TableError`` (the table needs it); if it
  has none, any ``seq_len`` passed is ignored.
* Stage outside ``0..N-1`` raises ``TableError`` naming ``stage``.

Derived quantities: ``throughput = batch_size / latency`` (queries per ms); ``demand`` is the throughput at a
batch size relative to the stage's best throughput over the profiled batch sizes at that sequence length,
clipped to (0, 1]; the *preferred batch size* of a stage (DVABatch paper, Sec. 3.2 / Figure 5) is the smallest
profiled batch size reaching ``threshold`` (default 0.9) of that best throughput.

Lookups are cached per ``(stage, batch_size, seq_len)``; the table is immutable after construction.
"""

from __future__ import annotations

import bisect
import io
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dvasim.core.arith import left_sum
from dvasim.errors import TableError
from dvasim.paths import traces_dir

__all__ = ["LatencyTable", "traces_dir", "default_table_path", "DEFAULT_TABLE_PATH", "read_provenance_csv"]

_FIELD = "model.table"
_REQUIRED = ("stage", "batch_size", "latency_ms")
_OPTIONAL = ("seq_len",)
_KEY_RE = re.compile(r"^[^:#\r\n]+$")


def default_table_path() -> Path:
    """Path of the shipped default table (VGG16 on a TITAN X (Pascal), 4 stages)."""
    return traces_dir() / "default" / "vgg16_titanx_4stages.csv"


DEFAULT_TABLE_PATH = default_table_path()


def provenance_header(prov: dict) -> str:
    """``# key: value`` lines (``source`` first, each value on one line) that :func:`read_provenance_csv` reads."""
    items = [("source", prov.get("source", "unspecified"))] + [(k, v) for k, v in prov.items() if k != "source"]
    return "".join(f"# {' '.join(str(k).replace(':', ' ').split())}: {' '.join(str(v).split())}\n" for k, v in items)


def read_provenance_csv(text: str) -> tuple[dict[str, str], str]:
    """Split ``text`` into (provenance dict from the leading ``# key: value`` lines, remaining CSV text)."""
    lines = text.splitlines(keepends=True)
    prov: dict[str, str] = {}
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith("\ufeff"):
            stripped = stripped[1:].strip()
        if stripped == "":
            i += 1
            continue
        if not stripped.startswith("#"):
            break
        key, sep, value = stripped.lstrip("#").strip().partition(":")
        key = key.strip().lower()
        if sep and key:
            value = value.strip()
            prov[key] = f"{prov[key]} {value}" if key in prov else value
        i += 1
    return prov, "".join(lines[i:])


def _is_intlike(x: Any) -> bool:
    if isinstance(x, bool | np.bool_):
        return False
    if isinstance(x, int | np.integer):
        return True
    if isinstance(x, float | np.floating):
        return math.isfinite(x) and float(x).is_integer()
    return False


def _check_columns(df: pd.DataFrame, fail) -> bool:
    """The table's columns (lower-cased already): the required ones, no unknown or repeated one, and some rows;
    returns whether it has ``seq_len``."""
    cols = list(df.columns)
    allowed = _REQUIRED + _OPTIONAL
    missing = [c for c in _REQUIRED if c not in cols]
    if missing:
        raise fail(f"missing column(s) {', '.join(missing)}; required columns are stage,batch_size,latency_ms (optional seq_len), found {','.join(cols)}")
    unknown = [c for c in cols if c not in allowed]
    if unknown:
        raise fail(f"unknown column(s) {', '.join(unknown)}; allowed columns are stage,batch_size,latency_ms,seq_len")
    dupcols = sorted({c for c in cols if cols.count(c) > 1})
    if dupcols:
        raise fail(f"column(s) {', '.join(dupcols)} appear more than once; give each column once")
    if len(df) == 0:
        raise fail("has no data rows; give at least one row per stage and batch size")
    return "seq_len" in cols


def _numeric_columns(df: pd.DataFrame, keys: list[str], fail) -> dict[str, np.ndarray]:
    """The key columns and ``latency_ms`` as float arrays: every cell a finite number, the keys integers at or
    above their lowest value (stage 0, batch size and length 1), the latencies > 0."""
    num: dict[str, np.ndarray] = {}
    for c in keys + ["latency_ms"]:
        raw = df[c]
        if pd.api.types.is_bool_dtype(raw):
            vals = pd.Series(np.nan, index=raw.index)
        elif pd.api.types.is_numeric_dtype(raw):
            vals = raw
        else:
            vals = pd.to_numeric(raw.astype(str).str.strip(), errors="coerce")
        arr = vals.to_numpy(dtype=np.float64, na_value=np.nan)
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            r = int(bad[0])
            raise fail(f"column {c} has a non-numeric or missing value {str(raw.iloc[r])!r} in data row {r + 1}; every cell must be a finite number")
        num[c] = arr
    for c in keys:
        arr = num[c]
        bad = np.flatnonzero(arr != np.round(arr))
        if bad.size:
            r = int(bad[0])
            raise fail(f"column {c} must hold integers, got {arr[r]!r} in data row {r + 1}")
    lows = {"stage": 0, "batch_size": 1, "seq_len": 1}
    for c in keys:
        bad = np.flatnonzero(num[c] < lows[c])
        if bad.size:
            r = int(bad[0])
            raise fail(f"column {c} must be >= {lows[c]}, got {num[c][r]:g} in data row {r + 1}")
    lat = num["latency_ms"]
    bad = np.flatnonzero(lat <= 0)
    if bad.size:
        r = int(bad[0])
        raise fail(f"latency_ms must be > 0, got {lat[r]!r} in data row {r + 1}")
    return num


def _grid_array(num: dict[str, np.ndarray], has_seq: bool, fail) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The latencies as ``lat[stage, i_batch, i_seq]`` with the batch-size and length grids (a length grid of
    one 1 without ``seq_len``): no duplicate point, stages 0..N-1, every stage on the full grid."""
    stage = num["stage"].astype(np.int64)
    bs = num["batch_size"].astype(np.int64)
    sl = num["seq_len"].astype(np.int64) if has_seq else np.ones_like(bs)
    lat = num["latency_ms"]
    tidy = pd.DataFrame({"stage": stage, "batch_size": bs, "seq_len": sl, "latency_ms": lat})
    dup = tidy.duplicated(subset=["stage", "batch_size", "seq_len"], keep="first")
    if dup.any():
        r = int(np.flatnonzero(dup.to_numpy())[0])
        what = f"stage {stage[r]}, batch_size {bs[r]}" + (f", seq_len {sl[r]}" if has_seq else "")
        raise fail(f"duplicate row for {what} (data row {r + 1}); give each point once")

    stages = np.unique(stage)
    n_stages = len(stages)
    if not np.array_equal(stages, np.arange(n_stages)):
        raise fail(f"stages must be contiguous integers 0..N-1, found {stages.tolist()}")
    b_grid = np.unique(bs)
    l_grid = np.unique(sl)
    per_stage = tidy.groupby("stage")
    for s, g in per_stage:
        pts_b = np.unique(g["batch_size"].to_numpy())
        pts_l = np.unique(g["seq_len"].to_numpy())
        if (
            len(g) != len(b_grid) * len(l_grid)
            or not np.array_equal(pts_b, b_grid)
            or not np.array_equal(pts_l, l_grid)
        ):
            grid = f"{len(b_grid)} batch sizes" + (f" x {len(l_grid)} seq_lens" if has_seq else "")
            raise fail(
                f"ragged grid: stage {s} has {len(g)} points but the table's grid is {grid} "
                f"({len(b_grid) * len(l_grid)} points); every stage needs every "
                + ("(batch_size, seq_len) combination" if has_seq else "batch size")
            )

    arr = np.empty((n_stages, len(b_grid), len(l_grid)), dtype=np.float64)
    bi = np.searchsorted(b_grid, bs)
    li = np.searchsorted(l_grid, sl)
    arr[stage, bi, li] = lat
    return arr, b_grid, l_grid


def _cuts(text: str | None, n_stages: int, name: str) -> tuple[int, ...] | None:
    """A table's cut bounds (its ``# cuts:`` line: the first operator of each stage, comma-separated, as
    :func:`dvasim.model.slicing.stage_table` and ``dvasim profile`` write it); None when the table has none."""
    if text is None or not text.strip():
        return None
    try:
        cuts = tuple(int(x) for x in text.replace("[", "").replace("]", "").split(","))
    except ValueError:
        cuts = ()
    if len(cuts) != n_stages or cuts[0] != 0 or any(b <= a for a, b in zip(cuts, cuts[1:])):
        raise TableError("cuts", f"table {name!r}: its cuts line must give {n_stages} increasing operator indices from 0 "
                         f"(the first operator of each stage), got {text!r}")
    return cuts


class LatencyTable:
    """Per-stage latencies (ms) on a grid of batch sizes (and optionally sequence lengths)."""

    n_stages: int
    batch_sizes: np.ndarray
    seq_lens: np.ndarray | None
    max_batch_size: int
    provenance: dict[str, str]
    name: str
    cuts: tuple[int, ...] | None  # the first operator of each stage, where the table was cut from a model's operators

    # ------------------------------------------------------------------ construction
    def __init__(
        self,
        lat: np.ndarray,
        batch_sizes: np.ndarray,
        seq_lens: np.ndarray | None,
        provenance: dict[str, str] | None = None,
        name: str = "table",
    ):
        """Low-level constructor: ``lat[stage, i_batch, i_seq]`` (``i_seq`` axis of length 1 without seq_lens).

        Prefer :meth:`load` or :meth:`from_frame`, which validate their input.
        """
        self._lat = np.asarray(lat, dtype=np.float64)
        self.batch_sizes = np.asarray(batch_sizes, dtype=np.int64)
        self.seq_lens = None if seq_lens is None else np.asarray(seq_lens, dtype=np.int64)
        self.n_stages = int(self._lat.shape[0])
        self.max_batch_size = int(self.batch_sizes[-1])
        self.name = str(name)
        prov = {str(k).strip().lower(): str(v) for k, v in (provenance or {}).items()}
        prov.setdefault("source", "unspecified")
        self.provenance = prov
        self.cuts = _cuts(prov.get("cuts"), self.n_stages, self.name)
        # plain-Python copies for fast scalar lookups
        self._b_list = [int(b) for b in self.batch_sizes]
        self._l_list = None if self.seq_lens is None else [int(s) for s in self.seq_lens]
        self._min_b = self._b_list[0]
        self._min_l = None if self._l_list is None else self._l_list[0]
        self._max_l = None if self._l_list is None else self._l_list[-1]
        self._b_index = {b: i for i, b in enumerate(self._b_list)}
        self._l_index = None if self._l_list is None else {s: i for i, s in enumerate(self._l_list)}
        self._lat_list = self._lat.tolist()
        # a bucketed table (``# length buckets: true``, e.g. profiled from CUDA graphs captured per length)
        # pads every input up to the next profiled length instead of interpolating between two
        self.bucketed = self._l_list is not None and prov.get("length buckets", "").strip().lower() in ("true", "yes", "1")
        self._cache: dict[tuple, float] = {}
        self._max_thr_cache: dict[tuple, float] = {}

    @classmethod
    def load(cls, path) -> LatencyTable:
        """Load a table from a CSV file (with optional ``# key: value`` provenance header)."""
        p = Path(path)
        if not p.is_file():
            raise TableError(
                _FIELD,
                f"latency table file not found: {p}; give the path of a CSV with columns "
                "stage,batch_size,latency_ms[,seq_len]",
            )
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TableError(_FIELD, f"cannot read latency table {p}: {exc}; it must be a UTF-8 CSV file") from None
        prov, body = read_provenance_csv(text)
        if body.strip() == "":
            raise TableError(
                _FIELD, f"latency table {p} has no CSV data; it needs a header stage,batch_size,latency_ms[,seq_len] and rows"
            )
        try:
            df = pd.read_csv(io.StringIO(body), skipinitialspace=True, dtype=str, keep_default_na=False)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, ValueError) as exc:
            msg = str(exc).replace("\n", " ")
            raise TableError(_FIELD, f"latency table {p} is not a valid CSV ({msg}); expected columns stage,batch_size,latency_ms[,seq_len]") from None
        return cls._build(df, prov, p.stem, origin=str(p))

    @classmethod
    def from_frame(cls, df: pd.DataFrame, provenance: dict[str, str] | None = None, name: str = "table") -> LatencyTable:
        """Build (and validate) a table from a DataFrame with columns stage,batch_size,latency_ms[,seq_len]."""
        if not isinstance(df, pd.DataFrame):
            raise TableError(_FIELD, f"from_frame needs a pandas DataFrame, got {type(df).__name__}")
        return cls._build(df, dict(provenance or {}), name, origin=f"table '{name}'")

    @classmethod
    def _build(cls, df: pd.DataFrame, prov: dict[str, str], name: str, origin: str) -> LatencyTable:
        def fail(problem: str) -> TableError:
            return TableError(_FIELD, f"{origin}: {problem}")

        df = df.copy()
        df.columns = [str(c).strip().lower() for c in df.columns]
        has_seq = _check_columns(df, fail)
        keys = ["stage", "batch_size"] + (["seq_len"] if has_seq else [])
        num = _numeric_columns(df, keys, fail)
        arr, b_grid, l_grid = _grid_array(num, has_seq, fail)
        for k in list(prov):
            if not _KEY_RE.match(str(k).strip()):
                raise fail(f"provenance key {k!r} is invalid; keys must be non-empty single-line text without ':' or '#'")
        return cls(arr, b_grid, l_grid if has_seq else None, prov, name)

    # ------------------------------------------------------------------ export
    def to_frame(self) -> pd.DataFrame:
        """The table as a tidy DataFrame (stage, batch_size[, seq_len], latency_ms), sorted by those keys."""
        n_b = len(self._b_list)
        n_l = 1 if self.seq_lens is None else len(self.seq_lens)
        s, b, ll = np.meshgrid(np.arange(self.n_stages), np.arange(n_b), np.arange(n_l), indexing="ij")
        data = {
            "stage": s.ravel().astype(np.int64),
            "batch_size": self.batch_sizes[b.ravel()],
        }
        if self.seq_lens is not None:
            data["seq_len"] = self.seq_lens[ll.ravel()]
        data["latency_ms"] = self._lat[s.ravel(), b.ravel(), ll.ravel()]
        return pd.DataFrame(data)

    def save(self, path) -> None:
        """Write the provenance header (``# key: value``) and then the CSV; :meth:`load` round-trips it."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        body = self.to_frame().to_csv(index=False, lineterminator="\n", float_format=None)
        p.write_text(provenance_header(self.provenance) + body, encoding="utf-8")

    def __repr__(self) -> str:
        seq = "" if self.seq_lens is None else f", seq_lens {int(self.seq_lens[0])}..{int(self.seq_lens[-1])}"
        return (
            f"LatencyTable(name={self.name!r}, n_stages={self.n_stages}, "
            f"batch_sizes {self._min_b}..{self.max_batch_size}{seq}, source={self.provenance.get('source')!r})"
        )

    # ------------------------------------------------------------------ validation
    def _range_b(self) -> str:
        return f"profiled batch sizes {self._min_b}..{self.max_batch_size} in table '{self.name}'"

    def _norm_bs(self, batch_size) -> int:
        if not _is_intlike(batch_size) or batch_size < 1 or batch_size > self.max_batch_size:
            raise TableError(
                "batch_size",
                f"must be an integer in 1..{self.max_batch_size} ({self._range_b()}), got {batch_size!r}",
            )
        return int(batch_size)

    def _norm_seq(self, seq_len) -> int | None:
        if self._l_list is None:
            return None
        if seq_len is None:
            raise TableError(
                "seq_len",
                f"table '{self.name}' has a seq_len column (profiled {self._min_l}..{self._max_l}); "
                f"pass seq_len as an integer in 1..{self._max_l}",
            )
        if not _is_intlike(seq_len) or seq_len < 1 or seq_len > self._max_l:
            raise TableError(
                "seq_len",
                f"must be an integer in 1..{self._max_l} (profiled seq_lens {self._min_l}..{self._max_l} in table "
                f"'{self.name}'; shorter inputs are padded up to {self._min_l}), got {seq_len!r}",
            )
        return int(seq_len)

    def _norm_stage(self, stage, upper: int | None = None) -> int:
        hi = self.n_stages - 1 if upper is None else upper
        if not _is_intlike(stage) or stage < 0 or stage > hi:
            raise TableError(
                "stage", f"must be an integer in 0..{hi} (table '{self.name}' has {self.n_stages} stages), got {stage!r}"
            )
        return int(stage)

    def check(self, batch_size, seq_len=None) -> None:
        """Raise :class:`TableError` if (batch_size, seq_len) is outside what :meth:`latency` accepts."""
        self._norm_bs(batch_size)
        self._norm_seq(seq_len)

    # ------------------------------------------------------------------ lookups
    @staticmethod
    def _bracket(grid: list[int], index: dict[int, int], x: int) -> tuple[int, int, float]:
        """(lo, hi, weight of hi) for x within [grid[0], grid[-1]] (x already clamped up to grid[0])."""
        i = index.get(x)
        if i is not None:
            return i, i, 0.0
        hi = bisect.bisect_left(grid, x)
        lo = hi - 1
        return lo, hi, (x - grid[lo]) / (grid[hi] - grid[lo])

    def latency(self, stage: int, batch_size: int, seq_len: int | None = None) -> float:
        """Latency (ms) of ``stage`` for a batch of ``batch_size`` inputs of length ``seq_len``."""
        key = (stage, batch_size, seq_len)
        try:
            return self._cache[key]
        except (KeyError, TypeError):
            pass
        s = self._norm_stage(stage)
        b = self._norm_bs(batch_size)
        ln = self._norm_seq(seq_len)
        rows = self._lat_list[s]
        b0, b1, wb = self._bracket(self._b_list, self._b_index, max(b, self._min_b))
        if ln is None:
            val = rows[b0][0] * (1.0 - wb) + rows[b1][0] * wb if wb else rows[b0][0]
        else:
            l0, l1, wl = self._bracket(self._l_list, self._l_index, max(ln, self._min_l))
            if self.bucketed and wl:
                l0, wl = l1, 0.0
            v0 = rows[b0][l0] * (1.0 - wl) + rows[b0][l1] * wl if wl else rows[b0][l0]
            if wb:
                v1 = rows[b1][l0] * (1.0 - wl) + rows[b1][l1] * wl if wl else rows[b1][l0]
                val = v0 * (1.0 - wb) + v1 * wb
            else:
                val = v0
        val = float(val)
        try:
            self._cache[key] = val
        except TypeError:  # unhashable argument types; just don't cache
            pass
        return val

    def bucket(self, seq_len: int | None) -> int | None:
        """The length an input of ``seq_len`` runs at: the smallest profiled length that holds it for a bucketed
        table; ``seq_len`` unchanged otherwise (and for tables without lengths)."""
        if not self.bucketed or seq_len is None:
            return seq_len
        ln = self._norm_seq(seq_len)
        return self._l_list[bisect.bisect_left(self._l_list, max(ln, self._min_l))]

    def stage_latencies(self, batch_size: int, seq_len: int | None = None) -> list[float]:
        """Latency (ms) of every stage, in order."""
        return [self.latency(s, batch_size, seq_len) for s in range(self.n_stages)]

    def total(self, batch_size: int, seq_len: int | None = None) -> float:
        """Sum of the stage latencies (ms): the whole-model latency of one batch run alone."""
        return self.remaining(0, batch_size, seq_len)

    def remaining(self, from_stage: int, batch_size: int, seq_len: int | None = None) -> float:
        """Sum of the latencies (ms) of stages ``from_stage..N-1``; 0.0 when ``from_stage == N``."""
        key = ("rem", from_stage, batch_size, seq_len)
        try:
            return self._cache[key]
        except (KeyError, TypeError):
            pass
        f = self._norm_stage(from_stage, upper=self.n_stages)
        self.check(batch_size, seq_len)
        val = float(left_sum(self.latency(s, batch_size, seq_len) for s in range(f, self.n_stages)))
        try:
            self._cache[key] = val
        except TypeError:
            pass
        return val

    def throughput(self, stage: int, batch_size: int, seq_len: int | None = None) -> float:
        """Queries per ms of ``stage`` at this batch size: ``batch_size / latency``."""
        return batch_size / self.latency(stage, batch_size, seq_len)

    def _max_throughput(self, stage: int, seq_len: int | None) -> float:
        key = (stage, seq_len)
        got = self._max_thr_cache.get(key)
        if got is None:
            # batch_size / latency at every profiled batch size (what throughput() gives there, without its
            # per-call checks: at a profiled batch size only the length is interpolated)
            rows = self._lat_list[self._norm_stage(stage)]
            if seq_len is None:
                lats = [r[0] for r in rows]
            else:
                l0, l1, wl = self._bracket(self._l_list, self._l_index, max(seq_len, self._min_l))
                if self.bucketed and wl:
                    l0, wl = l1, 0.0
                lats = [r[l0] * (1.0 - wl) + r[l1] * wl for r in rows] if wl else [r[l0] for r in rows]
            got = max(b / float(lat) for b, lat in zip(self._b_list, lats))
            self._max_thr_cache[key] = got
        return got

    def demand(self, stage: int, batch_size: int, seq_len: int | None = None) -> float:
        """Throughput at ``batch_size`` relative to the stage's best over profiled batch sizes, in (0, 1].

        Because latency is piecewise linear in the batch size, throughput is monotone on every segment, so
        the best over profiled points is also the best over all batch sizes in range.
        """
        thr = self.throughput(stage, batch_size, seq_len)
        return min(1.0, thr / self._max_throughput(int(stage), self._norm_seq(seq_len)))

    def preferred_batch_size(self, stage: int, seq_len: int | None = None, threshold: float = 0.9) -> int:
        """Smallest profiled batch size whose throughput is >= ``threshold`` x the stage's best throughput."""
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0 < threshold <= 1:
            raise TableError("threshold", f"must be a number in (0, 1], got {threshold!r}")
        s = self._norm_stage(stage)
        ln = self._norm_seq(seq_len)
        best = self._max_throughput(s, ln)
        target = threshold * best * (1.0 - 1e-12)
        for b in self._b_list:
            if self.throughput(s, b, ln) >= target:
                return b
        return self.max_batch_size  # unreachable: the best point always qualifies
