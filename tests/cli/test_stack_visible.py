"""The stack is chosen visibly (issue 37, item 4): every run prints ``stack: NAME (WHY)`` and its summary.json
carries ``stack`` and ``stack_source``, for each way a stack is chosen (--stack, [server] stack, [engine.host], the
device, the table's '# stack:' line, the default); a sweep that varies the device holds the stack at the base
config's and says so, ``--stack-follows-device`` lets it follow; a point's own stack wins. Cheap: short runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dvasim.cli import main

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "traces" / "default" / "vgg16_titanx_4stages.csv"

BERT = """[model]
name = "bert_base"
device = "{device}"
stages = 2
[policy]
name = "zerobatch"
[workload]
kind = "poisson"
rate_qps = 200.0
n_queries = 200
seed = 1
seq_len_dist = "glue:RTE"
{extra}"""


def _config(tmp_path: Path, device: str = "a100", extra: str = "", name: str = "c.toml") -> Path:
    p = tmp_path / name
    p.write_text(BERT.format(device=device, extra=extra))
    return p


def _run(capsys, tmp_path: Path, config: Path, *args: str) -> tuple[str, dict]:
    out = tmp_path / "out"
    assert main(["run", str(config), "--out", str(out), "--no-figure", *args]) == 0
    printed = capsys.readouterr().out
    return printed, json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("device,stack", [("h100", "cudagraph"), ("a100", "triton-tensorrt"),
                                          ("titanrtx", "triton-tensorrt-21.10")])
def test_the_device_implies_the_stack_and_the_run_says_so(tmp_path, capsys, device, stack):
    printed, s = _run(capsys, tmp_path, _config(tmp_path, device))
    assert f"stack: {stack} (implied by device {device})" in printed.splitlines()
    assert s["stack"] == stack and s["stack_source"] == f"implied by device {device}"


def test_set_model_device_on_the_command_line_is_named_as_the_reason(tmp_path, capsys):
    printed, s = _run(capsys, tmp_path, _config(tmp_path, "a100"), "--set", 'model.device="h100"')
    assert "stack: cudagraph (implied by device h100)" in printed
    assert s["stack_source"] == "implied by device h100"


@pytest.mark.parametrize("how,args,extra,want", [
    ("--stack", ["--stack", "gpu-only"], "", ("gpu-only", "set by --stack")),
    ("[server] stack", [], '[server]\nstack = "torchscript"\n', ("torchscript", "set in [server] stack")),
    ("--set server.stack", ["--set", 'server.stack="pytorch-eager"'], "", ("pytorch-eager", "set in [server] stack")),
    ("[engine.host]", [], "[engine.host]\nmodules = \"torchscript\"\nlaunch_per_op_ms = 0.01\n",
     ("custom", "implied by [engine.host] (an engine file or a hand-written host)")),
])
def test_a_named_stack_says_where_it_was_named(tmp_path, capsys, how, args, extra, want):
    printed, s = _run(capsys, tmp_path, _config(tmp_path, "h100", extra), *args)
    assert f"stack: {want[0]} ({want[1]})" in printed, how
    assert (s["stack"], s["stack_source"]) == want


@pytest.mark.parametrize("line,want", [("", ("as-profiled", "default: the table names no stack")),
                                       ("# stack: gpu-only\n", ("gpu-only", "named by the table's '# stack:' line"))])
def test_a_table_names_its_stack_or_gets_the_default(tmp_path, capsys, line, want):
    table = tmp_path / "t.csv"
    table.write_text(line + TABLE.read_text())
    cfg = tmp_path / "t.toml"
    cfg.write_text(f'[model]\ntable = "{table}"\n[policy]\nname = "zerobatch"\n[workload]\nkind = "poisson"\n'
                   "rate_qps = 50.0\nn_queries = 100\n")
    printed, s = _run(capsys, tmp_path, cfg)
    assert f"stack: {want[0]} ({want[1]})" in printed
    assert (s["stack"], s["stack_source"]) == want


# ----------------------------------------------------------------------------- studies
def _device_sweep(tmp_path: Path, grid: str = '"model.device" = ["a100", "h100"]', extra: str = "") -> Path:
    _config(tmp_path, "a100", extra, "base.toml")
    p = tmp_path / "sweep.toml"
    p.write_text(f'base = "base.toml"\n[grid]\n{grid}\n')
    return p


def _sweep(capsys, tmp_path: Path, sweep: Path, *args: str) -> tuple[str, pd.DataFrame]:
    out = tmp_path / "sweep_out"
    assert main(["sweep", str(sweep), "--out", str(out), "--workers", "1", "--no-figure", *args]) == 0
    return capsys.readouterr().out, pd.read_csv(out / "results.csv").set_index("model.device")


def test_a_device_sweep_holds_the_base_configs_stack_and_says_so(tmp_path, capsys):
    printed, t = _sweep(capsys, tmp_path, _device_sweep(tmp_path))
    assert list(t["stack"]) == ["triton-tensorrt", "triton-tensorrt"]  # the A100 base's, at the H100 too
    assert set(t["stack_source"]) == {"held across devices: the base config's, implied by device a100"}
    assert "stack: triton-tensorrt (held across devices: the base config's, implied by device a100)" in printed
    assert "holds the stack" in printed and "--stack-follows-device" in printed


def test_stack_follows_device_lets_each_device_imply_its_own(tmp_path, capsys):
    printed, t = _sweep(capsys, tmp_path, _device_sweep(tmp_path), "--stack-follows-device")
    assert dict(t["stack"]) == {"a100": "triton-tensorrt", "h100": "cudagraph"}
    assert dict(t["stack_source"]) == {"a100": "implied by device a100", "h100": "implied by device h100"}
    assert "cudagraph (implied by device h100): 1 of 2 points" in printed
    assert "the stack follows it (--stack-follows-device)" in printed


def test_a_stack_set_in_the_base_or_per_point_is_not_held(tmp_path, capsys):
    base_set = _device_sweep(tmp_path, extra='[server]\nstack = "gpu-only"\n')
    printed, t = _sweep(capsys, tmp_path, base_set)
    assert set(t["stack"]) == {"gpu-only"} and set(t["stack_source"]) == {"set in [server] stack"}
    assert "holds the stack" not in printed
    per_point = tmp_path / "pp"
    per_point.mkdir()
    sweep = _device_sweep(per_point, '"model.device" = ["a100", "h100"]\n"server.stack" = ["cudagraph"]')
    _, t = _sweep(capsys, per_point, sweep)
    assert set(t["stack"]) == {"cudagraph"} and set(t["stack_source"]) == {"set in [server] stack"}


def test_a_sweep_that_keeps_the_device_holds_nothing(tmp_path, capsys):
    printed, t = _sweep(capsys, tmp_path, _device_sweep(tmp_path, '"model.device" = ["h100"]\n"model.stages" = [1, 2]'))
    assert set(t["stack"]) == {"cudagraph"} and set(t["stack_source"]) == {"implied by device h100"}
    assert "stack: cudagraph (implied by device h100)" in printed.splitlines() and "holds the stack" not in printed


def test_capacity_and_plan_print_the_stack_before_their_probes(tmp_path, capsys):
    cfg = _config(tmp_path, "h100")
    tiny = ["--min-duration-s", "0.5", "--max-queries", "1000", "--resolution", "0.25", "--trigger", "none",
            "--confirm-factor", "0"]
    assert main(["capacity", str(cfg), "--slo-ms", "50", "--out", str(tmp_path / "cap"), *tiny]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "stack: cudagraph (implied by device h100)"
    assert main(["plan", str(cfg), "--replicas", "1", "--slo-ms", "50", "--out", str(tmp_path / "plan"), "--quiet",
                 "--stack", "gpu-only", *tiny]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "stack: gpu-only (set by --stack)"


def test_compare_names_its_stack_and_that_it_follows_the_device():
    from dvasim.studies.compare import stack_lines

    h100 = stack_lines(["bert_base", "resnet152"], "h100")
    assert h100[0] == "stack: cudagraph (implied by device h100)"
    assert "titanrtx (the default) triton-tensorrt-21.10" in h100[1] and "--stack NAME" in h100[1]
    assert stack_lines(["bert_base"], "titanrtx") == ["stack: triton-tensorrt-21.10 (implied by device titanrtx)"]
    assert stack_lines(["bert_base"], "h100", "triton-tensorrt") == ["stack: triton-tensorrt (set by --stack)"]


def test_validate_prints_its_simulations_stack(tmp_path, capsys):
    from dvasim.cli.validate import print_sim_stack

    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "summary.json").write_text(json.dumps({"stack": "as-profiled",
                                                                "stack_source": "implied by device cpu"}))
    print_sim_stack(tmp_path)
    assert capsys.readouterr().out == "stack: as-profiled (implied by device cpu)\n"
