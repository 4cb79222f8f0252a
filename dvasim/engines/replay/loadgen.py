"""Drive the replay with MLPerf LoadGen (``mlcommons-loadgen``, imported as ``mlperf_loadgen``), Server scenario.

LoadGen runs in-process: it draws its own Poisson arrival schedule at ``server_target_qps``, calls our
``issue_query`` with query samples (an index into our sample library and a response id), and measures every
query's latency itself, from its scheduled issue time to our ``QuerySamplesComplete``. Our side:

* **sample library (QSL)**: one sample per query of the config's workload (its input lengths: BERT token ids
  of the sampled lengths, images for the CNNs), all loaded up front, so ``load``/``unload`` have nothing to do;
* **system under test (SUT)**: ``issue_query`` hands the samples to :meth:`ReplayEngine.submit` (they arrive
  now, for the same pipeline, mechanism and policy objects as every other run); when a query leaves the last
  stage the engine's ``on_exit`` hook completes it towards LoadGen;
* LoadGen's ``mlperf_log_summary.txt`` and ``mlperf_log_detail.txt`` are kept in the output directory, its
  percentiles are parsed from the summary and compared with ours in ``loadgen.json`` (our latencies start when
  ``issue_query`` is called, LoadGen's at the scheduled time, so LoadGen's are larger by the issue delay).

Settings: ``server_target_qps`` = ``--target-qps`` or the workload's ``rate_qps``; ``min_query_count`` =
``max_query_count`` = the workload's ``n_queries`` and ``min_duration_ms`` = 0, so LoadGen issues exactly that
many queries (a submission run needs far more; the summary then says INVALID, which is expected);
``server_target_latency_ns`` = ``[qos] target_ms``; LoadGen's RNG seeds = the workload's ``seed``.
If a stage fails, every outstanding query is completed towards LoadGen (so it can finish) and the stage error
is raised after LoadGen returns. Ctrl-C takes effect when LoadGen returns (it blocks in C++).
"""

from __future__ import annotations

import json
import math
import re
import threading
from pathlib import Path

import numpy as np

from dvasim.engines.replay.engine import ReplayError, make_engine, prepare, to_run_result
from dvasim.errors import ConfigError
from dvasim.outputs import write_text

__all__ = ["replay_loadgen", "parse_summary", "KEEP"]

KEEP = ("mlperf_log_summary.txt", "mlperf_log_detail.txt")

_NS = {
    "mean": r"Mean latency \(ns\)\s*:\s*(\d+)",
    "min": r"Min latency \(ns\)\s*:\s*(\d+)",
    "max": r"Max latency \(ns\)\s*:\s*(\d+)",
}


def parse_summary(text: str) -> dict:
    """Latency statistics (ms), throughput and validity from ``mlperf_log_summary.txt``."""
    out: dict = {}
    for key, pat in _NS.items():
        m = re.search(pat, text)
        if m:
            out[f"{key}_latency_ms"] = int(m.group(1)) / 1e6
    for m in re.finditer(r"([\d.]+) percentile latency \(ns\)\s*:\s*(\d+)", text):
        p = float(m.group(1))
        name = f"p{int(p)}" if p == int(p) else f"p{m.group(1).replace('.', '_').rstrip('0').rstrip('_')}"
        out[f"{name}_latency_ms"] = int(m.group(2)) / 1e6
    for key, pat in (("completed_qps", r"Completed samples per second\s*:\s*([\d.]+)"),
                     ("scheduled_qps", r"Scheduled samples per second\s*:\s*([\d.]+)")):
        m = re.search(pat, text)
        if m:
            out[key] = float(m.group(1))
    m = re.search(r"Result is\s*:\s*(\w+)", text)
    if m:
        out["result"] = m.group(1)
    m = re.search(r"Scenario\s*:\s*(\w+)", text)
    if m:
        out["scenario"] = m.group(1)
    return out


def replay_loadgen(config, out_dir, overrides: list[str] | None = None, *, device: str = "cpu", threads: int = 1,
                   target_qps: float | None = None, warmup: int = 2, record_outputs: bool = False):
    """Replay ``config`` with LoadGen issuing the queries (Server scenario). Returns a
    :class:`dvasim.api.RunResult` whose summary has ``loadgen_*`` fields; writes LoadGen's logs and
    ``loadgen.json`` into ``out_dir``."""
    import mlperf_loadgen as lg

    setup = prepare(config, overrides, device=device, threads=threads)
    target_qps = _target_qps(setup.cfg["workload"], target_qps)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sut = _Sut(lg)
    engine = make_engine(setup, threads=threads, warmup=warmup, on_exit=sut.on_exit, on_fail=sut.on_fail,
                         record_outputs=record_outputs)
    sut.engine = engine
    res = _run_test(lg, sut, engine, _settings(lg, setup, target_qps), _log_settings(lg, out),
                    setup.workload.n_queries, out)
    summary_path = out / "mlperf_log_summary.txt"
    lgs = parse_summary(summary_path.read_text()) if summary_path.is_file() else {}
    result = to_run_result(setup, res)
    comparison = _comparison(lgs, _our_stats(result.queries), target_qps, len(res.queries))
    write_text(out / "loadgen.json", json.dumps(comparison, indent=2) + "\n")
    result.summary.update({f"loadgen_{k}": v for k, v in lgs.items()})
    result.summary["loadgen_target_qps"] = target_qps
    result.extra["loadgen"] = comparison
    return result


