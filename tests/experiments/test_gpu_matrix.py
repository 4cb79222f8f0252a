"""Issue 35, item 4: the GPU matrix in one command (``experiments/validation/gpu_matrix.py``), run as CI runs it:
``--cpu --tiny`` (the small VGG19 and BERT-base in two stages, the CPU stand-in graphs, 12 queries a replay) end to
end into a temporary folder. Every file the GPU run keeps must be there and readable by the project's own readers
(the fit's, the check's, the co-run loader's); a rerun on the same traces keeps what is there and gives the same
summary (``--analyse``); a spent budget skips steps and still writes the summary; bad flags are one line and status
2. Numbers are not checked: on this CPU they mean nothing."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import pandas as pd
import pytest
import tomllib

from tests.experiments import load_experiment

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "validation" / "gpu_matrix.py"
MODELS, POLICIES, LOADS = ("vgg19", "bert_base"), ("zerobatch", "delaybatch", "dvabatch"), ("0.3", "0.85")


def load():
    return load_experiment("validation/gpu_matrix")


@pytest.fixture(autouse=True)
def no_device_out(monkeypatch):
    """``$OUT`` (the device tool's folder) is the default of ``--out``: not here."""
    monkeypatch.delenv("OUT", raising=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny CPU matrix, run once for the tests of its files."""
    pytest.importorskip("torch")
    base = tmp_path_factory.mktemp("gpu_matrix")
    argv = ["--cpu", "--tiny", "--traces", str(base / "traces"), "--summary", str(base / "summary"),
            "--out", str(base / "out")]
    assert load().main(argv) == 0
    return base


@pytest.mark.torch
def test_every_replay_keeps_its_logs(tiny):
    from dvasim.fitting.logs import read_replay

    t = tiny / "traces"
    for m in MODELS:
        for p in POLICIES:
            for ld in LOADS:
                for r in ("r1", "r2"):
                    d = t / f"{m}_{p}_{ld}" / r
                    assert {"config.toml", "queries.csv.gz", "executions.csv.gz", "summary.json",
                            "config.json"} <= {f.name for f in d.iterdir()}, d
                    cfg = tomllib.loads((d / "config.toml").read_text())
                    assert cfg["replay"]["modules"] == "cudagraph" and cfg["policy"]["name"] == p
                    assert cfg["model"]["name"] == m and cfg["workload"]["n_queries"] == 12
                    rep = read_replay(d)  # the fit's reader: every file whole and well-formed
                    assert len(rep["queries"]) == 12 and rep["queries"]["latency_ms"].notna().all()
                    assert set(rep["executions"]["stage"]) == {0, 1}
                    s = json.loads((d / "summary.json").read_text())
                    assert s["n_completed"] == 12 and s["gpu_matrix"]["repeat"] == int(r[1])
                    assert s["replay_modules"] == "cudagraph" and not s["interrupted"]
    assert not list(t.glob("*/*.partial"))


@pytest.mark.torch
def test_tables_calibration_and_provenance(tiny):
    from dvasim.fitting.check import real_runs
    from dvasim.model.table import LatencyTable
    from dvasim.studies.contention import load_overlaps

    t = tiny / "traces"
    for m in MODELS:
        table = LatencyTable.load(t / f"{m}_table.csv")
        assert table.n_stages == 2 and table.max_batch_size == 4
        assert (t / f"{m}_table.launch.csv").is_file()
        assert (table.seq_lens is not None) == (m == "bert_base")
        assert real_runs(t / f"{m}_summary.json", "dvabatch", 0.85)["mean_latency_ms"][0] > 0
    co = load_overlaps(t / "overlap_4threads.csv")
    assert sorted(zip(co["model"], co["batch_size"])) == [("bert_base", 1), ("bert_base", 4), ("vgg19", 1), ("vgg19", 4)]
    assert (co["overlap"] > 0).all() and (co["threads"] == 2).all() and "source" in co.attrs["provenance"]
    env = json.loads((t / "environment.json").read_text())["runs"][0]
    assert {"date_utc", "python", "torch", "cuda", "device", "gpu", "dvasim"} <= set(env)
    info = json.loads((t / "matrix.json").read_text())
    assert set(info) == set(MODELS) and all(i["capacity_qps"] > 0 for i in info.values())
    for m, i in info.items():  # the loads are fractions of a measured ZeroBatch capacity, not the table's
        assert i["capacity_from"].startswith("measured") and i["table_capacity_qps"] > 0
        sat = json.loads((t / f"saturation_{m}" / "r1" / "summary.json").read_text())
        assert i["capacity_qps"] == round(sat["throughput_qps"], 1) and sat["n_completed"] == 12
        assert i["rates_qps"] == {ld: round(float(ld) * i["capacity_qps"], 1) for ld in LOADS}
        cfg = tomllib.loads((t / f"{m}_zerobatch_0.85" / "r1" / "config.toml").read_text())
        assert cfg["workload"]["rate_qps"] == i["rates_qps"]["0.85"]
    steps = [json.loads(x) for x in (t / "progress.jsonl").read_text().splitlines()]
    # profiles, saturation replays, replays, co-runs (CUDA graphs at batch 1 and 4, TorchScript at batch 1)
    assert {s["status"] for s in steps} == {"done"} and len(steps) == 2 + 2 + 24 + 6
    ts = load_overlaps(t / "overlap_4threads.csv", modules="torchscript")
    assert sorted(zip(ts["model"], ts["batch_size"])) == [("bert_base", 1), ("vgg19", 1)]
    assert all(len(x.split(";")) == 2 for x in ts["alone_ms_by_stage"])  # each stage's time alone
    assert "Measured, not modelled" in (t / "README.md").read_text() and (t / "run.log").stat().st_size > 0


@pytest.mark.torch
def test_summary_fit_and_prediction(tiny):
    s = tiny / "summary"
    df = pd.read_csv(s / "summary.csv")
    assert len(df) == len(MODELS) * len(POLICIES) * len(LOADS)
    assert set(df["role"]) == {"fit", "predicted"} and (df.loc[df["policy"] == "zerobatch", "role"] == "fit").all()
    for col in ("err_mean_latency_ms", "err_p99_latency_ms", "err_throughput_qps", "none_err_mean_latency_ms",
                "before_err_mean_latency_ms", "spread_mean_latency_ms", "verdict", "contention"):
        assert col in df.columns, col
    assert df["verdict"].isin(["within", "outside", "noise"]).all()
    res = json.loads((s / "summary.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    for key in ("with_contention", "without_contention", "default_engine"):
        c = res[key]
        assert {"scored", "within_15_25_5", "within_5_10_3", "median_abs_" + ("err_" if key == "with_contention"
                                                                              else "none_err_" if key == "without_contention"
                                                                              else "before_err_") + "mean_latency_ms"} <= set(c)
        assert 0 <= c["within_5_10_3"] <= c["within_15_25_5"] <= c["scored"] <= 8
    assert res["noise_floor"]["cases_with_repeats"] == 12 and res["skipped"] == [] and res["failed"] == {}
    assert 0.0 <= res["contention"]["share"] <= 1.0 and len(pd.read_csv(s / "calibration.csv")) == 4
    # the host path's contention from the TorchScript co-runs: launching cores between 1 and the threads (2)
    host = pd.read_csv(s / "calibration_host.csv")
    assert len(host) == 2 and host["cores"].between(1.0, 2.0).all() and 1.0 <= res["host_contention"]["cores"] <= 2.0
    for m in MODELS:
        eng = tomllib.loads((s / f"engine_{m}.toml").read_text())
        assert eng["engine"]["contention"] == "overlap" and "launch_fixed_ms" in eng["engine"]["host"]
        assert "contention" not in tomllib.loads((s / f"engine_{m}_none.toml").read_text())["engine"]
        assert "intervals" in json.loads((s / f"fit_{m}.json").read_text())
    assert "| vgg19 dvabatch 0.85 | predicted | 2 |" in (s / "summary.md").read_text()


@pytest.mark.torch
def test_one_archive_for_the_device_tool(tiny):
    out = tiny / "out"
    assert sorted(f.name for f in out.iterdir()) == ["gpu_matrix_" + tiny.name + ".tar.gz", "run.log", "summary.md"]
    with tarfile.open(out / f"gpu_matrix_{tiny.name}.tar.gz") as tar:
        names = tar.getnames()
        q = tar.extractfile(next(n for n in names if n.endswith("vgg19_zerobatch_0.3/r2/queries.csv.gz"))).read()
    assert len(pd.read_csv(io.BytesIO(gzip.decompress(q)))) == 12
    assert any(n.endswith("summary/summary.json") for n in names) and any(n.endswith("traces/README.md") for n in names)


@pytest.mark.torch
def test_rerun_keeps_the_replays_and_analyse_gives_the_same_summary(tiny, tmp_path):
    mod = load()
    before = json.loads((tiny / "summary" / "summary.json").read_text())
    argv = ["--cpu", "--tiny", "--traces", str(tiny / "traces"), "--summary", str(tmp_path / "s")]
    assert mod.main(argv + ["--analyse"]) == 0
    after = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert after["with_contention"] == before["with_contention"] and after["cases"] == before["cases"]
    n = len((tiny / "traces" / "progress.jsonl").read_text().splitlines())
    assert mod.main(argv) == 0  # a rerun keeps every finished step (nothing measured again)
    assert len((tiny / "traces" / "progress.jsonl").read_text().splitlines()) == n


@pytest.mark.torch
def test_a_spent_budget_skips_steps_and_still_writes_the_summary(tmp_path, capsys):
    pytest.importorskip("torch")
    argv = ["--cpu", "--tiny", "--models", "vgg19", "--traces", str(tmp_path / "t"), "--summary", str(tmp_path / "s"),
            "--budget-s", "1"]
    assert load().main(argv) == 0
    res = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert len(res["skipped"]) == 4 + 3 + 8 and res["with_contention"]["scored"] == 0  # replays, co-runs
    assert "skipped (estimated" in capsys.readouterr().out
    assert "(budget)" in (tmp_path / "t" / "README.md").read_text()


@pytest.mark.torch
def test_graphs_are_captured_once_per_model_inside_reused_graphs():
    pytest.importorskip("torch")
    from dvasim.engines.replay.engine import prepare, reused_graphs

    cfg = {"model": {"name": "vgg19", "device": "cpu", "stages": 2}, "policy": {"name": "zerobatch", "max_batch_size": 2},
           "workload": {"kind": "poisson", "rate_qps": 100.0, "n_queries": 4, "seed": 1},
           "replay": {"modules": "cudagraph"}}
    with reused_graphs():
        a, b = prepare(cfg).lane_stages, prepare(cfg).lane_stages
        c = prepare({**cfg, "policy": {"name": "zerobatch", "max_batch_size": 1}}).lane_stages
    assert a is b and c is not a and a[0][0].launches == 0
    assert prepare(cfg).lane_stages is not a  # outside the block every replay captures its own


@pytest.mark.parametrize("argv,field", [
    (["--queries", "0"], "--queries"), (["--queries", "many"], "--queries"), (["--loads", "0.3,x"], "--loads"),
    (["--models", "alexnet"], "--models"), (["--repeats", "0"], "--repeats"), (["--budget-s", "-5"], "--budget-s"),
    (["--policies", "dvabatch"], "--policies"), (["--bootstrap", "-1"], "--bootstrap"), (["--analyse"], "--traces"),
    (["--frobnicate"], "--frobnicate"), (["--wheels", "/nonexistent-wheels", "--models", "x"], "--models"),
])
def test_bad_flags_are_one_line_and_status_2(argv, field, capsys):
    assert load().main(["--cpu", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"gpu_matrix.py: error: {field}"), err


def test_a_file_where_a_folder_goes_is_refused(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("x")
    assert load().main(["--cpu", "--tiny", "--traces", str(f)]) == 2
    assert capsys.readouterr().err.startswith("gpu_matrix.py: error: --traces: ")


@pytest.mark.torch
def test_the_torchscript_co_run_takes_its_cuda_calls_from_the_setup(monkeypatch):
    """On the H200 (traces/gpu_matrix/h200_2026-11-28/run.log) both TorchScript co-runs failed with
    ``UnboundLocalError: bufs``: the CUDA branch named the graphs' buffers, which TorchScript stages do not have.
    Here the CUDA branch runs through a stand-in of CudaOps (a call runs at once), so it must ask the setup."""
    torch = pytest.importorskip("torch")
    import dvasim.model.stages.cuda as cuda
    from dvasim.engines.replay.engine import prepare

    mod = load()
    made = []

    class Ops(mod._HostOps):
        def __init__(self, device):
            made.append(str(device))

    monkeypatch.setattr(cuda, "CudaOps", Ops)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    cfg = {"model": {"name": "vgg19", "device": "cpu", "stages": 2}, "policy": {"name": "zerobatch", "max_batch_size": 4},
           "workload": {"kind": "poisson", "rate_qps": 100.0, "n_queries": 4, "seed": 1},
           "replay": {"modules": "torchscript"}}
    row = mod.co_run(prepare(cfg), 1, None, 3, "cuda", "torchscript")
    assert made == ["cpu"] and row["modules"] == "torchscript" and row["overlap"] > 0
    assert len(row["alone_ms_by_stage"].split(";")) == 2


@pytest.mark.torch
def test_a_hung_step_is_killed_and_the_matrix_goes_on_without_its_model(tmp_path, monkeypatch):
    """On the H200 a BERT-base replay blocked in its warm-up for the rest of the device call (600 s), and nothing
    after it ran. Supervised, the matrix measures in a child process; a step past its limit has the child
    killed, is recorded ``hung`` with its model, and a new child resumes with that model's GPU steps skipped. The
    hang is injected (``$DVASIM_GPU_MATRIX_HANG``: the child blocks in that step forever); every step's limit is
    capped at 20 s (the tiny steps of these two models take under 1 s on a quiet 2-core machine; a 6 s cap once
    killed resnet152's profile too on a busy one, a test run beside the notebooks)."""
    pytest.importorskip("torch")
    monkeypatch.setenv("DVASIM_GPU_MATRIX_HANG", "replay vgg19_zerobatch_0.3 r1")
    argv = ["--cpu", "--tiny", "--supervise", "--step-limit-s", "20", "--models", "vgg19,resnet152", "--policies",
            "zerobatch,dvabatch", "--loads", "0.3", "--repeats", "1", "--queries", "6", "--traces",
            str(tmp_path / "t"), "--summary", str(tmp_path / "s")]
    assert load().main(argv) == 0
    steps = {}
    for line in (tmp_path / "t" / "progress.jsonl").read_text().splitlines():
        rec = json.loads(line)
        steps[rec["job"]] = rec
    hung = steps["replay vgg19_zerobatch_0.3 r1"]
    assert hung["status"] == "hung" and hung["model"] == "vgg19" and hung["limit_s"] == 20 and hung["child"] == 1
    assert steps["replay vgg19_dvabatch_0.3 r1"]["status"] == "skipped"  # the hung model's later steps
    assert "hung" in steps["replay vgg19_dvabatch_0.3 r1"]["reason"]
    assert steps["replay resnet152_zerobatch_0.3 r1"]["status"] == "done"  # the other model's, in the next child
    assert steps["replay resnet152_dvabatch_0.3 r1"]["status"] == "done"
    assert not (tmp_path / "t" / "current_step.json").exists()
    res = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert res["hung"] == {"replay vgg19_zerobatch_0.3 r1": 20}
    assert [(c["model"], c["policy"], c["n_runs"]) for c in res["cases"] if c["n_runs"]] == [
        ("resnet152", "zerobatch", 1), ("resnet152", "dvabatch", 1)]
    assert "hung (the measuring process killed" in (tmp_path / "t" / "README.md").read_text()
    log = (tmp_path / "t" / "run.log").read_text()
    assert "measuring child 2" in log and "HUNG (past its limit of 20 s" in log


@pytest.mark.torch
def test_a_replay_whose_warm_up_blocks_is_recorded_hung_with_its_model(monkeypatch, tmp_path):
    """The replay gives up on a warm-up whose stage calls do not return (Stopped with ``blocked``); the matrix
    records that step ``hung`` with its model (so later children skip the model), where a plain stop request
    during the start-up stays a failure."""
    pytest.importorskip("torch")
    import dvasim.engines.replay.engine as engine

    mod = load()
    plan = mod.make_plan(mod.parser().parse_args(["--cpu", "--tiny", "--traces", str(tmp_path / "t"),
                                                  "--summary", str(tmp_path / "s")]))
    info = {"capacity_qps": 100.0, "table": "vgg19_table.csv", "delay_window_ms": 1.0}

    def blocked(*a, **k):
        err = engine.Stopped("the time limit", "stopped by the time limit during the warm-up: dvasim-executor-1 ...")
        err.blocked = ["dvasim-executor-1"]
        raise err

    monkeypatch.setattr(engine, "replay", blocked)
    got = mod.replay_job(plan, mod.Log(plan), "vgg19", "zerobatch", 0.3, 1, info)
    assert got["status"] == "hung" and got["model"] == "vgg19" and got["limit_s"] == round(3 * 12 / 30 + 30, 1)
    monkeypatch.setattr(engine, "replay", lambda *a, **k: (_ for _ in ()).throw(engine.Stopped("SIGTERM", "x")))
    assert mod.replay_job(plan, mod.Log(plan), "vgg19", "zerobatch", 0.3, 1, info)["status"] == "failed"
    assert mod.hung_models(mod.Log(plan)) == {}  # (replay_job returns; _run_job records the step)
    mod.Log(plan).step("replay vgg19_zerobatch_0.3 r1", "hung", model="vgg19")
    assert mod.hung_models(mod.Log(plan)) == {"vgg19": "replay vgg19_zerobatch_0.3 r1"}
