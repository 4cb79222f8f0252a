"""dvasim fit on real Triton server runs: the stack file's round trip and its refusals, the fit recovering known
host costs from hand-made records, and the shipped triton-python-cpu stack reproduced from the committed
calibration runs (its provenance)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dvasim.errors import ConfigError
from dvasim.fitting.triton_fit import LEVELS, fit_stack
from dvasim.server.stacks import STACKS, ServingStack, stack_from_toml, stack_to_toml

ROOT = Path(__file__).resolve().parents[2]
CALIBRATION = ROOT / "experiments" / "validation" / "triton" / "results" / "real"
CAL_RUNS = ["zb_200", "zb_500", "zb_800", "idle_20"]


def test_stack_file_round_trip():
    st = STACKS["triton-python-cpu"]
    back = stack_from_toml(stack_to_toml(st, "a header\nof two lines"), "x.toml")
    assert back == st and back.client_path_ms == st.client_path_ms and back.sources == st.sources


@pytest.mark.parametrize("edit, field", [
    (lambda t: t.replace("sync_ms = ", "# sync_ms = "), "sync_ms is missing"),
    (lambda t: t.replace("[stack]\n", "[stack]\nwarp_ms = 1.0\n"), "unknown field [stack] warp_ms"),
    (lambda t: t.replace('triton_release = "24.10"', 'triton_release = "99.99"'), "triton_release"),
    (lambda t: t.replace("idle_between_batches = true", "idle_between_batches = 1"), "idle_between_batches"),
])
def test_stack_file_refusals_name_the_field(edit, field):
    text = edit(stack_to_toml(STACKS["triton-python-cpu"]))
    with pytest.raises(ConfigError, match=field.replace("[", r"\[").replace("]", r"\]")):
        stack_from_toml(text, "bad.toml")


def fake_run(folder: Path, a: float, b: float, exit_ms: float, path_in: float, path_out: float, seed: int):
    """A dvasim triton folder whose ZeroBatch executions have entry a + b * size, exit exit_ms, and whose queries
    pay path_in before QUEUE_START and path_out after COMPUTE_END: one instance, batches back to back."""
    rng = np.random.default_rng(seed)
    rows, t, qid = [], 0.0, 0
    for k in range(200):
        size = int(rng.integers(1, 9))
        queued = t + 0.5  # the first request queued 0.5 ms after the instance was free: the dead time is entry
        dev_start = queued + a + b * size
        dev_end = dev_start + 3 + 0.6 * size
        ce = dev_end + exit_ms
        for _ in range(size):
            rows.append({"qid": qid, "arrival_ms": queued - path_in, "admitted_ms": queued, "start_ms": queued + 0.1,
                         "device_start_ms": dev_start, "device_end_ms": dev_end, "compute_end_ms": ce,
                         "finish_ms": ce + path_out, "status": "ok", "batch_id": k, "exit_batch_size": size,
                         "instance": "dvasim_0_0"})
            qid += 1
        t = ce + 1.0
    folder.mkdir(parents=True)
    pd.DataFrame(rows).to_csv(folder / "queries.csv.gz", index=False)
    (folder / "summary.json").write_text(json.dumps({"engine": "triton", "policy": "zerobatch",
                                                     "triton_version": "2.51.0", "machine": {"cpus": 2}}))


def test_fit_recovers_known_host_costs(tmp_path):
    fake_run(tmp_path / "a", 0.4, 0.02, 0.6, 1.0, 0.3, 1)
    fake_run(tmp_path / "b", 0.4, 0.02, 0.6, 1.0, 0.3, 2)
    st, rep = fit_stack([tmp_path / "a", tmp_path / "b"])
    assert st.request_ms == pytest.approx(0.4, abs=1e-9) and st.request_per_row_ms == pytest.approx(0.02, abs=1e-9)
    assert st.sync_ms == pytest.approx(0.6) and st.idle_between_batches and st.triton_release == "24.10"
    assert len(st.client_path_ms) == LEVELS and st.client_path_ms[0] == pytest.approx(1.3)
    assert st.client_path_ms[-1] == pytest.approx(1.3) and rep["n_executions"] == 400


def test_fit_refuses_runs_without_zerobatch(tmp_path):
    fake_run(tmp_path / "a", 0.4, 0.02, 0.6, 1.0, 0.3, 1)
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    (tmp_path / "a" / "summary.json").write_text(json.dumps({**s, "policy": "delaybatch"}))
    with pytest.raises(ConfigError, match="ZeroBatch"):
        fit_stack([tmp_path / "a"])


def test_the_shipped_stack_is_the_fit_of_the_committed_calibration_runs():
    """dvasim/server/stack_files/triton-python-cpu.toml is what dvasim fit gives on the committed calibration runs
    (ZeroBatch at 200, 500, 800 QPS and the 20 QPS idle probe): every number reproduced."""
    st, _ = fit_stack([CALIBRATION / n for n in CAL_RUNS], name="triton-python-cpu")
    shipped = STACKS["triton-python-cpu"]
    for k in ("request_ms", "request_per_row_ms", "sync_ms", "host_cores"):
        assert getattr(st, k) == pytest.approx(getattr(shipped, k), rel=1e-9), k
    assert (st.triton_release, st.idle_between_batches) == (shipped.triton_release, shipped.idle_between_batches)
    assert np.allclose(st.client_path_ms, shipped.client_path_ms, rtol=1e-9, atol=1e-12)


def test_dvasim_fit_cli_writes_a_stack_file_that_dvasim_run_takes(tmp_path):
    fake_run(tmp_path / "a", 0.4, 0.02, 0.6, 1.0, 0.3, 1)
    out = tmp_path / "mine.toml"
    res = subprocess.run([sys.executable, "-m", "dvasim", "fit", str(tmp_path / "a"), "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    st = stack_from_toml(out.read_text(), str(out))
    assert isinstance(st, ServingStack) and st.name == "mine"
    table = ROOT / "experiments" / "validation" / "triton" / "linear_table.csv"
    import dvasim

    cfg = {"model": {"table": str(table)}, "policy": {"name": "zerobatch", "max_batch_size": 32},
           "workload": {"kind": "explicit", "arrivals_ms": [100.0 * i for i in range(50)]}, "qos": {"target_ms": 200.0}}
    r = dvasim.run(cfg, stack=str(out))
    # 100 ms apart every query runs alone: latency = client path 1.3 + entry 0.4 + 0.02 + T(1) 3.6 + exit 0.6
    assert r.summary["mean_latency_ms"] == pytest.approx(1.3 + 0.42 + 3.6 + 0.6, rel=0.02)
    toml = tmp_path / "c.toml"
    toml.write_text(f'[model]\ntable = "{table}"\n[policy]\nname = "zerobatch"\nmax_batch_size = 32\n')
    bad = subprocess.run([sys.executable, "-m", "dvasim", "run", str(toml), "--out", str(tmp_path / "o"),
                          "--stack", str(tmp_path / "nope.toml")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--stack" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