def _target_qps(wl: dict, target_qps: float | None) -> float:
    """LoadGen's ``server_target_qps``: ``--target-qps``, else the workload's ``rate_qps``."""
    if target_qps is None:
        target_qps = wl.get("rate_qps")
        if target_qps is None:
            raise ConfigError("--target-qps", f"the workload (kind = {wl.get('kind')!r}) has no rate_qps; "
                                              "give LoadGen's target with --target-qps")
    try:
        qps = float(target_qps)
    except (TypeError, ValueError):
        qps = math.nan
    if not (math.isfinite(qps) and qps > 0):
        raise ConfigError("--target-qps", f"must be a finite number > 0 (queries per second), got {target_qps!r}")
    return qps


class _Sut:
    """Our system under test towards LoadGen: ``issue_query`` submits to the engine; queries that leave the
    pipeline (``on_exit``), or every outstanding one once the run failed (``on_fail``), are completed."""

    def __init__(self, lg):
        self.lg = lg
        self.engine = None  # set once the engine (which takes on_exit and on_fail) is made
        self.responded: set[int] = set()
        self.rlock = threading.Lock()
        self.outstanding: dict[int, int] = {}  # response id -> query id

    def respond(self, ids: list[int]) -> None:
        with self.rlock:
            ids = [i for i in ids if i not in self.responded]
            self.responded.update(ids)
            for i in ids:
                self.outstanding.pop(i, None)
        if ids:
            self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(i, 0, 0) for i in ids])

    def on_exit(self, queries) -> None:
        self.respond([self.engine.tags[q.qid] for q in queries])

    def on_fail(self, _err) -> None:  # let LoadGen finish: complete everything still outstanding
        with self.rlock:
            ids = list(self.outstanding)
        self.respond(ids)

    def issue_query(self, samples) -> None:
        ids = [s.id for s in samples]
        if self.engine.failed:
            self.respond(ids)
            return
        with self.rlock:
            for i in ids:
                self.outstanding[i] = -1
        try:
            self.engine.submit([s.index for s in samples], tags=ids)
        except ReplayError:
            self.respond(ids)

    def flush_queries(self) -> None:
        pass

    def load_samples(self, indices) -> None:  # everything is in memory already
        pass


def _settings(lg, setup, target_qps: float):
    """LoadGen's test settings (see the module docstring): exactly the workload's ``n_queries``, its seed."""
    n = setup.workload.n_queries
    seed = int(setup.cfg["workload"].get("seed", 0))
    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Server
    settings.mode = lg.TestMode.PerformanceOnly
    settings.server_target_qps = target_qps
    settings.server_target_latency_ns = int(setup.cfg["qos"]["target_ms"] * 1e6)
    settings.min_query_count = n
    settings.max_query_count = n
    settings.min_duration_ms = 0
    settings.max_duration_ms = 0
    settings.qsl_rng_seed = seed
    settings.sample_index_rng_seed = seed
    settings.schedule_rng_seed = seed
    return settings


def _log_settings(lg, out: Path):
    log = lg.LogSettings()
    log.log_output.outdir = str(out)
    log.log_output.copy_summary_to_stdout = False
    log.log_output.copy_detail_to_stdout = False
    log.enable_trace = False
    return log


def _run_test(lg, sut: _Sut, engine, settings, log, n: int, out: Path):
    """LoadGen's test against the live engine; the engine's result (LoadGen's objects and its other files
    removed afterwards, whatever happened)."""
    lg_sut = lg.ConstructSUT(sut.issue_query, sut.flush_queries)
    qsl = lg.ConstructQSL(n, n, sut.load_samples, sut.load_samples)
    engine.start_live()
    try:
        lg.StartTestWithLogSettings(lg_sut, qsl, settings, log)
    finally:
        try:
            res = engine.finish_live()
        finally:
            lg.DestroyQSL(qsl)
            lg.DestroySUT(lg_sut)
            for f in ("mlperf_log_trace.json", "mlperf_log_accuracy.json"):
                p = out / f
                if p.exists() and f not in KEEP:
                    p.unlink()
    return res


def _comparison(lgs: dict, ours: dict, target_qps: float, n_issued: int) -> dict:
    """``loadgen.json``: LoadGen's statistics beside ours and their relative differences."""
    return {
        "loadgen": lgs, "ours": ours, "target_qps": target_qps, "n_issued": n_issued,
        "relative_difference_ours_vs_loadgen": {
            k: (ours[k] - lgs[k]) / lgs[k] for k in ours if k in lgs and lgs[k] and math.isfinite(ours[k])
        },
        "note": "ours: from issue_query to completion; LoadGen: from its scheduled issue time to "
                "QuerySamplesComplete",
    }


def _our_stats(df) -> dict:
    lat = df.loc[df["finish_ms"].notna(), "latency_ms"].to_numpy()
    if not len(lat):
        return {}
    out = {"mean_latency_ms": float(lat.mean()), "min_latency_ms": float(lat.min()),
           "max_latency_ms": float(lat.max())}
    for p in (50, 90, 95, 97, 99):
        out[f"p{p}_latency_ms"] = float(np.percentile(lat, p))
    return out
