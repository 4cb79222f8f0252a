"""Slicing a model into stages from a per-operator profile (pure numpy; no torch)."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dvasim.errors import ConfigError
from dvasim.model.slicing import (
    balance,
    reference_seq_len,
    slice_at,
    slice_even,
    slice_ratios,
    stage_sums,
    stage_table,
)
from dvasim.model.table import LatencyTable

CPU_TRACES = Path(__file__).resolve().parents[2] / "traces" / "cpu"
MODELS = ("bert_base", "bert_large", "resnet152", "vgg19", "unet", "linknet")


def brute_force(t, k):
    """(min over partitions of the slowest stage, then max of the fastest) by enumeration."""
    best = None
    for cuts in itertools.combinations(range(1, len(t)), k - 1):
        s = stage_sums(t, [0, *cuts])
        key = (s.max(), -s.min())
        if best is None or key < best:
            best = key
    return best[0], -best[1]


@pytest.mark.parametrize("seed", range(8))
def test_slice_even_is_optimal_vs_brute_force(seed):
    rng = np.random.default_rng(seed)
    for _ in range(25):
        n = int(rng.integers(1, 11))
        k = int(rng.integers(1, n + 1))
        # mix continuous times with integer times (many ties) and zeros
        t = rng.exponential(1.0, n) if rng.random() < 0.6 else rng.integers(0, 4, n).astype(float)
        bounds = slice_even(t, k)
        assert len(bounds) == k and bounds[0] == 0
        assert all(b > a for a, b in zip(bounds, bounds[1:], strict=False)) and bounds[-1] < n
        s = stage_sums(t, bounds)
        slowest, fastest = brute_force(t, k)
        assert s.max() == pytest.approx(slowest, rel=1e-9, abs=1e-12)
        assert s.min() == pytest.approx(fastest, rel=1e-9, abs=1e-12)


def test_slice_even_extremes_and_validation():
    t = [1.0, 2.0, 3.0, 4.0]
    assert slice_even(t, 1) == [0]
    assert slice_even(t, 4) == [0, 1, 2, 3]
    assert slice_even([5.0] * 6, 3) == [0, 2, 4]
    for bad in (0, 5, -1, 2.5, True):
        with pytest.raises(ConfigError) as ei:
            slice_even(t, bad)
        assert ei.value.field == "model.stages"
        assert "1..4" in str(ei.value)
    with pytest.raises(ConfigError):
        slice_even([], 1)
    with pytest.raises(ConfigError):
        slice_even([1.0, -1.0], 1)


def test_slice_even_is_fast_for_20_stages_of_500_ops():
    t = np.random.default_rng(0).exponential(1.0, 500)
    b = slice_even(t, 20)
    assert balance(t, b) < 1.3


def test_slice_at_validation():
    assert slice_at(10, []) == [0]
    assert slice_at(10, [3, 7]) == [0, 3, 7]
    assert slice_at(10, [0, 3, 7]) == [0, 3, 7]
    for bad in ([7, 3], [3, 3], [10], [-1], [3, 11], [2.5]):
        with pytest.raises(ConfigError) as ei:
            slice_at(10, bad)
        assert ei.value.field == "model.cuts"


def test_slice_ratios():
    t = [1.0] * 10
    assert slice_ratios(t, 0.3) == [0, 3]
    assert slice_ratios(t, [0.3, 0.7]) == [0, 3]
    assert slice_ratios(t, [3, 7]) == [0, 3]
    assert slice_ratios(t, [1, 1, 1]) == [0, 3, 7]
    assert slice_ratios(t, [1]) == [0]
    # stages stay non-empty even when a share is tiny
    assert slice_ratios(t, [1e-9, 1e-9, 1.0]) == [0, 1, 2]
    assert slice_ratios(t, [1.0, 1e-9, 1e-9]) == [0, 8, 9]
    # the cut lands at the boundary nearest the share of *time*, not of operators
    assert slice_ratios([8.0, 1.0, 1.0], 0.5) == [0, 1]
    for bad in (0.0, 1.0, [0.5, -0.5], [], [1] * 11, "ab"):
        with pytest.raises(ConfigError):
            slice_ratios(t, bad)


def test_balance():
    assert balance([1, 1, 2, 2], [0, 2]) == pytest.approx(2.0)
    assert balance([1, 1, 2, 2], [0]) == 1.0
    assert balance([0.0, 1.0], [0, 1]) == float("inf")
    with pytest.raises(ConfigError):
        balance([1, 2, 3], [1, 2])


def op_frame(n_ops=12, bss=(1, 2, 4), sls=None, seed=0):
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.1, 2.0, n_ops)
    rows = []
    for i in range(n_ops):
        for b in bss:
            for sl in sls or [None]:
                row = {"stage": i, "batch_size": b, "latency_ms": base[i] * (0.5 + 0.5 * b) * ((sl or 16) / 16)}
                if sl is not None:
                    row["seq_len"] = sl
                rows.append(row)
    return pd.DataFrame(rows), base


@pytest.mark.parametrize("sls", [None, (8, 16, 32)])
def test_stage_table_sums_operators(sls):
    df, base = op_frame(sls=sls)
    ops = LatencyTable.from_frame(df, provenance={"source": "synthetic", "device name": "test"}, name="syn_ops")
    st = stage_table(ops, n_stages=3)
    ref_sl = None if sls is None else reference_seq_len(sls)
    ref = base * (0.5 + 0.5 * 1) * ((ref_sl or 16) / 16)
    bounds = slice_even(ref, 3)
    assert st.n_stages == 3
    assert list(st.batch_sizes) == [1, 2, 4]
    ends = [*bounds[1:], len(base)]
    for b in (1, 2, 4):
        for sl in sls or [None]:
            for k, (a, e) in enumerate(zip(bounds, ends, strict=True)):
                want = sum(ops.latency(i, b, sl) for i in range(a, e))
                assert st.latency(k, b, sl) == pytest.approx(want)
    prov = st.provenance
    assert prov["device name"] == "test"
    assert prov["slicing"].startswith(f"time-even N=3 cuts=[{','.join(map(str, bounds))}] balance=")
    assert "at bs=1" in prov["slicing"]
    if sls is not None:
        assert f"seq_len={ref_sl}" in prov["slicing"]


def test_stage_table_cuts_ratios_and_errors(tmp_path):
    df, _ = op_frame()
    ops = LatencyTable.from_frame(df, provenance={"source": "synthetic"}, name="syn_ops")
    st = stage_table(ops, cuts=[4, 8])
    assert st.n_stages == 3 and "at-cuts N=3 cuts=[0,4,8]" in st.provenance["slicing"]
    st2 = stage_table(ops, ratios=[1, 1])
    assert st2.n_stages == 2 and st2.provenance["slicing"].startswith("ratios N=2")
    # every stage count from 1 to the number of operators works
    for n in range(1, 13):
        t = stage_table(ops, n_stages=n, at_batch_size=4)
        assert t.n_stages == n
        assert t.total(4) == pytest.approx(ops.total(4))
    # round-trips through the CSV format
    p = tmp_path / "st.csv"
    st.save(p)
    back = LatencyTable.load(p)
    assert back.provenance["slicing"] == st.provenance["slicing"]
    with pytest.raises(ConfigError) as ei:
        stage_table(ops, n_stages=13)
    assert ei.value.field == "model.stages" and "1..12" in str(ei.value)
    with pytest.raises(ConfigError):
        stage_table(ops)
    with pytest.raises(ConfigError):
        stage_table(ops, n_stages=2, cuts=[3])
    with pytest.raises(ConfigError):
        stage_table(ops, n_stages=2, at_batch_size=3)


def shipped_op_tables():
    paths = [CPU_TRACES / f"{m}_small_ops.csv" for m in MODELS]
    return [p for p in paths if p.is_file()]


def test_shipped_cpu_op_tables_exist():
    missing = [m for m in MODELS if not (CPU_TRACES / f"{m}_small_ops.csv").is_file()]
    assert not missing, f"missing shipped per-operator CPU tables: {missing}"


def granularity_allows(t, n):
    """The operators are fine enough for a balanced N-stage cut: the largest is <= 1/3 of an even stage."""
    return float(np.max(t)) <= float(np.sum(t)) / n / 3


def test_time_even_balance_on_random_fine_grained_profiles():
    rng = np.random.default_rng(7)
    checked = 0
    for trial in range(400):
        n = int(rng.integers(5, 60))
        k = int(rng.integers(1, n + 1)) if trial % 4 == 0 else int(rng.integers(1, max(2, n // 6)))
        t = rng.exponential(1.0, n) if trial % 2 else rng.pareto(1.5, n) + 0.01
        b = slice_even(t, k)
        s = stage_sums(t, b)
        # provable bound of the optimal bottleneck: an even share plus one operator
        assert s.max() <= t.sum() / k + t.max() + 1e-9
        if granularity_allows(t, k):
            checked += 1
            assert balance(t, b) <= 1.5
    assert checked > 50


@pytest.mark.parametrize("path", shipped_op_tables(), ids=lambda p: p.stem)
def test_time_even_slicing_of_shipped_tables_is_balanced(path):
    """Measured per-operator CPU profiles: balance <= 1.5 at every N where the granularity allows it."""
    ops = LatencyTable.load(path)
    assert ops.n_stages >= 10
    assert ops.provenance["kind"] == "per-operator" and ops.provenance["threads"] == "1"
    sl = None if ops.seq_lens is None else reference_seq_len(ops.seq_lens)
    t = np.array(ops.stage_latencies(1, sl))
    balanced = 0
    for n in range(1, min(20, ops.n_stages) + 1):  # the paper sweeps 1..20 stages
        st = stage_table(ops, n_stages=n)
        bal = float(st.provenance["slicing"].split("balance=")[1].split()[0])
        stages = np.array(st.stage_latencies(1, sl))
        assert stages.sum() == pytest.approx(t.sum())
        assert stages.max() <= t.sum() / n + t.max() + 1e-9
        assert stages.max() / stages.min() == pytest.approx(bal, rel=2e-3)
        if granularity_allows(t, n):
            balanced += 1
            assert bal <= 1.5, f"{path.stem} N={n}: balance {bal}"
    assert balanced >= 2  # at least 1 and 2 stages
    # and every stage count up to the number of operators slices
    assert stage_table(ops, n_stages=ops.n_stages).n_stages == ops.n_stages


def test_a_named_models_stage_table_is_built_once_and_equals_a_fresh_slicing():
    """resolve_model keeps the stage tables it builds (a study resolves the same few for hundreds of runs): the
    kept table is the one slicing the operator table gives now, for stages, cuts and ratios alike."""
    import numpy as np

    from dvasim.model.catalog import load_op_table, resolve_model
    from dvasim.model.slicing import stage_table

    ops = load_op_table("resnet152", "titanrtx")
    for spec, how in (({"stages": 3}, {"n_stages": 3}), ({"cuts": [40, 100]}, {"cuts": [40, 100]}),
                      ({"ratios": [0.25, 0.75]}, {"ratios": [0.25, 0.75]})):
        cfg = {"name": "resnet152", "device": "titanrtx", **spec}
        first, again = resolve_model(cfg).table, resolve_model(dict(cfg)).table
        assert first is again
        fresh = stage_table(ops, name="resnet152_titanrtx", **how)
        assert first.n_stages == fresh.n_stages and list(first.cuts) == list(fresh.cuts)
        assert np.array_equal(first._lat, fresh._lat)
    assert resolve_model({"name": "resnet152", "stages": 2}).table is not resolve_model(
        {"name": "resnet152", "stages": 3}).table
