"""The GPU paths on the CPU: GPU-true profiling and the launch side file through the stand-in graph object,
graph stages with a bucketed table coarser than the inputs' lengths, the static buffers of one executor, and the
CLI's --modules and `--device cuda` answers. No GPU number is claimed here: the stand-in times wall clock."""

from __future__ import annotations

import io

import pandas as pd
import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from dvasim.cli import main  # noqa: E402
from dvasim.cli.profile import cli_profile  # noqa: E402
from dvasim.engines.replay.engine import CudaOps  # noqa: E402
from dvasim.model.profiling import profiler  # noqa: E402
from dvasim.model.stages.graphs import CpuGraphs, GraphStage  # noqa: E402
from dvasim.model.table import LatencyTable, read_provenance_csv  # noqa: E402
from tests.conftest import vgg19_config_file  # noqa: E402
from tests.engines.test_replay import assert_outputs_match, cfg  # noqa: E402


class CountingGraphs(CpuGraphs):
    """The CPU stand-in, counting the calls the GPU profiler makes through it."""

    def __init__(self):
        self.calls = {"graph_pool": 0, "capture_graph": 0, "time_replays": 0, "synchronize": 0, "replay_graph": 0}

    def graph_pool(self, name=None):
        self.calls["graph_pool"] += 1
        return ("pool", name)

    def capture_graph(self, fn, static_inputs, pool=None):
        self.calls["capture_graph"] += 1
        assert pool is not None  # every capture into the pool of its GraphStage
        return super().capture_graph(fn, static_inputs, pool)

    def replay_graph(self, graph):
        self.calls["replay_graph"] += 1
        super().replay_graph(graph)

    def time_replays(self, graph, n):
        self.calls["time_replays"] += 1
        return super().time_replays(graph, n)

    def synchronize(self):
        self.calls["synchronize"] += 1


def test_gpu_profile_goes_through_the_graph_object_and_writes_a_bucketed_table(monkeypatch, tmp_path):
    ops = CountingGraphs()
    import dvasim.model.stages.graphs as graphs

    monkeypatch.setattr(graphs, "graph_ops", lambda device: ops)  # the profiler takes its graphs from here
    df = profiler.profile_stages("bert_base", cuts=[4], batch_sizes=[1, 2], seq_lens=[8, 16], warmup=1, repeats=2,
                                 modules="cudagraph")
    # 2 stages x 2 batch sizes x 2 lengths captured once each, timed (warm-up + repeats) times each
    assert ops.calls["capture_graph"] == 8 and ops.calls["time_replays"] == 8 * 3
    assert ops.calls["replay_graph"] == 8 * 3 * profiler.GRAPH_REPLAYS
    t = profiler.save_profile(df, tmp_path / "t.csv", stats=False)
    text = (tmp_path / "t.csv").read_text()
    assert f"# timer: {ops.timer}\n" in text and "# length buckets: true\n" in text
    loaded = LatencyTable.load(tmp_path / "t.csv")
    assert loaded.bucketed and loaded.provenance["modules"] == "cudagraph" and t.n_stages == 2
    assert loaded.bucket(9) == 16 and loaded.latency(1, 2, 9) == loaded.latency(1, 2, 16)
    # what a GPU's table says (the exact line the simulator side and the docs rely on)
    assert CudaOps.timer == "CUDA graph replays between CUDA events (GPU time, no host launch cost)"
    # launch costs: timed with the host clock, the device synchronised through the object between calls
    ldf = profiler.profile_launch("bert_base", [0, 4], [1], [8], kinds=["eager", "cudagraph"], warmup=1, repeats=2)
    assert ops.calls["synchronize"] == 2 * 2 * 3 and list(ldf["modules"]) == ["eager"] * 2 + ["cudagraph"] * 2


