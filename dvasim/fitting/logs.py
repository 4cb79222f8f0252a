"""Reading replay folders: what ``dvasim replay --out DIR`` writes, as the fit (:mod:`dvasim.fitting.fit`) and the
checks of a fitted engine (:mod:`dvasim.fitting.check`) take it.

A replay folder holds ``config.toml`` (or ``config.json``), ``queries.csv`` and ``executions.csv``; each may be
gzipped (``NAME.gz``). Anything missing, unreadable (a truncated gzip, a file cut in the middle of a line) or
not what a replay writes (a config that is not a table, no rows, a stage that is not an integer, a time that is
not a finite number or is beyond any replay, :data:`MAX_MS`, an execution's thread time longer than its span or its
copies longer than its thread time) is a :class:`~dvasim.errors.ConfigError` naming ``fit`` and the file, before
anything is fitted.
"""

from __future__ import annotations

import gzip
import io
import json
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dvasim.errors import ConfigError

__all__ = ["read_replay", "find_log", "read_log_text"]

QUERY_COLUMNS = {"arrival_ms", "seen_ms", "finish_ms"}
MAX_STAGES, MAX_BATCH, MAX_SEQ_LEN = 100_000, 1_000_000, 1_000_000  # beyond any model a replay runs
EXECUTION_COLUMNS = {"stage", "batch_size", "table_ms", "begin_ms", "end_ms", "compute_ms", "copy_ms", "handoff_ms",
                     "bookkeeping_ms"}
# columns a replay leaves empty where there is nothing to say (a query never seen or never answered, a launch
# whose copies were not timed); every other column named above must hold a finite number in every row
MAY_BE_EMPTY = {"seen_ms", "finish_ms", "copy_ms"}
DURATIONS = ("table_ms", "compute_ms", "copy_ms", "handoff_ms", "bookkeeping_ms")  # >= 0 where given (table_ms > 0)
MAX_MS = 1e9  # every time in a replay's files, ms: 11.6 days, beyond any replay (a larger one is a damaged cell)
SPAN_SLACK_MS = 1e-3  # rounding allowed where one time must lie within another (a replay writes them exactly)
CONFIG_SECTIONS = ("model", "policy", "workload", "engine", "replay", "qos")  # tables where present


def find_log(d: Path, stem: str) -> Path | None:
    """``d / stem``, else ``d / (stem + ".gz")``, whichever is a file; ``None`` if neither."""
    for name in (stem, stem + ".gz"):
        if (d / name).is_file():
            return d / name
    return None


def read_log_text(p: Path) -> str:
    """The text of a (possibly gzipped) UTF-8 file."""
    try:
        if p.suffix == ".gz":
            with gzip.open(p, "rt", encoding="utf-8") as f:
                return f.read()
        return p.read_text(encoding="utf-8")
    except EOFError:
        raise ConfigError("fit", f"{p}: the gzip stream is cut short (a truncated copy?); copy the folder again "
                                 "or give the uncompressed file") from None
    except (OSError, UnicodeDecodeError, zlib.error) as e:
        raise ConfigError("fit", f"{p}: cannot be read ({e})") from None


def read_replay(path) -> dict[str, Any]:
    """One replay folder: ``{"dir", "config", "queries", "executions"}`` (DataFrames), every file checked."""
    d = Path(path)
    if not d.is_dir():
        raise ConfigError("fit", f"{str(d)!r} is not a folder; give replay output folders (dvasim replay --out DIR)")
    cfg = _read_config(d)
    frames = {}
    for stem, need in (("queries.csv", QUERY_COLUMNS), ("executions.csv", EXECUTION_COLUMNS)):
        frames[stem.split(".")[0]] = _read_frame(d, stem, need)
    _check_stages(d, frames["executions"], cfg)
    return {"dir": str(d), "config": cfg, **frames}


def _read_config(d: Path) -> dict[str, Any]:
    """The folder's config: ``config.toml``, else the ``config`` of ``config.json``; a table whose sections are
    tables."""
    cfg_path = find_log(d, "config.toml") or find_log(d, "config.json")
    if cfg_path is None:
        raise ConfigError("fit", f"{d}: no config.toml or config.json; give a folder written by dvasim replay")
    raw = read_log_text(cfg_path)
    try:
        if cfg_path.name.startswith("config.toml"):
            import tomllib

            cfg = tomllib.loads(raw)
        else:
            data = json.loads(raw)
            cfg = data.get("config") if isinstance(data, dict) else None
    except (ValueError, RecursionError) as e:
        raise ConfigError("fit", f"{cfg_path}: cannot be read ({e})") from None
    if not isinstance(cfg, dict):
        raise ConfigError("fit", f"{cfg_path}: holds no config table (config.json must be an object with a "
                                 "\"config\" object, as dvasim replay writes it)")
    for section in CONFIG_SECTIONS:
        if section in cfg and not isinstance(cfg[section], dict):
            raise ConfigError("fit", f"{cfg_path}: [{section}] must be a table, got {type(cfg[section]).__name__}")
    _check_config_keys(cfg_path, cfg)
    return cfg


def _check_config_keys(cfg_path: Path, cfg: dict[str, Any]) -> None:
    """The keys fit reads from a replay's config, checked against the schema's declaration of them."""
    from dvasim.config.sections import REPLAY
    from dvasim.model.catalog import MODEL

    for section, keys in ((MODEL, ("name", "device", "stages")), (REPLAY, ("modules",))):
        table = cfg.get(section.name, {})
        for key in keys:
            if key in table:
                try:
                    section[key].check(section.name, table[key])
                except ConfigError as e:
                    raise ConfigError("fit", f"{cfg_path}: {e}") from None


