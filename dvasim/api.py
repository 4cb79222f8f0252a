"""The Python API: ``run(config)`` -> :class:`RunResult` (records as a DataFrame, summary as a dict)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from dvasim import config as cfgmod
from dvasim.reporting.plots import run_title  # noqa: F401  (the public API's names)
from dvasim.reporting.result import (  # noqa: F401  (the public API's names)
    CSV_MAX_ROWS,
    RunResult,
    _json_default,
    versions,
    write_outputs,
)


def load_profile(model_cfg: dict[str, Any]):
    from dvasim.model.catalog import resolve_model

    return resolve_model(model_cfg).table


def run(config, overrides: list[str] | None = None, progress: bool | None = None,
        engine: str | Path | None = None, records: str | Path | None = None, timeline: int = 0,
        stack: str | None = None, stop: Callable[[], str | None] | None = None, _whole: bool = False) -> RunResult:
    """Simulate one config (a TOML path, a dict of sections, or an already resolved dict). ``engine``: an engine
    file written by ``dvasim fit``, merged over the config's ``[engine]`` (``--set`` overrides still win).
    ``stack``: the serving stack by name (over the config's ``[server] stack``; see :mod:`dvasim.server`); every
    run names its stack in ``summary["stack"]`` and why in ``summary["stack_source"]`` (e.g. ``implied by device
    h100``: :func:`dvasim.server.resolve.stack_reason`).
    ``records``: stream every query's record to this Parquet file as the run goes (memory then stays bounded
    whatever the run's length; ``result.queries`` reads the file back when used); default: keep them in memory.
    ``timeline``: also record the first this many stage executions (``result.extra["timeline"]``, a DataFrame:
    see :mod:`dvasim.reporting.timeline`).
    ``stop``: asked every few thousand events whether to stop (``None``, or why: ``dvasim run``'s signal handlers
    answer it). A run stopped so, or by Ctrl-C, returns what was collected: ``result.interrupted`` is true,
    ``summary["interrupted"]`` too with ``interrupted_reason``, and the queries that had not arrived are left out
    of the records and the metrics (``summary["n_not_arrived"]`` says how many).
    """
    from dvasim.reporting.records import RecordStore
    from dvasim.reporting.stability import offered_rates

    cfg = cfgmod.resolve(config, overrides, engine=engine)
    parts = build(cfg, stack)
    trigger = trigger_test(cfg, parts.workload, stack) if cfg["qos"].get("trigger", "none") != "none" else None
    pipeline, profile, workload, eng = parts.pipeline, parts.profile, parts.workload, cfg["engine"]
    recorder = None
    if timeline:
        from dvasim.reporting.timeline import TimelineRecorder

        recorder = TimelineRecorder(pipeline, max_rows=int(timeline))
    offered = offered_rates(cfg["workload"], len(workload.seq_lens))
    store = RecordStore(len(workload.seq_lens), profile.n_stages, path=records,
                        arrivals=None if workload.closed_clients is not None else workload.arrivals_ms,
                        offered_qps=offered)
    res = _engine(parts, cfg)(
        workload.arrivals_ms, workload.seq_lens, records=store, keep_queries=False,
        sharing=eng["sharing"], corun_slowdown=eng["corun_slowdown"], cores=eng["cores"],
        launch_overhead_ms=eng["launch_overhead_ms"],
        admission_delay_ms=_admission_delay(eng, parts.served.stack),
        service_cv=eng["service_cv"], seed=int(cfg["workload"].get("seed", 0)),
        progress=eng["progress"] if progress is None else progress,
        closed_clients=workload.closed_clients, think_ms=workload.think_ms, fail_soft=True, host=parts.served.host,
        transfer=parts.transfer, batch_costs=parts.served.batch, corun_per_worker=parts.served.corun_per_worker,
        stop=stop, **_contention(eng),
    )
    if res.interrupted is not None and _whole:  # a study's probe: nothing of it counts, so no summary either
        store.close()
        raise KeyboardInterrupt(res.stuck or "interrupted")
    summary = _summary(store, cfg, parts, res, offered, trigger)
    if res.stuck:
        import warnings

        from dvasim.errors import IncompleteRunWarning

        warnings.warn(f"dvasim.run: {res.stuck}", IncompleteRunWarning, stacklevel=2)
    extra = {}
    if records is not None:
        from dvasim.reporting.plots import FIGURE_MAX_POINTS

        # what the latency figure draws (every k-th query when there are many), so that writing the outputs of a
        # streamed run never reads its records back
        extra["latency_sample"] = store.latency_sample(FIGURE_MAX_POINTS)
    if recorder is not None:
        extra["timeline"] = recorder.frame()
    return RunResult(store.frame() if records is None else None, summary, _resolved(cfg, parts), res.stuck,
                     extra=extra, records_path=None if records is None else Path(records))


def run_whole(config, **kw) -> RunResult:
    """:func:`run` for a study's probe: a run stopped before its end (Ctrl-C, a stop request) is no result to count
    or cache, so it raises :class:`KeyboardInterrupt` (the command line's one line and status 130) instead of
    returning what was collected (issue 34: a capacity search took an interrupted probe's partial records for a
    verdict, a sweep cached a truncated point as done)."""
    res = run(config, **kw, _whole=True)
    if res.interrupted:
        raise KeyboardInterrupt(res.summary.get("interrupted_reason") or "interrupted")
    return res


def _engine(parts: _Parts, cfg: dict[str, Any]) -> Callable:
    """The engine call for these parts, less the arrivals and options: one pipeline on one device, or with
    ``[cluster] replicas > 1`` -- or one replica behind a network delay (issue 34: every ``[cluster]`` key acts at
    every replica count) -- the replicas behind their router (:mod:`dvasim.engines.sim.cluster`)."""
    cl = cfg.get("cluster", {})
    delay = cl.get("network_delay_ms", 0.0)
    delayed = any(float(d) != 0.0 for d in delay) if isinstance(delay, (list, tuple)) else float(delay or 0.0) != 0.0
    if len(parts.pipelines) == 1 and not delayed:
        from dvasim.engines.sim.engine import simulate

        return partial(simulate, parts.pipeline)
    from dvasim.engines.sim.cluster import simulate_cluster
    from dvasim.server.router import make_router

    router = make_router(cl["router"], len(parts.pipelines), seed=int(cfg["workload"].get("seed", 0)))
    return partial(simulate_cluster, parts.pipelines, router=router, network_delay_ms=cl["network_delay_ms"])


@dataclass
class _Parts:
    """What a resolved config builds before the engine runs: the model's table, the stack, the input copies, the
    policy, the workload and the pipeline that carries the policy's operations out."""

    profile: Any
    served: Any
    transfer: Any
    policy: Any
    workload: Any
    pipeline: Any
    pipelines: list  # one per replica ([cluster] replicas); ``pipeline`` is the first


def _admission_delay(eng: dict[str, Any], stack) -> Any:
    """``[engine] admission_delay_ms``, or where the config leaves it at 0 the stack's client path (a stack fitted
    to a real server: :attr:`dvasim.server.stacks.ServingStack.client_path_ms`)."""
    given = eng["admission_delay_ms"]
    if stack.client_path_ms and not isinstance(given, (list, tuple)) and float(given) == 0.0:
        return list(stack.client_path_ms)
    return given


def build(cfg: dict[str, Any], stack: str | None) -> _Parts:
    """Everything a resolved config builds before the engine runs (the model's table, the serving stack, the input
    copies, the policy, the workload and the pipeline), each checked: what a study calls to check a config whole
    without running it."""
    from dvasim.core.pipeline import Pipeline
    from dvasim.engines.common import policy_from_section, workload_for_table
    from dvasim.engines.sim.corun import sim_corun  # E-Ebird's offline profiler in the simulator
    from dvasim.model.catalog import resolve_model
    from dvasim.policies import make_policy
    from dvasim.server.resolve import resolve_stack
    from dvasim.server.transfer import transfer_from_config

    model = resolve_model(cfg["model"])
    profile = model.table
    transfer = transfer_from_config(cfg["engine"].get("transfer"))
    served = resolve_stack(cfg, model, transfer, stack=stack)
    params = {k: v for k, v in cfg["policy"].items() if k != "name"}
    policy = policy_from_section(cfg["policy"])
    workload = workload_for_table(cfg, profile)
    eng = cfg["engine"]
    replicas = int(cfg.get("cluster", {}).get("replicas", 1))
    if replicas > 1 and workload.closed_clients is not None:
        from dvasim.errors import ConfigError

        raise ConfigError("cluster.replicas", "a closed loop ([workload] kind = \"closed\") runs on one replica; "
                                              "use an open-loop workload (poisson, uniform, trace) for replicas > 1")
    pipelines = []
    for r in range(replicas):  # each replica its own policy object and pipeline (their state is the replica's)
        pol = policy if r == 0 else make_policy(cfg["policy"]["name"], params)
        pipelines.append(Pipeline(profile, pol, eng["buffer_pairs"], instances=eng["instances"],
                                  qos_target_ms=cfg["qos"]["target_ms"],
                                  input_lengths=workload.seq_lens if profile.seq_lens is not None else None,
                                  served=served, corun=sim_corun(pol, profile, served),
                                  priorities=workload.priorities))
    return _Parts(profile, served, transfer, policy, workload, pipelines[0], pipelines)


def trigger_test(cfg: dict[str, Any], workload, stack: str | None) -> dict[str, Any]:
    """``[qos] trigger = "backlog"``: the run again with a backlog of ``ceil(trigger_slos x rate x target_ms)``
    queries (:func:`dvasim.reporting.verdict.default_backlog`; the rate is ``rate_qps``, or the stream's mean for
    a stepping, phased or trace load) and whether it
    recovered (:func:`dvasim.reporting.verdict.recovery`)."""
    import copy

    from dvasim.errors import ConfigError
    from dvasim.reporting.verdict import default_backlog, recovery

    wl, qos = cfg["workload"], cfg["qos"]
    if workload.closed_clients is not None or wl.get("kind") == "explicit" or wl.get("backlog", 0):
        raise ConfigError("qos.trigger", "the trigger test needs an open-loop stream without a backlog of its own "
                                         "(kind poisson, gamma, uniform, stepping, phases or trace); set "
                                         "trigger = \"none\"")
    arr = workload.arrivals_ms
    span = float(arr[-1] - arr[0])
    if wl.get("kind") in ("poisson", "gamma", "uniform"):
        rate = float(wl["rate_qps"])
    else:  # a stepping, phased or trace load: its mean rate
        rate = (len(arr) - 1) / span * 1000.0 if span > 0 else float(wl.get("rate_qps", 1.0))
    backlog = default_backlog(rate, qos["target_ms"], qos.get("trigger_slos", 1.0))
    trial = copy.deepcopy(cfg)
    trial["workload"]["backlog"] = backlog
    if qos.get("trigger_queries") and "n_queries" in trial["workload"]:
        trial["workload"]["n_queries"] = min(int(qos["trigger_queries"]), int(trial["workload"]["n_queries"]))
    trial["qos"]["trigger"] = "none"
    trial["engine"]["progress"] = False
    res = run_whole(trial, stack=stack)
    q = res.queries
    return recovery(q["arrival_ms"].to_numpy(), q["finish_ms"].to_numpy(), backlog, qos["target_ms"],
                    qos.get("percentile", 99.0), status=q["status"].to_numpy())


def _summary(store, cfg: dict[str, Any], parts: _Parts, res, offered, trigger=None) -> dict[str, Any]:
    from dvasim.reporting.verdict import run_verdict

    summary = store.summary(cfg["qos"]["target_ms"])
    n = summary["n_queries"]
    profile = parts.profile
    n_rep = len(parts.pipelines)
    summary.update(
        policy=parts.policy.name, model=profile.name, stack=parts.served.label, stack_source=parts.served.reason,
        triton_release=parts.served.triton_release, n_stages=profile.n_stages,
        buffer_pairs=cfg["engine"]["buffer_pairs"], instances=parts.pipeline.instances,
        device_busy_fraction=res.device_busy_ms / res.sim_end_ms / n_rep if res.sim_end_ms > 0 else 0.0,
        sim_wall_s=res.wall_s, sim_queries_per_wall_s=n / res.wall_s if res.wall_s > 0 else float("nan"),
        **_meta_ops([p.table for p in parts.pipelines]),
    )
    summary.update(_contention(cfg["engine"]))  # the contention model every run names ("none" by default)
    if n_rep > 1:  # said only for a cluster (a single GPU's summary is unchanged)
        from dvasim.reporting.replicas import replica_summary

        summary.update(replica_summary(store, cfg, res))
    if cfg["policy"].get("triton_config"):  # the policy came from a Triton model configuration
        summary["triton_config"] = cfg["policy"]["triton_config"]
    summary.update(run_verdict(store, cfg, offered, trigger))  # the verdict, its measures; a stepping run's levels
    if res.interrupted is not None:  # said only when it happened (a finished run's summary is unchanged)
        summary.update(interrupted=True, interrupted_reason=res.stuck, n_not_arrived=res.n_not_arrived)
    return summary


def _contention(eng: dict[str, Any]) -> dict[str, Any]:
    """``[engine] contention`` as the engine takes it and the summary names it: ``"none"`` when absent; the share
    (its calibrated H100 value when absent) only with ``"overlap"``."""
    from dvasim.config.sections import OVERLAP_SHARE_H100

    model = eng.get("contention", "none")
    if model == "none":
        return {"contention": model}
    return {"contention": model, "contention_share": float(eng.get("contention_share", OVERLAP_SHARE_H100))}


def _meta_ops(tables) -> dict[str, Any]:
    """The meta operations' counts over every replica's batch table (a count summed, a mean averaged)."""
    from dvasim.core.batch_table import meta_op_counts

    counts = [meta_op_counts(t) for t in tables]
    if len(counts) == 1:
        return counts[0]
    out: dict[str, Any] = {}
    for key in counts[0]:
        vals = [c[key] for c in counts]
        total = vals[0]
        for v in vals[1:]:
            total += v
        out[key] = total / len(vals) if key.startswith("mean_") else total
    return out


def _resolved(cfg: dict[str, Any], parts: _Parts) -> dict[str, Any]:
    """The config as run: the policy's parameters, the table's provenance, the stack's and host's numbers."""
    resolved = {**cfg, "policy": {**cfg["policy"], **parts.policy.describe()}}
    resolved["model"] = {**cfg["model"], "provenance": dict(getattr(parts.profile, "provenance", {}))}
    resolved["server"] = parts.served.describe()
    host = parts.served.host
    if host is not None:
        resolved["engine"] = {**cfg["engine"], "host": host.describe()}
    if parts.transfer is not None:  # the copy model as run, its defaults included
        resolved["engine"] = {**resolved["engine"], "transfer": parts.transfer.describe()}
    return resolved


