"""Issue 23: bad input for ``fit``, ``validate``, ``profile``, ``compare``, ``policies``/``stacks`` and ``replay``.

Every case measured in the issue is one line naming the field (exit status 2, no traceback), found before any
work, with nothing written; and the commands' own outputs go to temporary names renamed when complete.
"""

from __future__ import annotations

import errno
import gzip
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dvasim.cli import main
from tests.cli.test_cli import assert_one_line_error

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "h100_replays"
REPLAY = DATA / "resnet152_zerobatch_0.6"
CPU_CONFIG = ('[model]\nname = "vgg19"\ndevice = "cpu"\nstages = 2\n[policy]\nname = "zerobatch"\nmax_batch_size = 4\n'
              '[workload]\nkind = "poisson"\nrate_qps = 50\nn_queries = 20\nseed = 1\n')


def run_cli(argv, capsys):
    code = main([str(a) for a in argv])
    return code, capsys.readouterr().err


def leftovers(folder: Path) -> list[str]:
    """Temporary files an atomic write left behind (none may be)."""
    return sorted(p.name for p in folder.rglob(".*partial*"))


# ----------------------------------------------------------------------------- dvasim fit
def replay_copy(tmp_path, name="r") -> Path:
    d = tmp_path / name
    shutil.copytree(REPLAY, d)
    return d


def rewrite_csv(d: Path, stem: str, change) -> None:
    p = d / f"{stem}.csv.gz"
    df = pd.read_csv(p)
    changed = change(df)
    (df if changed is None else changed).to_csv(p, index=False)


def truncated_gzip(d):
    p = d / "executions.csv.gz"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def config_json_a_list(d):
    (d / "config.toml").unlink()
    (d / "config.json").write_text("[1, 2]\n")


def empty_stage_cell(d):
    rewrite_csv(d, "executions", lambda df: df.__setitem__("stage", df["stage"].astype("object").where(df.index != 3)))


def infinite_compute(d):
    rewrite_csv(d, "executions", lambda df: df.__setitem__("compute_ms", float("inf")))


def header_only_queries(d):
    p = d / "queries.csv.gz"
    pd.read_csv(p).iloc[:0].to_csv(p, index=False)


