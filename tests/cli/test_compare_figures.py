"""``dvasim compare``'s figures (issue 25): drawn in a second process beside the first when ``--workers`` allows,
the same files as drawn in one; an error of the second process (a figure that cannot be written) is raised in the
first, and a second process that dies leaves its figure to the first."""

from __future__ import annotations

import os
import sys

import pandas as pd
import pytest

from dvasim.cli import compare as cmp
from dvasim.errors import OutputError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the second process is forked (Linux)")


def _results() -> pd.DataFrame:
    return pd.DataFrame([{"model": m, "load": ld, "policy": p, "offered_qps": 10.0 * f, "mean_latency_ms": v * f,
                          "p99_latency_ms": 2 * v * f}
                         for m, v in (("m1", 50.0), ("m2", 80.0)) for ld, f in (("low", 0.3), ("high", 1.0))
                         for p in ("zerobatch", "delaybatch", "dvabatch")])


def _figures(folder, p99_path=None) -> list:
    res = _results()
    return [("policy_bars", (res, "p99_latency_ms", p99_path or folder / "p99.png", "p99"), {"slo_ms": 200.0}),
            ("policy_bars", (res, "mean_latency_ms", folder / "mean.png", "mean"), {"device": "h100"})]


def test_two_processes_draw_the_files_one_draws(tmp_path):
    if cmp.figure_process(2) is None:
        pytest.skip("one core: no second process")
    for workers in (1, 2):
        (tmp_path / str(workers)).mkdir()
        cmp.draw_figures(_figures(tmp_path / str(workers)), workers)
    for name in ("p99.png", "mean.png"):
        assert (tmp_path / "1" / name).read_bytes() == (tmp_path / "2" / name).read_bytes()
    assert cmp.figure_process(1) is None  # --workers 1: one process


def test_the_second_processs_error_is_raised_in_the_first(tmp_path):
    if cmp.figure_process(2) is None:
        pytest.skip("one core: no second process")
    folder = tmp_path / "taken.png"
    folder.mkdir()  # the second process's figure cannot be written over a folder
    with pytest.raises(OutputError, match="taken.png"):
        cmp.draw_figures(_figures(tmp_path, p99_path=folder), 2)
    assert (tmp_path / "mean.png").is_file()  # the first process's figure is drawn all the same


def test_a_second_process_that_dies_leaves_its_figure_to_the_first(tmp_path, monkeypatch):
    if cmp.figure_process(2) is None:
        pytest.skip("one core: no second process")
    from dvasim.reporting import plots

    first, real = os.getpid(), plots.policy_bars

    def dies_aside(*a, **kw):
        if os.getpid() != first:
            os._exit(1)  # the forked process ends without a word
        return real(*a, **kw)

    monkeypatch.setattr(plots, "policy_bars", dies_aside)
    cmp.draw_figures(_figures(tmp_path), 2)
    assert (tmp_path / "p99.png").is_file() and (tmp_path / "mean.png").is_file()