def _read_frame(d: Path, stem: str, need: set[str]) -> pd.DataFrame:
    """One of the folder's CSV files, which must be whole (end with a line break), have the columns ``need``,
    at least one row, and finite numbers in them (:data:`MAY_BE_EMPTY` may be empty)."""
    p = find_log(d, stem)
    if p is None:
        raise ConfigError("fit", f"{d}: no {stem} (or {stem}.gz); give a folder written by dvasim replay")
    text = read_log_text(p)
    if text and not text.endswith("\n"):
        raise ConfigError("fit", f"{p}: ends in the middle of a line (a cut copy?); copy the folder again")
    try:
        df = pd.read_csv(io.StringIO(text))
    except (ValueError, pd.errors.ParserError) as e:
        raise ConfigError("fit", f"{p}: not a readable CSV ({str(e).strip()})") from None
    missing = sorted(need - set(df.columns))
    if missing:
        raise ConfigError("fit", f"{p}: missing columns {', '.join(missing)}; is it a replay's {stem}?")
    if df.empty:
        raise ConfigError("fit", f"{p}: has no rows (only a header); give a replay that ran queries")
    for col in sorted(need):
        _check_column(p, df, col)
    return df


def _check_column(p: Path, df: pd.DataFrame, col: str) -> None:
    """``df[col]`` numeric and finite (empty only where :data:`MAY_BE_EMPTY` allows); a time (``*_ms``) at most
    :data:`MAX_MS` in size, a duration ``>= 0``, the table's time ``> 0``."""
    x = pd.to_numeric(df[col], errors="coerce").to_numpy(float)
    bad = np.isinf(x) | (np.isnan(x) & (df[col].notna().to_numpy() | (col not in MAY_BE_EMPTY)))
    what = "a finite number"
    if col.endswith("_ms"):
        bad |= np.abs(x) > MAX_MS  # (nan compares false: an allowed empty cell stays allowed)
        what = f"a finite number of ms within +-{MAX_MS:.0e} (more is beyond any replay)"
    if col == "table_ms":
        bad |= x <= 0
        what = f"a number of ms > 0 and <= {MAX_MS:.0e} (more is beyond any replay)"
    elif col in DURATIONS:
        bad |= x < 0
        what = f"a number of ms in 0..{MAX_MS:.0e} (more is beyond any replay)"
    if bad.any():
        i = int(np.argmax(bad))
        v = df[col].iloc[i]
        got = "empty" if pd.isna(v) else repr(v) if isinstance(v, str) else str(v)
        raise ConfigError("fit", f"{p}: data row {i + 1}: {col} is {got}; each must be {what}")
    df[col] = x


def _check_stages(d: Path, ex: pd.DataFrame, cfg: dict[str, Any]) -> None:
    """Stages are the integers ``0..n-1``, every one executed (and ``n`` the config's ``[model] stages`` where it
    says); batch sizes integers >= 1; no execution ends before it begins."""
    for col, lo, hi in (("stage", 0, MAX_STAGES - 1), ("batch_size", 1, MAX_BATCH), ("seq_len", 1, MAX_SEQ_LEN)):
        if col not in ex.columns:  # seq_len: written by every replay, optional here
            continue
        v = pd.to_numeric(ex[col], errors="coerce").to_numpy(float)
        bad = ~np.isfinite(v) | (v != np.round(v)) | (v < lo) | (v > hi)
        if bad.any():
            i = int(np.argmax(bad))
            raise ConfigError("fit", f"{d}: executions.csv data row {i + 1}: {col} is {ex[col].iloc[i]}; must be an "
                                     f"integer in {lo}..{hi}")
        ex[col] = v.astype(np.int64)
    seen = set(ex["stage"].tolist())
    n = max(seen) + 1
    if len(seen) != n:
        missing = min(set(range(n)) - seen)
        raise ConfigError("fit", f"{d}: executions.csv has stages up to {n - 1} but none of stage {missing}; "
                                 "is the file whole?")
    stages = cfg.get("model", {}).get("stages")
    if isinstance(stages, int) and not isinstance(stages, bool) and stages != n:
        raise ConfigError("fit", f"{d}: its config cuts the model into {stages} stages, executions.csv has {n}")
    late = ex["end_ms"].to_numpy() < ex["begin_ms"].to_numpy()
    if late.any():
        i = int(np.argmax(late))
        raise ConfigError("fit", f"{d}: executions.csv data row {i + 1}: end_ms before begin_ms")
    _check_within(d, ex)


def _check_within(d: Path, ex: pd.DataFrame) -> None:
    """An execution's thread time lies within its span (a replay writes ``compute_ms = end_ms - begin_ms``) and
    its copies within its thread time (``copy_ms <= compute_ms``): a cell that breaks either is no time the fit can
    trust (one ``compute_ms`` of 1e308 ms made an engine whose launches cost 1e+304 ms an operator)."""
    span = ex["end_ms"].to_numpy() - ex["begin_ms"].to_numpy()
    compute, copy = ex["compute_ms"].to_numpy(), ex["copy_ms"].to_numpy()
    for col, x, limit, what in (("compute_ms", compute, span, "its span end_ms - begin_ms"),
                                ("copy_ms", copy, compute, "its compute_ms (the copies are part of it)")):
        bad = x > limit + SPAN_SLACK_MS  # (an empty copy_ms is nan: never bad)
        if bad.any():
            i = int(np.argmax(bad))
            raise ConfigError("fit", f"{d}: executions.csv data row {i + 1}: {col} is {x[i]:g} ms, more than "
                                     f"{what} ({limit[i]:g} ms); give the folder as dvasim replay wrote it")