def cut_queries(d):
    p = d / "queries.csv.gz"
    text = gzip.open(p, "rt").read()
    with gzip.open(p, "wt") as f:
        f.write(text[: len(text) // 2])


def missing_stage(d):
    rewrite_csv(d, "executions", lambda df: df[df["stage"] != 1])


def huge_compute(d):  # issue 35: a finite time no replay has made an engine launching for 1e+304 ms an operator
    rewrite_csv(d, "executions", lambda df: df.__setitem__("compute_ms", df["compute_ms"].where(df.index != 4, 1e308)))


def compute_beyond_span(d):
    rewrite_csv(d, "executions", lambda df: df.__setitem__(
        "compute_ms", df["compute_ms"].where(df.index != 4, 10 * (df["end_ms"] - df["begin_ms"]))))


def copy_beyond_compute(d):
    rewrite_csv(d, "executions", lambda df: df.__setitem__("copy_ms", df["copy_ms"].where(df.index != 4,
                                                                                           df["compute_ms"] + 1.0)))


def huge_arrival(d):
    rewrite_csv(d, "queries", lambda df: df.__setitem__("arrival_ms", df["arrival_ms"].where(df.index != 4, 1e308)))


@pytest.mark.parametrize("damage,needle", [
    (truncated_gzip, "cut short"),
    (config_json_a_list, "no config table"),
    (empty_stage_cell, "stage is empty"),
    (infinite_compute, "compute_ms is inf"),
    (header_only_queries, "no rows"),
    (cut_queries, "middle of a line"),
    (missing_stage, "none of stage 1"),
    (huge_compute, "data row 5: compute_ms is 1e+308"),
    (compute_beyond_span, "more than its span"),
    (copy_beyond_compute, "more than its compute_ms"),
    (huge_arrival, "data row 5: arrival_ms is 1e+308"),
])
def test_fit_refuses_a_damaged_replay_folder_and_writes_nothing(damage, needle, tmp_path, capsys):
    d = replay_copy(tmp_path)
    damage(d)
    out = tmp_path / "engine.toml"
    code, err = run_cli(["fit", d, "--out", out], capsys)
    assert_one_line_error(code, err, "fit:", needle, d.name)
    assert not out.exists() and not leftovers(tmp_path)


def test_fit_refuses_an_untrustworthy_time_in_one_line_without_warnings(tmp_path):
    """Issue 35, as reported: one ``compute_ms = 1e308`` cell gave 26 warning lines and an engine whose launches
    cost 1e+307 ms an operator; now one line, status 2, and no engine file."""
    d = replay_copy(tmp_path)
    huge_compute(d)
    out = tmp_path / "engine.toml"
    r = subprocess.run([sys.executable, "-m", "dvasim.cli", "fit", str(d), "--out", str(out)], capture_output=True,
                       text=True, cwd=tmp_path)
    assert_one_line_error(r.returncode, r.stderr, "fit:", "compute_ms is 1e+308", "executions.csv")
    assert "Warning" not in r.stderr and not out.exists()


def test_fit_refuses_a_gpu_table_time_beyond_any_replay(tmp_path, capsys):
    rows = [f"{s},{b},{1e308 if s == 1 else 0.5}" for s in range(4) for b in range(1, 17)]
    table = tmp_path / "gpu.csv"
    table.write_text("stage,batch_size,latency_ms\n" + "\n".join(rows) + "\n")
    out = tmp_path / "engine.toml"
    code, err = run_cli(["fit", REPLAY, "--out", out, "--gpu-table", table], capsys)
    assert_one_line_error(code, err, "--gpu-table:", "1e+308 ms", "beyond any replay")
    assert not out.exists()


def test_fit_checks_every_folder_before_fitting_any(tmp_path, capsys):
    good, bad = replay_copy(tmp_path, "good"), replay_copy(tmp_path, "bad")
    infinite_compute(bad)
    out = tmp_path / "engine.toml"
    code, err = run_cli(["fit", good, bad, "--out", out], capsys)
    assert_one_line_error(code, err, "fit:", "bad")
    assert not out.exists()


@pytest.mark.parametrize("args,field", [
    (["--table", "/nonexistent/table.csv"], "--table"),
    (["--table", DATA / "bert_base_serving_table.csv"], "--table"),  # the self-check cannot simulate the folder
    (["--host-cores", "100000"], "--host-cores"),
    (["--modules", "magic"], "--modules"),
    (["--gpu-table", "/nonexistent/gpu.csv"], "--gpu-table"),
])
def test_fit_argument_errors_leave_no_engine_file(args, field, tmp_path, capsys):
    out = tmp_path / "engine.toml"
    code, err = run_cli(["fit", REPLAY, "--out", out, *args], capsys)
    assert_one_line_error(code, err, f"{field}:")
    assert not out.exists() and not leftovers(tmp_path)


def test_fit_table_needs_each_folders_config_toml(tmp_path, capsys):
    import json

    import tomllib

    d = replay_copy(tmp_path)
    cfg = tomllib.loads((d / "config.toml").read_text())
    (d / "config.toml").unlink()
    (d / "config.json").write_text(json.dumps({"config": cfg}))
    out = tmp_path / "engine.toml"
    code, err = run_cli(["fit", d, "--out", out, "--table", DATA / "resnet152_serving_table.csv"], capsys)
    assert_one_line_error(code, err, "--table:", "config.toml")
    assert not out.exists()


@pytest.mark.parametrize("where", ["folder", "below-a-file", "empty"])
def test_fit_out_is_checked_first(where, tmp_path, capsys):
    (tmp_path / "afile").write_text("keep")
    out = {"folder": tmp_path, "below-a-file": tmp_path / "afile" / "e.toml", "empty": ""}[where]
    code, err = run_cli(["fit", REPLAY, "--out", out], capsys)
    assert_one_line_error(code, err, "--out:")
    assert (tmp_path / "afile").read_text() == "keep"


def test_fit_full_disk_is_one_line_and_leaves_no_partial_file(tmp_path, capsys, monkeypatch):
    import dvasim.outputs

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dvasim.outputs.os, "replace", full)
    out = tmp_path / "engine.toml"
    code, err = run_cli(["fit", REPLAY, "--out", out], capsys)
    assert_one_line_error(code, err, str(out), "no space left")
    assert not out.exists() and not leftovers(tmp_path)


def test_fit_refuses_a_non_finite_engine(tmp_path):
    from dvasim.errors import ConfigError
    from dvasim.fitting.fit import write_engine

    res = {"engine": {"service_cv": 0.1, "host": {"copy_ms": float("nan")}}, "fit": {}}
    with pytest.raises(ConfigError, match="engine.host.copy_ms = nan"):
        write_engine(res, tmp_path / "e.toml")
    assert not (tmp_path / "e.toml").exists()


# ----------------------------------------------------------------------------- dvasim compare
@pytest.mark.parametrize("args,needles", [
    (["--workers", "100000"], ["--workers:", "1..256"]),
    (["--out", ""], ["--out:", "empty"]),
    (["--queries", str(10**12)], ["--queries:", "20,000,000"]),
    (["--seed", str(10**30)], ["--seed:", "2**63-1"]),
    (["--slo-ms", "inf"], ["--slo-ms:", "finite"]),
    (["--device", "tpu"], ["--device:", "titanrtx"]),
])
def test_compare_refuses_before_any_run(args, needles, tmp_path, capsys, monkeypatch):
    import dvasim.studies.evaluation as ev

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ev, "compare", lambda *a, **k: pytest.fail("a run started"))
    code, err = run_cli(["compare", "--models", "vgg19", *args], capsys)
    assert_one_line_error(code, err, *needles)
    assert list(tmp_path.iterdir()) == []


