"""An engine file names no machine's absolute path: ``dvasim fit`` writes its tables and folders relative to the
file, and ``--engine`` reads them relative to the file (issue 35: the committed engine files held /work/main/...)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from dvasim.config import load_toml
from dvasim.config.files import apply_engine_file
from dvasim.fitting.fit import fit, write_engine

DATA = Path(__file__).resolve().parents[1] / "data" / "h100_replays"


def test_fit_writes_paths_relative_to_the_engine_file_and_run_reads_them_there(tmp_path):
    root = tmp_path / "project"
    shutil.copytree(DATA, root / "replays")
    table = root / "replays" / "resnet152_serving_table.csv"  # a per-stage table, given as the GPU table
    dirs = [str((root / "replays" / d).resolve()) for d in ("resnet152_zerobatch_0.6", "resnet152_zerobatch_0.85")]
    res = fit(dirs, operators=[39, 39, 40, 39], gpu_table=str(table))
    eng = write_engine(res, root / "engines" / "engine.toml")
    text = eng.read_text()
    assert str(tmp_path) not in text and "/replays/" in text.replace("../replays/", "/replays/")
    data = load_toml(eng)
    assert all(not os.path.isabs(f) and (eng.parent / f).is_dir() for f in data["fit"]["folders"])
    moved = tmp_path / "elsewhere"
    shutil.move(str(root), str(moved))  # the folder moves whole: the file still finds what it names
    merged = apply_engine_file({"engine": {}}, moved / "engines" / "engine.toml")
    assert data["engine"]["host"]["gpu_table"] == "../replays/resnet152_serving_table.csv"
    assert Path(merged["engine"]["host"]["gpu_table"]) == (moved / "replays" / table.name).resolve()
    assert merged["engine"]["host"]["launch_per_op_ms"] == data["engine"]["host"]["launch_per_op_ms"]
