"""dvasim sweep (issue 13): grids, random draws and seeds over any config keys (a section's shape included); the
same results serially, in local processes and on a Dask LocalCluster; resumable from its cache; one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import dvasim
from dvasim.cli import main
from dvasim.errors import ConfigError
from dvasim.studies.sweep import WALL_COLUMNS, expand, load_sweep, sweep

ROOT = Path(__file__).resolve().parents[2]

BASE = f"""
[model]
table = "{ROOT / 'traces/default/vgg16_titanx_4stages.csv'}"
[policy]
name = "delaybatch"
max_batch_size = 16
max_queue_delay_ms = 5.0
[workload]
kind = "poisson"
rate_qps = 80
n_queries = 300
seed = 1
"""


def write(tmp_path: Path, sweep_text: str) -> Path:
    (tmp_path / "base.toml").write_text(BASE)
    p = tmp_path / "sweep.toml"
    p.write_text('base = "base.toml"\n' + sweep_text)
    return p


GRID = """
[grid]
"policy" = [{name = "zerobatch", max_batch_size = 16}, {name = "dvabatch", max_batch_size = 16}]
"workload.rate_qps" = [60, 140]
[seeds]
values = [0, 3]
"""


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    drop = [c for c in WALL_COLUMNS if c in a]
    pd.testing.assert_frame_equal(a.drop(columns=drop).reset_index(drop=True),
                                  b.drop(columns=drop).reset_index(drop=True))


def test_a_grid_runs_its_product_with_seeds_and_each_row_is_that_run(tmp_path):
    table = sweep(write(tmp_path, GRID), tmp_path / "out", workers=1, progress=False)
    assert len(table) == 2 * 2 * 2
    assert list(table["label"].unique()) == ["zerobatch", "dvabatch"]
    assert sorted(set(zip(table["workload.rate_qps"], table["workload.seed"]))) == [(60, 0), (60, 3), (140, 0),
                                                                                    (140, 3)]
    # a row is exactly the run of its config (the whole [policy] section replaced: delaybatch's window is gone)
    row = table.iloc[5]
    cfg = {"model": {"table": str(ROOT / "traces/default/vgg16_titanx_4stages.csv")},
           "policy": json.loads(row["[policy]"]),
           "workload": {"kind": "poisson", "rate_qps": int(row["workload.rate_qps"]), "n_queries": 300,
                        "seed": int(row["workload.seed"])}}
    direct = dvasim.run(cfg).summary
    assert row["mean_latency_ms"] == direct["mean_latency_ms"] and row["p99_latency_ms"] == direct["p99_latency_ms"]
    assert row["policy"] == "dvabatch" and row["n_completed"] == 300
    out = tmp_path / "out"
    csv = pd.read_csv(out / "results.csv")
    assert list(csv.columns) == list(table.columns)
    np.testing.assert_array_equal(csv["p99_latency_ms"].to_numpy(), table["p99_latency_ms"].to_numpy())
    _same(pd.read_parquet(out / "results.parquet"), table)
    assert (out / "latency_vs_load.png").stat().st_size > 10_000
    assert len(list((out / "runs").glob("*.json"))) == 8


def test_serial_local_processes_and_a_dask_cluster_give_identical_results(tmp_path):
    from distributed import Client, LocalCluster

    path = write(tmp_path, GRID)
    serial = sweep(path, tmp_path / "serial", workers=1, progress=False, figure=False)
    local = sweep(path, tmp_path / "local", workers=2, progress=False, figure=False)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        on_dask = sweep(path, tmp_path / "dask", dask=client, progress=False, figure=False)
        assert len(client.scheduler_info()["workers"]) == 2
    _same(serial, local)
    _same(serial, on_dask)


def test_a_sweep_resumes_from_its_cache(tmp_path):
    path = write(tmp_path, GRID)
    first = sweep(path, tmp_path / "out", workers=1, progress=False, figure=False)
    runs = sorted((tmp_path / "out" / "runs").glob("*.json"))
    runs[2].unlink()  # as if the sweep had been interrupted before this run finished
    (tmp_path / "out" / "runs" / "junk.json.tmp").write_text("{")
    ran = []
    again = sweep(path, tmp_path / "out", workers=1, progress=False, figure=False,
                  on_result=lambda p, s: ran.append(p.key))
    assert ran == [runs[2].stem]
    _same(first, again)
    ran.clear()
    sweep(path, tmp_path / "out", workers=1, progress=False, figure=False, on_result=lambda p, s: ran.append(p.key))
    assert ran == []


def test_a_point_cut_by_ctrl_c_is_not_cached_and_a_resumed_sweep_reruns_it(tmp_path, monkeypatch):
    """Issue 34: Ctrl-C in a serial sweep truncated the point it was running (the engine returns what was collected
    as an "interrupted" run) and cached it as done, so a resume reused it for ever. A study's run that was stopped
    before its end now raises (dvasim.api.run_whole): the sweep stops, the cut point is not cached, a resumed sweep
    runs it again and gives what an uninterrupted sweep gives."""
    import dvasim.api as api

    path = write(tmp_path, GRID)
    whole = sweep(path, tmp_path / "whole", workers=1, progress=False, figure=False)
    calls = [0]
    real = api.run

    def cut_third(config, **kw):  # the third run is stopped half-way, as Ctrl-C stops the engine
        calls[0] += 1
        if calls[0] == 3:
            kw["stop"] = lambda: "Ctrl-C (test)"
        return real(config, **kw)

    monkeypatch.setattr(api, "run", cut_third)
    with pytest.raises(KeyboardInterrupt):
        sweep(path, tmp_path / "out", workers=1, progress=False, figure=False)
    assert len(list((tmp_path / "out" / "runs").glob("*.json"))) == 2  # the two runs before the cut, not the cut
    monkeypatch.setattr(api, "run", real)
    ran = []
    again = sweep(path, tmp_path / "out", workers=1, progress=False, figure=False,
                  on_result=lambda p, s: ran.append(p.key))
    assert len(ran) == len(whole) - 2
    _same(whole, again)


def test_random_draws_are_seeded_within_bounds_and_sections_change_shape(tmp_path):
    path = write(tmp_path, """
