"""``experiments/rerun_all.py``: the command that reruns the committed experiments from the tree, times each and
checks its CSVs against the committed ones. Its comparison must tell a reproduced result from a changed one (byte
for byte, numbers within 1e-9, a wall-time column aside) and name the column that changed; its jobs must cover every
committed script log; and two real jobs run side by side (the H100 fit check and Figure 21, a few seconds) must each
rerun end to end and reproduce exactly its own committed CSV, not the other's."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tests.experiments import load_experiment

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "experiments" / "rerun_all.py"


@pytest.fixture(scope="module")
def rerun():
    return load_experiment("rerun_all")


def _write(path: Path, df: pd.DataFrame) -> Path:
    df.to_csv(path, index=False)
    return path


def test_the_comparison_tells_same_close_and_different(rerun, tmp_path):
    base = pd.DataFrame({"model": ["a", "b"], "p99_ms": [1.25, 3.5], "wall_s": [10.0, 12.0]})
    old = _write(tmp_path / "old.csv", base)
    assert rerun.compare_csv(_write(tmp_path / "same.csv", base), old) == ("same", 0.0, "")
    close = base.assign(p99_ms=base.p99_ms * (1 + 1e-12), wall_s=[99.0, 1.0])  # another machine's wall time
    verdict, worst, _ = rerun.compare_csv(_write(tmp_path / "close.csv", close), old)
    assert verdict == "same numbers" and worst < 1e-9
    moved = base.assign(p99_ms=[1.25, 3.5 * 1.01])
    verdict, worst, col = rerun.compare_csv(_write(tmp_path / "moved.csv", moved), old)
    assert verdict == "DIFFERS" and col == "p99_ms" and worst == pytest.approx(0.01)
    renamed = base.assign(model=["a", "c"])
    assert rerun.compare_csv(_write(tmp_path / "renamed.csv", renamed), old)[2] == "model"
    verdict, _, _ = rerun.compare_csv(_write(tmp_path / "short.csv", base.head(1)), old)
    assert verdict.startswith("DIFFERS (shape")
    both_nan = base.assign(p99_ms=[float("nan"), 3.5])
    a = _write(tmp_path / "nan_a.csv", both_nan)
    assert rerun.compare_csv(_write(tmp_path / "nan_b.csv", both_nan.assign(wall_s=[1.0, 2.0])), a)[0] == \
        "same numbers"


def test_a_tables_provenance_lines_count_but_its_build_date_does_not(rerun, tmp_path):
    body = "batch_size,stage_0\n1,0.5\n2,0.75\n"
    old = tmp_path / "old.csv"
    old.write_text("# source: dvasim.model.gpu_model v1.2\n# date: 2026-11-22\n" + body)
    rebuilt = tmp_path / "rebuilt.csv"
    rebuilt.write_text("# source: dvasim.model.gpu_model v1.2\n# date: 2026-11-29\n" + body)
    assert rerun.compare_csv(rebuilt, old) == ("same", 0.0, "")
    renamed = tmp_path / "renamed.csv"
    renamed.write_text("# source: dvasim.calibration.gpu_model v1.2\n# date: 2026-11-22\n" + body)
    assert rerun.compare_csv(renamed, old) == ("DIFFERS (header)", 0.0, "# header")
    moved = tmp_path / "moved.csv"
    moved.write_text("# source: dvasim.model.gpu_model v1.2\n# date: 2026-11-22\n" + body.replace("0.75", "0.8"))
    assert rerun.compare_csv(moved, old)[::2] == ("DIFFERS", "stage_0")


def test_the_jobs_cover_every_committed_script_log(rerun):
    jobs = rerun.jobs()
    scripts = {a for j in jobs for a in j.argv if a.endswith(".py")}
    assert all((ROOT / s).exists() for s in scripts), scripts
    names = {j.name.split(" [")[0].replace(" --figures", "_figures") for j in jobs}
    logs = [p for p in (ROOT / "experiments" / "results").rglob("*.log")
            if "long_run_check_plan" not in p.parts and not any(part.startswith("rerun_") for part in p.parts)]
    assert logs
    for log in logs:
        stem = log.stem
        assert any(stem == n or stem.startswith(n + "_") for n in names), f"no job reruns {log.name}"
    # every job writes under the results root it is given, never into the committed results
    for j in jobs:
        outs = [j.argv[i + 1] for i, a in enumerate(j.argv) if a == "--out"]
        assert outs and all(o.startswith("{R}") for o in outs), j


def test_jobs_side_by_side_reproduce_their_own_committed_csvs(rerun, tmp_path, capsys):
    # two real jobs at once (about 3 s): each is compared on what it wrote, never on the other's files
    assert rerun.main(["--only", "h100_fit", "fig21_closed_loop [gpu-only]", "--jobs", "2",
                       "--scratch", str(tmp_path)]) == 0
    runs = pd.read_csv(tmp_path / "rerun.csv")
    assert list(runs.job) == ["fig21_closed_loop [gpu-only]", "h100_fit"] and runs.rc.tolist() == [0, 0]
    assert (runs.wall_s > 0).all()
    compared = pd.read_csv(tmp_path / "compared.csv")
    assert (compared.verdict == "same").all()
    assert dict(zip(compared.job, compared.file)) == {
        "h100_fit": "experiments/h100_fit/results.csv",
        "fig21_closed_loop [gpu-only]": "experiments/results/gpu-only/fig21_closed_loop.csv"}
    assert len(compared) == 2
    assert "0 CSVs differ" in capsys.readouterr().out
    table = (tmp_path / "rerun.md").read_text().splitlines()
    assert table[3].startswith("| `h100_fit` | ") and table[3].endswith("| 1 | 1 | 0 | 0 |")


def test_bad_jobs_flag_is_one_line(rerun, capsys):
    assert rerun.main(["--jobs", "0", "--list"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--jobs" in err
