"""Input-length (sequence length) distributions for models with a sequence dimension (e.g. BERT).

Shipped distributions live in ``traces/glue/<TASK>.csv`` (one row per GLUE dev example; see
``traces/README.md``). Their ``seq_len`` is a *whitespace-word approximation* of the BERT input length:
words of the text field(s) + 2 special tokens for single sentences or + 3 for sentence pairs. No WordPiece
vocabulary is available offline, so real BERT token counts would be somewhat longer.

A length spec is either ``"glue:<TASK>"`` (task name case-insensitive, e.g. ``"glue:RTE"``) or a path to a CSV
with a ``seq_len`` column of positive integers (optionally preceded by ``# key: value`` comment lines).
Relative paths are resolved against ``base_dir`` if given, else the current directory.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

from dvasim.errors import ConfigError, WorkloadError
from dvasim.model.table import read_provenance_csv, traces_dir

__all__ = ["glue_tasks", "glue_path", "load_lengths"]

_FIELD = "workload.seq_len_dist"
_cache: dict[str, np.ndarray] = {}


def _glue_dir() -> Path:
    return traces_dir() / "glue"


def glue_tasks() -> list[str]:
    """Names of the shipped GLUE tasks (e.g. ``['CoLA', 'MRPC', 'QNLI', 'QQP', 'RTE', 'SST-2', 'STS-B', 'WNLI']``)."""
    d = _glue_dir()
    if not d.is_dir():
        return []
    return sorted((p.stem for p in d.glob("*.csv")), key=str.lower)


def glue_path(task: str) -> Path:
    """Path of the shipped length file of a GLUE task (case-insensitive name); ConfigError if not shipped."""
    tasks = glue_tasks()
    by_lower = {t.lower(): t for t in tasks}
    name = by_lower.get(str(task).strip().lower())
    if name is None:
        raise ConfigError(
            _FIELD,
            f"unknown GLUE task {task!r}; shipped tasks are {', '.join(tasks) or '(none found in ' + str(_glue_dir()) + ')'}"
            " (write e.g. seq_len_dist = \"glue:RTE\")",
        )
    return _glue_dir() / f"{name}.csv"


def load_lengths(spec: str, base_dir: str | Path | None = None) -> np.ndarray:
    """The empirical length distribution named by ``spec`` as an int64 array (one entry per example).

    The returned array is read-only (it is cached); copy it before modifying.
    """
    if not isinstance(spec, str) or spec.strip() == "":
        raise ConfigError(
            _FIELD, f"must be a string \"glue:<TASK>\" or a path to a CSV with a seq_len column, got {spec!r}"
        )
    spec = spec.strip()
    if spec.lower().startswith("glue:"):
        path = glue_path(spec[5:])
    else:
        path = Path(spec).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = Path(base_dir) / path
        if not path.is_file():
            raise ConfigError(
                _FIELD,
                f"length file not found: {path}; give \"glue:<TASK>\" (tasks: {', '.join(glue_tasks())}) "
                "or the path of a CSV with a seq_len column",
            )
    key = str(path.resolve())
    got = _cache.get(key)
    if got is None:
        got = _read_lengths_csv(path)
        got.setflags(write=False)
        _cache[key] = got
    return got


def _read_lengths_csv(path: Path) -> np.ndarray:
    try:
        _, body = read_provenance_csv(path.read_text(encoding="utf-8"))
        df = pd.read_csv(io.StringIO(body), skipinitialspace=True)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        msg = str(exc).replace("\n", " ")
        raise WorkloadError(_FIELD, f"cannot read length file {path} ({msg}); it must be a CSV with a seq_len column") from None
    df.columns = [str(c).strip().lower() for c in df.columns]
    if "seq_len" not in df.columns:
        raise WorkloadError(
            _FIELD, f"length file {path} has no seq_len column (columns: {', '.join(df.columns)}); add a seq_len column"
        )
    if len(df) == 0:
        raise WorkloadError(_FIELD, f"length file {path} has no rows; it needs at least one seq_len value")
    vals = pd.to_numeric(df["seq_len"], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = np.flatnonzero(~np.isfinite(vals) | (vals < 1) | (vals != np.round(vals)))
    if bad.size:
        r = int(bad[0])
        raise WorkloadError(
            _FIELD,
            f"length file {path}: seq_len must be integers >= 1, got {df['seq_len'].iloc[r]!r} in data row {r + 1}",
        )
    return vals.astype(np.int64)


def check_lengths(profile, seq_lens) -> None:
    """Fail before simulating if some input is longer than the table's profiled range."""
    from dvasim.errors import WorkloadError

    longest = int(max(seq_lens))
    top = int(profile.seq_lens.max())
    if longest > top:
        n = int((seq_lens > top).sum())
        raise WorkloadError(
            "workload.seq_len",
            f"{n} queries have seq_len up to {longest} but the table {profile.name!r} is profiled up to seq_len {top}; "
            "use a table profiled at longer lengths or shorter inputs",
        )