[grid]
"workload" = [{kind = "poisson", rate_qps = 90, n_queries = 200}, {kind = "stepping", start_qps = 40, end_qps = 200, step_queries = 50, n_queries = 200}]
"policy.max_queue_delay_ms" = [{unset = true}]
[random]
n = 3
seed = 7
"policy.max_queue_delay_ms" = {uniform = [1.0, 9.0]}
"policy.max_batch_size" = {randint = [4, 16]}
"engine.sharing" = {choice = ["fluid", "exclusive"]}
""")
    pts = expand(load_sweep(path))
    assert len(pts) == 2 * 3
    assert all("max_queue_delay_ms" in p.config["policy"] for p in pts)  # unset by the grid, then drawn again
    assert [p.values for p in pts] == [p.values for p in expand(load_sweep(path))]  # the same draws every time
    draws = [p.values for p in pts[:3]]
    assert all(1.0 <= d["policy.max_queue_delay_ms"] <= 9.0 and 4 <= d["policy.max_batch_size"] <= 16 for d in draws)
    assert pts[3].config["workload"]["kind"] == "stepping" and "rate_qps" not in pts[3].config["workload"]
    assert len({p.key for p in pts}) == 6
    table = sweep(path, tmp_path / "out", workers=1, progress=False, figure=False)
    assert (table["n_completed"] == 200).all()
    assert np.isclose(table.loc[0, "policy.max_queue_delay_ms"], draws[0]["policy.max_queue_delay_ms"])


@pytest.mark.parametrize("text,field", [
    ('[grid]\n"policy.name" = "zerobatch"\n', "sweep.grid.policy.name"),
    ('[grid]\n"polcy.name" = ["zerobatch"]\n', "sweep.grid.polcy.name"),
    ('[grid]\n"policy" = ["zerobatch"]\n', "sweep.grid.policy"),
    ('[random]\nn = 2\n"workload.rate_qps" = {normal = [1, 2]}\n', "sweep.random.workload.rate_qps"),
    ('[random]\nn = 0\n"workload.rate_qps" = {uniform = [1, 2]}\n', "sweep.random.n"),
    ('[seeds]\nvalues = [-1]\n', "sweep.seeds.values"),
    ('grids = 1\n', "sweep.grids"),
    ('[capacity]\nslo = 5\n', "sweep.capacity.slo"),
    ('[capacity]\nslo_ms = 5\nsteps = 3\n', "sweep.capacity.steps"),
    ('[grid]\n"policy.name" = ["nosuch"]\n', "policy.name"),
])
def test_bad_sweep_files_give_one_line_naming_the_field(tmp_path, capsys, text, field):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        expand(load_sweep(path))
    assert e.value.field == field
    assert main(["sweep", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and field in err
    assert not (tmp_path / "o" / "results.csv").exists()


def test_cli_sweep_writes_the_table(tmp_path, capsys):
    path = write(tmp_path, '[grid]\n"policy.name" = ["zerobatch", "delaybatch"]\n'
                           '"policy.max_queue_delay_ms" = [0.0]\n')
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1", "--no-figure"]) == 0
    t = pd.read_csv(tmp_path / "o" / "results.csv")
    assert list(t["policy"]) == ["zerobatch", "delaybatch"] and (t["n_completed"] == 300).all()
    assert "2 runs" in capsys.readouterr().out


def test_a_capacity_sweep_finds_each_points_capacity(tmp_path):
    path = write(tmp_path, """
