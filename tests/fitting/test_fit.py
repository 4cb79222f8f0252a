"""`dvasim fit`: recovering known host parameters from synthetic replay logs, and predicting real H100 replays
the fit never saw (tests/data/h100_replays/, measured on an NVIDIA H100; provenance in its README)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dvasim.cli import main
from dvasim.fitting.check import TARGETS, score_case
from dvasim.fitting.fit import fit, overlap_fraction, read_replay, write_engine
from tests.synthetic_replays import write_replay

DATA = Path(__file__).parents[1] / "data" / "h100_replays"


def synthetic_replay(d: Path, seed: int, n: int = 1500, stall_p: float = 0.02, model: str = "resnet152",
                     max_batch: int = 16):
    """A replay folder whose executions follow known laws: host-bound stages (table 0.5 ms) whose launch costs
    1.0 + 0.05 b (stage 0) / 0.8 + 0.02 b (stage 1) times a log-normal factor of CV 0.1, copies 0.2 + 0.01 b,
    hand-off 0.1, book-keeping 0.02; a fraction ``stall_p`` of launches stalls for 10 ms. Batch sizes ``b`` uniform
    in ``1..max_batch`` (1: an unbatched replay)."""
    rng = np.random.default_rng(seed)
    rows, t = [], 0.0
    sigma = np.sqrt(np.log1p(0.1 ** 2))
    for i in range(n):
        s = i % 2
        b = int(rng.integers(1, max_batch + 1))
        launch = (1.0 + 0.05 * b if s == 0 else 0.8 + 0.02 * b) * rng.lognormal(-sigma ** 2 / 2, sigma)
        launch += 10.0 if rng.random() < stall_p else 0.0
        copy = 0.2 + 0.01 * b
        start = t
        begin = start + 0.1
        end = begin + copy + launch
        rows.append(dict(stage=s, batch_size=b, seq_len=1, table_ms=0.5, start_ms=start, begin_ms=begin,
                         end_ms=end, finish_ms=end + 0.02, handoff_ms=0.1, bookkeeping_ms=0.02,
                         compute_ms=end - begin, copy_ms=copy, n_queries=b))
        t = end + 0.02 + 0.5  # never two at once
    return write_replay(d, rows, t, rng, model, 2)


def test_fit_recovers_known_host_parameters(tmp_path):
    dirs = [synthetic_replay(tmp_path / f"r{k}", seed=k) for k in range(2)]
    res = fit(dirs)
    h, e, f = res["engine"]["host"], res["engine"], res["fit"]
    # medians per batch size of a mean-1 log-normal sit slightly below the mean: 1 / sqrt(1 + cv^2) = 0.995
    assert f["launch_ms_by_stage"][0] == pytest.approx(1.0, rel=0.05)
    assert f["launch_per_row_ms_by_stage"][0] == pytest.approx(0.05, rel=0.1)
    assert f["launch_ms_by_stage"][1] == pytest.approx(0.8, rel=0.05)
    assert f["launch_per_row_ms_by_stage"][1] == pytest.approx(0.02, rel=0.15)
    # written as the launch law (any slicing): resnet152's h100 cut at 2 stages has 84 and 73 operators, too alike
    # to resolve an intercept, so the whole model's 1.8 ms spread over its 157 operators
    assert f["stage_operators"] == [84, 73] and h["launch_fixed_ms"] == 0.0
    assert h["launch_per_op_ms"] == pytest.approx(1.8 / 157, rel=0.05)
    assert h["launch_model_per_row_ms"] == pytest.approx(0.07, rel=0.1)
    assert h["copy_ms"] == pytest.approx(0.2, rel=1e-6) and h["copy_per_row_ms"] == pytest.approx(0.01, rel=1e-6)
    assert "transfer" not in e and h["first_copy_ms"] == pytest.approx(0, abs=1e-9)  # both stages copy alike
    assert e["launch_overhead_ms"] == pytest.approx(0.12)
    assert e["service_cv"] == pytest.approx(0.1, abs=0.02)
    assert h["stall_prob"] == pytest.approx(0.02, abs=0.008)
    assert np.median(h["stall_ms"]) == pytest.approx(10.0, rel=0.1)
    assert e["admission_delay_ms"][10] == pytest.approx(0.05)


def test_overlap_fraction_against_brute_force():
    rng = np.random.default_rng(0)
    b = rng.uniform(0, 100, 60)
    e = b + rng.uniform(0.1, 10, 60)
    got = overlap_fraction(b, e)
    grid = np.linspace(0, 120, 240001)
    for i in range(0, 60, 7):
        inside = (grid >= b[i]) & (grid < e[i])
        others = np.zeros_like(grid, bool)
        for k in range(60):
            if k != i:
                others |= (grid >= b[k]) & (grid < e[k])
        assert got[i] == pytest.approx((inside & others).sum() / inside.sum(), abs=0.01)


def test_fit_on_zerobatch_predicts_the_bert_dvabatch_collapse(tmp_path):
    """The H100 replay of BERT-base under DVABatch stopped near 370 qps (batches of about one query, each stage
    launch costing ~2 ms of host time): the GPU-only simulator said 1,410 qps. Fitted on two ZeroBatch replays
    only, in the format that fits any slicing (the launch per operator, and the first and last stages' differences
    from it: the replays' first and last BERT stages launch ~15% more than the middle ones), the host model must
    reproduce it within the issue's targets."""
    from dvasim.fitting.fit import table_operators

    ops = table_operators(DATA / "bert_base_serving_table.csv")  # the cut the replays ran
    eng = write_engine(fit([DATA / "bert_base_zerobatch_0.6", DATA / "bert_base_zerobatch_0.85"], operators=ops),
                       tmp_path / "e.toml")
    row = score_case(DATA / "bert_base_dvabatch_0.3", DATA / "bert_base_serving_table.csv", eng,
                     DATA / "bert_base_summary.json", "dvabatch", 0.3)
    assert row["verdict"] == "within", row
    assert row["before_throughput_qps"] > 3 * row["real_throughput_qps"]  # what the GPU-only model said
    assert row["sim_mean_exit_batch_size"] < 1.5


def test_fit_on_zerobatch_predicts_resnet_delaybatch(tmp_path):
    # the replays ran the cut of their serving table (39/39/40/39 operators; today's zoo cuts stages = 4 elsewhere)
    from dvasim.fitting.fit import table_operators

    ops = table_operators(DATA / "resnet152_serving_table.csv")
    eng = write_engine(fit([DATA / "resnet152_zerobatch_0.6", DATA / "resnet152_zerobatch_0.85"], operators=ops),
                       tmp_path / "e.toml")
    row = score_case(DATA / "resnet152_delaybatch_0.85", DATA / "resnet152_serving_table.csv", eng,
                     DATA / "resnet152_summary.json", "delaybatch", 0.85)
    for k, tol in TARGETS.items():
        assert abs(row[f"err_{k}"]) <= tol, (k, row)


def test_cli_fit_then_run_with_engine(tmp_path, capsys):
    out = tmp_path / "engine.toml"
    assert main(["fit", str(DATA / "resnet152_zerobatch_0.6"), str(DATA / "resnet152_zerobatch_0.85"),
                 "--out", str(out), "--table", str(DATA / "resnet152_serving_table.csv")]) == 0
    text = out.read_text()
    assert "[engine]" in text and "[engine.host]" in text
    # the self-check simulated both folders with the fitted engine: throughput within 15% of their own runs
    import tomllib

    errs = tomllib.loads(text)["fit"]["self_check_err_throughput_qps"]
    assert len(errs) == 2 and all(abs(x) < 0.15 for x in errs)
    assert "resnet152_zerobatch_0.6: simulated vs real" in capsys.readouterr().out
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[model]\ntable = "{DATA / "resnet152_serving_table.csv"}"\n[policy]\nname = "zerobatch"\n'
                   'max_batch_size = 16\n[workload]\nkind = "poisson"\nrate_qps = 600.0\nn_queries = 500\nseed = 1\n')
    assert main(["run", str(cfg), "--out", str(tmp_path / "a"), "--no-figure"]) == 0
    assert main(["run", str(cfg), "--out", str(tmp_path / "b"), "--no-figure", "--engine", str(out)]) == 0
    a = json.loads((tmp_path / "a" / "summary.json").read_text())
    b = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert b["mean_latency_ms"] > 1.5 * a["mean_latency_ms"]  # the host's launch costs are now counted
    resolved = json.loads((tmp_path / "b" / "config.json").read_text())["config"]
    assert resolved["engine"]["host"]["modules"] == "torchscript"
    # the Python API takes the same file
    import dvasim

    r = dvasim.run(cfg, engine=out, progress=False)
    assert r.summary["mean_latency_ms"] == pytest.approx(b["mean_latency_ms"])