class CountingPool:
    """A stand-in process pool: records how many workers it was asked for and runs jobs in this process."""

    asked: list[int] = []

    def __init__(self, max_workers, **_kw):  # (initializer: the workers' signal handling)
        CountingPool.asked.append(max_workers)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, jobs):
        return map(fn, jobs)

    def submit(self, fn, arg):
        from concurrent.futures import Future

        fut = Future()
        fut.set_result(fn(arg))
        return fut

    def shutdown(self, cancel_futures=False):
        pass


def test_compare_never_starts_more_processes_than_jobs(monkeypatch, capsys):
    import dvasim.studies.evaluation as ev

    CountingPool.asked = []
    monkeypatch.setattr(ev, "ProcessPoolExecutor", CountingPool)
    monkeypatch.setattr(ev, "_peak_job", lambda job: (100.0, (90.0, 110.0)))
    monkeypatch.setattr(ev, "_run_job", lambda job: {"model": job[0], "policy": job[1], "load": job[3]})
    results, calib = ev.compare(["vgg19"], workers=256, windows={"vgg19": 2.0}, policies=["zerobatch", "dvabatch"])
    assert len(results) == 6 and len(calib) == 1
    assert CountingPool.asked == [8]  # one pool for the study's eight jobs: the two peaks, then the six runs
    assert ev._map(lambda x: x * 2, [1, 2, 3], 100) == [2, 4, 6] and CountingPool.asked[-1] == 3
    assert capsys.readouterr().err == ""  # no bar drawn into a captured (non-terminal) stderr


# ----------------------------------------------------------------------------- dvasim policies / stacks
@pytest.mark.parametrize("argv", [["policies"], ["policies", "--json"], ["stacks"], ["stacks", "--json"],
                                  ["policies", "dvabatch"], ["stacks", "cudagraph"]])