[grid]
"policy" = [{name = "zerobatch", max_batch_size = 16}, {name = "dvabatch", max_batch_size = 16}]
[capacity]
slo_ms = 40
resolution = 0.1
max_queries = 4000
min_duration_s = 2
confirm_factor = 2
""")
    table = sweep(path, tmp_path / "out", workers=1, progress=False)
    assert list(table["label"]) == ["zerobatch", "dvabatch"]
    assert (table["capacity_qps"] <= table["capacity_searched_qps"]).all()  # each point's answer confirmed
    assert (table["capacity_qps"] > 0).all() and table["top_exceeded"].all()
    assert (table["bracket_hi_qps"] / table["bracket_lo_qps"] - 1 <= 0.1 + 1e-12).all()
    from dvasim.studies.capacity import capacity

    cfg = expand(load_sweep(path))[1].config
    assert capacity(cfg, 40, resolution=0.1, max_queries=4000, min_duration_s=2,
                    confirm_factor=2)["capacity_qps"] == table.loc[1, "capacity_qps"]
    assert (tmp_path / "out" / "capacity.png").stat().st_size > 5_000
    # a different [capacity] is a different run: nothing is taken from the cache
    path.write_text(path.read_text().replace("slo_ms = 40", "slo_ms = 80"))
    ran = []
    sweep(path, tmp_path / "out", workers=1, progress=False, figure=False, on_result=lambda p, s: ran.append(p))
    assert len(ran) == 2


PEERS = """
[grid]
"policy" = [{name = "serial"}, {name = "graphbatch", max_batch_size = 16}, {name = "lazybatch", max_batch_size = 16},
            {name = "tfserving-nowait", max_batch_size = 16}, {name = "tfserving-optwait", max_batch_size = 16},
            {name = "tfserving-static", max_batch_size = 16}, {name = "n-ebird", workers = [1, 2, 4, 8]},
            {name = "e-ebird"}]
"""


def test_a_sweep_runs_every_peer_systems_policy_by_name(tmp_path):
    """issue 14: the papers' peer systems are names a sweep (like any config) accepts; each row is that policy's
    own run, every query completed."""
    table = sweep(write(tmp_path, PEERS), tmp_path / "out", workers=1, progress=False, figure=False)
    want = ["serial", "graphbatch", "lazybatch", "tfserving-nowait", "tfserving-optwait", "tfserving-static",
            "n-ebird", "e-ebird"]
    assert list(table["policy"]) == want
    assert (table["n_completed"] == 300).all()
    by = table.set_index("policy")
    assert by.loc["serial", "mean_exit_batch_size"] == 1.0
    # an overload policy check: NO_Wait batches under this load, Serial does not; Static pays for padding
    assert by.loc["tfserving-nowait", "mean_exit_batch_size"] > 1.0
    assert by.loc["tfserving-static", "mean_latency_ms"] > by.loc["tfserving-optwait", "mean_latency_ms"]
