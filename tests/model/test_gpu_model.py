"""The analytic GPU model and the shipped per-operator tables in traces/gpu/.

The first part reads only the shipped CSVs (pandas, no torch). The tests marked ``torch`` recompute the model.
"""

from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

TRACES = Path(__file__).resolve().parents[2] / "traces"
GPU = TRACES / "gpu"
VAL = TRACES / "validation"
DEVICES = ("titanrtx", "a100", "h100")
MODELS = ("bert_base", "bert_large", "resnet152", "vgg19", "unet", "linknet")
SEQ_LENS = (8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 384, 512)
TOLERANCE = 0.25


def read_table(path: Path) -> tuple[dict[str, str], pd.DataFrame]:
    """Parse a shipped CSV: ``# key: value`` header lines, then the CSV body."""
    header, body = {}, []
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            header[key.strip()] = value.strip()
        else:
            body.append(line)
    return header, pd.read_csv(io.StringIO("\n".join(body)))


_CACHE: dict[Path, tuple[dict[str, str], pd.DataFrame]] = {}


def table(device: str, model: str):
    p = GPU / device / f"{model}.csv"
    if p not in _CACHE:
        _CACHE[p] = read_table(p)
    return _CACHE[p]


def preferred(bs, lat, threshold=0.9) -> int:
    thr = np.asarray(bs, float) / np.asarray(lat, float)
    return int(np.asarray(bs)[np.argmax(thr >= threshold * thr.max())])


def op_prefs(df: pd.DataFrame) -> list[int]:
    out = []
    for _, g in df.sort_values(["stage", "batch_size"]).groupby("stage"):
        out.append(preferred(g.batch_size, g.latency_ms))
    return out


# --------------------------------------------------------------------------------------------- shipped tables
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("model", MODELS)
def test_shipped_table_grid_and_provenance(device, model):
    path = GPU / device / f"{model}.csv"
    assert path.stat().st_size < 5_000_000
    head, df = table(device, model)
    for key in ("source", "device", "precision", "spec", "params", "torch", "date", "op_names", "validation"):
        assert head.get(key), key
    assert "modelled" in head["device"] and "analytic model" in head["source"]
    n_ops = len(head["op_names"].split())
    assert sorted(df.stage.unique()) == list(range(n_ops))
    assert sorted(df.batch_size.unique()) == list(range(1, 65))
    if model.startswith("bert"):
        assert sorted(df.seq_len.unique()) == list(SEQ_LENS)
        assert len(df) == n_ops * 64 * len(SEQ_LENS)
    else:
        assert "seq_len" not in df.columns and len(df) == n_ops * 64
    assert not df.duplicated([c for c in df.columns if c != "latency_ms"]).any()
    assert np.isfinite(df.latency_ms).all() and (df.latency_ms > 0).all()
    # an operator never gets faster when the batch grows
    keys = ["stage"] + (["seq_len"] if "seq_len" in df.columns else [])
    diffs = df.sort_values(keys + ["batch_size"]).groupby(keys).latency_ms.diff().dropna()
    assert (diffs >= -1e-9).all()


def test_total_size_of_gpu_traces():
    total = sum(p.stat().st_size for p in GPU.rglob("*") if p.is_file())
    assert total < 40_000_000


def test_faster_devices_are_faster():
    # the same modelled stack (TensorRT-style) on two devices; the h100 tables model torch kernels (measured
    # calibration) and are compared with measurements instead (test_h100_tables_match_measured_gpu_time)
    for model in MODELS:
        tot = {}
        for d in ("titanrtx", "a100"):
            _, df = table(d, model)
            if "seq_len" in df.columns:
                df = df[df.seq_len == 128]
            tot[d] = df[df.batch_size == 64].latency_ms.sum()
        assert tot["a100"] < tot["titanrtx"], (model, tot)


H100_MEASURED = GPU / "h100" / "measured"
H100_OP_BS = (1, 2, 4, 8, 16, 32)
H100_FIT_BS = (1, 8, 32)


