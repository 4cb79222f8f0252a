"""``dvasim sweep --export perf-analyzer`` (issue 24, item 5): a request-rate or concurrency sweep written as the CSV
``perf_analyzer -f`` writes (header and order per perf_analyzer's ``src/report_writer.cc`` and
``docs/measurements_metrics.md`` at commit 263c5f6e0c7a6c15472a54409174981f67930cfe; see
tests/reporting/test_perf_analyzer.py), and every sweep it cannot be refused in one line, exit 2, before any run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dvasim.cli import main
from dvasim.reporting.perf_analyzer import header, read_perf_analyzer_csv

ROOT = Path(__file__).resolve().parents[2]
DOC_EXAMPLE = ROOT / "tests/data/perf_analyzer/docs_example_concurrency.csv"

BASE = f"""
[model]
table = "{ROOT / 'traces/default/vgg16_titanx_4stages.csv'}"
[policy]
name = "zerobatch"
max_batch_size = 16
[workload]
kind = "{{kind}}"
n_queries = 240
seed = 1
"""


def sweep_file(tmp_path: Path, grid: str, kind: str = "poisson", extra: str = "") -> Path:
    (tmp_path / "base.toml").write_text(BASE.replace("{kind}", kind))
    p = tmp_path / "sweep.toml"
    p.write_text(f'base = "base.toml"\n{extra}\n[grid]\n{grid}\n')
    return p


def test_a_request_rate_sweep_is_exported_sorted_by_throughput(tmp_path, capsys):
    out = tmp_path / "out"
    sweep = sweep_file(tmp_path, '"workload.rate_qps" = [300, 40, 120]')
    assert main(["sweep", str(sweep), "--out", str(out), "--workers", "1", "--no-figure", "--export",
                 "perf-analyzer", "--verbose-csv"]) == 0
    path = out / "perf_analyzer.csv"
    assert str(path) in capsys.readouterr().out
    assert path.read_text().splitlines()[0] == ",".join(header("request-rate", verbose=True))
    table = read_perf_analyzer_csv(path)
    assert table.attrs["mode"] == "request-rate"
    assert table["Inferences/Second"].is_monotonic_increasing and sorted(table["Request Rate"]) == [40, 120, 300]
    results = pd.read_csv(out / "results.csv").set_index("workload.rate_qps")
    assert not any(c.startswith("perf") for c in results.columns)  # the row stays out of results.csv
    for _, row in table.iterrows():
        summary = results.loc[int(row["Request Rate"])]
        assert row["Inferences/Second"] == pytest.approx(summary["throughput_qps"], rel=5e-6)
        assert abs(row["Avg latency"] - summary["mean_latency_ms"] * 1000) <= 1  # microseconds
        assert row["p50 latency"] <= row["p90 latency"] <= row["p95 latency"] <= row["p99 latency"]
        assert row["Client Send"] == row["Client Recv"] == 0


def test_a_concurrency_sweep_cached_without_rows_runs_again_and_can_be_overlaid(tmp_path, capsys):
    out = tmp_path / "out"
    sweep = sweep_file(tmp_path, '"workload.clients" = [1, 4, 2]', kind="closed")
    assert main(["sweep", str(sweep), "--out", str(out), "--workers", "1", "--no-figure"]) == 0
    assert not (out / "perf_analyzer.csv").exists()
    assert all("perf_analyzer" not in json.loads(p.read_text())["summary"] for p in (out / "runs").glob("*.json"))
    csv = tmp_path / "pa" / "sim.csv"
    assert main(["sweep", str(sweep), "--out", str(out), "--workers", "1", "--no-figure", "--export",
                 "perf-analyzer", "--export-out", str(csv), "--overlay", str(DOC_EXAMPLE)]) == 0
    table = read_perf_analyzer_csv(csv)
    assert table.attrs["mode"] == "concurrency" and sorted(table["Concurrency"]) == [1, 2, 4]
    assert list(table.columns) == header("concurrency")
    assert table["Inferences/Second"].is_monotonic_increasing
    assert all(json.loads(p.read_text())["summary"]["perf_analyzer"] for p in (out / "runs").glob("*.json"))
    assert (out / "perf_analyzer_overlay.png").stat().st_size > 10_000


BAD = [
    ('"workload.rate_qps" = [40, 80]\n"policy.max_batch_size" = [4, 8]', "poisson", "",
     "--export: the sweep also varies 'policy.max_batch_size': perf_analyzer's table has one load column"),
    ('"policy.max_batch_size" = [4, 8]', "poisson", "", "--export: the sweep varies 'policy.max_batch_size', "
                                                        "which is not a load"),
    ('"workload.rate_qps" = [40, 80]', "poisson", "[seeds]\nn = 2", "(and no [seeds]: one run per load)"),
    ('"workload.clients" = [1, 2]', "poisson", "", "--export: concurrency mode (workload.clients) needs a closed "
                                                   "loop"),
    ('"workload.rate_qps" = [40, 80]', "poisson", "[capacity]\nslo_ms = 50", "not capacity searches"),
]


@pytest.mark.parametrize("grid,kind,extra,message", BAD)
def test_a_sweep_perf_analyzer_cannot_hold_is_one_line_and_exit_2_before_any_run(tmp_path, capsys, grid, kind,
                                                                                  extra, message):
    out = tmp_path / "out"
    code = main(["sweep", str(sweep_file(tmp_path, grid, kind, extra)), "--out", str(out), "--workers", "1",
                 "--export", "perf-analyzer"])
    err = capsys.readouterr().err
    assert code == 2 and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (out / "runs").exists()


@pytest.mark.parametrize("flags,message", [
    (["--verbose-csv"], "--verbose-csv: needs --export perf-analyzer"),
    (["--export", "perf-analyzer", "--overlay", "{missing}"], "--overlay: cannot read it as a perf_analyzer CSV"),
    (["--export", "perf-analyzer", "--overlay", "{base}"], "--overlay: not a perf_analyzer CSV"),
    (["--export", "csv"], "argument --export: invalid choice: 'csv'"),
])
def test_bad_export_flags_are_one_line_and_exit_2(tmp_path, capsys, flags, message):
    sweep = sweep_file(tmp_path, '"workload.rate_qps" = [40, 80]')
    flags = [f.replace("{missing}", str(tmp_path / "none.csv")).replace("{base}", str(tmp_path / "base.toml"))
             for f in flags]
    code = main(["sweep", str(sweep), "--out", str(tmp_path / "out"), "--workers", "1", *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "runs").exists()


def test_serial_local_processes_and_dask_write_the_same_file(tmp_path):
    """Each worker computes its row from its records and sends back only that row: the file does not depend on
    where the runs ran."""
    from distributed import Client, LocalCluster

    from dvasim.studies.sweep import sweep

    path = sweep_file(tmp_path, '"workload.rate_qps" = [40, 300, 120]')
    texts = []
    for name, kw in (("serial", {"workers": 1}), ("local", {"workers": 2})):
        sweep(path, tmp_path / name, progress=False, figure=False, export="perf-analyzer", **kw)
        texts.append((tmp_path / name / "perf_analyzer.csv").read_text())
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        table = sweep(path, tmp_path / "dask", dask=client, progress=False, figure=False, export="perf-analyzer")
    texts.append((tmp_path / "dask" / "perf_analyzer.csv").read_text())
    assert texts[0] == texts[1] == texts[2] and len(texts[0].splitlines()) == 4
    assert table.attrs["files"][-1] == str(tmp_path / "dask" / "perf_analyzer.csv")
    assert table.attrs["perf_analyzer_left_out"] == 0
