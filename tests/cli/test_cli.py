"""The command line and the Python API: outputs, determinism, and one-line errors with exit code 2."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import dvasim
from dvasim.cli import main

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["workload.n_queries=400", "engine.progress=false"]


def write_config(tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


BASE = """
[model]
table = "{table}"
[policy]
name = "zerobatch"
max_batch_size = 16
[workload]
kind = "poisson"
rate_qps = 100
n_queries = 300
seed = 3
"""


def test_run_writes_the_three_files_and_figure(tmp_path):
    out = tmp_path / "out"
    rc = main(["run", str(ROOT / "configs/default.toml"), "--out", str(out), *sum([["--set", s] for s in SMALL], [])])
    assert rc == 0
    df = pd.read_csv(out / "queries.csv")
    for col in ["query_id", "arrival_ms", "start_ms", "finish_ms", "latency_ms", "seq_len"]:
        assert col in df.columns
    assert len(df) == 400 and df["finish_ms"].notna().all()
    assert (df["latency_ms"] - (df["finish_ms"] - df["arrival_ms"])).abs().max() < 1e-9
    summary = json.loads((out / "summary.json").read_text())
    for key in ["n_queries", "n_completed", "mean_latency_ms", "p50_latency_ms", "p90_latency_ms", "p95_latency_ms",
                "p99_latency_ms", "throughput_qps", "qos_target_ms", "qos_violation_rate"]:
        assert key in summary
    assert summary["mean_latency_ms"] == pytest.approx(df["latency_ms"].mean())
    assert summary["p99_latency_ms"] == pytest.approx(df["latency_ms"].quantile(0.99))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["config"]["workload"]["n_queries"] == 400 and "simpy" in cfg["versions"]
    assert cfg["config"]["model"]["provenance"]["source"].startswith("uwsampl/nexus")
    assert (out / "latency.png").stat().st_size > 10_000


def test_api_returns_dataframe_and_summary_and_is_deterministic():
    a = dvasim.run(ROOT / "configs/default.toml", overrides=SMALL)
    b = dvasim.run(ROOT / "configs/default.toml", overrides=SMALL)
    assert isinstance(a.queries, pd.DataFrame) and a.summary["n_completed"] == 400
    pd.testing.assert_frame_equal(a.queries, b.queries)
    c = dvasim.run(ROOT / "configs/default.toml", overrides=[*SMALL, "workload.seed=99"])
    assert not a.queries["arrival_ms"].equals(c.queries["arrival_ms"])


def test_set_overrides_policy(tmp_path):
    r0 = dvasim.run(ROOT / "configs/default.toml", overrides=[*SMALL, "policy.name=zerobatch",
                                                               "policy.max_queue_delay_ms=0"])
    assert r0.summary["policy"] == "zerobatch"
    assert (r0.queries["queue_ms"] < 10.0).mean() > 0.5  # no 10 ms window


def cli(*args):
    """Run the real console entry point in a subprocess and return (code, stdout, stderr)."""
    p = subprocess.run([sys.executable, "-m", "dvasim.cli", *map(str, args)], capture_output=True, text=True,
                       cwd=ROOT)
    return p.returncode, p.stdout, p.stderr


def assert_one_line_error(code, err, *needles):
    assert code == 2, err
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.parametrize(
    "override,needles",
    [
        ("policy.name=fastest", ["policy.name", "allowed", "zerobatch"]),
        ("policy.colour=1", ["policy.colour", "allowed"]),
        ("workload.rate_qps=-5", ["workload.rate_qps", "in [1e-06, 1e+09]"]),
        ("engine.buffer_pairs=0", ["engine.buffer_pairs", "1..64"]),
        ("engine.sharing=magic", ["engine.sharing", "fluid"]),
        ("engine.turbo=true", ["engine.turbo", "allowed"]),
        ("model.table=nowhere.csv", ["model.table", "not found"]),
        ("policy.max_batch_size=128", ["policy.max_batch_size", "64"]),
        ("qos.target_ms=0", ["qos.target_ms"]),
        ("gpu.kind=1", ["gpu", "allowed"]),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, override, needles):
    code, _, err = cli("run", ROOT / "configs/default.toml", "--out", tmp_path / "o", "--set", override,
                       "--set", "engine.progress=false")
    assert_one_line_error(code, err, *needles)


def test_malformed_table_and_input_outside_table(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("stage,batch_size\n0,1\n")
    cfg = write_config(tmp_path, BASE.format(table=bad))
    code, _, err = cli("run", cfg, "--out", tmp_path / "o")
    assert_one_line_error(code, err, "model.table", "latency_ms")
    seq = tmp_path / "seq.csv"
    seq.write_text("stage,batch_size,seq_len,latency_ms\n" + "".join(
        f"0,{b},{L},{b * L / 100}\n" for b in (1, 16) for L in (16, 64)))
    cfg = write_config(tmp_path, BASE.format(table=seq) + "seq_len = 128\n")
    code, _, err = cli("run", cfg, "--out", tmp_path / "o")
    assert_one_line_error(code, err, "seq_len", "128", "64")


def test_missing_config_and_bad_toml(tmp_path):
    code, _, err = cli("run", tmp_path / "none.toml", "--out", tmp_path / "o")
    assert_one_line_error(code, err, "not found")
    broken = write_config(tmp_path, "[model\n")
    code, _, err = cli("run", broken, "--out", tmp_path / "o")
    assert_one_line_error(code, err, "TOML")


def test_a_failing_policy_keeps_every_record(tmp_path):
    """An error in the middle of a run stops it with a message, and every query is still in queries.csv."""
    from dvasim.policies.base import _REGISTRY, Policy, register

    @register
    class Broken(Policy):
        name = "broken-after-50"
        params = {"max_batch_size": "unused", "max_queue_delay_ms": "unused"}

        def __init__(self, **_):
            super().__init__()

        def admit(self, now):
            from dvasim.policies.base import New

            if self.pending and self.pending[0].qid >= 50:
                raise RuntimeError("policy bug")
            return [New(self.take(1))] if self.pending and self.view.free_instances() else []

    try:
        out = tmp_path / "o"
        rc = main(["run", str(ROOT / "configs/default.toml"), "--out", str(out), "--no-figure",
                   "--set", "policy.name=broken-after-50", *sum(
                       [["--set", s] for s in SMALL], [])])
        assert rc == 1
        df = pd.read_csv(out / "queries.csv")
        assert len(df) == 400 and 0 < df["finish_ms"].notna().sum() < 400
        assert "policy bug" in json.loads((out / "summary.json").read_text())["stuck"]
        # the Python API returns the partial result too, and says so with a warning
        import dvasim
        from dvasim.errors import IncompleteRunWarning

        with pytest.warns(IncompleteRunWarning, match="policy bug"):
            r = dvasim.run(ROOT / "configs/default.toml", overrides=["policy.name=broken-after-50", *SMALL])
        assert r.stuck and r.summary["n_completed"] < r.summary["n_queries"]
    finally:
        _REGISTRY.pop("broken-after-50", None)


def test_compare_flags_a_peak_at_the_top_of_the_load_ladder_and_takes_an_slo(tmp_path, capsys):
    """On the H100, LinkNet meets the SLO at every level of the ladder (up to 4,000 qps): its peak is only a lower
    bound, and compare says so instead of reporting the ladder's top as the peak."""
    from dvasim.cli.compare import cli_compare as compare_main

    rc = compare_main(["--quick", "--device", "h100", "--models", "linknet", "--policies", "delaybatch,dvabatch",
                       "--slo-ms", "150", "--out", str(tmp_path / "c")])
    assert rc == 0
    cap = capsys.readouterr()
    assert "linknet:delaybatch: every level of the load ladder" in cap.err and "150 ms SLO" in cap.err
    assert "p99 <= 150 ms" in cap.out
    calib = pd.read_csv(tmp_path / "c" / "calibration.csv")
    assert calib.loc[0, "peak_qps_delaybatch"] == 4000.0
    assert compare_main(["--slo-ms", "0", "--out", str(tmp_path / "d")]) == 2


