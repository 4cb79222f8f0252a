"""The example sweep files (issue 37, item 3): ``configs/sweeps/*.toml``, one per common study (window, stages,
load, closed-loop clients, one policy against another, capacity). Each is read and expanded as shipped (its header
says the question, the command, what to read and its run time), then run through the real command line at a tiny
size (``--set workload.n_queries=300``; the capacity file with a shrunk ``[capacity]`` table), and its results
checked: the expected rows and columns, finite numbers, and one property that answers the file's question."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from dvasim.cli import main
from dvasim.studies.sweep import expand, load_sweep

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = ROOT / "configs" / "sweeps"
STUDIES = ("window", "stages", "load", "closed_loop_clients", "policies", "capacity")
TINY = ["--set", "workload.n_queries=300"]
# a capacity search at a tiny size: short probes, a coarse bracket, no trigger test
TINY_CAPACITY = {"min_duration_s": 0.5, "max_queries": 1000, "resolution": 0.25, "trigger": "none",
                 "confirm_factor": 0}


def test_every_study_ships_one_file_and_nothing_else():
    assert sorted(p.stem for p in SWEEPS.glob("*.toml")) == sorted(STUDIES)


@pytest.mark.parametrize("name", STUDIES)
def test_each_file_says_its_question_command_reading_and_size_and_expands_as_shipped(name):
    path = SWEEPS / f"{name}.toml"
    head = path.read_text(encoding="utf-8").split("\nbase")[0]
    for word in ("# Question:", "# Run:", "# Read:", "# Size:"):
        assert word in head, f"{name}.toml: its header lacks {word!r}"
    assert f"dvasim sweep configs/sweeps/{name}.toml --out" in head
    assert "on a 2-core machine" in head and "(3x)" in head  # its measured time, and its check at 3x the size
    points = expand(load_sweep(path))
    assert 3 <= len(points) <= 30  # a study of a few runs, not a grid nobody waits for
    assert len({p.key for p in points}) == len(points)


def _run(name: str, tmp_path: Path, extra: list[str]) -> tuple[pd.DataFrame, str]:
    path = SWEEPS / f"{name}.toml"
    if name == "capacity":  # its probes' size is the sweep file's, not a config key: a tiny copy of the file
        spec = load_sweep(path)  # its base made absolute
        lines = [f"base = {json.dumps(spec['base'])}",
                 f"set = {json.dumps(spec['set'])}", "[grid]"]
        lines += [f"{json.dumps(k)} = {_toml(v)}" for k, v in spec["grid"].items()]
        lines += ["[capacity]"] + [f"{k} = {_toml(v)}" for k, v in {**spec["capacity"], **TINY_CAPACITY}.items()]
        path = tmp_path / "capacity.toml"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    code = main(["sweep", str(path), "--out", str(out), "--workers", "1", "--no-figure", *extra])
    assert code == 0
    table = pd.read_csv(out / "results.csv")
    for f in (out / "runs").glob("*.json"):  # every run's cache is strict JSON (no NaN or Infinity in its metrics)
        json.loads(f.read_text(encoding="utf-8"), parse_constant=lambda c, name=f.name: pytest.fail(f"{name} holds {c}"))
    return table, str(out)


def _toml(v) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return json.dumps(v)


def _finite(table: pd.DataFrame, cols) -> None:
    for c in cols:
        assert c in table, c
        assert all(math.isfinite(float(x)) for x in table[c]), (c, list(table[c]))


RUN_METRICS = ("mean_latency_ms", "p99_latency_ms", "throughput_qps", "offered_qps")


def test_load_sweep_one_row_per_rate_and_latency_grows_with_load(tmp_path, capsys):
    table, _ = _run("load", tmp_path, TINY)
    rates = load_sweep(SWEEPS / "load.toml")["grid"]["workload.rate_qps"]
    assert list(table["workload.rate_qps"]) == rates
    _finite(table, RUN_METRICS)
    assert {"verdict", "stable", "stack", "stack_source"} <= set(table.columns)
    assert table["p99_latency_ms"].iloc[-1] > table["p99_latency_ms"].iloc[0]
    assert "stack: as-profiled (" in capsys.readouterr().out


def test_window_sweep_one_row_per_window_and_seed_and_a_long_window_waits(tmp_path):
    table, _ = _run("window", tmp_path, TINY)
    spec = load_sweep(SWEEPS / "window.toml")
    windows, seeds = spec["grid"]["policy.max_queue_delay_ms"], spec["seeds"]["values"]
    assert len(table) == len(windows) * len(seeds)
    assert sorted(set(table["policy.max_queue_delay_ms"])) == sorted(windows)
    _finite(table, RUN_METRICS)
    mean = table.groupby("policy.max_queue_delay_ms")["mean_latency_ms"].mean()
    assert mean[max(windows)] > mean[min(windows)]


def test_closed_loop_sweep_throughput_grows_with_the_clients(tmp_path):
    table, _ = _run("closed_loop_clients", tmp_path, TINY)
    clients = load_sweep(SWEEPS / "closed_loop_clients.toml")["grid"]["workload.clients"]
    assert list(table["workload.clients"]) == clients
    _finite(table, ("mean_latency_ms", "p99_latency_ms", "throughput_qps"))
    assert table["throughput_qps"].iloc[-1] > 2 * table["throughput_qps"].iloc[0]


def test_stages_sweep_runs_each_stage_count(tmp_path):
    table, _ = _run("stages", tmp_path, TINY)
    stages = load_sweep(SWEEPS / "stages.toml")["grid"]["model.stages"]
    assert list(table["model.stages"]) == stages and list(table["n_stages"]) == stages
    _finite(table, RUN_METRICS)
    assert set(table["stack"]) == {"triton-tensorrt-21.10"}


def test_policies_sweep_ranks_the_policies(tmp_path):
    table, _ = _run("policies", tmp_path, TINY)
    spec = load_sweep(SWEEPS / "policies.toml")
    assert len(table) == len(spec["grid"]["policy"]) * spec["seeds"]["n"]
    _finite(table, RUN_METRICS)
    names = table["[policy]"].map(lambda s: json.loads(s)["name"])
    ranking = table.groupby(names)["p99_latency_ms"].mean().sort_values()
    assert list(ranking.index)[0] == "dvabatch" and len(ranking) == 3


def test_capacity_sweep_gives_each_policy_a_capacity(tmp_path):
    table, _ = _run("capacity", tmp_path, [])
    assert len(table) == 3
    _finite(table, ("capacity_qps",))
    names = table["[policy]"].map(lambda s: json.loads(s)["name"])
    cap = dict(zip(names, table["capacity_qps"]))
    assert min(cap.values()) > 0 and cap["dvabatch"] >= max(cap["zerobatch"], cap["delaybatch"])
