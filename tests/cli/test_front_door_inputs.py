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
