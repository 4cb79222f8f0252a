"""Issue 35: the replay-to-fit loop on its own output. ``dvasim replay`` (the CPU path: the small zoo VGG19 in two
TorchScript stages, as tests/engines/test_replay.py runs it) writes a folder, ``dvasim fit`` fits an engine to
that folder and ``dvasim run --engine`` simulates with the engine, batched and unbatched (ZeroBatch with
``max_batch_size = 1``: every batch of size 1). Without torch, the same shapes on synthetic replays: the
``config.json`` a replay writes (its ``[model]`` as run: provenance, variant, the cut's bounds) and executions all
of batch size 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib

from dvasim.cli import main
from dvasim.errors import ConfigError
from dvasim.fitting.fit import fit, overlap_fraction, read_replay
from tests.conftest import vgg19_config_file
from tests.fitting.test_fit import synthetic_replay

PER_ROW_KEYS = ("launch_model_per_row_ms", "copy_per_row_ms", "first_copy_per_row_ms")  # the slopes over batch size


def as_replay_writes_it(d: Path, bounds: list[int]) -> Path:
    """Replace the synthetic folder's ``config.toml`` by the ``config.json`` ``dvasim replay`` writes: the config
    as run (:func:`dvasim.engines.replay.engine.to_run_result`), whose ``[model]`` carries the table's provenance,
    the variant and the bounds of the cut it ran (here not today's time-even cut of resnet152 in two: 84 + 73)."""
    (d / "config.toml").unlink()
    cfg = {"model": {"name": "resnet152", "device": "h100", "stages": 2, "variant": "full", "bounds": bounds,
                     "provenance": {"source": "sum of per-operator latencies from resnet152", "device": "h100"}},
           "policy": {"name": "zerobatch", "max_batch_size": 16, "preferred_batch_size": [], "max_queue_delay_ms": 0.0},
           "workload": {"kind": "poisson", "rate_qps": 500.0, "n_queries": 200, "seed": 1},
           "engine": {"buffer_pairs": 2, "instances": 1}, "qos": {"target_ms": 200.0}, "server": {},
           "replay": {"modules": "torchscript", "device": "cuda", "threads": 1, "stages": ["ops 0..79", "ops 80..156"]},
           "cluster": {"replicas": 1, "router": "round_robin", "network_delay_ms": 0.0}, "base_dir": str(d)}
    (d / "config.json").write_text(json.dumps({"config": cfg, "versions": {"dvasim": "test"}}))
    return d


def test_fit_reads_the_config_a_replay_writes(tmp_path, capsys):
    """Defect 1: ``model.provenance: unknown key ... give --operators`` on a folder the replay had just written.
    The notes are dropped and the recorded cut gives the operators (80 + 77, not today's 84 + 73)."""
    d = as_replay_writes_it(synthetic_replay(tmp_path / "r", seed=0, n=300), [0, 80])
    f = fit([d])["fit"]
    assert f["stage_operators"] == [80, 77] and "recorded cuts" in f["stage_operators_source"]
    assert main(["fit", str(d), "--out", str(tmp_path / "e.toml"), "--bootstrap", "0"]) == 0
    assert "stages of [80, 77] operators" in capsys.readouterr().out
    other = as_replay_writes_it(synthetic_replay(tmp_path / "r2", seed=1, n=300), [0, 90])
    with pytest.raises(ConfigError, match="different cuts"):
        fit([d, other])


def test_fit_on_unbatched_replays_keeps_what_they_identify(tmp_path, capsys):
    """Defect 2: batches all of size 1 raised ``TypeError: dict.update() got multiple values for keyword argument
    'launch_law_rel_err_by_stage_b1'``. The launch and copy at batch size 1 are fitted; the slopes per row are not
    identifiable (written as 0, said so, and given no interval)."""
    dirs = [synthetic_replay(tmp_path / f"r{k}", seed=k, n=600, max_batch=1) for k in range(2)]
    res = fit(dirs, operators=[10, 10], n_boot=20)
    h, f = res["engine"]["host"], res["fit"]
    assert f["launch_ms_by_stage"] == pytest.approx([1.05, 0.82], rel=0.05)  # 1.0 + 0.05 b, 0.8 + 0.02 b at b = 1
    assert h["copy_ms"] == pytest.approx(0.21) and all(h[k] == 0.0 for k in PER_ROW_KEYS)
    assert "a per-row slope needs at least two batch sizes" in f["not_identified"]
    assert len(f["launch_law_rel_err_by_stage_b1"]) == 2
    assert not any(k.startswith("launch_law_rel_err_by_stage_b") and k != "launch_law_rel_err_by_stage_b1" for k in f)
    iv = res["intervals"]
    assert "launch_per_op_ms" in iv["engine"]["host"] and not set(PER_ROW_KEYS) & set(iv["engine"]["host"])
    assert "launch_per_row_ms_by_stage" not in iv["fit"] and "not identified" in iv["about"]["not_given"]
    out = tmp_path / "e.toml"
    assert main(["fit", *map(str, dirs), "--out", str(out), "--operators", "10,10", "--bootstrap", "0"]) == 0
    assert "not identified: launch_model_per_row_ms" in capsys.readouterr().out
    assert "not_identified" in tomllib.loads(out.read_text())["fit"]


def _alone_batch_sizes(folder: Path) -> set[int]:
    """The batch sizes of a replay's executions that ran alone (as the fit counts them: overlap below 5%)."""
    ex = read_replay(folder)["executions"]
    return set(ex["batch_size"][overlap_fraction(ex["begin_ms"], ex["end_ms"]) < 0.05].tolist())


@pytest.mark.torch
@pytest.mark.parametrize("max_bs,fit_args", [(8, []), (1, ["--operators", "10,10"])])
def test_replay_then_fit_then_run_with_the_engine(max_bs, fit_args, tmp_path, capsys):
    """Defect 5: the loop on its own output, batched and unbatched (the issue's ``--operators 10,10``)."""
    pytest.importorskip("torch")
    from dvasim.model.catalog import load_op_table

    conf = vgg19_config_file(tmp_path / "c.toml", 800, 60, 4)  # a burst: batches of several sizes when allowed
    size = ["--set", f"policy.max_batch_size={max_bs}"]
    rep, eng, sim = tmp_path / "replay", tmp_path / "engine.toml", tmp_path / "sim"
    assert main(["replay", str(conf), "--out", str(rep), "--no-figure", *size]) == 0
    assert main(["fit", str(rep), "--out", str(eng), "--bootstrap", "20", *fit_args]) == 0
    capsys.readouterr()
    fitted = tomllib.loads(eng.read_text())
    f = fitted["fit"]
    if not fit_args:  # the cut the replay recorded in its config.json
        bounds = json.loads((rep / "config.json").read_text())["config"]["model"]["bounds"]
        ends = [*bounds[1:], load_op_table("vgg19", "cpu").n_stages]
        assert f["stage_operators"] == [b - a for a, b in zip(bounds, ends)]
    sizes = _alone_batch_sizes(rep)
    assert ("not_identified" in f) == (len(sizes) == 1)
    if max_bs == 1:
        assert sizes == {1} and fitted["engine"]["host"]["launch_model_per_row_ms"] == 0.0
    assert main(["run", str(conf), "--out", str(sim), "--no-figure", "--engine", str(eng), *size]) == 0
    assert json.loads((sim / "summary.json").read_text())["n_completed"] == 60
    host = json.loads((sim / "config.json").read_text())["config"]["engine"]["host"]
    assert host["launch_per_op_ms"] == pytest.approx(fitted["engine"]["host"]["launch_per_op_ms"])
