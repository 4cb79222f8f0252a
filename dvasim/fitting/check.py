"""Predicting replays the fit never saw: fit the engine on some replay folders, simulate others, score them.

Used by ``experiments/h100_fit/check.py`` on the H100 replays in ``traces/h100_replays/`` and by the tests on
a few of them. A case is simulated with its folder's own config (same workload, seed, policy and engine), the
model's stage table in place of the named model (``[model] table = <model>_serving_table.csv``, the table the
replay's policy decided with), DVABatch's parameters as the recording tree resolved them
(:func:`recorded_dvabatch`) and the fitted engine file. The real figures are the mean of the case's real runs
(``<model>_summary.json`` holds two per case); a case whose real runs differ in mean latency by more than half
their mean is reported as noise and not scored.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

TARGETS = {"throughput_qps": 0.05, "mean_latency_ms": 0.15, "p99_latency_ms": 0.25}
REPLAY_CLUSTER_HOST_COST = False  # a replay's DVABatch decides on the GPU's time alone (it knows no serving stack)


def case_config(folder, table) -> dict[str, Any]:
    """The folder's replay config as a simulator config on ``table``."""
    import tomllib

    from dvasim.fitting.logs import find_log, read_log_text

    d = Path(folder)
    cfg = tomllib.loads(read_log_text(find_log(d, "config.toml")))
    cfg = {k: v for k, v in cfg.items() if k != "replay"}
    cfg["model"] = {"table": str(Path(table).resolve())}
    cfg["_base_dir"] = str(d.resolve())
    if cfg.get("policy", {}).get("name") == "dvabatch":
        cfg["policy"] = {**recorded_dvabatch(table, cfg["policy"].get("max_batch_size", 64)), **cfg["policy"]}
    return cfg


def recorded_dvabatch(table, max_batch_size: int) -> dict[str, Any]:
    """DVABatch's parameters as the tree that recorded the H100 replays (commit 15db935) resolved them, so that a
    case is simulated with the policy its replay ran: *input* when the table has lengths, *operator* when a
    batch of ``bs_max`` would be split at some boundary, *load* without *input*; Policy I's window at the
    table's longest length; no stretch of a started batch; split sub-batches overlapping (pipelined); Policy I's
    clusters costed on the GPU's time alone (a replay's policy knows no serving stack)."""
    from dvasim.model.table import LatencyTable

    t = LatencyTable.load(table)
    L = int(max(t.seq_lens)) if t.seq_lens is not None else None
    bs = int(max_batch_size)
    splits = bs >= 2 and any(t.remaining(s, bs, L) >= 2.0 * t.remaining(s, bs // 2, L) - 1e-9
                             for s in range(1, t.n_stages))
    policies = (["input"] if L else []) + (["operator"] if splits else []) + ([] if L else ["load"])
    return {"policies": policies, "t_comp_wait_ms": 0.0, "split_manner": "pipelined",
            "max_queue_delay_ms": t.latency(0, bs, L) if L else 0.0,
            "cluster_host_cost": REPLAY_CLUSTER_HOST_COST}


def real_runs(summary_json, policy: str, load: float) -> dict[str, list[float]] | None:
    """The real runs of one case from a ``<model>_summary.json`` (lists over runs), or ``None``."""
    for c in json.loads(Path(summary_json).read_text()):
        if c["policy"] == policy and abs(float(c["load"]) - load) < 1e-9:
            return {"mean_latency_ms": c["real_mean_latency_ms"], "p99_latency_ms": c["real_p99_latency_ms"],
                    "throughput_qps": c["real_throughput_qps"], "p50_latency_ms": c["real_p50_latency_ms"],
                    "sim_before": {"mean_latency_ms": c["sim_mean_latency_ms"],
                                   "p99_latency_ms": c["sim_p99_latency_ms"],
                                   "throughput_qps": c["sim_throughput_qps"]}}
    return None


def is_noise(means: list[float]) -> bool:
    """Two real runs whose mean latencies differ by more than half of their mean."""
    m = sum(means) / len(means)
    return (max(means) - min(means)) > 0.5 * m


def score_case(folder, table, engine_file, summary_json, policy: str, load: float) -> dict[str, Any]:
    """Simulate one case with the fitted engine and compare it with its real runs."""
    from dvasim.api import run

    res = run(case_config(folder, table), engine=engine_file, progress=False)
    real = real_runs(summary_json, policy, load)
    row: dict[str, Any] = {"case": Path(folder).name, "policy": policy, "load": load,
                           "sim_mean_exit_batch_size": res.summary.get("mean_exit_batch_size")}
    if real is None:
        row["verdict"] = "no real runs"
        return row
    noise = is_noise(real["mean_latency_ms"])
    ok = True
    for k, tol in TARGETS.items():
        r = sum(real[k]) / len(real[k])
        s = float(res.summary[k])
        err = (s - r) / r if r else math.nan
        row[f"real_{k}"] = r
        row[f"real_{k}_runs"] = list(real[k])
        row[f"sim_{k}"] = s
        row[f"err_{k}"] = err
        row[f"before_{k}"] = real["sim_before"][k]
        row[f"ok_{k}"] = bool(abs(err) <= tol)
        ok = ok and abs(err) <= tol
    row["verdict"] = "noise" if noise else ("within" if ok else "outside")
    return row


def self_check(dirs, table, engine_file) -> list[dict[str, Any]]:
    """Each replay folder simulated with ``table`` and the engine file, against its own ``queries.csv``:
    how well the fitted engine reproduces the runs it was fitted on."""
    from dvasim.api import run
    from dvasim.fitting.logs import read_replay
    from dvasim.reporting.metrics import summarize

    rows = []
    for d in dirs:
        rep = read_replay(d)
        real = summarize(rep["queries"], 200.0)
        sim = run(case_config(d, table), engine=engine_file, progress=False).summary
        row: dict[str, Any] = {"folder": Path(d).name}
        for k in TARGETS:
            r, s_ = float(real[k]), float(sim[k])
            row[f"real_{k}"], row[f"sim_{k}"] = r, s_
            row[f"err_{k}"] = (s_ - r) / r if r else math.nan
        rows.append(row)
    return rows