def test_compare_can_find_its_peaks_with_the_capacity_search(tmp_path):
    from dvasim.cli.compare import cli_compare as compare_main
    from dvasim.studies.capacity import capacity
    from dvasim.studies.evaluation import make_config

    assert compare_main(["--quick", "--peak", "capacity", "--models", "bert_base", "--policies",
                         "zerobatch,delaybatch,dvabatch", "--out", str(tmp_path / "c")]) == 0
    calib = pd.read_csv(tmp_path / "c" / "calibration.csv").iloc[0]
    # the DelayBatch peak is exactly what dvasim capacity finds for that window (same search, same effort; the
    # Triton baselines run the model whole, as Triton runs a TensorRT engine)
    cfg = make_config("bert_base", {"name": "delaybatch", "max_queue_delay_ms": float(calib["delaybatch_window_ms"])},
                      {"kind": "poisson", "rate_qps": 100.0, "n_queries": 1000, "seed": 0}, stages=1)
    assert int(calib["baseline_stages"]) == 1
    assert capacity(cfg, 200.0, resolution=0.05, max_queries=8000, min_duration_s=2.0,
                    confirm_factor=0)["capacity_qps"] == \
        calib["peak_qps_delaybatch"]  # as compare searches at refine < 4 (evaluation.capacity_of)
    assert calib["peak_qps_dvabatch"] > calib["peak_qps_delaybatch"]  # input diversity: DVABatch removes padding
