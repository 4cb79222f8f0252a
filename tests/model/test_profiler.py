"""The profiler measures valid latency tables of small zoo variants on the CPU (needs torch)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from dvasim.cli.profile import cli_profile  # noqa: E402
from dvasim.errors import ConfigError  # noqa: E402
from dvasim.model import zoo  # noqa: E402
from dvasim.model.profiling.profiler import profile_ops, profile_stages, stats_path, to_table  # noqa: E402
from dvasim.model.slicing import stage_table  # noqa: E402
from dvasim.model.table import LatencyTable  # noqa: E402

PROVENANCE_KEYS = ("device name", "torch", "threads", "repeats", "warmup", "date", "model", "variant", "timer")


def test_cli_profile_writes_a_valid_stage_table(tmp_path, capsys):
    out = tmp_path / "vgg19_small_3st.csv"
    rc = cli_profile([
        "--model", "vgg19", "--variant", "small", "--stages", "3", "--device", "cpu",
        "--batch-sizes", "1,2,8", "--repeats", "3", "--warmup", "1", "--out", str(out),
    ])
    assert rc == 0, capsys.readouterr().err
    table = LatencyTable.load(out)
    assert table.n_stages == 3
    assert list(table.batch_sizes) == [1, 2, 8]
    prov = table.provenance
    for key in PROVENANCE_KEYS + ("slicing", "command"):
        assert prov.get(key), f"provenance lacks {key!r}"
    assert prov["model"] == "vgg19" and prov["variant"] == "small"
    assert prov["threads"] == "1" and prov["repeats"] == "3" and prov["warmup"] == "1"
    assert prov["torch"] == torch.__version__
    assert prov["slicing"].startswith("time-even N=3 cuts=[0,")
    assert "balance=" in prov["slicing"]
    for s in range(3):  # wall-clock times: positive and finite, no order or ratio between them is asserted
        assert all(0 < table.latency(s, b) < math.inf for b in (1, 2, 8))
    # the spread side file
    stats = pd.read_csv(stats_path(out))
    assert {"p10_ms", "p90_ms", "min_ms", "repeats", "foreign_cpu"} <= set(stats.columns)
    assert (stats["p10_ms"] <= stats["latency_ms"] + 1e-9).all() and (stats["latency_ms"] <= stats["p90_ms"] + 1e-9).all()
    assert "wrote" in capsys.readouterr().out


def test_per_operator_profile_of_a_token_model_slices_on_demand(tmp_path):
    model = zoo.build("bert_base", variant="small")
    df = profile_ops(model, [1, 2], seq_lens=[8, 16], repeats=2, warmup=1)
    assert list(df.columns[:3]) == ["stage", "name", "batch_size"]
    assert len(df) == model.n_ops() * 2 * 2
    assert df[df["batch_size"] == 1].sort_values(["seq_len", "stage"])["name"].tolist()[: model.n_ops()] == model.op_names
    table = to_table(df)
    assert table.n_stages == model.n_ops()
    assert list(table.seq_lens) == [8, 16]
    for key in PROVENANCE_KEYS:
        assert table.provenance.get(key)
    p = tmp_path / "ops.csv"
    table.save(p)
    ops = LatencyTable.load(p)
    # every stage count from 1 to the number of operators slices the per-operator table
    for n in range(1, ops.n_stages + 1):
        st = stage_table(ops, n_stages=n)
        assert st.n_stages == n
        assert st.total(2, 16) == pytest.approx(ops.total(2, 16))


def test_profile_stages_times_real_stage_modules():
    model = zoo.build("resnet152", variant="small")
    df = profile_stages(model, 2, batch_sizes=[1, 2], repeats=2, warmup=1)
    assert sorted(df["stage"].unique()) == [0, 1]
    bounds = df.attrs["bounds"]
    assert bounds[0] == 0 and 0 < bounds[1] < model.n_ops()
    assert df["name"].iloc[0] == f"ops 0-{bounds[1] - 1}"
    assert (df["latency_ms"] > 0).all()
    prov = df.attrs["provenance"]
    assert "measured balance" in prov and prov["stages"] == "2"
    df2 = profile_stages(model, cuts=[5], batch_sizes=[1], repeats=1, warmup=0)
    assert df2.attrs["bounds"] == [0, 5]
    with pytest.raises(ConfigError):
        profile_stages(model, model.n_ops() + 1, batch_sizes=[1], repeats=1, warmup=0)
    with pytest.raises(ConfigError):
        profile_ops(model, [1], seq_lens=[8], repeats=1, warmup=0)  # images take no sequence length
    with pytest.raises(ConfigError):
        profile_ops(model, [0], repeats=1, warmup=0)


def test_profile_stages_can_time_the_replays_torchscript_modules(monkeypatch):
    """The replay runs traced, frozen stages by default; the profiler times the same modules on request: the units
    it times are TorchScript stages whose frozen graphs have BatchNorm folded into the convolutions (checked on the
    graphs, not on the clock)."""
    from dvasim.model.profiling import profiler
    from dvasim.model.stages.compiled import TorchScriptStage

    timed = {}
    measure = profiler._measure_units

    def spy(model, units, names, *args, **kwargs):
        timed[len(timed)] = list(units)
        return measure(model, units, names, *args, **kwargs)

    monkeypatch.setattr(profiler, "_measure_units", spy)
    model = zoo.build("resnet152", variant="small")
    ts = profile_stages(model, cuts=[10], batch_sizes=[4], repeats=2, warmup=1, modules="torchscript")
    eager = profile_stages(model, cuts=[10], batch_sizes=[4], repeats=2, warmup=1, modules="eager")
    assert ts.attrs["provenance"]["modules"] == "torchscript" and eager.attrs["provenance"]["modules"] == "eager"
    assert ts.attrs["bounds"] == eager.attrs["bounds"] == [0, 10]
    ts_units, eager_units = timed[0], timed[1]
    assert len(ts_units) == len(eager_units) == 2
    assert all(isinstance(u, TorchScriptStage) for u in ts_units)
    assert not any(isinstance(u, TorchScriptStage) for u in eager_units)
    assert any(isinstance(m, torch.nn.BatchNorm2d) for u in eager_units for m in u.modules())
    assert all("batch_norm" not in str(u.module.graph) for u in ts_units)  # folded by freezing
    assert all(0 < t < math.inf for t in (*ts["latency_ms"], *eager["latency_ms"]))
    with pytest.raises(ConfigError, match="modules"):
        profile_stages(model, cuts=[10], batch_sizes=[1], repeats=1, warmup=0, modules="onnx")


BAD_ARGS = [
    ([], "--model"),  # argparse's own errors name the first option they mention
    (["--model", "vgg19", "--stages", "2"], "--out"),
    (["--model", "alexnet", "--stages", "2"], "--model"),
    (["--model", "vgg19", "--variant", "tiny", "--stages", "2"], "--variant"),
    (["--model", "vgg19", "--device", "tpu", "--stages", "2"], "--device"),
    (["--model", "vgg19", "--batch-sizes", "0,1", "--stages", "2"], "--batch-sizes"),
    (["--model", "vgg19", "--batch-sizes", "one", "--stages", "2"], "--batch-sizes"),
    (["--model", "vgg19", "--stages", "0"], "--stages"),
    (["--model", "vgg19", "--stages", "999"], "--stages"),
    (["--model", "vgg19"], "--stages"),  # neither stages nor --per-op
    (["--model", "vgg19", "--per-op", "--stages", "2"], "--per-op"),
    (["--model", "vgg19", "--stages", "2", "--seq-lens", "16"], "--seq-lens"),
    (["--model", "bert_base", "--per-op", "--seq-lens", "8,x"], "--seq-lens"),
    (["--model", "vgg19", "--stages", "2", "--repeats", "0"], "--repeats"),
    (["--model", "vgg19", "--stages", "2", "--warmup", "-1"], "--warmup"),
    (["--model", "vgg19", "--stages", "2", "--threads", "0"], "--threads"),
    (["--model", "vgg19", "--cuts", "5,3"], "--cuts"),
    (["--model", "vgg19", "--ratios", "0.5,-1"], "--ratios"),
    (["--model", "vgg19", "--stages", "2", "--slice-batch-size", "3"], "--slice-batch-size"),
    (["--model", "vgg19", "--stages", "2", "--bogus"], "--bogus"),
]


@pytest.mark.parametrize("argv,field", BAD_ARGS, ids=[" ".join(a) or "empty" for a, _ in BAD_ARGS])
def test_cli_profile_bad_arguments(argv, field, tmp_path, capsys):
    # every case but the two that test a missing --out gets a valid one
    full = list(argv) + ([] if argv in ([], ["--model", "vgg19", "--stages", "2"]) else ["--out", str(tmp_path / "t.csv")])
    rc = cli_profile(full)
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"dvasim profile: error: {field}: "), lines[0]
    assert not (tmp_path / "t.csv").exists()


def test_cli_profile_bad_out_and_cuda(tmp_path, capsys):
    assert cli_profile(["--model", "vgg19", "--stages", "2", "--out", str(tmp_path / "t.txt")]) == 2
    assert capsys.readouterr().err.startswith("dvasim profile: error: --out: ")
    if not torch.cuda.is_available():
        assert cli_profile(["--model", "vgg19", "--stages", "2", "--device", "cuda", "--out", str(tmp_path / "t.csv")]) == 2
        assert capsys.readouterr().err.startswith("dvasim profile: error: --device: ")
