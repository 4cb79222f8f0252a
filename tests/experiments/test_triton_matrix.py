"""make triton-check's tiny version (the CI one): calibrate on a real run, fit a stack file, predict one case served
twice, and write the table. About 17 s on the 2-core VM (three real server runs)."""

import json

import pandas as pd

from dvasim.server.stacks import stack_from_toml
from tests.experiments import load_experiment


def test_tiny_matrix_calibrates_fits_and_predicts(tmp_path, triton_env):
    matrix = load_experiment("validation/triton/matrix")
    assert matrix.main(["--tiny", "--out", str(tmp_path)]) == 0
    cases = pd.read_csv(tmp_path / "cases.csv")
    assert list(cases["case"]) == ["zb_200", "delay_2ms_400"]
    assert cases["calibration"].tolist() == [True, False]
    for m in ("mean", "p99", "throughput"):
        assert cases[f"err_{m}"].notna().all() and cases[f"sim_{m}"].gt(0).all()
    # throughput is the offered load's, on both sides, when nothing is refused
    assert cases["err_throughput"].abs().max() < 0.05
    assert cases.loc[1, "real_mean"].count("/") == 1 and cases.loc[1, "spread_mean"] >= 0
    stack = stack_from_toml((tmp_path / "stack.toml").read_text(), "stack.toml")
    assert stack.triton_release == "24.10" and len(stack.client_path_ms) == 101 and stack.request_ms > 0
    s = json.loads((tmp_path / "real" / "zb_200" / "summary.json").read_text())
    assert s["engine"] == "triton" and "others_cpu_s" in s["machine"] and s["n_completed"] == 300
    assert (tmp_path / "summary.md").read_text().startswith("Predicted cases: 1;")
