"""CUDA-graph stages (`[replay] modules = "cudagraph"`) and GPU-true profiling, through the CPU stand-in graphs
(same static-buffer semantics as torch.cuda.CUDAGraph: copy in, replay writes static outputs in place)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

from dvasim.engines.replay import replay  # noqa: E402
from dvasim.model import zoo  # noqa: E402
from dvasim.model.stages.graphs import CpuGraphs, GraphStage  # noqa: E402
from tests.engines.test_replay import assert_outputs_match, cfg  # noqa: E402


def test_graph_stage_static_buffers_are_overwritten_by_the_next_replay():
    lin = torch.nn.Linear(4, 3)
    g = GraphStage(lambda x: lin(x), CpuGraphs(), 0)
    with torch.inference_mode():
        g.capture(torch.zeros(2, 4))
        a, b = torch.randn(2, 4), torch.randn(2, 4)
        out_a = g(a)
        torch.testing.assert_close(out_a, lin(a))
        kept = out_a.clone()
        out_b = g(b)
        # the same static output tensor: the caller must copy it out before the next launch (the engine does)
        assert out_b.data_ptr() == out_a.data_ptr()
        torch.testing.assert_close(out_a, lin(b))
        assert not torch.equal(kept, out_a)
        with pytest.raises(KeyError, match="no CUDA graph"):
            g(torch.zeros(3, 4))


def test_cudagraph_replay_outputs_equal_the_unbatched_model_vgg():
    r = replay(cfg("vgg19", "delaybatch", rate=400.0, n=60, max_queue_delay_ms=4.0),
               overrides=["replay.modules=cudagraph"], record_outputs=True, warmup=0)
    assert r.summary["n_completed"] == 60 and r.summary["replay_modules"] == "cudagraph"
    assert r.summary["mean_exit_batch_size"] > 1.0
    assert_outputs_match(r)
    setup = r.extra["setup"]
    # one graph per batch size the policy can form, per stage (images: one length)
    assert all(len(st.graphs) == 8 for st in setup.lane_stages[0])


def test_cudagraph_bert_pads_to_buckets_with_stretch_and_split():
    """BERT with stretch (rows written at shorter lengths) and inputs padded up to the table's lengths."""
    r = replay(cfg("bert_base", "dvabatch", rate=800.0, n=50, policies=["load"], t_comp_wait_ms=50.0),
               overrides=["replay.modules=cudagraph"], record_outputs=True, warmup=0)
    assert r.summary["n_completed"] == 50 and r.summary["n_stretch"] > 0
    assert_outputs_match(r)
    setup = r.extra["setup"]
    lens = sorted({int(L) for L in setup.workload.seq_lens})
    assert setup.buckets and setup.buckets[-1] >= lens[-1]
    ex = r.extra["replay"].executions
    # every execution ran through a captured graph (a length between buckets would have raised KeyError)
    assert sum(st.launches for st in setup.lane_stages[0]) == len(ex)
    assert any(e["seq_len"] not in setup.buckets for e in ex)  # ... including lengths padded up to a bucket
    assert setup.buffers.max_len == setup.buckets[-1]
    r2 = replay(cfg("bert_base", "dvabatch-split", rate=600.0, n=40, split_factor=1.0, max_queue_delay_ms=3.0),
                overrides=["replay.modules=cudagraph"], record_outputs=True, warmup=0)
    assert r2.summary["n_split"] > 0
    assert_outputs_match(r2)


def test_auto_modules_is_torchscript_on_cpu():
    r = replay(cfg("vgg19", "zerobatch", rate=100.0, n=10), warmup=0)
    assert r.summary["replay_modules"] == "torchscript"


def test_graph_profile_and_launch_side_file(tmp_path):
    from dvasim.model.profiling.profiler import (
        LAUNCH_KINDS,
        launch_path,
        profile_launch,
        profile_ops,
        profile_stages,
        save_launch,
        save_profile,
    )
    from dvasim.model.table import LatencyTable
    from dvasim.server.host import LaunchTable

    df = profile_stages("bert_base", 2, batch_sizes=[1, 2], seq_lens=[16, 32], warmup=1, repeats=3,
                        modules="cudagraph")
    t = save_profile(df, tmp_path / "t.csv", stats=False)
    loaded = LatencyTable.load(tmp_path / "t.csv")
    assert loaded.bucketed and "stand-in" in loaded.provenance["timer"]
    assert loaded.bucket(20) == 32 and loaded.latency(0, 1, 20) == pytest.approx(loaded.latency(0, 1, 32))
    # per-operator graph times: one per operator, in the model's order, positive and finite (wall clock on the
    # stand-in: no sum or ratio of them is asserted; test_profile_gpu checks what each graph was captured on)
    ops = profile_ops("bert_base", [2], [32], warmup=1, repeats=5, graphs=True)
    b = df.attrs["bounds"]
    model = zoo.build("bert_base", "small", seed=0)
    assert ops.sort_values("stage")["name"].tolist() == [nm for nm, _ in model.ops]
    assert sorted(ops["stage"]) == list(range(model.n_ops())) and b[0] == 0 and 0 < b[1] < model.n_ops()
    assert all(0 < t < math.inf for t in (*ops["latency_ms"], *df["latency_ms"]))
    ldf = profile_launch("bert_base", b, [1, 2], [16, 32], warmup=1, repeats=3)
    p = save_launch(ldf, launch_path(tmp_path / "t.csv"))
    assert p.name == "t.launch.csv"
    text = p.read_text()
    assert text.startswith("# ") and "modules,stage,batch_size,seq_len,launch_ms" in text
    lt = LaunchTable.load(p)
    assert lt.kinds() == set(LAUNCH_KINDS) and lt.n_stages("cudagraph") == 2
    assert all(lt.cost(k, s, 2, 32) > 0 for k in LAUNCH_KINDS for s in range(2))
    body = pd.read_csv(p, comment="#")
    assert len(body) == 3 * 2 * 2 * 2 and t.n_stages == 2


def test_validate_gpu_tables_feed_the_host_model(tmp_path):
    """`dvasim validate --device cuda` simulates with the graphs' GPU-time table and their launch costs in the
    host model: the same files, made through the CPU stand-in, drive a simulation."""
    from dvasim import config as cfgmod
    from dvasim.api import run
    from dvasim.fitting.validate import gpu_stage_table

    c = cfgmod.resolve(cfg("bert_base", "zerobatch", rate=100.0, n=40, stages=2))
    c["policy"]["max_batch_size"] = 2
    path = gpu_stage_table(c, tmp_path / "t.csv", repeats=2, warmup=1, device="cpu")
    sim_cfg = {**c, "model": {"table": str(path)},
               "engine": {**c["engine"], "host": {"launch_table": str(tmp_path / "t.launch.csv"),
                                                  "modules": "cudagraph"}}}
    with_host = run(sim_cfg, progress=False)
    without = run({**c, "model": {"table": str(path)}}, progress=False)
    assert with_host.summary["n_completed"] == 40
    assert with_host.config["engine"]["host"]["modules"] == "cudagraph"
    assert with_host.summary["mean_latency_ms"] >= without.summary["mean_latency_ms"]
    # the launch table really drives the simulation: launches 20x slower make the queries slower (the measured
    # launch costs are wall clock: only the direction is asserted, not by how much)
    slow = {**sim_cfg, "engine": {**sim_cfg["engine"], "host": {**sim_cfg["engine"]["host"], "launch_scale": 20.0}}}
    assert run(slow, progress=False).summary["mean_latency_ms"] > with_host.summary["mean_latency_ms"]