@pytest.mark.parametrize("args,field", [
    (["fit", "/nonexistent/dir", "--out", "x.toml"], "fit"),
    (["fit", str(DATA / "bert_base_zerobatch_0.6"), str(DATA / "resnet152_zerobatch_0.6"), "--out", "x.toml"], "fit"),
    (["fit", str(DATA / "resnet152_zerobatch_0.6"), "--out", "x.toml", "--host-cores", "zero"], "--host-cores"),
    (["fit", str(DATA / "resnet152_zerobatch_0.6")], None),
])
def test_fit_bad_input_is_one_line_exit_2(args, field, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = subprocess.run([sys.executable, "-m", "dvasim.cli", *args], capture_output=True, text=True)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr
    if field:
        assert f" {field}:" in lines[0]


def test_run_with_a_bad_engine_file(tmp_path):
    bad = tmp_path / "e.toml"
    bad.write_text("[model]\nname = 'x'\n")
    r = subprocess.run([sys.executable, "-m", "dvasim.cli", "run", "configs/default.toml", "--out",
                        str(tmp_path / "o"), "--engine", str(bad)], capture_output=True, text=True,
                       cwd=Path(__file__).parents[2])
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "--engine" in r.stderr


def test_read_replay_reads_gzip(tmp_path):
    r = read_replay(DATA / "resnet152_zerobatch_0.6")
    assert len(r["executions"]) > 100 and r["config"]["policy"]["name"] == "zerobatch"


def processor_sharing_ends(starts, work, cores: float) -> np.ndarray:
    """When each job ends under exact processor sharing of ``cores`` (an independent event loop: advance between
    events), jobs arriving at ``starts`` (sorted) with ``work`` ms each."""
    n = len(starts)
    left, t, active, end, nxt = np.array(work, dtype=float), 0.0, [], np.full(n, np.nan), 0
    while nxt < n or active:
        rate = min(1.0, cores / len(active)) if active else 0.0
        t_fin = t + min(left[i] for i in active) / rate if active else np.inf
        t_arr = starts[nxt] if nxt < n else np.inf
        t_new = min(t_fin, t_arr)
        for i in active:
            left[i] -= (t_new - t) * rate
        t = t_new
        for i in [i for i in active if left[i] <= 1e-9]:
            active.remove(i)
            end[i] = t
        if t_arr <= t_fin and nxt < n:
            active.append(nxt)
            nxt += 1
    return end


def test_fit_cores_recovers_the_launching_cores():
    """Launches simulated by an independent event loop (processor sharing on c cores): the fit finds c."""
    from dvasim.fitting.fit import fit_cores, segments

    rng = np.random.default_rng(1)
    for c_true in (1.0, 2.0, 3.0):
        starts = np.sort(rng.uniform(0, 400, 300))
        work = rng.uniform(1.0, 3.0, 300)
        end = processor_sharing_ends(starts, work, c_true)
        pieces = segments(starts, end)
        c, err = fit_cores(pieces, work)
        assert c == pytest.approx(c_true, abs=0.15) and err < 0.02


def test_fit_cores_needs_overlap(tmp_path):
    from dvasim.errors import ConfigError

    d = synthetic_replay(tmp_path / "r", seed=0, n=200)
    with pytest.raises(ConfigError, match="overlapped"):
        fit([d], fit_cores_from_overlap=True)


def test_stall_clustering_recovers_bursts():
    """A host that stalls in bursts: base probability 0.01, 0.3 within 50 ms after a burst-starting stall."""
    from dvasim.fitting.fit import stall_clustering

    rng = np.random.default_rng(3)
    t = np.cumsum(rng.uniform(1.0, 3.0, 40000))  # launches every 2 ms on average
    st = np.zeros(len(t), bool)
    start = -np.inf
    for i, ti in enumerate(t):
        inside = ti - start < 50.0
        st[i] = rng.random() < (0.3 if inside else 0.01)
        if st[i] and not inside:
            start = ti
    p_near, p_far, n = stall_clustering(t, st, np.zeros(len(t)))
    assert p_near == pytest.approx(0.3, abs=0.03) and p_far == pytest.approx(0.01, abs=0.003) and n > 1000
    # independent stalls show no bursts
    flat = rng.random(len(t)) < 0.02
    p_near, p_far, _ = stall_clustering(t, flat, np.zeros(len(t)))
    assert p_near == pytest.approx(p_far, abs=0.01)