def _h100_bounds() -> dict[str, list[int]]:
    b = pd.read_csv(H100_MEASURED / "stage_bounds.csv").sort_values(["model", "stage"])
    return {m: g.first_op.tolist() for m, g in b.groupby("model", sort=False)}


def test_h100_measured_files_and_stage_bounds():
    """The measurement copies are complete, and stage_bounds.csv holds the cuts the stage measurements used: the
    earlier (v1.0) modelled times recorded beside every measurement (analytic_ms) add up over these operator
    ranges to the recorded stage times."""
    op = pd.read_csv(H100_MEASURED / "op_gpu_times.csv")
    st = pd.read_csv(H100_MEASURED / "stage_times.csv")
    bounds = _h100_bounds()
    assert set(bounds) == set(op.model) == set(st.model) == {"bert_base", "resnet152", "vgg19", "unet"}
    assert len(op) == 1992 and len(st) == 504
    assert (op.graph_ms > 0).all() and (st.graph_ms > 0).all()
    for model, b in bounds.items():
        n_ops = len(table("h100", model)[0]["op_names"].split())
        assert op[op.model == model].op.max() + 1 == n_ops and b[0] == 0 and b == sorted(b)
        ends = [*b[1:], n_ops]
        s = st[st.model == model]
        for r in s[s.batch_size.isin(H100_OP_BS) & (s.seq_len.isna() | s.seq_len.isin([32, 128]))].itertuples():
            o = op[(op.model == model) & (op.batch_size == r.batch_size)]
            if model == "bert_base":
                o = o[o.seq_len == r.seq_len]
            total = o[(o.op >= b[r.stage]) & (o.op < ends[r.stage])].analytic_ms.sum()
            assert total == pytest.approx(r.analytic_ms, abs=2e-4), (model, r.stage, r.batch_size)


def _h100_stage_errors() -> pd.DataFrame:
    """The shipped h100 per-operator tables summed into the measured stages, against their measured GPU time
    (computed from the shipped files only, not from the model code)."""
    st = pd.read_csv(H100_MEASURED / "stage_times.csv")
    rows = []
    for model, bounds in _h100_bounds().items():
        _, df = table("h100", model)
        ends = [*bounds[1:], int(df.stage.max()) + 1]
        for r in st[st.model == model].itertuples():
            sel = (df.batch_size == r.batch_size) & (df.stage >= bounds[r.stage]) & (df.stage < ends[r.stage])
            if "seq_len" in df.columns:
                sel &= df.seq_len == int(r.seq_len)
            fitted = r.batch_size in H100_FIT_BS and (model != "bert_base" or int(r.seq_len) in (32, 128))
            rows.append((model, fitted, df.loc[sel, "latency_ms"].sum() / r.graph_ms - 1))
    return pd.DataFrame(rows, columns=["model", "fitted", "err"])


def _h100_op_errors() -> pd.DataFrame:
    op = pd.read_csv(H100_MEASURED / "op_gpu_times.csv")
    rows = []
    for model in op.model.unique():
        _, df = table("h100", model)
        keys = ["stage", "batch_size"] + (["seq_len"] if "seq_len" in df.columns else [])
        o = op[op.model == model].rename(columns={"op": "stage"})
        m = o.merge(df, on=keys, how="left", validate="one_to_one")
        assert m.latency_ms.notna().all()
        rows.append(pd.DataFrame({"model": model, "fitted": m.batch_size.isin(H100_FIT_BS),
                                  "err": m.latency_ms / m.graph_ms - 1}))
    return pd.concat(rows, ignore_index=True)


