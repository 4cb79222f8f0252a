"""The Python API: ``run(config)`` -> :class:`RunResult` (records as a DataFrame, summary as a dict)."""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from dvasim import config as cfgmod


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
            from dvasim.records import read_records

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


def load_profile(model_cfg: dict[str, Any]):
    from dvasim.calibration.models import resolve_model

    return resolve_model(model_cfg).table


def run(config, overrides: list[str] | None = None, progress: bool | None = None,
        engine: str | Path | None = None, records: str | Path | None = None, timeline: int = 0,
        stack: str | None = None) -> RunResult:
    """Simulate one config (a TOML path, a dict of sections, or an already resolved dict). ``engine``: an engine
    file written by ``dvasim fit``, merged over the config's ``[engine]`` (``--set`` overrides still win).
    ``stack``: the serving stack by name (over the config's ``[server] stack``; see :mod:`dvasim.server`); every
    run names its stack in ``summary["stack"]``.
    ``records``: stream every query's record to this Parquet file as the run goes (memory then stays bounded
    whatever the run's length; ``result.queries`` reads the file back when used); default: keep them in memory.
    ``timeline``: also record the first this many stage executions (``result.extra["timeline"]``, a DataFrame:
    see :mod:`dvasim.timeline`).
    """
    from dvasim.calibration.models import resolve_model
    from dvasim.core.batch_table import meta_op_counts
    from dvasim.core.pipeline import Pipeline
    from dvasim.policies import make_policy
    from dvasim.records import RecordStore
    from dvasim.server.resolve import resolve_stack
    from dvasim.sim.engine import simulate
    from dvasim.sim.transfer import transfer_from_config
    from dvasim.stability import offered_rates, run_verdict
    from dvasim.workload import workload_from_config

    cfg = cfgmod.resolve(config, overrides, engine=engine)
    model = resolve_model(cfg["model"])
    profile = model.table
    transfer = transfer_from_config(cfg["engine"].get("transfer"))
    served = resolve_stack(cfg, model, transfer, stack=stack)
    host = served.host
    params = {k: v for k, v in cfg["policy"].items() if k != "name"}
    policy = make_policy(cfg["policy"]["name"], params)
    workload = workload_from_config(
        cfg["workload"], needs_seq_len=profile.seq_lens is not None, base_dir=cfg["base_dir"]
    )
    if profile.seq_lens is not None and len(workload.seq_lens):
        _check_lengths(profile, workload.seq_lens)
    eng = cfg["engine"]
    pipeline = Pipeline(profile, policy, eng["buffer_pairs"], instances=eng["instances"],
                        qos_target_ms=cfg["qos"]["target_ms"],
                        input_lengths=workload.seq_lens if profile.seq_lens is not None else None,
                        served=served)
    recorder = None
    if timeline:
        from dvasim.timeline import TimelineRecorder

        recorder = TimelineRecorder(pipeline, max_rows=int(timeline))
    offered = offered_rates(cfg["workload"], len(workload.seq_lens))
    store = RecordStore(len(workload.seq_lens), profile.n_stages, path=records,
                        arrivals=None if workload.closed_clients is not None else workload.arrivals_ms,
                        offered_qps=offered)
    res = simulate(
        pipeline, workload.arrivals_ms, workload.seq_lens, records=store, keep_queries=False,
        sharing=eng["sharing"], corun_slowdown=eng["corun_slowdown"], cores=eng["cores"],
        launch_overhead_ms=eng["launch_overhead_ms"],
        admission_delay_ms=eng["admission_delay_ms"],
        service_cv=eng["service_cv"], seed=int(cfg["workload"].get("seed", 0)),
        progress=eng["progress"] if progress is None else progress,
        closed_clients=workload.closed_clients, think_ms=workload.think_ms, fail_soft=True, host=host,
        transfer=transfer, batch_costs=served.batch, corun_per_worker=served.corun_per_worker,
    )
    summary = store.summary(cfg["qos"]["target_ms"])
    n = summary["n_queries"]
    summary.update(
        policy=policy.name, model=profile.name, stack=served.label, n_stages=profile.n_stages, buffer_pairs=eng["buffer_pairs"], instances=pipeline.instances,
        device_busy_fraction=res.device_busy_ms / res.sim_end_ms if res.sim_end_ms > 0 else 0.0,
        sim_wall_s=res.wall_s, sim_queries_per_wall_s=n / res.wall_s if res.wall_s > 0 else float("nan"),
        **meta_op_counts(res.pipeline.table),
    )
    summary.update(run_verdict(store, cfg, offered))  # stable, its measures; a stepping run's levels
    resolved = {**cfg, "policy": {**cfg["policy"], **policy.describe()}}
    resolved["model"] = {**cfg["model"], "provenance": dict(getattr(profile, "provenance", {}))}
    resolved["server"] = served.describe()
    if host is not None:
        resolved["engine"] = {**cfg["engine"], "host": host.describe()}
    if transfer is not None:  # the copy model as run, its defaults included
        resolved["engine"] = {**resolved["engine"], "transfer": transfer.describe()}
    if res.stuck:
        import warnings

        from dvasim.errors import IncompleteRunWarning

        warnings.warn(f"dvasim.run: {res.stuck}", IncompleteRunWarning, stacklevel=2)
    extra = {}
    if records is not None:
        from dvasim.plots import FIGURE_MAX_POINTS

        # what the latency figure draws (every k-th query when there are many), so that writing the outputs of a
        # streamed run never reads its records back
        extra["latency_sample"] = store.latency_sample(FIGURE_MAX_POINTS)
    if recorder is not None:
        extra["timeline"] = recorder.frame()
    return RunResult(store.frame() if records is None else None, summary, resolved, res.stuck, extra=extra,
                     records_path=None if records is None else Path(records))


def _check_lengths(profile, seq_lens) -> None:
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
        from dvasim.timeline import chrome_trace, gantt_figure

        tl = result.extra["timeline"]
        chrome_trace(tl, out / "timeline.json", name=f"{result.summary.get('policy')} {result.summary.get('model')}")
        if figure and len(tl):
            gantt_figure(tl, out / "timeline.png", title=run_title(result.summary))
    if figure:
        from dvasim.plots import latency_figure

        df = result.extra.get("latency_sample")
        if df is None:
            df = result.queries
        latency_figure(
            df, out / "latency.png", title=run_title(result.summary),
            qos_target_ms=result.summary.get("qos_target_ms"),
        )
    return out


def run_title(summary: dict) -> str:
    """A figure's title: the policy, the model and the serving stack the run simulated."""
    stack = summary.get("stack")
    return f"{summary.get('policy')} on {summary.get('model', '')}" + (f" [stack: {stack}]" if stack else "")


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
