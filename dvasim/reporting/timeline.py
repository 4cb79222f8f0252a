"""Executor timelines: every stage execution of a run, as a table, a Gantt figure and a Chrome/Perfetto trace.

:class:`TimelineRecorder` hooks a :class:`~dvasim.core.pipeline.Pipeline` (``on_finish``) and keeps one row per
stage execution: instance (lane), stage, start, end, batch id, batch size, padded length and the first query
id. ``frame()`` gives them as a DataFrame; :func:`gantt_figure` draws one row per stage executor (instance x
stage) with a bar per execution, coloured by batch; :func:`chrome_trace` writes the Trace Event Format that
``chrome://tracing`` and https://ui.perfetto.dev open (one process per instance, one thread per stage; times in
microseconds).

``max_rows`` bounds what is kept (the first executions of a long run), so a timeline never costs more memory
than asked. Both files are written whole (a temporary name, renamed when complete: :mod:`dvasim.outputs`); the
Gantt chart's title is the caller's (``dvasim run --timeline`` gives it :func:`~dvasim.reporting.plots.run_title`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from dvasim.outputs import write_text

COLUMNS = ("lane", "stage", "start_ms", "end_ms", "batch_id", "batch_size", "seq_len", "first_query")


class TimelineRecorder:
    def __init__(self, pipeline, max_rows: int = 200_000):
        self.rows: list[tuple] = []
        self.max_rows = max_rows
        self.dropped = 0
        pipeline.on_finish.append(self._on_finish)

    def _on_finish(self, ex) -> None:
        if len(self.rows) >= self.max_rows:
            self.dropped += 1
            return
        self.rows.append((ex.lane, ex.stage, ex.start, ex.end, ex.batch.bid, ex.batch_size, ex.seq_len,
                          ex.queries[0].qid if ex.queries else -1))

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=list(COLUMNS))


def chrome_trace(timeline: pd.DataFrame, path: str | Path, name: str = "dvasim") -> Path:
    """Write ``timeline`` as a Chrome/Perfetto trace (``traceEvents`` with complete events, times in us), whole (a
    temporary name, renamed when complete)."""
    events = []
    for lane in sorted(timeline["lane"].unique()) if len(timeline) else []:
        events.append({"ph": "M", "name": "process_name", "pid": int(lane), "tid": 0,
                       "args": {"name": f"{name} instance {lane}"}})
    for (lane, stage) in sorted({(int(r.lane), int(r.stage)) for r in timeline.itertuples()}):
        events.append({"ph": "M", "name": "thread_name", "pid": lane, "tid": stage,
                       "args": {"name": f"stage {stage} executor"}})
    for r in timeline.itertuples():
        events.append({"ph": "X", "name": f"batch {r.batch_id} x{r.batch_size}", "cat": f"stage{r.stage}",
                       "pid": int(r.lane), "tid": int(r.stage), "ts": float(r.start_ms) * 1000.0,
                       "dur": float(r.end_ms - r.start_ms) * 1000.0,
                       "args": {"batch_id": int(r.batch_id), "batch_size": int(r.batch_size),
                                "seq_len": int(r.seq_len), "first_query": int(r.first_query)}})
    return write_text(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}) + "\n")


def window_words(shown_ms: float, run_ms: float | None, start_ms: float = 0.0) -> str:
    """The window a partial timeline shows, in words: ``"first 140 ms of 1,500 ms"`` (``"all 1,500 ms"`` when it
    shows the whole run; ``"140 ms from 300 ms of 1,500 ms"`` when it starts later)."""
    def ms(v: float) -> str:
        return f"{v:,.0f} ms" if v >= 10 else f"{v:.3g} ms"

    if run_ms is None or not run_ms > 0:
        return f"first {ms(shown_ms)}"
    if shown_ms >= run_ms * (1 - 1e-9) and start_ms <= 0:
        return f"all {ms(run_ms)}"
    head = f"first {ms(shown_ms)}" if start_ms <= 0 else f"{ms(shown_ms)} from {ms(start_ms)}"
    return f"{head} of {ms(run_ms)}"


def gantt_figure(timeline: pd.DataFrame, path: str | Path, title: str = "", window_ms: float | None = None,
                 run_ms: float | None = None) -> Path:
    """One row per stage executor, a bar per execution (labelled with its batch size when it fits), coloured by
    batch; ``window_ms``: only the first so many milliseconds (default: the first 60 executions' span). The
    panel's title says which window of the run it shows (:func:`window_words`: ``"first 140 ms of 1,500 ms"``);
    ``run_ms``: the run's span (default: the timeline's, first start to last end)."""
    from dvasim.reporting.plots import _plt, save_figure

    plt, sns = _plt()
    df = timeline
    t0 = float(df["start_ms"].min()) if len(df) else 0.0
    if run_ms is None and len(df):
        run_ms = float(df["end_ms"].max()) - t0
    if len(df) and window_ms is None:
        window_ms = float(df["end_ms"].iloc[: min(len(df), 60)].max() - t0)
    if len(df):
        df = df[df["start_ms"] <= t0 + window_ms]
    shown = min(float(df["end_ms"].max()) - t0, run_ms or math.inf) if len(df) else 0.0
    rows = sorted({(int(a), int(b)) for a, b in zip(df["lane"], df["stage"])})
    fig, ax = plt.subplots(figsize=(11, 0.5 * max(len(rows), 2) + 1.5))
    colours = sns.color_palette("husl", 12)
    for r in df.itertuples():
        y = rows.index((int(r.lane), int(r.stage)))
        w = float(r.end_ms - r.start_ms)
        ax.barh(y, w, left=float(r.start_ms), height=0.7, color=colours[int(r.batch_id) % 12], edgecolor="black",
                linewidth=0.4)
        if window_ms and w > window_ms / 60:
            ax.text(float(r.start_ms) + w / 2, y, str(int(r.batch_size)), ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"instance {a} stage {b}" if len({x for x, _ in rows}) > 1 else f"stage {b}"
                        for a, b in rows])
    ax.invert_yaxis()
    window = window_words(shown, run_ms, 0.0)
    ax.set(xlabel="simulated time (ms)",
           title=f"stage executions, {window} of the run (labels: batch size; colour: batch)")
    return save_figure(fig, path, title)