def test_per_operator_graphs_are_captured_on_their_predecessors_carry(monkeypatch):
    """Each operator is captured alone on the carry its predecessors produced, and a stage graph on the carry at its
    first operator: the per-operator and the per-stage profiles time graphs of the same inputs. Checked on the
    inputs the graph object was given, not on the times (wall clock on the stand-in: only positive and finite)."""
    import math

    import dvasim.model.stages.graphs as graphs
    from dvasim.model import zoo
    from dvasim.model.stages.buffers import flatten

    class ShapeRecordingGraphs(CountingGraphs):
        def __init__(self):
            super().__init__()
            self.inputs = []

        def capture_graph(self, fn, static_inputs, pool=None):
            self.inputs.append(tuple(tuple(t.shape) for t in static_inputs))
            return super().capture_graph(fn, static_inputs, pool)

    per_op, per_stage = ShapeRecordingGraphs(), ShapeRecordingGraphs()
    monkeypatch.setattr(graphs, "graph_ops", lambda device: per_op)
    ops = profiler.profile_ops("vgg19", [2], warmup=1, repeats=2, graphs=True)
    monkeypatch.setattr(graphs, "graph_ops", lambda device: per_stage)
    st = profiler.profile_stages("vgg19", cuts=[8, 16], batch_sizes=[2], warmup=1, repeats=2, modules="cudagraph")
    assert "stand-in" in ops.attrs["provenance"]["timer"] and "length buckets" not in ops.attrs["provenance"]
    # the carry each operator sees, computed here op by op
    model = zoo.build("vgg19", "small", seed=0)
    want, carry = [], model.example_input(2)
    with torch.inference_mode():
        for _, mod in model.ops:
            want.append(tuple(tuple(t.shape) for t in flatten(carry)[0] if t is not None))
            carry = mod(carry)
    n = model.n_ops()
    assert per_op.inputs == want  # one capture per operator, on its predecessors' carry, in order
    assert per_op.calls["time_replays"] == n * (1 + 2)  # warm-up + repeats passes over every graph
    assert per_stage.inputs == [want[0], want[8], want[16]]  # the stage graphs start at the cuts
    assert st.attrs["bounds"] == [0, 8, 16]
    # one time per operator (and per stage): positive and finite, nothing more is claimed of a wall clock
    assert ops.sort_values("stage")["name"].tolist() == [nm for nm, _ in model.ops]
    assert sorted(ops["stage"]) == list(range(n)) and sorted(st["stage"]) == [0, 1, 2]
    for t in (*ops["latency_ms"], *st["latency_ms"]):
        assert 0 < t < math.inf


def _launch_file(path):
    prov, body = read_provenance_csv(path.read_text())
    return prov, body, pd.read_csv(io.StringIO(body), dtype=str, keep_default_na=False)


