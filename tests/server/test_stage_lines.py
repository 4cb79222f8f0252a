"""Per-stage launch lines at the replayed cut (issue 35): an engine file from ``dvasim fit`` holds the launch law
(any slicing) and each stage's own fitted line with the cut it belongs to; the host model uses the lines where the
run's stages have exactly that cut, and the law everywhere else."""

from __future__ import annotations

import pytest

from dvasim.errors import ConfigError
from dvasim.server.host import host_from_config

LAW = {"launch_fixed_ms": 0.1, "launch_per_op_ms": 0.02, "launch_model_per_row_ms": 0.3, "first_launch_ms": 0.5,
       "last_launch_ms": -0.05}
LINES = {"stage_launch_ms": [1.7, 0.9, 1.1, 0.8], "stage_launch_per_row_ms": [0.0, 0.12, 0.1, 0.08],
         "stage_operators": [39, 39, 40, 39]}


def test_the_recorded_cut_runs_each_stages_own_line_without_the_laws_ends():
    h = host_from_config({**LAW, **LINES}, 4, operators=[39, 39, 40, 39])
    assert h.launch_ms == LINES["stage_launch_ms"] and h.launch_per_row_ms == LINES["stage_launch_per_row_ms"]
    assert h.launch(0, 4) == pytest.approx(1.7) and h.launch(1, 4) == pytest.approx(0.9 + 4 * 0.12)
    assert "per-stage lines" in h.describe()["launch_from"]


@pytest.mark.parametrize("ops", [[39, 39, 40, 38], [78, 79], [20, 19, 20, 19, 20, 20, 20, 19]])
def test_any_other_cut_runs_the_law_exactly_as_without_the_lines(ops):
    with_lines = host_from_config({**LAW, **LINES}, len(ops), operators=ops)
    law_only = host_from_config(dict(LAW), len(ops), operators=ops)
    assert with_lines.launch_ms == law_only.launch_ms and with_lines.launch_per_row_ms == law_only.launch_per_row_ms
    # the law by hand: fixed + per-op * ops[s], the model's per-row growth shared by operators, the two ends added
    total = sum(ops)
    want = [0.1 + 0.02 * o for o in ops]
    want[0] += 0.5
    want[-1] -= 0.05
    assert with_lines.launch_ms == pytest.approx(want)
    assert with_lines.launch_per_row_ms == pytest.approx([0.3 * o / total for o in ops])
    assert "the law" in with_lines.describe()["launch_from"]


@pytest.mark.parametrize("keys, field", [
    ({**LAW, "stage_launch_ms": [1.0] * 4, "stage_operators": [39, 39, 40, 39]}, "engine.host.stage_launch_per_row_ms"),
    ({**LAW, **LINES, "stage_launch_ms": [1.0, 2.0]}, "engine.host.stage_launch_ms"),
    ({**LINES}, "engine.host.stage_launch_ms"),  # no law for the other cuts
    ({**LAW, **LINES, "stage_operators": [39, 0, 40, 39]}, "engine.host.stage_operators"),
])
def test_bad_per_stage_lines_are_one_line_naming_the_key(keys, field):
    with pytest.raises(ConfigError) as e:
        host_from_config(keys, 4, operators=[39, 39, 40, 39])
    assert e.value.field == field and "\n" not in e.value.message


def test_fit_writes_the_replayed_cuts_lines_and_a_run_at_that_cut_uses_them(tmp_path):
    from pathlib import Path

    from dvasim.config import load_toml
    from dvasim.fitting.fit import fit, write_engine

    data = Path(__file__).resolve().parents[1] / "data" / "h100_replays"
    res = fit([data / "resnet152_zerobatch_0.6", data / "resnet152_zerobatch_0.85"], operators=[39, 39, 40, 39])
    host = load_toml(write_engine(res, tmp_path / "e.toml"))["engine"]["host"]
    assert host["stage_operators"] == [39, 39, 40, 39]
    # each host-bound stage's own fitted line ([fit] keeps them), not the law's evened-out value
    assert host["stage_launch_ms"] == pytest.approx(res["fit"]["launch_ms_by_stage"], abs=1e-6)
    assert host["stage_launch_ms"] != pytest.approx(res["fit"]["launch_law_ms_by_stage"], abs=1e-3)
    h = host_from_config({k: v for k, v in host.items() if k != "_base_dir"}, 4, operators=[39, 39, 40, 39])
    assert h.launch_ms == host["stage_launch_ms"]
