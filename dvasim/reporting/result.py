"""What one run gives back, engine-agnostic: :class:`RunResult` (records, summary, resolved config) and its files
(``queries.parquet``/``.csv``, ``summary.json``, ``config.json``, the figures). May import: the foundation, the
model data and the rest of :mod:`dvasim.reporting`."""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd


@dataclass
class RunResult:
    """A run: its per-query records (``queries``, a DataFrame in query id order), its ``summary``, the resolved
    ``config``, what stopped it early (``stuck``). A run whose records were streamed to a Parquet file
    (``records_path``) reads them back on the first use of ``queries``."""

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
    """Write ``queries.parquet`` (unless the run already streamed it there), ``queries.csv`` (``csv``; default:
    runs of at most :data:`CSV_MAX_ROWS` queries), ``summary.json``, ``config.json`` and ``latency.png``; for a
    run with a timeline, ``timeline.json`` (Chrome/Perfetto trace) and ``timeline.png`` (Gantt chart)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parquet = out / "queries.parquet"
    streamed = result.records_path is not None and Path(result.records_path).resolve() == parquet.resolve()
    if not streamed:
        result.queries.to_parquet(parquet, index=False, compression="zstd")
    if csv or (csv is None and result.summary.get("n_queries", 0) <= CSV_MAX_ROWS):
        result.queries.to_csv(out / "queries.csv", index=False)
    summary = dict(result.summary)
    if result.stuck:
        summary["stuck"] = result.stuck
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=_json_default) + "\n")
    (out / "config.json").write_text(
        json.dumps({"config": result.config, "versions": versions()}, indent=2, default=_json_default) + "\n"
    )
    if "timeline" in result.extra:
        from dvasim.reporting.plots import run_title
        from dvasim.reporting.timeline import chrome_trace, gantt_figure

        tl = result.extra["timeline"]
        chrome_trace(tl, out / "timeline.json", name=f"{result.summary.get('policy')} {result.summary.get('model')}")
        if figure and len(tl):
            gantt_figure(tl, out / "timeline.png", title=run_title(result.summary))
    if figure:
        from dvasim.reporting.plots import latency_figure, run_title

        df = result.extra.get("latency_sample")
        if df is None:
            df = result.queries
        latency_figure(
            df, out / "latency.png", title=run_title(result.summary),
            qos_target_ms=result.summary.get("qos_target_ms"),
        )
    return out


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