def test_cli_profile_writes_the_launch_side_file_in_the_exact_format(tmp_path, capsys):
    out = tmp_path / "vgg.csv"
    rc = cli_profile(["--model", "vgg19", "--cuts", "8", "--batch-sizes", "1,2", "--repeats", "2",
                      "--warmup", "1", "--modules", "cudagraph", "--launch", "eager,cudagraph",
                      "--out", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert "launch costs of eager,cudagraph in" in capsys.readouterr().out
    table = LatencyTable.load(out)
    assert table.provenance["modules"] == "cudagraph" and not table.bucketed  # images: nothing to bucket
    prov, body, lf = _launch_file(tmp_path / "vgg.launch.csv")
    assert body.splitlines()[0] == "modules,stage,batch_size,seq_len,launch_ms"
    for key in ("device name", "torch", "date", "repeats", "timer"):
        assert prov.get(key), key
    assert prov["timer"].startswith("host time until the launching call returned, before synchronising")
    assert prov["repeats"] == "2" and prov["torch"] == torch.__version__
    assert len(lf) == 2 * 2 * 2 and set(lf["modules"]) == {"eager", "cudagraph"}
    assert (lf["seq_len"] == "").all()  # image model: empty
    assert (lf["launch_ms"].astype(float) > 0).all()
    # a token model: the lengths filled in
    out = tmp_path / "bert.csv"
    assert cli_profile(["--model", "bert_base", "--cuts", "4", "--batch-sizes", "1", "--seq-lens", "8,16",
                        "--repeats", "1", "--warmup", "0", "--modules", "cudagraph", "--launch",
                        "cudagraph", "--out", str(out)]) == 0
    assert LatencyTable.load(out).bucketed
    _, _, lf = _launch_file(tmp_path / "bert.launch.csv")
    assert sorted(set(lf["seq_len"])) == ["16", "8"] and set(lf["modules"]) == {"cudagraph"}


@pytest.mark.parametrize("argv,field", [
    (["--modules", "onnx"], "--modules"),
    (["--modules", "eager,cudagraph"], "--modules"),  # on cpu: one kind, the table's
    (["--launch", "eager,jit"], "--launch"),
])
def test_cli_profile_modules_errors(argv, field, tmp_path, capsys):
    rc = cli_profile(["--model", "vgg19", "--stages", "2", *argv, "--out", str(tmp_path / "t.csv")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"dvasim profile: error: {field}: "), err


def test_graph_stage_shares_one_static_input_and_one_pool_per_executor():
    ops = CountingGraphs()
    lin = torch.nn.Linear(4, 3)
    g = GraphStage(lambda x: lin(x), ops, 0, name=(0, 0))
    with torch.inference_mode():
        g.capture_rows(torch.zeros(4, 4), [1, 2, 4])
        assert ops.calls["graph_pool"] == 1 and ops.calls["capture_graph"] == 3
        assert list(g.graphs) == [((4, 4),), ((2, 4),), ((1, 4),)]  # largest first
        ins = [gr["inputs"][0] for gr in g.graphs.values()]
        assert len({t.data_ptr() for t in ins}) == 1 and all(t.is_contiguous() for t in ins)  # views of one copy
        x = torch.randn(2, 4)
        torch.testing.assert_close(g(x), lin(x))
        with pytest.raises(ValueError, match="rows"):
            g.capture_rows(torch.zeros(2, 4), [3])


def _bucketed_table(tmp_path, lengths=(16, 32, 64, 128)):
    """The small BERT's CPU table at coarse lengths only, marked bucketed."""
    from dvasim.model.catalog import resolve_model

    base = resolve_model({"name": "bert_base", "device": "cpu", "stages": 3}).table
    rows = [{"stage": s, "batch_size": b, "seq_len": L, "latency_ms": base.latency(s, b, L)}
            for s in range(3) for b in range(1, 9) for L in lengths]
    t = LatencyTable.from_frame(pd.DataFrame(rows), provenance={"source": "test", "length buckets": "true"})
    path = tmp_path / "bucketed.csv"
    t.save(path)
    return LatencyTable.load(path)


def test_cudagraph_replay_with_a_bucketed_table_coarser_than_the_lengths(tmp_path):
    """Stretch and split on BERT with inputs padded to 16/32/64/128: outputs equal the unbatched model's, the
    policy's table times are the bucket's, and only the buckets the workload needs are captured."""
    from dvasim.engines.replay import replay

    table = _bucketed_table(tmp_path)
    assert table.bucketed and table.bucket(17) == 32 and table.bucket(128) == 128
    c = cfg("bert_base", "dvabatch", rate=800.0, n=40, policies=["load", "operator"], split_factor=1.0,
            t_comp_wait_ms=30.0)
    r = replay(c, overrides=["replay.modules=cudagraph"], record_outputs=True, warmup=0, table=table)
    s = r.summary
    assert s["n_completed"] == 40 and s["n_stretch"] + s["n_split"] > 0
    assert_outputs_match(r)
    setup = r.extra["setup"]
    top = max(int(L) for L in setup.workload.seq_lens)
    assert setup.buckets == [L for L in (16, 32, 64, 128) if L <= table.bucket(top)]
    assert setup.buffers.max_len == table.bucket(top) >= top
    for st in setup.lane_stages[0]:  # one graph per batch size per needed bucket
        assert len(st.graphs) == 8 * len(setup.buckets)
    ex = r.extra["replay"].executions
    assert any(e["seq_len"] not in setup.buckets for e in ex)
    for e in ex:  # the policy decided with the bucket's time, the time the simulator takes from the same table
        assert e["table_ms"] == pytest.approx(table.latency(e["stage"], e["batch_size"], table.bucket(e["seq_len"])))


def test_cli_replay_modules_flag_and_validate_on_a_machine_without_cuda(tmp_path, capsys):
    conf = vgg19_config_file(tmp_path / "c.toml", 200, 20, 4)
    assert main(["replay", str(conf), "--out", str(tmp_path / "r"), "--modules", "cudagraph", "--no-figure"]) == 0
    import json

    assert json.loads((tmp_path / "r" / "summary.json").read_text())["replay_modules"] == "cudagraph"
    capsys.readouterr()
    assert main(["replay", str(conf), "--out", str(tmp_path / "r"), "--modules", "jit"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dvasim replay: error: --modules: ")
    if torch.cuda.is_available():
        return
    for cmd in ("validate", "replay"):
        assert main([cmd, str(conf), "--out", str(tmp_path / "v"), "--device", "cuda"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == ["dvasim: error: device: cuda is not available on this machine; use --device cpu"], err
    assert not (tmp_path / "v").exists()
