"""Tests of dvasim.model.table.LatencyTable (interpolation, validation, the shipped default table)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dvasim.errors import TableError
from dvasim.model.table import DEFAULT_TABLE_PATH, LatencyTable


def table_1d() -> LatencyTable:
    # stage 0: bs 1 -> 2 ms, 4 -> 5 ms, 8 -> 6 ms; stage 1: 1 ms flat
    df = pd.DataFrame(
        {
            "stage": [0, 0, 0, 1, 1, 1],
            "batch_size": [1, 4, 8, 1, 4, 8],
            "latency_ms": [2.0, 5.0, 6.0, 1.0, 1.0, 1.0],
        }
    )
    return LatencyTable.from_frame(df, provenance={"source": "synthetic"}, name="t1d")


def table_2d() -> LatencyTable:
    # one stage, bs {1, 4} x seq_len {16, 64}: f(1,16)=1, f(4,16)=4, f(1,64)=3, f(4,64)=9
    df = pd.DataFrame(
        {
            "stage": [0, 0, 0, 0],
            "batch_size": [1, 4, 1, 4],
            "seq_len": [16, 16, 64, 64],
            "latency_ms": [1.0, 4.0, 3.0, 9.0],
        }
    )
    return LatencyTable.from_frame(df, provenance={"source": "synthetic", "note": "bilinear test"}, name="t2d")


def write(tmp_path, text: str, name: str = "bad.csv"):
    p = tmp_path / name
    p.write_text(text)
    return p


# ---------------------------------------------------------------- round trip / provenance
def test_save_load_round_trip(tmp_path):
    t = table_2d()
    p = tmp_path / "t.csv"
    t.save(p)
    u = LatencyTable.load(p)
    pd.testing.assert_frame_equal(t.to_frame(), u.to_frame())
    assert u.provenance == {"source": "synthetic", "note": "bilinear test"}
    assert u.name == "t"
    assert u.n_stages == 1 and u.max_batch_size == 4
    assert u.batch_sizes.tolist() == [1, 4] and u.seq_lens.tolist() == [16, 64]
    assert p.read_text().startswith("# source: synthetic\n")


def test_round_trip_exact_floats_without_seq(tmp_path):
    df = pd.DataFrame({"stage": [0, 0], "batch_size": [1, 2], "latency_ms": [0.1 + 0.2, 1 / 3]})
    t = LatencyTable.from_frame(df)
    t.save(tmp_path / "x.csv")
    u = LatencyTable.load(tmp_path / "x.csv")
    assert u.latency(0, 1) == 0.1 + 0.2 and u.latency(0, 2) == 1 / 3
    assert u.seq_lens is None


def test_table_without_header_has_unspecified_source(tmp_path):
    p = write(tmp_path, "stage,batch_size,latency_ms\n0,1,1.5\n0,2,2.5\n", "plain.csv")
    t = LatencyTable.load(p)
    assert t.provenance == {"source": "unspecified"}
    assert t.latency(0, 2) == 2.5


def test_provenance_keys_lowercased(tmp_path):
    p = write(tmp_path, "# Source: lab A\n# GPU: T4\n#free comment\nstage,batch_size,latency_ms\n0,1,1\n", "p.csv")
    assert LatencyTable.load(p).provenance == {"source": "lab A", "gpu": "T4"}


# ---------------------------------------------------------------- interpolation
def test_latency_at_and_between_points():
    t = table_1d()
    assert t.latency(0, 1) == 2.0 and t.latency(0, 4) == 5.0 and t.latency(0, 8) == 6.0
    assert t.latency(0, 2) == pytest.approx(3.0)  # 2 + 1/3 * (5 - 2)
    assert t.latency(0, 3) == pytest.approx(4.0)
    assert t.latency(0, 6) == pytest.approx(5.5)  # 5 + 2/4 * (6 - 5)
    assert t.stage_latencies(6) == pytest.approx([5.5, 1.0])
    assert t.total(6) == pytest.approx(6.5)
    assert t.remaining(1, 6) == pytest.approx(1.0)
    assert t.remaining(2, 6) == 0.0
    assert t.remaining(0, 2) == pytest.approx(4.0)


def test_seq_len_ignored_without_seq_column():
    t = table_1d()
    assert t.latency(0, 2, 512) == t.latency(0, 2) == pytest.approx(3.0)


def test_bilinear():
    t = table_2d()
    # corners
    assert [t.latency(0, 1, 16), t.latency(0, 4, 16), t.latency(0, 1, 64), t.latency(0, 4, 64)] == [1, 4, 3, 9]
    # (bs 2, L 32): a = 1/3, b = 1/3 -> 4/9*1 + 2/9*4 + 2/9*3 + 1/9*9 = 3
    assert t.latency(0, 2, 32) == pytest.approx(3.0)
    # edges: linear in one dimension
    assert t.latency(0, 4, 40) == pytest.approx(6.5)  # 4 + 0.5 * 5
    assert t.latency(0, 3, 64) == pytest.approx(7.0)  # 3 + 2/3 * 6


def test_short_inputs_padded_to_min_seq_len():
    t = table_2d()
    assert t.latency(0, 2, 1) == t.latency(0, 2, 16) == pytest.approx(2.0)
    assert t.latency(0, 4, 8) == 4.0


def test_small_batch_padded_to_min_profiled_batch():
    df = pd.DataFrame({"stage": [0, 0], "batch_size": [2, 4], "latency_ms": [3.0, 5.0]})
    t = LatencyTable.from_frame(df)
    assert t.latency(0, 1) == 3.0


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(0.01, 100.0), min_size=2, max_size=6),
    st.data(),
)
def test_interpolation_between_neighbours(lats, data):
    bs = [2**i for i in range(len(lats))]
    t = LatencyTable.from_frame(pd.DataFrame({"stage": 0, "batch_size": bs, "latency_ms": lats}))
    for b, v in zip(bs, lats, strict=True):
        assert t.latency(0, b) == v
    b = data.draw(st.integers(1, bs[-1]))
    i = int(np.searchsorted(bs, b))
    lo, hi = lats[max(i - 1, 0)], lats[i]
    assert min(lo, hi) - 1e-9 <= t.latency(0, b) <= max(lo, hi) + 1e-9


# ---------------------------------------------------------------- Figure 5: preferred batch size, demand
def gemm_table() -> LatencyTable:
    bs = np.array([1, 2, 4, 8, 16, 32])
    gemm_a = 0.05 * bs  # latency proportional to batch size: batching gains nothing
    gemm_b = 0.4 * np.maximum(bs, 8) / 8  # flat up to 8, then proportional
    df = pd.DataFrame(
        {"stage": [0] * 6 + [1] * 6, "batch_size": np.r_[bs, bs], "latency_ms": np.r_[gemm_a, gemm_b]}
    )
    return LatencyTable.from_frame(df, name="gemm")


def test_preferred_batch_sizes_like_figure5():
    t = gemm_table()
    assert t.preferred_batch_size(0) == 1
    assert t.preferred_batch_size(1) == 8
    assert t.preferred_batch_size(1, threshold=0.5) == 4  # throughput(4) = 0.5 * best


def test_demand():
    t = gemm_table()
    assert t.demand(0, 1) == pytest.approx(1.0) and t.demand(0, 32) == pytest.approx(1.0)
    assert t.demand(1, 4) == pytest.approx(0.5)
    assert t.demand(1, 1) == pytest.approx(1 / 8)
    assert t.demand(1, 16) == pytest.approx(1.0)
    assert t.throughput(1, 4) == pytest.approx(4 / 0.4)


def test_threshold_must_be_in_unit_interval():
    with pytest.raises(TableError) as e:
        gemm_table().preferred_batch_size(0, threshold=1.5)
    assert e.value.field == "threshold" and "(0, 1]" in e.value.message


# ---------------------------------------------------------------- lookup errors
@pytest.mark.parametrize("bad", [0, -1, 2.5, 9, "4", None, True])
def test_bad_batch_size(bad):
    t = table_1d()
    with pytest.raises(TableError) as e:
        t.latency(0, bad)
    assert e.value.field == "batch_size"
    assert "1..8" in e.value.message and repr(bad) in e.value.message
    with pytest.raises(TableError):
        t.check(bad)


def test_bad_seq_len():
    t = table_2d()
    with pytest.raises(TableError) as e:
        t.latency(0, 2, 65)
    assert e.value.field == "seq_len" and "16..64" in e.value.message and "65" in e.value.message
    with pytest.raises(TableError) as e:
        t.latency(0, 2, 0)
    assert e.value.field == "seq_len"
    with pytest.raises(TableError) as e:
        t.latency(0, 2)
    assert e.value.field == "seq_len" and "seq_len column" in e.value.message
    with pytest.raises(TableError):
        t.check(2)
    t.check(4, 64)  # in range: no error


@pytest.mark.parametrize("stage", [-1, 2, 1.5])
def test_bad_stage(stage):
    with pytest.raises(TableError) as e:
        table_1d().latency(stage, 1)
    assert e.value.field == "stage" and "0..1" in e.value.message


def test_remaining_from_stage_range():
    t = table_1d()
    with pytest.raises(TableError) as e:
        t.remaining(3, 1)
    assert e.value.field == "stage" and "0..2" in e.value.message


# ---------------------------------------------------------------- file errors
GOOD_HEADER = "stage,batch_size,latency_ms\n"


@pytest.mark.parametrize(
    "text, needle",
    [
        ("stage,latency_ms\n0,1\n", "missing column(s) batch_size"),
        ("stage,batch_size,latency_ms,foo\n0,1,1,2\n", "unknown column(s) foo"),
        (GOOD_HEADER + "0,1,abc\n", "non-numeric"),
        (GOOD_HEADER + "0,1,\n", "non-numeric or missing"),
        (GOOD_HEADER + "0,1,-2\n", "latency_ms must be > 0"),
        (GOOD_HEADER + "0,1,0\n", "latency_ms must be > 0"),
        (GOOD_HEADER + "0,1,1\n0,1,2\n", "duplicate row for stage 0, batch_size 1"),
        (GOOD_HEADER + "0,1,1\n0,2,2\n1,1,1\n", "ragged grid: stage 1"),
        (GOOD_HEADER + "0,1,1\n0,2,2\n1,1,1\n1,4,2\n", "ragged grid"),
        (GOOD_HEADER + "0,1,1\n2,1,1\n", "contiguous"),
        (GOOD_HEADER + "1,1,1\n", "contiguous"),
        (GOOD_HEADER + "0,1.5,1\n", "batch_size must hold integers"),
        (GOOD_HEADER + "0,0,1\n", "batch_size must be >= 1"),
        ("stage,batch_size,seq_len,latency_ms\n0,1,16,1\n0,1,32,2\n0,2,16,2\n", "ragged grid"),
        (GOOD_HEADER, "no data rows"),
        ("# source: x\n", "no CSV data"),
    ],
)
def test_malformed_files(tmp_path, text, needle):
    p = write(tmp_path, text, "broken_table.csv")
    with pytest.raises(TableError) as e:
        LatencyTable.load(p)
    assert e.value.field == "model.table"
    assert "broken_table.csv" in e.value.message
    assert needle in e.value.message
    assert "\n" not in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(TableError) as e:
        LatencyTable.load(tmp_path / "nope.csv")
    assert e.value.field == "model.table" and "nope.csv" in e.value.message and "not found" in e.value.message


# ---------------------------------------------------------------- shipped default table
# Measured whole-model forward latency of Caffe VGG16 on TITAN X (Pascal), copied from uwsampl/nexus
# tests/data/model_db/profiles/TITAN_X_(Pascal)/caffe_vgg16_1.txt (commit 27fd0283), microseconds -> ms.
MEASURED_MS = {1: 6.2774, 8: 28.7682, 16: 54.1577, 64: 222.100}


def test_default_table():
    t = LatencyTable.load(DEFAULT_TABLE_PATH)
    assert "uwsampl/nexus" in t.provenance["source"]
    assert "modelled" in t.provenance and "measured" in t.provenance
    assert t.n_stages == 4
    assert t.batch_sizes.tolist() == list(range(1, 65)) and t.max_batch_size == 64
    for bs, ms in MEASURED_MS.items():
        assert t.total(bs) == pytest.approx(ms, abs=1e-5)


def test_default_table_split_follows_vgg16_flops():
    # Independent hand computation of VGG16 multiply-accumulates (224x224): stage 0 = conv1_1, conv1_2, conv2_1.
    conv = [  # (H*W, C_in, C_out)
        (224 * 224, 3, 64), (224 * 224, 64, 64),
        (112 * 112, 64, 128), (112 * 112, 128, 128),
        (56 * 56, 128, 256), (56 * 56, 256, 256), (56 * 56, 256, 256),
        (28 * 28, 256, 512), (28 * 28, 512, 512), (28 * 28, 512, 512),
        (14 * 14, 512, 512), (14 * 14, 512, 512), (14 * 14, 512, 512),
    ]
    macs = [hw * ci * co * 9 for hw, ci, co in conv] + [25088 * 4096, 4096 * 4096, 4096 * 1000]
    share0 = sum(macs[:3]) / sum(macs)
    t = LatencyTable.load(DEFAULT_TABLE_PATH)
    for bs in (1, 32, 64):
        assert t.latency(0, bs) / t.total(bs) == pytest.approx(share0, abs=1e-6)


def test_bad_provenance_key():
    df = pd.DataFrame({"stage": [0], "batch_size": [1], "latency_ms": [1.0]})
    with pytest.raises(TableError) as e:
        LatencyTable.from_frame(df, provenance={"a:b": "x"}, name="pk")
    assert e.value.field == "model.table" and "'a:b'" in e.value.message
    t = LatencyTable.from_frame(df, provenance={"Device Name": "cpu (x86)", "source": "s"})
    assert t.provenance["device name"] == "cpu (x86)"


def test_bucketed_table_pads_up_to_the_next_length():
    from tests.conftest import make_table

    t = make_table(2, lambda s, b, L: float(L), batch_sizes=[1, 2], seq_lens=[16, 32, 64])
    assert t.latency(0, 1, 40) == pytest.approx(40.0)  # interpolated
    assert t.bucket(40) == 40 and not t.bucketed
    tb = make_table(2, lambda s, b, L: float(L), batch_sizes=[1, 2], seq_lens=[16, 32, 64])
    tb = type(tb).from_frame(tb.to_frame(), provenance={"source": "test", "length buckets": "true"})
    assert tb.bucketed
    assert tb.latency(0, 1, 40) == pytest.approx(64.0) and tb.bucket(40) == 64
    assert tb.latency(1, 2, 32) == pytest.approx(32.0) and tb.bucket(32) == 32
    assert tb.latency(0, 1, 5) == pytest.approx(16.0) and tb.bucket(5) == 16
    assert make_table(1, lambda s, b: 1.0, batch_sizes=[1]).bucket(7) == 7


def test_the_best_throughput_of_a_stage_is_the_max_over_profiled_batch_sizes_exactly():
    """The demand's denominator is computed in one pass over the table's rows; it equals, bit for bit, the
    maximum of throughput() over the profiled batch sizes (at every length, interpolated or not)."""
    from dvasim.model.catalog import resolve_model

    for model in ("bert_base", "vgg19"):
        t = resolve_model({"name": model, "device": "titanrtx", "stages": 3}).table
        lens = [None] if t.seq_lens is None else list(range(1, int(t.seq_lens.max()) + 1, 7))
        for s in range(t.n_stages):
            for length in lens:
                t._max_thr_cache.clear()
                assert t._max_throughput(s, length) == max(t.throughput(s, b, length) for b in t._b_list)