def test_h100_tables_match_measured_gpu_time():
    """Issue 9: the shipped h100 tables, summed into the measured four stages, within 15% median and 30% worst
    |error| of the measured GPU time per model, over all 504 stage points and over the held-out ones alone
    (batch sizes other than 1, 8, 32 and BERT lengths 64, 256). Measured here (all points): bert_base 2.7 / 27.1,
    resnet152 3.2 / 12.3, unet 5.1 / 22.5, vgg19 5.9 / 19.2 (traces/gpu/README.md). Per operator the medians are
    within 15% too (5-10%); the worst operators are not (up to 69%: cuDNN/cuBLAS kernel choices, README)."""
    st = _h100_stage_errors().assign(a=lambda d: d.err.abs())
    assert len(st) == 504
    for sub in (st, st[~st.fitted]):
        med, worst = sub.groupby("model").a.median(), sub.groupby("model").a.max()
        for model in ("bert_base", "resnet152", "unet", "vgg19"):
            assert med[model] <= 0.15 and worst[model] <= 0.30, (model, med[model], worst[model])
    # unbiased: the old unfitted tables were 1.5-4x too fast
    assert abs(st.err.median()) < 0.05
    op = _h100_op_errors().assign(a=lambda d: d.err.abs())
    assert len(op) == 1992
    for sub in (op, op[~op.fitted]):
        assert (sub.groupby("model").a.median() <= 0.15).all()


def test_h100_validation_record_matches_tables():
    """traces/gpu/h100/measured/validation.csv (written by build_gpu_tables) says what the shipped tables say."""
    v = pd.read_csv(H100_MEASURED / "validation.csv")
    stv = v[v.kind == "stage"].sort_values(["model", "seq_len", "index", "batch_size"])
    st = _h100_stage_errors()
    assert len(stv) == len(st) == 504
    for model in ("bert_base", "resnet152", "unet", "vgg19"):
        a = st[st.model == model].err.abs()
        b = stv[stv.model == model].rel_error.abs()
        assert a.median() == pytest.approx(b.median(), abs=2e-3) and a.max() == pytest.approx(b.max(), abs=2e-3)
        assert st[st.model == model].fitted.sum() == stv[stv.model == model].fit.sum()


@pytest.mark.torch
def test_h100_fit_is_reproducible():
    """Refitting on the measured operators (about 15 s) gives the shipped parameters (rounded to 4 digits)."""
    pytest.importorskip("scipy")
    from dvasim.model import build_gpu_tables as b
    from dvasim.model import gpu_model as gm

    p = b.fit_h100()
    for k in b.H100_FIT_KEYS:
        assert getattr(p, k) == pytest.approx(getattr(gm.PARAMS["h100"], k), rel=2e-3), k
    assert b.h100_loss(p) == pytest.approx(b.h100_loss(gm.PARAMS["h100"]), rel=1e-3)


@pytest.mark.parametrize("model", ["bert_base", "bert_large"])
def test_bert_latency_grows_with_sequence_length(model):
    _, df = table("titanrtx", model)
    # per operator: never decreasing in the sequence length
    diffs = (
        df.sort_values(["stage", "batch_size", "seq_len"])
        .groupby(["stage", "batch_size"])
        .latency_ms.diff()
        .dropna()
    )
    assert (diffs >= -1e-9).all()
    total = df.groupby(["batch_size", "seq_len"]).latency_ms.sum().unstack()
    for bs in (1, 8, 32, 64):
        row = total.loc[bs]
        assert (np.diff(row.loc[32:].to_numpy()) > 0).all(), bs  # strictly increasing from 32 tokens on
    assert total.loc[8, 256] > 4 * total.loc[8, 32]
    assert total.loc[8, 512] > 1.9 * total.loc[8, 256]


def test_figure5_gemms_preferred_batch_sizes():
    _, df = table("titanrtx", "fig5_gemms")
    a = df[df.stage == 0].sort_values("batch_size")
    b = df[df.stage == 1].sort_values("batch_size")
    assert preferred(a.batch_size, a.latency_ms) == 1
    assert preferred(b.batch_size, b.latency_ms) == 8
    la, lb = a.latency_ms.to_numpy(), b.latency_ms.to_numpy()
    assert la[1] / la[0] > 1.8  # GEMM-A: batching only adds latency
    assert np.allclose(lb[:8], lb[0]) and lb[8] > 1.5 * lb[7]  # GEMM-B: flat until 8, then a new wave


def _names(device, model):
    return table(device, model)[0]["op_names"].split()


