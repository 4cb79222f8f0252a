"""Reading replay folders: what ``dvasim replay --out DIR`` writes, as the fit (:mod:`dvasim.fitting.fit`) and the
checks of a fitted engine (:mod:`dvasim.fitting.check`) take it.

A replay folder holds ``config.toml`` (or ``config.json``), ``queries.csv`` and ``executions.csv``; each may be
gzipped (``NAME.gz``). Anything missing or unreadable is a :class:`~dvasim.errors.ConfigError` naming ``fit``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pandas as pd

from dvasim.errors import ConfigError

__all__ = ["read_replay", "find_log", "read_log_text"]

QUERY_COLUMNS = {"arrival_ms", "seen_ms", "finish_ms"}
EXECUTION_COLUMNS = {"stage", "batch_size", "table_ms", "begin_ms", "end_ms", "compute_ms", "copy_ms", "handoff_ms",
                     "bookkeeping_ms"}


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
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("fit", f"{p}: cannot be read ({e})") from None


def read_replay(path) -> dict[str, Any]:
    """One replay folder: ``{"dir", "config", "queries", "executions"}`` (DataFrames)."""
    d = Path(path)
    if not d.is_dir():
        raise ConfigError("fit", f"{str(d)!r} is not a folder; give replay output folders (dvasim replay --out DIR)")
    cfg = _read_config(d)
    frames = {}
    for stem, need in (("queries.csv", QUERY_COLUMNS), ("executions.csv", EXECUTION_COLUMNS)):
        frames[stem.split(".")[0]] = _read_frame(d, stem, need)
    if frames["executions"].empty:
        raise ConfigError("fit", f"{d}: executions.csv has no rows")
    return {"dir": str(d), "config": cfg, **frames}


def _read_config(d: Path) -> dict[str, Any]:
    """The folder's config: ``config.toml``, else the ``config`` of ``config.json``."""
    cfg_path = find_log(d, "config.toml") or find_log(d, "config.json")
    if cfg_path is None:
        raise ConfigError("fit", f"{d}: no config.toml or config.json; give a folder written by dvasim replay")
    raw = read_log_text(cfg_path)
    try:
        if cfg_path.name.startswith("config.toml"):
            import tomllib

            return tomllib.loads(raw)
        return json.loads(raw).get("config", {})
    except ValueError as e:
        raise ConfigError("fit", f"{cfg_path}: cannot be read ({e})") from None


def _read_frame(d: Path, stem: str, need: set[str]) -> pd.DataFrame:
    """One of the folder's CSV files, which must have the columns ``need``."""
    p = find_log(d, stem)
    if p is None:
        raise ConfigError("fit", f"{d}: no {stem} (or {stem}.gz); give a folder written by dvasim replay")
    try:
        df = pd.read_csv(p)
    except (ValueError, OSError, UnicodeDecodeError) as e:
        raise ConfigError("fit", f"{p}: not a readable CSV ({e})") from None
    missing = sorted(need - set(df.columns))
    if missing:
        raise ConfigError("fit", f"{p}: missing columns {', '.join(missing)}; is it a replay's {stem}?")
    return df
