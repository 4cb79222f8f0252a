"""``dvasim fit`` says which replay folders identify which parameter (issue 35): ``[fit] identified_by``."""

from __future__ import annotations

import json
from pathlib import Path

from dvasim.cli import main
from dvasim.fitting.fit import fit

DATA = Path(__file__).resolve().parents[1] / "data" / "h100_replays"


def test_zerobatch_folders_identify_the_lines_and_nothing_identifies_the_cores():
    res = fit([DATA / "resnet152_zerobatch_0.6", DATA / "resnet152_zerobatch_0.85"], operators=[39, 39, 40, 39])
    ident = json.loads(res["fit"]["identified_by"])
    names = {"resnet152_zerobatch_0.6", "resnet152_zerobatch_0.85"}
    for s in range(4):  # every stage host-bound in both folders: each line from both
        line = ident[f"launch line of stage {s}"]
        assert set(line) == names and sum(line.values()) == res["fit"]["n_host_bound_by_stage"][s]
    assert set(ident["per-row slopes (batch sizes seen alone: two or more)"]) == names
    assert sum(ident["copies, service_cv, stalls (executions alone)"].values()) == res["fit"]["n_alone"]
    assert sum(ident["admission_delay_ms (every query)"].values()) == res["fit"]["n_queries"]
    # ZeroBatch runs one stage at a time: no launch overlapped another, so nothing identifies the cores
    assert ident["host.cores (launches overlapping others, --fit-cores)"] == {}


def test_a_dvabatch_folder_identifies_the_cores_and_the_cli_prints_it(tmp_path, capsys):
    dirs = [str(DATA / "bert_base_zerobatch_0.6"), str(DATA / "bert_base_dvabatch_0.3")]
    assert main(["fit", *dirs, "--operators", "15,16,16,15", "--out", str(tmp_path / "e.toml")]) == 0
    out = capsys.readouterr().out
    res = fit(dirs, operators=[15, 16, 16, 15])
    cores = json.loads(res["fit"]["identified_by"])["host.cores (launches overlapping others, --fit-cores)"]
    assert list(cores) == ["bert_base_dvabatch_0.3"] and cores["bert_base_dvabatch_0.3"] > 0
    assert "identified by: launch line of stage 0: " in out and "bert_base_dvabatch_0.3 (" in out