def test_unet_late_operators_saturate_below_8():
    _, df = table("titanrtx", "unet")
    names = _names("titanrtx", "unet")
    prefs = dict(zip(names, op_prefs(df), strict=True))
    late = [n for n in names if n.startswith("dec1.") or n == "out"]
    assert len(late) == 4 and all(prefs[n] < 8 for n in late), prefs


@pytest.mark.xfail(
    strict=True,
    reason="paper Figure 6 not reproduced: in a 256x256 Ronneberger UNet every operator "
    "fills the Titan RTX by batch 2 under this model (see traces/gpu/README.md)",
)
def test_unet_early_operators_keep_gaining_up_to_32():
    _, df = table("titanrtx", "unet")
    prefs = op_prefs(df)
    early = prefs[: len(prefs) // 2]
    assert sum(p >= 32 for p in early) > len(early) / 2


def test_linknet_operator_diversity():
    _, df = table("titanrtx", "linknet")
    names = _names("titanrtx", "linknet")
    prefs = dict(zip(names, op_prefs(df), strict=True))
    low_res = [n for n in names if n.startswith(("enc3.", "enc4.", "dec4."))]
    assert max(prefs[n] for n in low_res) >= 16
    assert np.median([prefs[n] for n in low_res]) >= 8
    tail = [n for n in names if n.startswith(("dec1.", "final."))]
    assert all(prefs[n] < 8 for n in tail), prefs


# --------------------------------------------------------------------------------------------- validation record
def _commented_csv(path: Path) -> pd.DataFrame:
    return read_table(path)[1]


def test_validation_record_matches_published_sources():
    rec = pd.read_csv(GPU / "validation_errors.csv")
    e2 = _commented_csv(VAL / "e2bird_table1_titanrtx.csv")
    nx = _commented_csv(VAL / "nexus_vgg16_titanx_pascal.csv")
    ch = _commented_csv(VAL / "characterization_a100.csv")
    # spot values transcribed from the papers / profile (independent of the copies): E2bird Table 1, Nexus txt
    assert e2.set_index(["model", "batch_size"]).loc[("resnet152", 32), "latency_ms"] == 93.7
    assert nx.set_index("batch_size").loc[64, "latency_ms"] == pytest.approx(222.100)
    assert ch[(ch.system == "dvabatch")].set_index("model").throughput_qps.to_dict() == {
        "resnet152": 4288,
        "bert_base": 1088,
        "linknet": 3264,
    }
    got = rec[rec.source == "E2bird Table 1"].set_index(["model", "batch_size"]).measured
    assert got.to_dict() == e2.set_index(["model", "batch_size"]).latency_ms.to_dict()
    got = rec[rec.gpu == "titanx_pascal"].set_index("batch_size").measured
    assert np.allclose(
        got.sort_index().to_numpy(), nx.set_index("batch_size").latency_ms.sort_index().to_numpy()
    )
    assert len(got) == 64
    a100 = rec[rec.gpu == "a100"]
    high = ch[(ch.system == "triton") & (ch.load == "high")]
    assert len(a100) == 3 + len(high) == 24
    assert sorted(a100[a100.metric == "qps"].measured) == sorted(high.throughput_qps)


def test_validation_errors_and_tolerance_claims():
    rec = pd.read_csv(GPU / "validation_errors.csv")
    assert np.allclose(rec.rel_error, rec.predicted / rec.measured - 1, atol=1e-4)
    assert (rec.within_tolerance == (rec.rel_error.abs() <= TOLERANCE)).all()
    misses = rec[~rec.within_tolerance]
    assert misses.note.fillna("").str.len().gt(0).all()
    # the claims made in traces/gpu/README.md
    e2 = rec[rec.source == "E2bird Table 1"]
    assert len(e2) == 12 and e2.within_tolerance.all() and e2.rel_error.abs().max() < 0.16
    assert set(e2[e2.used_for_fit].model) == {"resnet50"}
    nx = rec[rec.gpu == "titanx_pascal"]
    assert sorted(nx[nx.used_for_fit].batch_size) == [1, 8, 32]
    assert sorted(nx[~nx.within_tolerance].batch_size) == [2, 3]
    assert nx[nx.batch_size >= 5].rel_error.abs().max() < 0.085
    bert = rec[(rec.gpu == "a100") & (rec.model == "bert_base")]
    assert len(bert) == 8 and bert.within_tolerance.all()
    r152 = rec[(rec.gpu == "a100") & (rec.model == "resnet152")]
    assert r152[(r152.metric == "peak_qps") | (r152.batch_size >= 16)].within_tolerance.all()
    assert not rec[(rec.gpu == "a100") & (rec.model == "linknet")].within_tolerance.any()


# --------------------------------------------------------------------------------------------- model (torch)
@pytest.fixture(scope="module")
def gm():
    pytest.importorskip("torch")
    from dvasim.model import gpu_model

    return gpu_model


@pytest.mark.torch
def test_published_points_recomputed(gm):
    """Re-run the model for every published point: same predictions as recorded, and each point the README
    claims within tolerance is within 25 % of the published measurement."""
    from dvasim.model import build_gpu_tables as bt

    rec = pd.read_csv(GPU / "validation_errors.csv")
    fresh = pd.concat([bt.validate_e2bird(), bt.validate_nexus(), bt.validate_a100()], ignore_index=True)
    assert len(fresh) == len(rec)
    assert np.allclose(fresh.predicted.to_numpy(), rec.predicted.to_numpy(), rtol=1e-3)
    assert np.allclose(fresh.measured.to_numpy(), rec.measured.to_numpy())
    claimed = rec.within_tolerance.to_numpy()
    err = (fresh.predicted / fresh.measured - 1).abs().to_numpy()
    assert (err[claimed] <= TOLERANCE).all()
    assert (err[~claimed] > TOLERANCE).all()


@pytest.mark.torch
def test_flops_against_flopcounter_and_published(gm):
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from dvasim.model import zoo

    for name, seq, published_gmacs in (
        ("resnet50", None, 4.09),
        ("vgg16", None, 15.47),
        ("bert_base", 128, None),
    ):
        ops = gm.op_templates(name, seq)
        ours = sum(k.flops(2) for o in ops for k in o if k.kind == "gemm")
        m = zoo.build(name, "full", device="meta")
        x = m.example_input(2, seq_len=seq, device="meta")
        with FlopCounterMode(display=False) as fc, torch.no_grad():
            m.forward(x)
        assert ours == pytest.approx(fc.get_total_flops(), rel=1e-9), name
        if published_gmacs:  # torchvision / paper counts: multiply-adds per image
            assert ours / 2 / 2 / 1e9 == pytest.approx(published_gmacs, rel=0.03), name


@pytest.mark.torch
@pytest.mark.parametrize("name", ["resnet152", "vgg19", "linknet"])
def test_weights_read_once_per_batch(gm, name):
    """The batch-independent bytes of all kernels are the weights (+ BN statistics): 4 bytes per parameter."""
    from dvasim.model import zoo

    fixed = sum(k.bytes_fixed for o in gm.op_templates(name) for k in o)
    m = zoo.build(name, "full", device="meta")
    buffers = sum(b.numel() for b in m.module().buffers() if b.dtype.is_floating_point)
    assert fixed == pytest.approx(4 * (m.parameters_count() + buffers), rel=1e-6)


@pytest.mark.torch
def test_kernel_time_by_hand(gm):
    g = gm.GPUS["titanrtx"]
    p = gm.PARAMS["titanrtx"]
    slots = g.sms * p.blocks_per_sm
    per_slot = g.peak_tflops["fp32"] * 1e12 * p.compute_eff / slots
    # GEMM-B at batch 1: 2 x 16 = 32 blocks, one wave of 32x32x576 blocks
    wave = 2 * 32 * 32 * 576 / per_slot * 1e3  # ms
    assert gm.gemm_latency_ms(49, 512, 576, [1])[0] == pytest.approx(wave, rel=1e-9)
    # batch 9: ceil(441/32) * 16 = 224 > 216 blocks -> two waves
    assert gm.gemm_latency_ms(49, 512, 576, [9])[0] == pytest.approx(2 * wave, rel=1e-9)
    # a tiny GEMM hits the floor t0; a large one is compute bound: ceil(ceil(64*3136/32)*2/216) waves
    assert gm.gemm_latency_ms(1, 8, 8, [1])[0] == pytest.approx(p.kernel_overhead_us / 1e3)
    waves = math.ceil(math.ceil(64 * 3136 / 32) * 2 / slots)
    assert gm.gemm_latency_ms(3136, 64, 576, [64])[0] == pytest.approx(waves * wave, rel=1e-9)
    # long thin reduction (M=4, N=1024, K=9216): split-K into 4 parts (128 blocks, one wave of K=2304 blocks)
    # plus writing and re-reading 4 partial 4x1024 results beats one wave of 32 blocks with the full K
    no_split = 2 * 32 * 32 * 9216 / per_slot * 1e3
    split4 = no_split / 4 + 2 * 4 * 4 * 1024 * 4 / (672e9 * 0.8) * 1e3
    assert gm.gemm_latency_ms(4, 1024, 9216, [1])[0] == pytest.approx(split4, rel=1e-9)
    # memory bound: bytes / (BW * e_mem)
    kt = gm.KernelTemplate("mem", ("x",), 0, 0, 0, 0.0, "", 0.0, 8e6, 0.0)
    assert gm.kernel_time_us(kt, 4, g, p, "fp32") == pytest.approx(32e6 / (672e9 * 0.8) * 1e6)
    assert gm.kernel_time_us(kt, 4, g, p, "fp16") == pytest.approx(16e6 / (672e9 * 0.8) * 1e6)


@pytest.mark.torch
def test_kernel_time_by_hand_h100_torch(gm):
    """The v1.2 terms (H100 fit, torch kernels): t = t0 + max(t_compute, t_memory), t_compute = latency + K loop +
    waves; convolutions at e_conv * N / (N + n_half); a one-row GEMM is a memory-bound matrix-vector product."""
    g, p = gm.GPUS["h100"], gm.PARAMS["h100"]
    assert p.fusion == "torch" and p.additive_t0 and not p.split_k
    slots = g.sms * p.blocks_per_sm
    bw = g.dram_gbs * 1e9 * p.mem_eff
    # [512, 768] x [768, 3072] (BERT's FFN1 at batch 4, length 128): 16 x 96 = 1536 blocks, 4 waves
    kt = gm.KernelTemplate("gemm", ("addmm",), 1, 128, 3072, 768.0, "M", 4.0 * 768 * 3072, 4.0 * 128 * 3840, 0.0)
    per_slot = g.peak_flops("tf32") * p.compute_eff / slots
    t_comp = p.gemm_latency_us + 4 * 2 * 32 * 32 * 768 / per_slot * 1e6 + 768 * p.gemm_k_latency_ns / 1e3
    t_mem = kt.bytes(4) / bw * 1e6
    assert t_comp > t_mem
    assert gm.kernel_time_us(kt, 4, g, p, "tf32") == pytest.approx(p.kernel_overhead_us + t_comp, rel=1e-12)
    # batch 1 of a classifier (M = 1): gemv, memory-bound
    kt1 = gm.KernelTemplate("gemm", ("addmm",), 1, 1, 1000, 2048.0, "M", 4.0 * 2048 * 1000, 4.0 * 3048, 0.0)
    assert gm.kernel_time_us(kt1, 1, g, p, "tf32") == pytest.approx(p.kernel_overhead_us + kt1.bytes(1) / bw * 1e6)
    # a 3x3 convolution, 64 -> 128 channels, 56x56 output: e_conv * 128 / (128 + n_half), 98 x 4 blocks: 1 wave
    kc = gm.KernelTemplate("gemm", ("convolution",), 1, 3136, 128, 576.0, "M", 4.0 * 576 * 128, 4.0 * 3136 * 192, 0.0)
    per_slot = g.peak_flops("tf32") * p.conv_eff * 128 / (128 + p.conv_n_half) / slots
    t_comp = p.gemm_latency_us + 2 * 32 * 32 * 576 / per_slot * 1e6 + 576 * p.conv_k_latency_ns / 1e3
    assert gm.kernel_time_us(kc, 1, g, p, "tf32") == pytest.approx(p.kernel_overhead_us + t_comp, rel=1e-12)
    # the Titan RTX / A100 sets keep the v1.0 form (the new terms are inert there)
    for d in ("titanrtx", "a100"):
        q = gm.PARAMS[d]
        assert (q.fusion, q.additive_t0, q.split_k, q.gemv, q.narrow_tiles) == ("tensorrt", False, True, False, False)
        assert q.gemm_latency_us == q.gemm_k_latency_ns == q.conv_k_latency_ns == q.conv_n_half == 0


@pytest.mark.torch
def test_torch_kernel_inventory(gm):
    """fusion="torch" records the kernels torch launches: every element-wise op, a convolution's bias as its own
    kernel, copies for strided reshapes (not at batch 1, where the reshape is a view) and cat, pooling indices."""
    bert = gm.op_templates("bert_base", 128, "torch")
    attn = [k.names[0] for k in bert[2]]
    assert attn == ["clone", "clone", "bmm", "div", "add", "_softmax", "clone", "bmm", "clone"]
    assert [k.min_bs for k in bert[2] if k.names[0] == "clone"] == [2, 2, 2, 1]
    assert [k.names[0] for k in bert[4]] == ["addmm", "gelu"]
    unet = gm.op_templates("unet", None, "torch")
    assert [k.names for k in unet[24]] == [("cat",), ("convolution",), ("conv_bias",), ("relu",)]  # dec1.conv1
    pool = unet[2][0]  # pool1: reads 64x256x256, writes 64x128x128 values and their int64 indices
    assert pool.bytes_per_sample == 4 * 64 * (256 * 256 + 128 * 128) and pool.int_bytes_per_sample == 8 * 64 * 128**2
    r = gm.op_templates("resnet152", None, "torch")
    assert [k.names for k in r[2]] == [("convolution",), ("native_batch_norm",)]  # s1.b0.down: stride 1
    assert [k.names for k in r[12]] == [("convolution", "strided"), ("native_batch_norm",)]  # s2.b0.down
    assert [k.names for k in r[5]] == [("convolution",), ("native_batch_norm",), ("add",), ("relu",)]


@pytest.mark.torch
def test_shipped_tables_are_reproducible(gm):
    _, df = table("titanrtx", "resnet152")
    lat = gm.op_latencies_ms("resnet152", [1, 17, 64], gpu="titanrtx")
    for j, bs in enumerate((1, 17, 64)):
        shipped = df[df.batch_size == bs].sort_values("stage").latency_ms.to_numpy()
        assert np.allclose(shipped, lat[:, j], atol=1e-5)
    for device in ("a100", "h100"):
        _, df = table(device, "bert_base")
        for bs, L in ((1, 32), (8, 384)):
            lat = gm.op_latencies_ms("bert_base", [bs], seq_len=L, gpu=device)
            shipped = df[(df.batch_size == bs) & (df.seq_len == L)].sort_values("stage").latency_ms.to_numpy()
            assert np.allclose(shipped, lat[:, 0], atol=1e-5)
    _, df = table("h100", "unet")
    lat = gm.op_latencies_ms("unet", [1, 17, 64], gpu="h100")
    for j, bs in enumerate((1, 17, 64)):
        assert np.allclose(df[df.batch_size == bs].sort_values("stage").latency_ms.to_numpy(), lat[:, j], atol=1e-5)


@pytest.mark.torch
def test_unknown_inputs_rejected(gm):
    with pytest.raises(ValueError):
        gm.op_latencies_ms("bert_base", [1])  # needs seq_len
    with pytest.raises(ValueError):
        gm.GPUS["titanx_pascal"].peak_flops("tf32")
    assert gm.preferred_batch_size([1, 2, 4], [1.0, 1.0, 2.0]) == 2
