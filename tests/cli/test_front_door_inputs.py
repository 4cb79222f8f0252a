"""Bad input from issue 37's corpus that used to slip through: each is now one line naming the field, status 2,
or (a closed standard output) a run that writes its files and says nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dvasim.cli import main
from dvasim.workload.arrivals import CV_RANGE, gamma_arrivals

ROOT = Path(__file__).resolve().parents[2]


def test_config_refuses_an_unknown_section_even_with_reference(capsys):
    assert main(["config", "bogus", "--reference"]) == 2  # printed the whole reference, status 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown section 'bogus'" in err[0]
    assert main(["config", "engine", "--reference"]) == 2  # a section and the whole reference: which one?
    assert "give it without a section" in capsys.readouterr().err


def test_a_negative_timeline_is_one_line(tmp_path, capsys):
    assert main(["run", str(ROOT / "configs" / "default.toml"), "--out", str(tmp_path / "o"), "--timeline", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dvasim: error: --timeline: must be an integer >= 0")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("cv", [1e-320, 1e-7, 1e4, float("inf")])
def test_a_gamma_cv_whose_shape_cannot_be_drawn_is_one_line(tmp_path, capsys, cv):
    # 1e-320 squared is 0: the Gamma shape 1 / cv^2 was a ZeroDivisionError
    args = ["run", str(ROOT / "configs" / "default.toml"), "--out", str(tmp_path / "o"), "--set",
            "workload.kind=gamma", "--set", f"workload.cv={cv!r}", "--set", "workload.n_queries=50"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "workload.cv" in err[0]


def test_the_cv_range_ends_draw_finite_arrivals():
    import numpy as np

    for cv in CV_RANGE:
        t = gamma_arrivals(100.0, cv, 2000, seed=1)
        assert np.isfinite(t).all() and (np.diff(t) >= 0).all() and t[-1] > 0
    smooth = np.diff(gamma_arrivals(100.0, CV_RANGE[0], 2000, seed=1))
    assert np.allclose(smooth, 10.0, rtol=1e-4)  # cv 1e-6: the gaps are the mean, 10 ms


def test_a_run_with_standard_output_closed_writes_its_files(tmp_path):
    # `dvasim run ... >&-`: Python starts with sys.stdout = None, and every command died on its flush
    out = tmp_path / "o"
    p = subprocess.run([sys.executable, "-m", "dvasim", "run", "configs/default.toml", "--out", str(out), "--set",
                        "workload.n_queries=200", "--no-figure"], cwd=ROOT, capture_output=False, timeout=300,
                       stderr=subprocess.PIPE, text=True, pass_fds=(), preexec_fn=lambda: os.close(1))
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr and (out / "summary.json").is_file()


def test_compare_refuses_a_model_given_twice_before_any_run(tmp_path, capsys):
    # it ran every case, then failed with KeyError: 'model'
    assert main(["compare", "--models", "linknet,linknet", "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--models: 'linknet' is given twice" in err[0] and not (tmp_path / "c").exists()


def test_summary_json_is_strict_json_for_a_run_too_short_to_judge(tmp_path):
    # under 60 measured queries the stability figures are not a number: they were written as NaN, which JSON lacks
    import json

    assert main(["run", str(ROOT / "configs" / "default.toml"), "--out", str(tmp_path / "o"), "--no-figure",
                 "--set", "workload.n_queries=40"]) == 0
    text = (tmp_path / "o" / "summary.json").read_text()
    s = json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in summary.json"))
    assert s["throughput_ratio"] is None and s["latency_trend"] is None and s["n_completed"] == 40


# ---- issue 37, item 7: a number beyond any physical meaning is refused by the schema, in one line with the range

NAMED = '[model]\nname = "vgg19"\ndevice = "titanrtx"\n[policy]\nname = "zerobatch"\nmax_batch_size = 8\n' \
        '[workload]\nkind = "poisson"\nrate_qps = 50\nn_queries = 50\n'


def test_every_time_bandwidth_and_rate_of_the_schema_has_its_physical_range():
    """The unit rule (dvasim.schema: MAX_MS, MIN_GBPS, MIN_QPS / MAX_QPS): a key named ``*_ms`` is at most 1e6 ms,
    ``*_gbps`` at least 1e-3 GB/s, ``*_qps`` in [1e-3, 1e9]; a slowdown or scale has MAX_FACTOR."""
    from dvasim.config.sections import SCHEMA, SUBSECTIONS
    from dvasim.schema import MAX_FACTOR, MAX_MS, MAX_QPS, MIN_GBPS, MIN_QPS

    keys = {f"{s.name}.{k.name}": k for s in [*SCHEMA.values(), *SUBSECTIONS.values()] for k in s.keys
            if k.kind in ("number", "numbers", "per_stage", "quantiles")}
    for name, k in keys.items():
        if name.endswith("_ms"):
            assert k.maximum is not None and k.maximum <= 1e12 and k.minimum is not None, name
        elif name.endswith("_gbps"):
            assert k.minimum == MIN_GBPS, name
        elif name.endswith("_qps"):
            assert (k.minimum, k.maximum) == (MIN_QPS, MAX_QPS), name
    assert keys["engine.launch_overhead_ms"].maximum == MAX_MS
    for name in ("engine.corun_slowdown", "server.corun_per_worker", "engine.host.launch_scale",
                 "workload.time_scale"):
        assert keys[name].maximum == MAX_FACTOR, name


@pytest.mark.parametrize("sets,field,allowed", [
    (["server.request_ms=1e308"], "server.request_ms", "in [0, 1e+06]"),
    (["server.h2d_gbps=1e-320"], "server.h2d_gbps", ">= 0.001"),
    (["engine.corun_slowdown=1e308"], "engine.corun_slowdown", "in [1, 1000]"),
    (["engine.admission_delay_ms=[0, 1e308]"], "engine.admission_delay_ms", "[0, 1e+06]"),
    (['policy={name="delaybatch",max_queue_delay_ms=1e308}'], "policy.max_queue_delay_ms", "in [-1e+06, 1e+06]"),
    (["workload.rate_qps=1e-320"], "workload.rate_qps", "in [1e-06, 1e+09]"),
    (["workload.rate_qps=1e-6", "workload.n_queries=20000"], "workload.rate_qps", "beyond 1e+13 ms"),
    (["engine.host.launch_scale=1e308"], "engine.host.launch_scale", "in [0.001, 1000]"),
])
def test_a_number_beyond_its_physical_range_is_one_line_with_the_range(tmp_path, capsys, sets, field, allowed):
    cfg = tmp_path / "named.toml"
    cfg.write_text(NAMED)
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), *sum([["--set", s] for s in sets], [])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"dvasim: error: {field}: ") and allowed in err[0], err
    assert not (tmp_path / "o").exists()


def test_the_ends_of_the_ranges_give_finite_strict_json_results(tmp_path):
    # the slowest host and copies the ranges allow: a finite run, not a hang (1e308 ran past 120 s, then nan ms)
    import json
    import math

    cfg = tmp_path / "named.toml"
    cfg.write_text(NAMED)
    sets = ["server.request_ms=1e6", "server.h2d_gbps=1e-3", "server.launch_per_op_ms=1e6",
            "engine.launch_overhead_ms=1e6", "engine.corun_slowdown=1000", "engine.admission_delay_ms=1e6"]
    assert main(["run", str(cfg), "--out", str(tmp_path / "o"), "--no-figure",
                 *sum([["--set", s] for s in sets], [])]) == 0
    s = json.loads((tmp_path / "o" / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(c))
    assert s["n_completed"] == 50 and math.isfinite(s["mean_latency_ms"]) and s["mean_latency_ms"] > 1e6


@pytest.mark.parametrize("unit,value", [("s", "1e306"), ("ms", "1e308"), ("us", "2e15")])
def test_a_trace_beyond_its_span_names_the_column_without_warnings(tmp_path, unit, value):
    # 1e306 s is inf ms: numpy warned, then the run named workload.arrivals_ms
    import warnings

    from dvasim.errors import WorkloadError
    from dvasim.workload.traces import load_trace

    path = tmp_path / f"far_{unit}.csv"
    path.write_text(f"time\n0\n{value}\n5\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(WorkloadError) as e:
            load_trace(str(path), unit=unit)
    assert e.value.field == "workload.column" and "at most 1e+12 ms" in e.value.message


def test_compare_refuses_an_slo_no_query_can_meet_before_any_run(tmp_path, capsys):
    # 1e-320 ms ran the whole study, then failed naming workload.rate_qps (the peak found was 0 QPS)
    for slo in ("1e-320", "5"):  # vgg19's fastest query on the Titan RTX is 5.495 ms
        assert main(["compare", "--models", "vgg19", "--policies", "zerobatch", "--slo-ms", slo,
                     "--out", str(tmp_path / "c")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--slo-ms" in err[0] and "give at least 5.495" in err[0], err
    assert main(["compare", "--slo-ms", "1e308", "--out", str(tmp_path / "c")]) == 2
    assert "(0, 1e+06]" in capsys.readouterr().err and not (tmp_path / "c").exists()


def _sweep_files(tmp_path):
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(f'base = "{ROOT / "configs" / "default.toml"}"\nset = ["workload.n_queries=50"]\n[grid]\n'
                     '"workload.rate_qps" = [50, 100]\n')
    return ["sweep", str(sweep), "--out", str(tmp_path / "out"), "--workers", "1", "--no-figure"]


def test_sweep_overlay_on_a_fifo_is_refused_not_waited_on(tmp_path, capsys):
    # a FIFO (or a device) as the measured table: the read waited for a writer forever
    import signal

    fifo = tmp_path / "measured.csv"
    os.mkfifo(fifo)

    def hung(*_):
        raise TimeoutError("dvasim sweep waited on the FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        code = main([*_sweep_files(tmp_path), "--export", "perf-analyzer", "--overlay", str(fifo)])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--overlay" in err[0] and "not a regular file" in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_damaged_sweep_cache_entry_is_run_again_and_the_cache_is_strict_json(tmp_path, capsys):
    # {"summary": [1, 2]} in a cache file was an AttributeError; NaN (a short run's stability figures) was written
    import json

    argv = _sweep_files(tmp_path)
    assert main(argv) == 0
    runs = sorted((tmp_path / "out" / "runs").glob("*.json"))
    assert len(runs) == 2
    for f in runs:  # strict: no NaN (the stability figures of a 50-query run are null)
        assert "NaN" not in f.read_text() and "Infinity" not in f.read_text(), f.name
    first = (tmp_path / "out" / "results.csv").read_text()
    for damaged in ('{"summary": [1, 2]}', '{"summary": {"a": 1}}', "[]"):
        runs[0].write_text(damaged)
        capsys.readouterr()
        assert main(argv) == 0, capsys.readouterr().err
        assert "Traceback" not in capsys.readouterr().err
        assert json.loads(runs[0].read_text())["summary"]["run_wall_s"] > 0  # run again, and cached again
    assert (tmp_path / "out" / "results.csv").read_text().split("\n")[0] == first.split("\n")[0]
