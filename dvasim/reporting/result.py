"""What one run gives back, engine-agnostic: :class:`RunResult` (records, summary, resolved config) and its files
(``queries.parquet``/``.csv``, ``summary.json``, ``config.json``, the figures). Every file is written under a
temporary name and renamed when complete (:mod:`dvasim.outputs`): a full disk is one
:class:`~dvasim.errors.OutputError` and leaves no torn file. May import: the foundation, the model data and the
rest of :mod:`dvasim.reporting`."""

from __future__ import annotations

import json
import math
import platform
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from dvasim.outputs import atomic_path, output_error, write_text


@dataclass
class RunResult:
    """A run: its per-query records (``queries``, a DataFrame in query id order), its ``summary``, the resolved
    ``config``, what stopped it early (``stuck``; an interrupted run's ``summary`` also says ``interrupted``). A run
    whose records were streamed to a Parquet file (``records_path``) reads them back on the first use of
    ``queries``."""

    frame: pd.DataFrame | None
    summary: dict[str, Any]
    config: dict[str, Any]
    stuck: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    records_path: Path | None = None

    @property
    def queries(self) -> pd.DataFrame:
        if self.frame is None and self.records_path is not None:
            from dvasim.reporting.records import read_records

            self.frame = read_records(self.records_path)
        return self.frame

    @property
    def interrupted(self) -> bool:
        """The run was stopped before its end (Ctrl-C, a signal): its records are what had been collected."""
        return bool(self.summary.get("interrupted", False))


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("dvasim", "simpy", "numpy", "scipy", "pandas", "seaborn", "torch", "mlcommons-loadgen"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return out


CSV_MAX_ROWS = 100_000  # queries.csv is written by default up to this many queries (queries.parquet always)


def write_outputs(result: RunResult, out_dir: str | Path, figure: bool = True, csv: bool | None = None) -> Path:
    """Write ``queries.parquet`` (unless the run already streamed it there), ``summary.json``, ``config.json``,
    ``queries.csv`` (``csv``; default: runs of at most :data:`CSV_MAX_ROWS` queries, counting those an interrupted
    run left out) and ``latency.png``; for a run with a timeline, ``timeline.json`` (Chrome/Perfetto trace) and
    ``timeline.png`` (Gantt chart). Each file appears complete or not at all; an ``OSError`` (a full disk) raises
    :class:`~dvasim.errors.OutputError`."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise output_error(out, e) from None
    parquet = out / "queries.parquet"
    streamed = result.records_path is not None and Path(result.records_path).resolve() == parquet.resolve()
    if not streamed:
        with atomic_path(parquet) as tmp:
            result.queries.to_parquet(tmp, index=False, compression="zstd")
    summary = dict(result.summary)
    if result.stuck:
        summary["stuck"] = result.stuck
    write_text(out / "summary.json", json.dumps(strict_json(summary), indent=2, default=_json_default,
                                                allow_nan=False) + "\n")
    write_text(out / "config.json",
               json.dumps({"config": result.config, "versions": versions()}, indent=2, default=_json_default) + "\n")
    planned = result.summary.get("n_queries", 0) + result.summary.get("n_not_arrived", 0)
    if csv or (csv is None and planned <= CSV_MAX_ROWS):
        with atomic_path(out / "queries.csv") as tmp:
            result.queries.to_csv(tmp, index=False)
    _write_figures(result, out, figure)
    return out


def _write_figures(result: RunResult, out: Path, figure: bool) -> None:
    """``timeline.json`` and ``timeline.png`` of a run with a timeline, ``latency.png`` (with ``figure``)."""
    from dvasim.reporting.plots import run_title

    summary = {**result.summary, "stuck": result.stuck} if result.stuck else result.summary
    title = run_title(summary, result.config)  # the model, device, stack and load; marked when incomplete
    if "timeline" in result.extra:
        from dvasim.reporting.timeline import chrome_trace, gantt_figure

        tl = result.extra["timeline"]
        # the trace and the figures write themselves whole (dvasim.reporting.timeline, dvasim.reporting.plots)
        chrome_trace(tl, out / "timeline.json", name=f"{result.summary.get('policy')} {result.summary.get('model')}")
        if figure and len(tl):
            gantt_figure(tl, out / "timeline.png", title=title)
    if figure:
        from dvasim.reporting.plots import latency_figure

        df = result.extra.get("latency_sample")
        if df is None:
            df = result.queries
        latency_figure(df, out / "latency.png", title=title,
                       qos_target_ms=result.summary.get("qos_target_ms"), n_queries=result.summary.get("n_queries"))


def strict_json(o):
    """``o`` with every non-finite float (a stability figure of a run too short to judge, say) as None: JSON has no
    NaN or Infinity, and a strict reader (``jq``, JavaScript, ``json.loads(..., parse_constant=...)``) refuses them."""
    if isinstance(o, float):
        return o if math.isfinite(o) else None
    if isinstance(o, dict):
        return {k: strict_json(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [strict_json(v) for v in o]
    if type(o).__module__ == "numpy" and hasattr(o, "item") and getattr(o, "ndim", 1) == 0:
        return strict_json(o.item())  # a numpy scalar (float32 is no float)
    return o


def _json_default(o):
    try:
        import numpy as np

        if isinstance(o, np.generic):
            return o.item()
        if isinstance(o, np.ndarray):
            return o.tolist()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(o, Path):
        return str(o)
    return str(o)