def test_policies_and_stacks_write_only_to_stdout(argv, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(argv, capsys)
    assert code == 0 and err == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv,field", [(["policies", "fastest"], "policy"), (["stacks", "warp"], "stacks")])
def test_policies_and_stacks_unknown_name(argv, field, capsys):
    code, err = run_cli(argv, capsys)
    assert_one_line_error(code, err, f"{field}:", "allowed")


# ----------------------------------------------------------------------------- the torch commands
torch_only = pytest.mark.torch


NO_TORCH = """
import sys
class _NoTorch:  # as on a machine without torch: importing it (or any torch.*) raises ImportError
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch'")
sys.meta_path.insert(0, _NoTorch())
from dvasim.cli import main
"""


def no_torch(code: str, cwd) -> subprocess.CompletedProcess:
    """``code`` run in a fresh interpreter in which torch cannot be imported."""
    return subprocess.run([sys.executable, "-c", NO_TORCH + code], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize("command", ["run", "sweep", "capacity", "plan", "compare", "profile", "replay", "validate",
                                     "fit", "policies", "stacks", "config"])
def test_every_subcommand_has_help_without_torch(command, tmp_path):
    r = no_torch(f"sys.exit(main(['{command}', '--help']))", tmp_path)
    assert r.returncode == 0 and "usage" in r.stdout.lower() and not r.stderr.strip(), r.stderr


@pytest.mark.parametrize("command", ["validate", "replay"])
def test_help_and_errors_without_torch(command, tmp_path):
    r = no_torch(f"sys.exit(main(['{command}', '--help']))", tmp_path)
    assert r.returncode == 0 and "--out" in r.stdout and "Traceback" not in r.stderr, r.stderr
    (tmp_path / "c.toml").write_text(CPU_CONFIG)
    r = no_torch(f"sys.exit(main(['{command}', 'c.toml', '--out', 'o']))", tmp_path)
    assert_one_line_error(r.returncode, r.stderr, f"dvasim {command}: error:", "needs torch")
    assert not (tmp_path / "o").exists()


@pytest.fixture
def cpu_config(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(CPU_CONFIG)
    return p


@torch_only
@pytest.mark.parametrize("args,needles", [
    (["--threads", "100000"], ["--threads:", "1.."]),
    (["--warmup", "100000"], ["--warmup:", "0..1000"]),
    (["--loadgen", "--target-qps", "inf"], ["--target-qps:", "finite"]),
    (["--set", 'model.device="titanrtx"'], ["model.device:", 'device = "cpu"']),
    # issue 35: a [cluster] the replay cannot run is refused, not ignored
    (["--set", "cluster.replicas=2"], ["cluster.replicas:", "one replica", "dvasim run"]),
    (["--set", "cluster.network_delay_ms=0.5"], ["cluster.network_delay_ms:", "set it to 0"]),
])
def test_replay_refuses_before_running(args, needles, cpu_config, tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "o"
    code, err = run_cli(["replay", cpu_config, "--out", out, *args], capsys)
    assert_one_line_error(code, err, *needles)
    assert not out.exists()


@torch_only
def test_replay_out_an_existing_file_is_refused_first(cpu_config, tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    import dvasim.engines.replay.engine as eng

    monkeypatch.setattr(eng, "replay", lambda *a, **k: pytest.fail("the replay ran"))
    f = tmp_path / "afile"
    f.write_text("keep")
    code, err = run_cli(["replay", cpu_config, "--out", f], capsys)
    assert_one_line_error(code, err, "--out:", "not a directory")
    assert f.read_text() == "keep"


@torch_only
def test_replay_table_must_be_the_machines():
    pytest.importorskip("torch")
    from dvasim.engines.replay.engine import check_table_device, gpu_table_name
    from dvasim.errors import ConfigError

    assert gpu_table_name("NVIDIA H100 80GB HBM3") == "h100" and gpu_table_name("NVIDIA A100-SXM4-40GB") == "a100"
    assert gpu_table_name("TITAN RTX") == "titanrtx" and gpu_table_name("NVIDIA L4") is None
    check_table_device({"name": "vgg19", "device": "cpu"}, "cpu")
    check_table_device({"name": "vgg19", "device": "h100"}, "cuda", gpu="NVIDIA H100 80GB HBM3")
    check_table_device({"table": "t.csv"}, "cpu")  # a table config: the replay refuses it elsewhere
    for model, device, gpu, needle in [
        ({"name": "vgg19"}, "cpu", None, "'titanrtx'"),  # the catalog's default device is a GPU's
        ({"name": "vgg19", "device": "h100"}, "cpu", None, 'device = "cpu"'),
        ({"name": "vgg19", "device": "cpu"}, "cuda", "NVIDIA H100 80GB HBM3", 'device = "h100"'),
        ({"name": "vgg19", "device": "titanrtx"}, "cuda", "NVIDIA A100-SXM4-80GB", 'device = "a100"'),
        ({"name": "vgg19", "device": "h100"}, "cuda", "NVIDIA L4", "validate --device cuda"),
    ]:
        with pytest.raises(ConfigError) as e:
            check_table_device(model, device, gpu=gpu)
        assert e.value.field == "model.device" and needle in e.value.message, e.value.message


@torch_only
def test_loadgen_target_must_be_finite():
    pytest.importorskip("mlperf_loadgen")
    from dvasim.engines.replay.loadgen import _target_qps
    from dvasim.errors import ConfigError

    assert _target_qps({"rate_qps": 50.0}, None) == 50.0
    for bad in (float("inf"), float("nan"), 0.0, -1.0):
        with pytest.raises(ConfigError, match="--target-qps"):
            _target_qps({}, bad)


@torch_only
@pytest.mark.parametrize("change,args,needles", [
    ('[model]\ntable = "traces/default/vgg16_titanx_4stages.csv"\n', [], ["model.table:"]),
    (None, ["--set", 'engine.transfer.mode="pool"'], ["engine.transfer.mode:"]),
    (None, ["--set", "workload.n_queries=0"], ["workload.n_queries:"]),
    (None, ["--threads", "100000"], ["--threads:"]),
    (None, ["--repeats", "1000"], ["--repeats:", "1..100"]),
    (None, ["--max-foreign-load", "inf"], ["--max-foreign-load:", "finite"]),
    # issue 35: validate compared a 2-replica simulation with a 1-replica replay
    (None, ["--set", "cluster.replicas=2"], ["cluster.replicas:", "one replica"]),
    (None, ["--set", "cluster.network_delay_ms=[0.0, 1.0]"], ["cluster.network_delay_ms:"]),
])
def test_validate_checks_the_config_before_simulating(change, args, needles, tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    import dvasim.api

    monkeypatch.setattr(dvasim.api, "run", lambda *a, **k: pytest.fail("the simulation ran"))
    conf = tmp_path / "c.toml"
    conf.write_text(CPU_CONFIG if change is None else change + CPU_CONFIG[CPU_CONFIG.index("[policy]"):])
    out = tmp_path / "o"
    code, err = run_cli(["validate", conf, "--out", out, "--repeats", "1", *args], capsys)
    assert_one_line_error(code, err, *needles)
    assert not out.exists()


@torch_only
@pytest.mark.parametrize("command", ["replay", "validate"])
def test_a_cluster_config_is_refused_not_ignored(command, tmp_path, capsys, monkeypatch):
    """Issue 35: ``[cluster] replicas = 2`` was ignored: validate compared a 2-replica simulation with a 1-replica
    replay. Refused in one line before anything is simulated, replayed or written."""
    pytest.importorskip("torch")
    import dvasim.api
    import dvasim.engines.replay.engine as eng

    monkeypatch.setattr(dvasim.api, "run", lambda *a, **k: pytest.fail("the simulation ran"))
    monkeypatch.setattr(eng, "make_engine", lambda *a, **k: pytest.fail("the replay ran"))
    conf = tmp_path / "c.toml"
    conf.write_text(CPU_CONFIG + "[cluster]\nreplicas = 2\n")
    out = tmp_path / "o"
    code, err = run_cli([command, conf, "--out", out], capsys)
    assert_one_line_error(code, err, "cluster.replicas:", "is 2", "replicas (or set it to 1)")
    assert not out.exists()


@torch_only
def test_validate_out_an_existing_file(cpu_config, tmp_path, capsys):
    pytest.importorskip("torch")
    f = tmp_path / "afile"
    f.write_text("keep")
    code, err = run_cli(["validate", cpu_config, "--out", f], capsys)
    assert_one_line_error(code, err, "--out:")
    assert f.read_text() == "keep"


@torch_only
@pytest.mark.parametrize("args,needles", [
    (["--stages", "2", "--threads", "100000"], ["--threads:", "1.."]),
    (["--stages", "2", "--seed", str(10**30)], ["--seed:", "2**63-1"]),
    (["--stages", "2", "--batch-sizes", "100000000"], ["--batch-sizes:", "1..4096"]),
    (["--stages", "2", "--seq-lens", "1000"], ["--seq-lens:", "512"]),
])
def test_profile_limits(args, needles, tmp_path, capsys):
    pytest.importorskip("torch")
    from dvasim.cli.profile import cli_profile

    out = tmp_path / "t.csv"
    code = cli_profile(["--model", "bert_base", "--out", str(out), *args])
    assert_one_line_error(code, capsys.readouterr().err, *needles)
    assert not out.exists()


@torch_only
@pytest.mark.parametrize("where", ["folder", "below-a-file"])
def test_profile_out_is_checked_before_measuring(where, tmp_path, capsys):
    pytest.importorskip("torch")
    from dvasim.cli.profile import cli_profile

    (tmp_path / "afile").write_text("keep")
    (tmp_path / "d.csv").mkdir()
    out = {"folder": tmp_path / "d.csv", "below-a-file": tmp_path / "afile" / "t.csv"}[where]
    code = cli_profile(["--model", "vgg19", "--stages", "2", "--out", str(out)])
    assert_one_line_error(code, capsys.readouterr().err, "--out:")
    assert (tmp_path / "afile").read_text() == "keep"


@torch_only
def test_profile_table_is_written_atomically(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import dvasim.outputs
    from dvasim.errors import OutputError
    from dvasim.model.profiling.profiler import profile_stages, save_profile

    df = profile_stages("vgg19", 2, [1, 2], repeats=1, warmup=0)
    out = tmp_path / "t.csv"
    save_profile(df, out)
    assert out.is_file() and (tmp_path / "t.stats.csv").is_file() and not leftovers(tmp_path)

    def full(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(dvasim.outputs.os, "replace", full)
    with pytest.raises(OutputError, match="no space left"):
        save_profile(df, tmp_path / "u.csv")
    assert not (tmp_path / "u.csv").exists() and not leftovers(tmp_path)
