"""MLPerf LoadGen (Server scenario, in-process) driving the replay end to end."""

from __future__ import annotations

import json
import threading

import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")
pytest.importorskip("mlperf_loadgen")

import dvasim.engines.replay.loadgen as lgmod  # noqa: E402
from dvasim.cli import main  # noqa: E402
from dvasim.engines.replay import ReplayStageError  # noqa: E402
from dvasim.engines.replay.loadgen import parse_summary, replay_loadgen  # noqa: E402
from tests.conftest import vgg19_config_file  # noqa: E402
from tests.engines.test_replay import Exploding, assert_outputs_match, cfg  # noqa: E402


def test_loadgen_server_run_end_to_end(tmp_path):
    r = replay_loadgen(cfg("vgg19", "dvabatch", rate=150.0, n=60), tmp_path, warmup=1, record_outputs=True)
    s = r.summary
    assert s["n_queries"] == 60 and s["n_completed"] == 60  # LoadGen issued exactly n, all completed
    assert s["loadgen_scenario"] == "Server"
    for f in ("mlperf_log_summary.txt", "mlperf_log_detail.txt", "loadgen.json"):
        assert (tmp_path / f).is_file(), f
    assert not (tmp_path / "mlperf_log_trace.json").exists()
    cmp_ = json.loads((tmp_path / "loadgen.json").read_text())
    lg, ours = cmp_["loadgen"], cmp_["ours"]
    # LoadGen measures from its scheduled issue time, we from issue_query: its latencies are not smaller (an order
    # of timestamps, not a speed claim: how much larger depends on how busy the machine is)
    assert lg["mean_latency_ms"] >= ours["mean_latency_ms"] * 0.999
    assert lg["p50_latency_ms"] <= lg["p90_latency_ms"] <= lg["p99_latency_ms"]
    assert abs(s["loadgen_mean_latency_ms"] - lg["mean_latency_ms"]) < 1e-9
    # the samples LoadGen chose are real inputs and come out right
    assert_outputs_match(r)


def test_cli_replay_loadgen(tmp_path):
    conf = vgg19_config_file(tmp_path / "c.toml", 100, 30, 2)
    out = tmp_path / "out"
    assert main(["replay", str(conf), "--out", str(out), "--loadgen", "--target-qps", "120", "--no-figure"]) == 0
    for f in ("queries.csv", "summary.json", "config.json", "mlperf_log_summary.txt", "loadgen.json"):
        assert (out / f).is_file(), f
    s = json.loads((out / "summary.json").read_text())
    assert s["n_completed"] == 30 and s["loadgen_target_qps"] == 120.0


def test_stage_failure_under_loadgen_does_not_hang(tmp_path, monkeypatch):
    real_prepare = lgmod.prepare

    def faulty_prepare(*a, **k):
        setup = real_prepare(*a, **k)
        setup.stages[1] = Exploding(setup.stages[1], fail_on_call=4)
        return setup

    monkeypatch.setattr(lgmod, "prepare", faulty_prepare)
    box: dict = {}

    def target():
        try:
            replay_loadgen(cfg("vgg19", "zerobatch", rate=200.0, n=40), tmp_path, warmup=0)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "LoadGen hung after a stage failure"
    err = box.get("error")
    assert isinstance(err, ReplayStageError) and err.stage == 1 and err.query_ids


SUMMARY = """
================================================
MLPerf Results Summary
================================================
SUT name : PySUT
Scenario : Server
Mode     : PerformanceOnly
Completed samples per second    : 186.93
Result is : INVALID
================================================
Additional Stats
================================================
Scheduled samples per second : 187.85
Min latency (ns)                : 3147904
Max latency (ns)                : 7191687
Mean latency (ns)               : 4313599
50.00 percentile latency (ns)   : 4333914
90.00 percentile latency (ns)   : 5158110
99.00 percentile latency (ns)   : 6370700
99.90 percentile latency (ns)   : 7191687
"""


def test_parse_summary():
    s = parse_summary(SUMMARY)
    assert s["mean_latency_ms"] == pytest.approx(4.313599)
    assert s["p50_latency_ms"] == pytest.approx(4.333914)
    assert s["p99_latency_ms"] == pytest.approx(6.3707)
    assert s["p99_9_latency_ms"] == pytest.approx(7.191687)
    assert s["completed_qps"] == pytest.approx(186.93) and s["scheduled_qps"] == pytest.approx(187.85)
    assert s["result"] == "INVALID" and s["scenario"] == "Server"
