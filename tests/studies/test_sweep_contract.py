"""dvasim sweep as solid as dvasim run (issue 23): every point checked before any run, limits stated (sweep size,
workers, seeds, [capacity], the Dask scheduler's answer), one line and status 2 for each bad input; --set for every
point; the results table printed with its flags; the figure against the swept key, named for it; results written
whole; no progress bar off a terminal; interrupted and concurrent sweeps on one --out."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pandas as pd
import pytest

from dvasim.cli import main
from dvasim.errors import ConfigError, DvasimError, OutputError, UsageError
from dvasim.studies import sweep as sw
from dvasim.studies.sweep import expand, figure_key, figure_name, load_sweep, sweep
from tests.studies.test_sweep import GRID, _same, write


def _no_runs(out: Path) -> None:
    """Nothing ran: no run cached, no results written."""
    assert not list(out.glob("runs/*.json"))
    assert not (out / "results.csv").exists() and not (out / "results.parquet").exists()


def _one_line(capsys, field: str) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"dvasim: error: {field}: "), err
    return err


# ----------------------------------------------------------------------------- checked before any run
@pytest.mark.parametrize("bad,field", [
    ("-5", "workload.rate_qps"),                       # the workload builder's check, not the schema's
    ('"fast"', "workload.rate_qps"),
])
def test_a_bad_point_after_good_ones_fails_before_any_run(tmp_path, capsys, bad, field):
    path = write(tmp_path, f'[grid]\n"workload.rate_qps" = [60, 100, {bad}]\n')
    ran = []
    with pytest.raises(ConfigError) as e:
        sweep(path, tmp_path / "out", workers=1, progress=False, on_result=lambda p, s: ran.append(p))
    assert e.value.field == field and "sweep point 3 of 3" in e.value.message
    assert ran == []
    _no_runs(tmp_path / "out")
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1"]) == 2
    assert "sweep point 3 of 3: workload.rate_qps=" in _one_line(capsys, field)
    _no_runs(tmp_path / "o")


def test_a_capacity_point_is_checked_as_its_probes_would_run_it(tmp_path, capsys):
    # a closed loop has no rate to search: found at the second point, before the first one's search starts
    path = write(tmp_path, '[grid]\n"workload" = [{kind = "poisson", rate_qps = 10, n_queries = 100}, '
                           '{kind = "closed", n_queries = 100}]\n[capacity]\nslo_ms = 40\n')
    with pytest.raises(ConfigError) as e:
        sweep(path, tmp_path / "out", workers=1, progress=False)
    assert e.value.field == "workload.kind" and "sweep point 2 of 2" in e.value.message
    _no_runs(tmp_path / "out")


def test_cached_points_are_not_checked_again_but_new_ones_are(tmp_path, monkeypatch):
    path = write(tmp_path, '[grid]\n"workload.rate_qps" = [60, 100]\n')
    sweep(path, tmp_path / "out", workers=1, progress=False, figure=False)
    checked = []
    monkeypatch.setattr(sw, "check_buildable", lambda raw, stack=None: checked.append(raw["workload"]["rate_qps"]))
    path.write_text(path.read_text().replace("[60, 100]", "[60, 100, 140]"))
    sweep(path, tmp_path / "out", workers=1, progress=False, figure=False)
    assert checked == [140]


# ----------------------------------------------------------------------------- limits
def test_the_sweep_size_is_limited_before_anything_is_expanded(tmp_path, capsys):
    vals = list(range(1, 401))
    path = write(tmp_path, f'[grid]\n"workload.n_queries" = {vals}\n"workload.seed" = {vals}\n')
    with pytest.raises(ConfigError) as e:
        load_sweep(path)
    assert e.value.field == "sweep" and "160,000 runs" in e.value.message
    assert f"at most {sw.MAX_POINTS:,}" in e.value.message
    assert main(["sweep", str(path), "--out", str(tmp_path / "o")]) == 2
    _one_line(capsys, "sweep")
    _no_runs(tmp_path / "o")


@pytest.mark.parametrize("text,field", [
    ('[random]\nn = 1000000000\n"workload.rate_qps" = {uniform = [50, 100]}\n', "sweep.random.n"),
    ('[random]\nn = 2\nseed = -1\n"workload.rate_qps" = {uniform = [50, 100]}\n', "sweep.random.seed"),
    ('[seeds]\nn = 1000000\n', "sweep.seeds.n"),
    ('[seeds]\nvalues = [0, 9223372036854775808]\n', "sweep.seeds.values"),
    ('[seeds]\nvalues = [0, 9223372036854775807]\n', None),  # the top seed is allowed
    ('[random]\nn = 1000\n"workload.rate_qps" = {uniform = [50, 100]}\n[seeds]\nn = 101\n', "sweep"),
    ('[capacity]\nslo_ms = 40\nmax_queries = "many"\n', "sweep.capacity.max_queries"),
    ('[capacity]\nslo_ms = 40\nmax_queries = 0\n', "sweep.capacity.max_queries"),
    ('[capacity]\nslo_ms = 40\nmax_queries = 400\n', "sweep.capacity.max_queries"),  # below the first probe's
    ('[capacity]\nslo_ms = 40\nmax_queries = 30000000\n', "sweep.capacity.max_queries"),
    ('[capacity]\nslo_ms = 40\nresolution = 1e-300\n', "sweep.capacity.resolution"),
    ('[capacity]\nslo_ms = "40"\n', "sweep.capacity.slo_ms"),
    ('[capacity]\nslo_ms = 40\npercentile = 100\n', "sweep.capacity.percentile"),
    ('[capacity]\npercentile = 90\n', "sweep.capacity.slo_ms"),
])
def test_limits_of_a_sweep_file_are_one_line_naming_the_key(tmp_path, capsys, text, field):
    path = write(tmp_path, text)
    if field is None:
        assert len(expand(load_sweep(path))) == 2
        return
    with pytest.raises(ConfigError) as e:
        expand(load_sweep(path))
    assert e.value.field == field
    assert main(["sweep", str(path), "--out", str(tmp_path / "o")]) == 2
    _one_line(capsys, field)
    _no_runs(tmp_path / "o")


@pytest.mark.parametrize("workers", [0, -1, True, "2", 2.0, 10**6])
def test_workers_are_limited(tmp_path, workers):
    path = write(tmp_path, '[grid]\n"workload.rate_qps" = [60]\n')
    with pytest.raises(UsageError) as e:
        sweep(path, tmp_path / "out", workers=workers, progress=False)
    assert e.value.field == "--workers" and f"1..{sw.max_workers()}" in e.value.message
    _no_runs(tmp_path / "out")


def test_workers_limit_is_per_core_and_capped(monkeypatch):
    monkeypatch.setattr(sw.os, "cpu_count", lambda: 2)
    assert sw.max_workers() == 2 * sw.MAX_WORKERS_PER_CORE
    monkeypatch.setattr(sw.os, "cpu_count", lambda: 10_000)
    assert sw.max_workers() == sw.MAX_WORKERS
    assert sw.check_workers(None) is None and sw.check_workers(3) == 3


def test_cli_workers_out_of_range_is_one_line(tmp_path, capsys):
    path = write(tmp_path, '[grid]\n"workload.rate_qps" = [60]\n')
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "100000"]) == 2
    _one_line(capsys, "--workers")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("address", ["tcp://127.0.0.1:1", "nonsense", "http://localhost:8786", ""])
def test_an_unreachable_dask_scheduler_is_one_line_and_quick_to_say_so(tmp_path, capsys, monkeypatch, address):
    import dvasim.studies.parallel as par

    monkeypatch.setattr(par, "DASK_CONNECT_TIMEOUT_S", 0.5)
    path = write(tmp_path, '[grid]\n"workload.rate_qps" = [60, 100]\n')
    ran = []
    with pytest.raises(UsageError) as e:
        sweep(path, tmp_path / "out", dask=address, progress=False, on_result=lambda p, s: ran.append(p))
    assert e.value.field == "--dask" and ran == []
    _no_runs(tmp_path / "out")
    if address:
        assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--dask", address]) == 2
        assert address in _one_line(capsys, "--dask")
        _no_runs(tmp_path / "o")


def test_a_dask_client_of_the_wrong_kind_is_refused(tmp_path):
    path = write(tmp_path, '[grid]\n"workload.rate_qps" = [60]\n')
    with pytest.raises(UsageError, match="scheduler address"):
        sweep(path, tmp_path / "out", dask=8786, progress=False)


# ----------------------------------------------------------------------------- --set for every point
def test_set_applies_to_every_point_after_the_files_set(tmp_path, capsys):
    path = write(tmp_path, 'set = ["workload.n_queries=500"]\n[grid]\n"policy.max_queue_delay_ms" = [0.0, 2.0]\n')
    table = sweep(path, tmp_path / "out", workers=1, progress=False, figure=False,
                  overrides=["workload.n_queries=200", "policy.max_batch_size=4"])
    assert (table["n_queries"] == 200).all() and (table["mean_exit_batch_size"] <= 4).all()
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1", "--no-figure",
                 "--set", "workload.n_queries=200", "--set", "policy.max_batch_size=4"]) == 0
    _same(pd.read_csv(tmp_path / "o" / "results.csv"), pd.read_csv(tmp_path / "out" / "results.csv"))


@pytest.mark.parametrize("override", ["policy.max_queue_delay_ms=3", "workload.seed=1"])
def test_set_of_a_swept_key_is_refused(tmp_path, capsys, override):
    path = write(tmp_path, '[grid]\n"policy.max_queue_delay_ms" = [0.0, 2.0]\n[seeds]\nn = 2\n')
    with pytest.raises(UsageError) as e:
        expand(load_sweep(path), overrides=[override])
    assert e.value.field == "--set" and override.split("=")[0] in e.value.message
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--set", override]) == 2
    _one_line(capsys, "--set")
    _no_runs(tmp_path / "o")


def test_set_inside_a_swept_section_is_refused_and_a_bad_set_is_one_line(tmp_path, capsys):
    path = write(tmp_path, '[grid]\n"policy" = [{name = "zerobatch"}, {name = "dvabatch"}]\n')
    with pytest.raises(UsageError):
        expand(load_sweep(path), overrides=["policy.max_batch_size=4"])
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--set", "nosection.key=1"]) == 2
    _one_line(capsys, "nosection.key")


# ----------------------------------------------------------------------------- what is printed and written
def test_the_cli_prints_the_results_table_with_flags(tmp_path, capsys):
    path = write(tmp_path, '[grid]\n"workload.rate_qps" = [60, 5000]\n')
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1", "--set", "qos.target_ms=30"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].endswith(f"{tmp_path / 'o' / 'results.csv'}, {tmp_path / 'o' / 'results.parquet'}, "
                             f"{tmp_path / 'o' / 'latency_vs_load.png'}")
    header = lines[1].split()
    assert header == ["workload.rate_qps", "mean_latency_ms", "p99_latency_ms", "qos_violation_rate", "stable",
                      "verdict", "flags"]
    table = pd.read_csv(tmp_path / "o" / "results.csv")
    slow = table["p99_latency_ms"] > 30
    assert slow.any() and not table["stable"].all()  # the overloaded point: unstable, over the target
    assert table.set_index("workload.rate_qps").loc[5000, "verdict"] == "unstable"
    row_5000 = next(line for line in lines[2:4] if line.split()[0] == "5000")
    assert "unstable" in row_5000 and "SLO missed" in row_5000
    row_60 = next(line for line in lines[2:4] if line.split()[0] == "60")
    assert ("SLO missed" in row_60) == bool(slow[0]) and "unstable" not in row_60
    assert lines[4].startswith("flagged: ") and "1 of 2 runs unstable" in lines[4]


def test_overview_names_sections_by_their_label_and_flags_stuck_runs():
    table = pd.DataFrame({"[policy]": ['{"max_batch_size": 4, "name": "zerobatch"}',
                                       '{"max_batch_size": 8, "name": "zerobatch"}'],
                          "workload.seed": [0, 1], "label": ["", ""], "run": ["a", "b"],
                          "mean_latency_ms": [1.0, 2.0], "p99_latency_ms": [5.0, float("nan")],
                          "qos_violation_rate": [0.0, 1.0], "stable": [True, False],
                          "verdict": ["stable", "unstable"], "qos_target_ms": [10.0, 10.0],
                          "stuck": ["", "3 queries waiting at stage 0"]})
    view = sw.overview(table)
    assert list(view.columns) == ["[policy]", "workload.seed", *sw.RUN_METRICS, "flags"]
    assert list(view["[policy]"]) == ["zerobatch (max_batch_size=4)", "zerobatch (max_batch_size=8)"]
    assert list(view["flags"]) == ["", "unstable, SLO missed, stuck"]


def test_figure_key_is_the_load_when_it_varies_else_the_first_varying_key(tmp_path):
    def keys(text):
        return figure_key(expand(load_sweep(write(tmp_path, text))))

    assert keys('[grid]\n"policy.max_batch_size" = [4, 8]\n"workload.rate_qps" = [60, 90]\n') == \
        "workload.rate_qps"
    assert keys('[grid]\n"workload.rate_qps" = [60]\n"policy.max_queue_delay_ms" = [1.0, 2.0]\n[seeds]\nn = 2\n') \
        == "policy.max_queue_delay_ms"
    assert keys('[grid]\n"policy.name" = ["delaybatch"]\n[seeds]\nn = 2\n') == "workload.seed"
    assert keys('[grid]\n"policy.name" = ["delaybatch"]\n') is None
    assert figure_name(None) == figure_name("workload.rate_qps") == "latency_vs_load.png"
    assert figure_name("policy.max_queue_delay_ms") == "latency_vs_policy_max_queue_delay_ms.png"
    assert figure_name("policy") == "latency_vs_policy.png"


def test_the_figure_plots_against_the_swept_key_and_is_named_for_it(tmp_path, monkeypatch, capsys):
    from dvasim.reporting import plots

    drawn = {}
    real = plots.save_figure

    def keep(fig, path, title=""):
        drawn["x"] = [list(line.get_xdata()) for line in fig.axes[0].get_lines() if len(line.get_xdata()) > 1]
        drawn["xlabel"] = fig.axes[0].get_xlabel()
        return real(fig, path, title)

    monkeypatch.setattr(plots, "save_figure", keep)
    path = write(tmp_path, '[grid]\n"policy.max_queue_delay_ms" = [0.0, 2.0, 5.0]\n')
    table = sweep(path, tmp_path / "out", workers=1, progress=False)
    name = "latency_vs_policy_max_queue_delay_ms.png"
    assert table.attrs["files"][-1] == str(tmp_path / "out" / name)
    assert all(Path(f).is_file() for f in table.attrs["files"])
    assert not (tmp_path / "out" / "latency_vs_load.png").exists()
    assert drawn["x"] == [[0.0, 2.0, 5.0]] and drawn["xlabel"] == plots.axis_label("policy.max_queue_delay_ms")
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(str(tmp_path / "o" / name))
    assert (tmp_path / "o" / name).is_file()


def test_a_capacity_sweep_prints_the_figure_it_wrote(tmp_path, capsys):
    path = write(tmp_path, '[grid]\n"policy.max_batch_size" = [16]\n[capacity]\nslo_ms = 40\nresolution = 0.2\n'
                           'max_queries = 2000\n')
    assert main(["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(f"{tmp_path / 'o' / 'capacity.png'}") and "latency_vs_load" not in out[0]
    assert out[1].split() == ["policy.max_batch_size", *sw.CAPACITY_METRICS, "flags"]
    assert (tmp_path / "o" / "capacity.png").is_file() and not (tmp_path / "o" / "latency_vs_load.png").exists()


def test_results_are_written_whole_or_not_at_all(tmp_path, monkeypatch, capsys):
    path = write(tmp_path, '[grid]\n"workload.rate_qps" = [60]\n')
    sweep(path, tmp_path / "out", workers=1, progress=False, figure=False)
    before = (tmp_path / "out" / "results.parquet").read_bytes()

    def full_disk(self, target, *a, **k):
        Path(target).write_bytes(b"PAR1 torn")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", full_disk)
    path.write_text(path.read_text().replace("[60]", "[70]"))
    with pytest.raises(OutputError) as e:
        sweep(path, tmp_path / "out", workers=1, progress=False, figure=False)
    assert e.value.field.endswith("results.parquet") and "no space left" in e.value.message
    assert (tmp_path / "out" / "results.parquet").read_bytes() == before  # the old file, whole
    assert not [p.name for p in (tmp_path / "out").rglob(".*partial*")]
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--workers", "1", "--no-figure"]) == 2
    _one_line(capsys, str(tmp_path / "out" / "results.parquet"))


def test_no_progress_bar_off_a_terminal(tmp_path, capsys):
    sweep(write(tmp_path, '[grid]\n"workload.rate_qps" = [60, 100]\n'), tmp_path / "out", workers=1, progress=True,
          figure=False)
    err = capsys.readouterr().err
    assert "\r" not in err and "run/s" not in err and "sweep:" not in err


# ----------------------------------------------------------------------------- interrupted and concurrent sweeps
def test_an_interrupted_sweep_resumes_with_every_row_once(tmp_path):
    path = write(tmp_path, GRID)
    done = []

    def stop_after_three(p, s):
        done.append(p.key)
        if len(done) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep(path, tmp_path / "out", workers=1, progress=False, figure=False, on_result=stop_after_three)
    assert len(list((tmp_path / "out" / "runs").glob("*.json"))) == 3
    assert not (tmp_path / "out" / "results.csv").exists()
    ran = []
    table = sweep(path, tmp_path / "out", workers=1, progress=False, figure=False,
                  on_result=lambda p, s: ran.append(p.key))
    assert len(ran) == 5 and not set(ran) & set(done)
    assert len(table) == 8 and table["run"].is_unique
    _same(table, sweep(path, tmp_path / "fresh", workers=1, progress=False, figure=False))


def test_two_sweeps_at_once_on_one_out_give_identical_results(tmp_path):
    path = write(tmp_path, GRID)
    tables, errors = [], []

    def one():
        try:
            tables.append(sweep(path, tmp_path / "out", workers=1, progress=False, figure=False))
        except DvasimError as e:  # pragma: no cover  (what the test is about)
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(tables) == 2
    _same(tables[0], tables[1])
    assert len(list((tmp_path / "out" / "runs").glob("*.json"))) == 8
    assert not list((tmp_path / "out").rglob(".*partial*"))
    csv = pd.read_csv(tmp_path / "out" / "results.csv")
    assert len(csv) == 8 and list(csv["run"]) == list(tables[0]["run"])


def test_points_differing_only_in_their_seed_are_built_once_and_every_seed_is_checked(tmp_path, monkeypatch):
    built = []
    real = sw.check_buildable
    monkeypatch.setattr(sw, "check_buildable", lambda raw, stack=None: (built.append(raw), real(raw, stack)))
    points = expand(load_sweep(write(tmp_path, '[grid]\n"workload.rate_qps" = [60, 100]\n[seeds]\nn = 3\n')))
    sw.check_points(points)
    assert len(points) == 6 and [b["workload"]["rate_qps"] for b in built] == [60, 100]
    points = expand(load_sweep(write(tmp_path, '[grid]\n"workload.seed" = [0, 1, -1]\n')))
    with pytest.raises(ConfigError) as e:
        sw.check_points(points)
    assert e.value.field == "workload.seed" and "sweep point 3 of 3" in e.value.message
