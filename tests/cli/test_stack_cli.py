"""The serving stack on the command line and in the Python API (issue 20, item 3): `run`, `capacity`, `sweep` and
`compare` take `--stack NAME` and `--engine ENGINE.toml`; `dvasim stacks [NAME]` lists the stacks with their
numbers' provenance; every run names its stack."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from dvasim.cli import main
from dvasim.server.stacks import STACKS

ROOT = Path(__file__).resolve().parents[2]

CONFIG = """[model]
name = "resnet152"
device = "titanrtx"
stages = 4
[policy]
name = "zerobatch"
max_batch_size = 16
[workload]
kind = "poisson"
rate_qps = 150.0
n_queries = 400
seed = 3
"""

# a hand-written engine file in the format dvasim fit writes (the launch law: any slicing)
ENGINE = """[engine]
launch_overhead_ms = 0.1
[engine.host]
modules = "torchscript"
launch_fixed_ms = 0.0
launch_per_op_ms = 0.02
launch_model_per_row_ms = 0.1
copy_ms = 0.1
copy_per_row_ms = 0.0
"""


@pytest.fixture
def cfg(tmp_path) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(CONFIG)
    return p


@pytest.fixture
def engine(tmp_path) -> Path:
    p = tmp_path / "engine.toml"
    p.write_text(ENGINE)
    return p


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "dvasim", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd or ROOT)


def test_run_names_the_stack_it_ran_and_gpu_only_is_the_lower_bound(cfg, tmp_path):
    assert main(["run", str(cfg), "--out", str(tmp_path / "a"), "--no-figure"]) == 0
    assert main(["run", str(cfg), "--out", str(tmp_path / "b"), "--no-figure", "--stack", "gpu-only"]) == 0
    a = json.loads((tmp_path / "a" / "summary.json").read_text())
    b = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert a["stack"] == "triton-tensorrt-21.10"  # what the Titan RTX tables imply: the paper's release
    assert b["stack"] == "gpu-only"
    assert b["mean_latency_ms"] <= a["mean_latency_ms"]
    assert a["n_completed"] == b["n_completed"] == 400


def test_run_takes_an_engine_file_and_the_stack_over_it(cfg, engine, tmp_path):
    assert main(["run", str(cfg), "--out", str(tmp_path / "e"), "--no-figure", "--engine", str(engine)]) == 0
    assert json.loads((tmp_path / "e" / "summary.json").read_text())["stack"] == "custom"
    assert main(["run", str(cfg), "--out", str(tmp_path / "t"), "--no-figure", "--engine", str(engine),
                 "--stack", "torchscript"]) == 0
    assert json.loads((tmp_path / "t" / "summary.json").read_text())["stack"] == "torchscript"


@pytest.mark.parametrize("command", ["run", "capacity", "sweep", "compare"])
def test_an_unknown_stack_is_one_line_exit_2_and_writes_nothing(command, cfg, tmp_path):
    out = tmp_path / "out"
    sweep = tmp_path / "s.toml"
    sweep.write_text(f'base = "{cfg}"\n')
    args = {"run": ["run", cfg, "--out", out], "capacity": ["capacity", cfg, "--slo-ms", "50", "--out", out],
            "sweep": ["sweep", sweep, "--out", out, "--workers", "1"],
            "compare": ["compare", "--quick", "--out", out]}[command]
    p = _cli(*args, "--stack", "nope")
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr
    assert "--stack" in lines[0] and "'nope'" in lines[0] and "gpu-only" in lines[0]  # names the allowed ones
    assert not out.exists()


def test_stacks_lists_every_stack():
    p = _cli("stacks")
    assert p.returncode == 0, p.stderr
    names = [line.split()[0] for line in p.stdout.splitlines() if line and not line.startswith(" ")]
    assert set(STACKS) <= set(names)
    js = json.loads(_cli("stacks", "--json").stdout)
    assert [s["name"] for s in js] == list(STACKS)


def test_stacks_name_prints_every_parameter_with_its_provenance():
    p = _cli("stacks", "tfserving")
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())  # the printout wraps long lines
    stack = STACKS["tfserving"]
    for key in stack.parameters():
        assert f"{key} = " in text
        assert " ".join(stack.sources[key].split())[:60] in text, key  # each number's source, as recorded
    js = json.loads(_cli("stacks", "tfserving", "--json").stdout)[0]
    assert set(js["parameters"]) == set(stack.parameters())
    assert js["parameters"]["h2d_gbps"] == {"value": stack.h2d_gbps, "source": stack.sources["h2d_gbps"]}
    bad = _cli("stacks", "nope")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_capacity_takes_the_stack_and_an_engine(cfg, engine, tmp_path):
    from dvasim.studies.capacity import capacity

    kw = dict(resolution=0.1, max_queries=2000, lo=50.0, hi=400.0, min_duration_s=2.0)  # 2 s probes: the stack is tested
    gpu = capacity(cfg, 50.0, stack="gpu-only", **kw)
    tfs = capacity(cfg, 50.0, stack="tfserving", **kw)
    assert gpu["stack"] == "gpu-only" and tfs["stack"] == "tfserving"
    assert tfs["capacity_qps"] < gpu["capacity_qps"]  # TF-Serving's idle gaps cost capacity
    assert capacity(cfg, 50.0, engine=engine, **kw)["stack"] == "custom"
    # the command line writes the stack into capacity.json and its line
    assert main(["capacity", str(cfg), "--slo-ms", "50", "--out", str(tmp_path / "c"), "--stack", "gpu-only",
                 "--resolution", "0.1", "--max-queries", "2000", "--lo", "50", "--hi", "400", "--min-duration-s", "2"]) == 0
    assert json.loads((tmp_path / "c" / "capacity.json").read_text())["capacity_qps"] == gpu["capacity_qps"]


def test_sweep_runs_every_point_on_the_stack_and_caches_per_stack(cfg, engine, tmp_path):
    from dvasim.studies.sweep import sweep

    s = tmp_path / "s.toml"
    s.write_text(f'base = "{cfg}"\nset = ["workload.n_queries=200"]\n[grid]\n"workload.rate_qps" = [50, 100]\n')
    gpu = sweep(s, tmp_path / "o", workers=1, progress=False, figure=False, stack="gpu-only")
    assert list(gpu["stack"]) == ["gpu-only", "gpu-only"]
    trt = sweep(s, tmp_path / "o", workers=1, progress=False, figure=False, stack="triton-tensorrt")
    assert list(trt["stack"]) == ["triton-tensorrt"] * 2 and set(trt["run"]).isdisjoint(gpu["run"])
    assert (trt["mean_latency_ms"] >= gpu["mean_latency_ms"]).all()
    eng = sweep(s, tmp_path / "o", workers=1, progress=False, figure=False, engine=engine)
    assert list(eng["stack"]) == ["custom"] * 2
    assert main(["sweep", str(s), "--out", str(tmp_path / "cli"), "--workers", "1", "--no-figure",
                 "--stack", "gpu-only"]) == 0
    assert list(pd.read_csv(tmp_path / "cli" / "results.csv")["stack"]) == ["gpu-only"] * 2


def test_compare_passes_the_stack_and_names_it_in_rows_tables_and_titles(tmp_path, monkeypatch, capsys):
    """A real quick compare on one model: the study is asked for the stack and the engine file, and every row,
    printed table and figure title names the stack (spies record the calls and run the real functions)."""
    from dvasim.cli import compare as cmp
    from dvasim.reporting import plots
    from dvasim.studies import evaluation as study

    asked, titles = {}, []
    real_compare, real_bars = study.compare, plots.policy_bars

    def spy_compare(models, **kw):
        asked.update(kw)
        return real_compare(models, **kw)

    def spy_bars(res, metric, path, title="", **kw):
        titles.append(title)
        return real_bars(res, metric, path, title=title, **kw)

    monkeypatch.setattr(study, "compare", spy_compare)
    monkeypatch.setattr(plots, "policy_bars", spy_bars)
    engine = tmp_path / "e.toml"
    engine.write_text(ENGINE)
    assert cmp.cli_compare(["--quick", "--models", "resnet152", "--policies", "zerobatch,dvabatch", "--stack", "tfserving",
                     "--engine", str(engine), "--workers", "1", "--out", str(tmp_path / "c")]) == 0
    assert asked["stack"] == "tfserving" and asked["engine_file"] == str(engine)
    res = pd.read_csv(tmp_path / "c" / "compare.csv")
    assert list(res.columns[:2]) == ["model", "stack"] and set(res["stack"]) == {"tfserving"}
    assert pd.read_csv(tmp_path / "c" / "calibration.csv")["stack"].tolist() == ["tfserving"]
    assert len(titles) == 2 and all("[stack: tfserving]" in t for t in titles)
    out = capsys.readouterr().out
    assert "stack" in out.split("mean latency (ms)")[1].splitlines()[1]  # the printed table's header
    assert out.count("tfserving") >= 6  # every (model, load) row of both latency tables names it


def test_the_real_study_compare_takes_the_stack_and_an_engine_file():
    from dvasim.studies import evaluation as study

    params = inspect.signature(study.compare).parameters
    assert "stack" in params and "engine_file" in params
